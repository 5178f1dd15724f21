"""The search ranking on small, made-up catalogues."""

from __future__ import annotations

from psych_sidecar.domain.search import SearchDocument, SearchIndex, tokenize


def test_identifiers_split_in_every_spelling() -> None:
    for name in ("get_current_time", "getCurrentTime", "get-current-time", "GetCurrentTime"):
        assert tokenize(name) == ["get", "current", "time"]
    assert tokenize("HTTPServer parseJSON") == ["http", "server", "pars", "json"]


def test_english_is_stemmed_and_stop_words_dropped() -> None:
    assert tokenize("Searching the repositories") == tokenize("search repository")


def test_cjk_runs_become_characters_and_bigrams() -> None:
    assert tokenize("获取热榜") == ["获", "取", "热", "榜", "获取", "取热", "热榜"]
    assert tokenize("微博 trending") == ["微", "博", "微博", "trend"]


DOCUMENTS = [
    SearchDocument("files", "write_file", "Write or append to file contents.", ("path", "content")),
    SearchDocument("files", "read_file", "Read a file's contents.", ("path",)),
    SearchDocument("notes", "save_note", "Store a note; the note can mention how to write a file."),
    SearchDocument("trends", "get-weibo-trending", "获取微博热搜榜 包含实时热门话题"),
    SearchDocument("time", "get_current_time", "Current time in a timezone.", ("timezone",)),
    SearchDocument("other", "read_file", "Reads files from another server."),
]


def names(query: str, limit: int = 10) -> list[str]:
    index = SearchIndex(DOCUMENTS)
    return [
        f"{DOCUMENTS[h.index].server}/{DOCUMENTS[h.index].name}" for h in index.search(query, limit)
    ]


def test_a_word_in_the_name_outranks_the_same_word_in_a_description() -> None:
    assert names("write file")[0] == "files/write_file"


def test_exact_names_rank_first_in_every_form() -> None:
    for query in ("read_file", "READ_FILE", "other/read_file", "other__read_file"):
        assert names(query)[0] in {"files/read_file", "other/read_file"}, query
    assert names("other/read_file")[0] == "other/read_file"
    assert names("get_current_time")[0] == "time/get_current_time"


def test_chinese_queries_match_chinese_descriptions() -> None:
    assert names("微博热搜")[0] == "trends/get-weibo-trending"


def test_no_match_no_hits_and_ties_keep_catalogue_order() -> None:
    assert names("kubernetes") == []
    assert names("read_file", 2) == ["files/read_file", "other/read_file"]


def test_limit_and_scores_are_ordered() -> None:
    index = SearchIndex(DOCUMENTS)
    hits = index.search("file", 3)
    assert len(hits) == 3
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
