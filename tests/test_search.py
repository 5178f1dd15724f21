"""The search ranking on small, made-up catalogues: keywords alone, and fused with sentence
embeddings (the real all-MiniLM-L6-v2, installed by scripts/test)."""

from __future__ import annotations

import pytest

from psych_sidecar.search import (
    SearchDocument,
    SearchIndex,
    ToolEmbeddings,
    identifier_words,
    listing_texts,
    normalise_query,
    tokenize,
)
from psych_sidecar.search.model import tool_embeddings


def test_identifiers_split_in_every_spelling() -> None:
    for name in ("get_current_time", "getCurrentTime", "get-current-time", "GetCurrentTime"):
        assert tokenize(name) == ["get", "current", "time"]
    assert tokenize("HTTPServer parseJSON") == ["http", "server", "pars", "json"]


def test_english_is_stemmed_and_stop_words_dropped() -> None:
    assert tokenize("Searching the repositories") == tokenize("search repository")


def test_cjk_runs_become_characters_and_bigrams() -> None:
    assert tokenize("获取热榜") == ["获", "取", "热", "榜", "获取", "取热", "热榜"]
    assert tokenize("微博 trending") == ["微", "博", "微博", "trend"]


def test_identifier_abbreviations_also_read_as_the_word_they_stand_for() -> None:
    assert tokenize("get_repo_info") == ["get", "repo", "repositori", "info", "inform"]
    # Both ways: a query's abbreviation meets a description's word.
    assert set(tokenize("repository information")) <= set(tokenize("getRepoInfo"))
    assert set(tokenize("list dir")) >= set(tokenize("directory"))
    # Ordinary words are left alone.
    assert tokenize("information") == ["inform"]


def test_urls_and_file_paths_in_a_query_become_the_kind_of_argument() -> None:
    assert normalise_query("save it to /root/markdown/cv.md") == "save it to file path"
    assert normalise_query("fetch https://example.org/team/ now") == "fetch URL now"
    assert normalise_query("open www.example.org") == "open URL"
    assert normalise_query("read ~/notes/today and ./src/main.py") == (
        "read file path and file path"
    )
    assert normalise_query("summarise report.pdf") == "summarise file path"
    assert normalise_query(r"copy C:\Users\me\a.txt") == "copy file path"
    # Not paths: a server/tool name, a single root folder, a sentence with full stops.
    for unchanged in ("files/write_file", "list /tmp", "Send a message. Then wait."):
        assert normalise_query(unchanged) == unchanged


def test_a_path_in_the_query_does_not_match_tools_about_its_folder_names() -> None:
    documents = [
        SearchDocument("files", "write_file", "Write content to a file at the given path."),
        SearchDocument("convert", "html_to_markdown", "Convert HTML to markdown text."),
        SearchDocument("notes", "read_note", "Read a markdown note from the root of the vault."),
    ]
    index = SearchIndex(documents)
    hits = index.search("write it to /root/markdown/daily.md", 3)
    assert documents[hits[0].index].name == "write_file"
    assert len(hits) == 1


def test_names_read_as_words_for_the_encoder() -> None:
    assert identifier_words("get_current_time") == "get current time"
    assert identifier_words("getCurrentTime") == "get Current Time"
    assert identifier_words("mcp_howtocook_whatToEat") == "mcp howtocook what To Eat"
    assert identifier_words("get-36kr-trending") == "get 36kr trending"


DOCUMENTS = [
    SearchDocument("files", "write_file", "Write or append to file contents.", ("path", "content")),
    SearchDocument("files", "read_file", "Read a file's contents.", ("path",)),
    SearchDocument("notes", "save_note", "Store a note; the note can mention how to write a file."),
    SearchDocument("trends", "get-weibo-trending", "获取微博热搜榜 包含实时热门话题"),
    SearchDocument("time", "get_current_time", "Current time in a timezone.", ("timezone",)),
    SearchDocument("other", "read_file", "Reads files from another server."),
    SearchDocument("http", "fetch", "Retrieve the contents of a URL as markdown.", ("url",)),
]


@pytest.fixture(scope="module")
def embeddings() -> ToolEmbeddings:
    found = tool_embeddings("auto")
    assert found is not None, "run scripts/install-search-model"
    # Encoded ahead, as the sidecar's warm-up does with every listing it stores.
    found.warm([(d.name, d.description) for d in DOCUMENTS])
    return found


@pytest.fixture(scope="module", params=["lexical", "hybrid"])
def index(request: pytest.FixtureRequest) -> SearchIndex:
    if request.param == "lexical":
        return SearchIndex(DOCUMENTS)
    built = SearchIndex(DOCUMENTS, request.getfixturevalue("embeddings"))
    assert built.semantic
    return built


