"""Whether the provider blocks of earlier turns are still sent.

A reasoning model's blocks are kept in place (docs/prompt.md, "Provider blocks"), but they are
never elided, and a long session's thinking would fill the context window on its own. Every
provider allows the blocks of earlier turns to be left out: Anthropic ("you can omit thinking
blocks from prior assistant role turns"), OpenAI (the model discards earlier turns' reasoning)
and Gemini (earlier turns' signatures are not validated). So the blocks of the turns before
the current one are sent while they take at most a quarter of the budget, and from the first
turn at which they would take more, the blocks of every earlier turn are left out.

That decision is a function of the log before the turn's user message, so it is the same at
every step of the turn (each call's body stays a prefix of the next); at a turn boundary it
costs what elision's flip costs, a cache miss from the first block left out. And when a
prompt does not fit even with the current turn's results elided, earlier turns' blocks are
left out before the context guard gives up (the assembler, `assembly.py`): a miss within the
turn, as the guard's own unavoidable ones, rather than a failed call.
"""

from __future__ import annotations

from collections.abc import Sequence

from psych_sidecar.domain.cache import ImmutableCache
from psych_sidecar.domain.estimate import estimate_tokens
from psych_sidecar.domain.runlog import LogReader, PartKind, RecordKind, RecordSkeleton

# The provider-block bytes of one assistant record: immutable per record.
BlockSizeCache = ImmutableCache[tuple[str, int], int]

# The share of the budget (the window less the output reserve) earlier turns' blocks may take.
PRIOR_BLOCKS_BUDGET_DIVISOR = 4


def prior_block_sizes(
    log: LogReader, cache: BlockSizeCache, run_id: str, skeletons: Sequence[RecordSkeleton]
) -> dict[int, int]:
    """The provider-block bytes of each assistant record before the last user message that
    has any."""
    last_user = max(
        (i for i, s in enumerate(skeletons) if s.kind is RecordKind.USER_MESSAGE), default=-1
    )
    prior = [
        s.sequence for s in skeletons[: max(last_user, 0)] if s.kind is RecordKind.ASSISTANT_MESSAGE
    ]
    sizes: dict[int, int] = {}
    wanted = []
    for sequence in prior:
        cached = cache.get((run_id, sequence))
        if cached is None:
            wanted.append(sequence)
        else:
            sizes[sequence] = cached
    if wanted:
        metas = log.part_metas(run_id, wanted)
        for sequence in wanted:
            size = sum(
                m.byte_length for m in metas.get(sequence, []) if m.kind is PartKind.PROVIDER_BLOCK
            )
            sizes[sequence] = size
            cache.put((run_id, sequence), size)
    return {sequence: size for sequence, size in sizes.items() if size}


def over_their_share(sizes: dict[int, int], budget_tokens: int) -> bool:
    """Whether earlier turns' blocks take more than their share of the budget."""
    return estimate_tokens(sum(sizes.values())) > budget_tokens // PRIOR_BLOCKS_BUDGET_DIVISOR
