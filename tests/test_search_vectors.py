"""Tool search's sentence vectors in the database: shared by sidecars, kept across restarts,
orphans collected; and a search never waits for (or does) a catalogue's encoding.

The encoder is the real all-MiniLM-L6-v2 (scripts/install-search-model), wrapped to count
what it is asked to encode or to hold it back; the databases are real SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
import pytest
from sqlalchemy import Engine

from psych.sidecar.v1 import (
    connection_pb2,
    connection_service_pb2,
    connection_service_pb2_grpc,
    content_pb2,
    run_service_pb2,
    run_service_pb2_grpc,
    spec_pb2,
    spec_service_pb2,
    spec_service_pb2_grpc,
    tool_service_pb2,
    tool_service_pb2_grpc,
)
from psych_sidecar.config import Settings
from psych_sidecar.domain.calls.meta_tools import partial_ranking_note
from psych_sidecar.domain.catalog import CatalogTool, CatalogWrite, Connection, TransportKind
from psych_sidecar.search import (
    SearchDocument,
    SearchIndex,
    ToolEmbeddings,
    content_key,
    listing_texts,
    tool_texts,
)
from psych_sidecar.search.encoder import MiniLmEncoder, load_packaged_encoder
from psych_sidecar.search.model import encoder_identity
from psych_sidecar.storage.connections import SqlConnectionStore
from psych_sidecar.storage.engines import create_database_engine
from psych_sidecar.storage.migrate import migrate
from psych_sidecar.storage.search_vectors import SqlVectorStore
from tests.support.connections import fixture_commands
from tests.support.databases import TEST_SECRET_KEY, keys_of_the_tests, postgres_database
from tests.support.polling import SETTLE_SECONDS, wait_for
from tests.support.processes import served
from tests.support.settings import flat_settings
from tests.support.sidecar import RunningSidecar

TOOLS = [
    ("get_current_time", "Current time in a timezone."),
    ("write_file", "Write or append to file contents."),
    ("fetch", "Retrieve the contents of a URL as markdown."),
    ("get-weibo-trending", "获取微博热搜榜"),
]


class CountingEncoder:
    """The real encoder, counting the catalogue texts it encodes (queries apart); `gate`,
    while clear, holds the warm-up thread's encodings back (a warm-up not there yet)."""

    def __init__(self, encoder: MiniLmEncoder) -> None:
        self.encoder = encoder
        self.encoded: list[str] = []
        self.gate = threading.Event()
        self.gate.set()

    def encode(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if threading.current_thread().name.startswith("search-warmup"):
            assert self.gate.wait(SETTLE_SECONDS), "the test never released the warm-up"
        self.encoded.extend(texts)
        return self.encoder.encode(texts)


@pytest.fixture(scope="module")
def encoder() -> MiniLmEncoder:
    """One loaded model for the module (loading takes about a second)."""
    return load_packaged_encoder()


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """A migrated database; the module's database is shared, so tests use their own texts
    or read only what they wrote."""
    created = create_database_engine(database_url, pool_size=2)
    migrate(created)
    yield created
    created.dispose()


def embeddings_on(engine: Engine, counting: CountingEncoder) -> ToolEmbeddings:
    return ToolEmbeddings(
        lambda: counting, encoder_id=encoder_identity(), store=SqlVectorStore(engine)
    )


def texts_of(tools: Sequence[tuple[str, str]]) -> list[str]:
    return sorted({text for name, description in tools for text in tool_texts(name, description)})


def _catalog(
    store: SqlConnectionStore, tenant: str, versions: Sequence[Sequence[tuple[str, str]]]
) -> None:
    stored = store.put_connection(
        Connection(tenant=tenant, name="srv", transport=TransportKind.STDIO, command="fixture")
    )
    for version, tools in enumerate(versions, start=1):
        listing = [
            CatalogTool(server="srv", name=name, description=description, input_schema_json=b"")
            for name, description in tools
        ]
        written = store.write_catalog(tenant, "srv", stored.revision, listing)
        assert written == CatalogWrite(version, len(listing), changed=True)


def test_stored_vectors_survive_a_restart(
    engine: Engine, database_url: str, encoder: MiniLmEncoder, unique: Any
) -> None:
    tenant = unique("restart")
    tools = [(f"{tenant}_{name}", description) for name, description in TOOLS]
    # Listed texts: the warm-up's collection keeps them.
    _catalog(SqlConnectionStore(engine, keys_of_the_tests()), tenant, [tools])
    first = CountingEncoder(encoder)
    before = embeddings_on(engine, first)
    before.warm(tools)
    assert sorted(first.encoded) == texts_of(tools)
    assert before.counters().vectors_written == len(texts_of(tools))
    wanted, _ = before.vectors_in_memory(texts_of(tools))
    before.close(wait=True)
    engine.dispose()

    # A new process: a new engine, an empty memory, the same database.
    restarted = create_database_engine(database_url, pool_size=2)
    try:
        second = CountingEncoder(encoder)
        after = embeddings_on(restarted, second)
        rows, have = after.known_vectors(texts_of(tools))
        assert have.all()
        np.testing.assert_array_equal(rows, wanted)
        after.warm(tools)
        assert second.encoded == []
        counters = after.counters()
        assert counters.texts_encoded == 0
        assert counters.vectors_read == len(texts_of(tools))
        assert counters.backlog == 0
    finally:
        restarted.dispose()


def test_a_search_racing_the_warm_up_answers_at_once_and_says_it_is_partial(
    engine: Engine, encoder: MiniLmEncoder, unique: Any
) -> None:
    tag = unique("run")  # texts no other test stored
    tools = [(f"race_{name}", f"{description} ({tag})") for name, description in TOOLS]
    counting = CountingEncoder(encoder)
    embeddings = embeddings_on(engine, counting)
    assert embeddings.load()
    embeddings.query_vector("warm the query path")  # the model is loaded: queries encode
    counting.gate.clear()  # the warm-up cannot encode anything yet
    warming = embeddings.warm_in_background(tools)
    assert warming is not None
    documents = [SearchDocument("s", name, description) for name, description in tools]
    # Only the gate holds the warm-up; the search returns while it is held (a search that
    # waited for the warm-up, or encoded the catalogue itself, would fail the gate's wait).
    index = SearchIndex(documents, embeddings)
    ranking = index.rank("race_write_file", 3)
    assert ranking.partial
    # The query has its vector, no tool has one yet: every tool ranked by keywords alone.
    assert (ranking.keyword_only, ranking.documents) == (len(tools), len(tools))
    assert documents[ranking.hits[0].index].name == "race_write_file"
    # Only the queries were encoded, on this thread.
    assert counting.encoded == ["warm the query path", "race_write_file"]
    assert embeddings.counters().texts_encoded == 0
    assert embeddings.counters().backlog == len(texts_of(tools))

    counting.gate.set()
    warming.result(timeout=SETTLE_SECONDS)
    assert sorted(counting.encoded[2:]) == texts_of(tools)
    fresh = index.refreshed()
    assert fresh.complete
    ranking = fresh.rank("what time is it", 1)
    assert not ranking.partial
    assert ranking.keyword_only == 0
    assert documents[ranking.hits[0].index].name == "race_get_current_time"
    embeddings.close(wait=True)


def test_a_search_before_the_model_loads_is_keywords_only_and_partial(engine: Engine) -> None:
    loading = threading.Event()

    def slow_load() -> MiniLmEncoder:
        assert loading.wait(SETTLE_SECONDS)
        return load_packaged_encoder()

    embeddings = ToolEmbeddings(
        slow_load, encoder_id=encoder_identity(), store=SqlVectorStore(engine)
    )
    documents = [SearchDocument("s", name, description) for name, description in TOOLS]
    ranking = SearchIndex(documents, embeddings).rank("write file", 2)
    assert ranking.partial
    assert ranking.keyword_only == len(documents)
    assert documents[ranking.hits[0].index].name == "write_file"
    loading.set()
    embeddings.close(wait=True)


def test_orphan_collection_removes_vectors_of_texts_no_version_uses(
    engine: Engine, encoder: MiniLmEncoder, unique: Any
) -> None:
    tenant = unique("orphans")
    old = [(f"{tenant}_old_tool", "A tool only the first version has.")]
    kept = [(f"{tenant}_kept_tool", "A tool in both versions.")]
    gone = [(f"{tenant}_never_listed", "A text no catalogue version has.")]
    _catalog(SqlConnectionStore(engine, keys_of_the_tests()), tenant, [old + kept, kept])
    counting = CountingEncoder(encoder)
    embeddings = embeddings_on(engine, counting)
    embeddings.vectors(texts_of(old + kept + gone))  # encoded and stored, not collected
    vectors = SqlVectorStore(engine)
    vectors.write_vectors("another-encoder@0", [("0" * 32, b"\0\0\0\0")])

    deleted = embeddings.collect()

    remaining = set(vectors.vector_keys())

    def stored(tools: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        return {(encoder_identity(), content_key(text)) for text in texts_of(tools)}

    # The old version's texts stay (a version still refers to them); the never-listed ones
    # and the other encoder's go.
    assert stored(old + kept) <= remaining
    assert not stored(gone) & remaining
    assert ("another-encoder@0", "0" * 32) not in remaining
    assert deleted >= len(stored(gone)) + 1
    assert embeddings.counters().vectors_collected == deleted
    embeddings.close(wait=True)


def test_a_listings_template_sentence_is_not_encoded_and_its_vectors_are_kept(
    engine: Engine, encoder: MiniLmEncoder, unique: Any
) -> None:
    tenant = unique("template")
    template = "Acme - Api: This is the public Acme REST API."
    first = [(f"{tenant}_tool_{i}", f"{template} Tool number {i}.") for i in range(3)]
    # The next version has two of them: alone they are no template, read whole.
    second = first[:2]
    _catalog(SqlConnectionStore(engine, keys_of_the_tests()), tenant, [first, second])
    counting = CountingEncoder(encoder)
    embeddings = embeddings_on(engine, counting)
    embeddings.warm(first)
    assert all(not text.startswith(template) for text in counting.encoded)
    embeddings.warm(second)
    assert all(text.startswith(template) for text in counting.encoded[-2:])

    # An index over two of the first version's tools reads the texts the whole listing
    # gives, which the warm-up encoded: nothing left to encode, nothing keyword-only.
    texts = dict(zip((name for name, _ in first), listing_texts(first), strict=True))
    documents = [
        SearchDocument("srv", name, description, encoder_texts=texts[name])
        for name, description in first[:2]
    ]
    encoded = len(counting.encoded)
    assert SearchIndex(documents, embeddings).complete
    assert len(counting.encoded) == encoded

    # Both versions' texts are live: the collection keeps every vector the warm-ups stored.
    embeddings.collect()
    remaining = {key for _, key in SqlVectorStore(engine).vector_keys()}
    assert {content_key(text) for text in counting.encoded} <= remaining
    embeddings.close(wait=True)


# Two sidecars on one database, through the gRPC contract.


def _settings(database_url: str, tmp_path: Any) -> Settings:
    return flat_settings(
        listen=["127.0.0.1:0"],
        database_url=database_url,
        data_dir=tmp_path,
        shutdown_grace_seconds=5,
        secret_keys=TEST_SECRET_KEY,
        mcp_commands=fixture_commands(),
    )


class _Client:
    def __init__(self, running: RunningSidecar) -> None:
        self.running = running
        self.channel = grpc.insecure_channel(running.sidecar.bound[0])
        self.specs = spec_service_pb2_grpc.SpecServiceStub(self.channel)
        self.runs = run_service_pb2_grpc.RunServiceStub(self.channel)
        self.connections = connection_service_pb2_grpc.ConnectionServiceStub(self.channel)
        self.tools = tool_service_pb2_grpc.ToolServiceStub(self.channel)

    def fixture_run(self, tenant: str, spec_name: str, tools: int, preload: bool) -> str:
        """A Run of `tenant` that may use every tool, with the fixture server (`tools`
        generated tools) connected as "gen"."""
        spec = spec_pb2.Spec(
            name=spec_name,
            version=1,
            grants=[spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")],
        )
        self.specs.PublishSpec(spec_service_pb2.PublishSpecRequest(spec=spec))
        run_id: str = self.runs.CreateRun(
            run_service_pb2.CreateRunRequest(tenant=tenant, spec_name=spec.name, spec_version=1)
        ).run.run_id
        self.connections.PutConnection(
            connection_service_pb2.PutConnectionRequest(
                connection=connection_pb2.Connection(
                    tenant=tenant,
                    name="gen",
                    stdio=connection_pb2.StdioTransport(
                        command="fixture", args=["--tools", str(tools)]
                    ),
                    preload=preload,
                )
            )
        )
        return run_id

    def search(self, run_id: str, query: str) -> tool_service_pb2.SearchToolsResponse:
        request = tool_service_pb2.SearchToolsRequest(run_id=run_id, query=query, page_size=5)
        response: tool_service_pb2.SearchToolsResponse = self.tools.SearchTools(request)
        return response

    def fully_ranked(self, run_id: str, query: str) -> tool_service_pb2.SearchToolsResponse:
        """Search until the answer is not partial (the warm-up and model load run in the
        background); fails after SETTLE_SECONDS."""

        def ranked() -> tool_service_pb2.SearchToolsResponse | None:
            response = self.search(run_id, query)
            return None if response.partial else response

        return wait_for(ranked, "a ranking that is not partial")


def test_the_model_is_told_when_its_search_was_ranked_before_the_tools_were_indexed(
    tmp_path: Any, unique: Any
) -> None:
    """mcp_search_tools, the model's search, says what SearchTools' `partial` says: here the
    sentence model is held back from loading, so the ranking is keywords only until it is."""
    loading = threading.Event()
    running = RunningSidecar(_settings(f"sqlite:///{tmp_path / 'sidecar.db'}", tmp_path))
    embeddings = running.sidecar.graph.embeddings
    assert embeddings is not None
    load = embeddings._load_encoder

    def held_load() -> Any:
        assert loading.wait(SETTLE_SECONDS), "the test never let the model load"
        return load()

    embeddings._load_encoder = held_load
    with running:
        client = _Client(running)
        run_id = client.fixture_run(unique("told"), unique("spec"), tools=250, preload=True)

        def model_search(call_id: str) -> dict[str, Any]:
            call = content_pb2.ToolCall(
                call_id=call_id,
                name="mcp_search_tools",
                arguments_json=json.dumps({"query": "echo the text back"}),
            )
            outcome = client.tools.DispatchToolCall(
                tool_service_pb2.DispatchToolCallRequest(run_id=run_id, call=call)
            ).outcome
            assert not outcome.is_error, outcome.result_json
            found: dict[str, Any] = json.loads(outcome.result_json)["structuredContent"]
            return found

        # Listed: the search tier is there.
        wait_for(lambda: client.search(run_id, "echo").hits, "the fixture server listed")
        held = model_search("held")
        assert held["results"]
        assert held["partial"] is True
        assert "every tool was matched by keywords only" in held["note"]
        assert "Searching again in a few seconds" in held["note"]
        loading.set()
        client.fully_ranked(run_id, "echo the text back")
        ready = model_search("ready")
        assert "note" not in ready
        assert "partial" not in ready
        assert ready["results"][0]["tool"] == "echo"
        client.channel.close()


@pytest.fixture
def own_database_url(database_url: str, tmp_path: Any) -> Iterator[str]:
    """An empty database of the module's backend for one test. Every sidecar reconnects every
    stored connection when it starts, and warms their listings: on the module's database, the
    connections other tests stored would be encoded by whichever sidecar got there first."""
    if database_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path / 'own.db'}"
        return
    with postgres_database() as url:
        yield url


def test_a_second_sidecar_searches_without_encoding_anything(
    own_database_url: str, tmp_path_factory: pytest.TempPathFactory, unique: Any
) -> None:
    database_url = own_database_url
    tenant = unique("shared")
    with RunningSidecar(_settings(database_url, tmp_path_factory.mktemp("a"))) as first:
        a = _Client(first)
        run_id = a.fixture_run(tenant, unique("spec"), tools=30, preload=False)
        hit = a.fully_ranked(run_id, "echo the text back").hits[0]
        counters = first.sidecar.search_counters
        assert counters is not None
        assert counters.texts_encoded > 0

        # A second sidecar on the same database, while the first still serves.
        with RunningSidecar(_settings(database_url, tmp_path_factory.mktemp("b"))) as second:
            b = _Client(second)
            found = b.fully_ranked(run_id, "echo the text back")
            assert (found.hits[0].server, found.hits[0].tool) == (hit.server, hit.tool)
            counters = second.sidecar.search_counters
            assert counters is not None
            assert counters.texts_encoded == 0
            assert counters.vectors_read > 0
            b.channel.close()
        a.channel.close()

    # Both stopped: a restart reads them too.
    with RunningSidecar(_settings(database_url, tmp_path_factory.mktemp("c"))) as third:
        c = _Client(third)
        c.fully_ranked(run_id, "echo the text back")
        counters = third.sidecar.search_counters
        assert counters is not None
        assert counters.texts_encoded == 0
        c.channel.close()

    # And a separate `psych-sidecar serve` process, whose counters are in its stop line.
    socket_path = tmp_path_factory.mktemp("d") / "s.sock"
    with (
        served(
            "--listen",
            f"unix://{socket_path}",
            "--database-url",
            database_url,
            env={"PSYCH_SIDECAR_MCP_COMMANDS": json.dumps(fixture_commands())},
        ) as process,
        grpc.insecure_channel(f"unix:{socket_path}") as channel,
    ):
        stub = tool_service_pb2_grpc.ToolServiceStub(channel)
        request = tool_service_pb2.SearchToolsRequest(
            run_id=run_id, query="echo the text back", page_size=5
        )
        wait_for(
            lambda: not stub.SearchTools(request, timeout=5).partial,
            "a fully-ranked search from the process",
        )
    log = process.log
    stopped = re.search(
        r"search vectors this run: (\d+) texts encoded, \d+ queries encoded, (\d+) read", log
    )
    assert stopped is not None, log[-2000:]
    assert int(stopped.group(1)) == 0, log[-4000:]
    assert int(stopped.group(2)) > 0, log[-4000:]


def test_the_models_note_says_how_much_of_a_partial_ranking_is_keywords_only() -> None:
    some = partial_ranking_note(1204, 1409)
    assert some.startswith("Partial ranking: 1204 of 1409 tools are still being indexed")
    assert "matched by keywords only" in some
    every = partial_ranking_note(1409, 1409)
    assert every.startswith("The search model is still loading: every tool was matched")