def ranked(index: SearchIndex, query: str, limit: int = 10) -> list[str]:
    return [
        f"{DOCUMENTS[h.index].server}/{DOCUMENTS[h.index].name}" for h in index.search(query, limit)
    ]


def names(query: str, limit: int = 10) -> list[str]:
    return ranked(SearchIndex(DOCUMENTS), query, limit)


def test_a_word_in_the_name_outranks_the_same_word_in_a_description() -> None:
    assert names("write file")[0] == "files/write_file"


def test_exact_names_rank_first_in_every_form(index: SearchIndex) -> None:
    for query in ("read_file", "READ_FILE", "other/read_file", "other__read_file"):
        assert ranked(index, query)[0] in {"files/read_file", "other/read_file"}, query
    assert ranked(index, "other/read_file")[0] == "other/read_file"
    assert ranked(index, "get_current_time")[0] == "time/get_current_time"
    # Tied, they keep catalogue order.
    assert ranked(index, "read_file", 2) == ["files/read_file", "other/read_file"]


def test_chinese_queries_match_chinese_descriptions(index: SearchIndex) -> None:
    assert ranked(index, "微博热搜")[0] == "trends/get-weibo-trending"


def test_english_queries_find_chinese_descriptions_through_their_gloss(
    index: SearchIndex,
) -> None:
    # 获取微博热搜榜 包含实时热门话题: "to get … microblog … hot search … list … real time
    # popular … topic"; no English word of the query is in the tool's name or description.
    assert ranked(index, "popular topics on microblogs")[0] == "trends/get-weibo-trending"
    assert ranked(index, "real-time hot search list")[0] == "trends/get-weibo-trending"


def test_chinese_queries_find_english_descriptions_through_their_gloss(
    index: SearchIndex,
) -> None:
    # 当前时间: "current; present time"; 时区: "time zone".
    assert ranked(index, "当前时区时间")[0] == "time/get_current_time"


def test_a_query_meaning_nothing_in_the_catalogue_finds_nothing(index: SearchIndex) -> None:
    assert ranked(index, "kubernetes") == []


def test_limit_and_scores_are_ordered(index: SearchIndex) -> None:
    hits = index.search("file", 3)
    assert len(hits) == 3
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("download a web page", "http/fetch"),
        ("what hour is it in Tokyo", "time/get_current_time"),
    ],
)
def test_meaning_finds_what_keywords_miss(
    embeddings: ToolEmbeddings, query: str, expected: str
) -> None:
    assert names(query) == []
    assert ranked(SearchIndex(DOCUMENTS, embeddings), query)[0] == expected


def test_a_tool_matching_both_ways_outranks_one_matching_either(
    embeddings: ToolEmbeddings,
) -> None:
    # save_note matches "write" and "file" in its description and means much the same; the
    # name says it plainly only for write_file.
    assert ranked(SearchIndex(DOCUMENTS, embeddings), "write file")[0] == "files/write_file"


def test_without_an_encoder_the_index_is_lexical() -> None:
    assert not SearchIndex(DOCUMENTS).semantic
    without = ToolEmbeddings(lambda: None)
    assert not without.load()
    assert not SearchIndex(DOCUMENTS, without).semantic


def test_a_leading_sentence_shared_by_a_servers_tools_is_not_their_summary() -> None:
    from psych_sidecar.search.ranking import _summaries

    template = "Acme - Api: This is the public Acme REST API."
    documents = [
        SearchDocument("acme", "CreateMessage", f"{template} Send a message. Costs apply."),
        SearchDocument("acme", "DeleteMessage", f"{template} Delete a message."),
        SearchDocument("acme", "ListCalls", f"{template}\nList calls."),
        SearchDocument("acme", "Ping", template),
        # The same sentence under another server is that server's own (one tool: no template).
        SearchDocument("other", "Hello", f"{template} Say hello."),
        SearchDocument("other", "Bye", "Say bye. Then leave."),
    ]
    assert _summaries(documents) == [
        "Send a message.",
        "Delete a message.",
        "List calls.",
        template,  # nothing but the template: it stays
        template,
        "Say bye.",
    ]


def test_the_encoder_reads_a_description_without_its_listings_template() -> None:
    template = "Acme - Api: This is the public Acme REST API."
    listing = [
        ("CreateMessage", f"{template} Send a message. Costs apply."),
        ("DeleteMessage", f"{template} Delete a message."),
        ("ListCalls", f"{template}\nList calls."),
        ("Ping", template),
    ]
    assert [description for _, description in listing_texts(listing)] == [
        "Send a message. Costs apply.",
        "Delete a message.",
        "List calls.",
        template,  # nothing but the template: it stays
    ]
    # Two tools sharing a sentence are no template: each reads its whole description.
    assert listing_texts(listing[:2]) == [
        ("Create Message", f"{template} Send a message. Costs apply."),
        ("Delete Message", f"{template} Delete a message."),
    ]
