"""Narrowing and naming on plain data: the rules every path to a tool goes through."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from psych_sidecar.domain.catalog import CatalogTool, Connection, Grants, TransportKind, glob_match
from psych_sidecar.domain.runlog import ToolGrant
from psych_sidecar.domain.surface import naming

PROVIDER_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def connection(name: str = "github", **fields: object) -> Connection:
    return Connection(tenant="t", name=name, transport=TransportKind.STDIO, **fields)  # type: ignore[arg-type]


def tool(name: str, removed_in_version: int = 0) -> CatalogTool:
    return CatalogTool("github", name, "", b"{}", removed_in_version=removed_in_version)


@pytest.mark.parametrize(
    ("pattern", "name", "matches"),
    [
        ("*", "anything", True),
        ("*", "", True),
        ("list_*", "list_issues", True),
        ("list_*", "get_issue", False),
        ("get_?", "get_a", True),
        ("get_?", "get_ab", False),
        ("a.b", "a.b", True),
        ("a.b", "axb", False),
        ("[ab]", "a", False),
        ("[ab]", "[ab]", True),
        ("x+", "xx", False),
        ("*issue*", "create_issue_comment", True),
        ("GitHub", "github", False),
    ],
)
def test_glob_matches_only_star_and_question_mark(pattern: str, name: str, matches: bool) -> None:
    assert glob_match(pattern, name) is matches


ALL = (ToolGrant("*", "*"),)
TOOLS = [tool("create_issue"), tool("delete_repo"), tool("list_issues"), tool("old", 3)]


def names(grants: Grants, conn: Connection) -> list[str]:
    return [t.name for t in grants.permitted(conn, TOOLS)]


def test_no_grant_permits_nothing() -> None:
    assert names(Grants((), ()), connection()) == []


def test_a_newer_versions_removal_marker_does_not_withhold_a_tool() -> None:
    # Narrowing judges the catalogue version it is given; which version is current is the
    # reader's business (a version superseded after it was read still had "old").
    assert names(Grants(ALL, ()), connection()) == [
        "create_issue",
        "delete_repo",
        "list_issues",
        "old",
    ]


def test_connection_allow_then_deny_with_deny_winning() -> None:
    conn = connection(allow_tools=("*issue*", "delete_*"), deny_tools=("delete_*",))
    assert names(Grants(ALL, ()), conn) == ["create_issue", "list_issues"]


def test_spec_grants_match_server_and_tool() -> None:
    grants = Grants((ToolGrant("git*", "list_*"), ToolGrant("other", "*")), ())
    assert names(grants, connection()) == ["list_issues"]
    assert names(grants, connection("gitlab")) == ["list_issues"]
    assert names(grants, connection("jira")) == []


def test_run_restrictions_narrow_further_only_when_present() -> None:
    grants = Grants(ALL, (ToolGrant("github", "create_*"), ToolGrant("github", "list_*")))
    assert names(grants, connection()) == ["create_issue", "list_issues"]
    restricted = Grants((ToolGrant("github", "list_*"),), (ToolGrant("*", "create_*"),))
    assert names(restricted, connection()) == []


def test_may_reach_server_follows_grants_and_restrictions() -> None:
    assert Grants(ALL, ()).may_reach_server("x")
    assert not Grants((), ()).may_reach_server("x")
    assert not Grants(ALL, (ToolGrant("y", "*"),)).may_reach_server("x")


def test_clean_names_read_as_server_and_tool() -> None:
    assert naming.tool_name("github", "create_issue") == "github__create_issue"
    assert naming.tool_name("git-hub", "list-x_y") == "git-hub__list-x_y"
    assert naming.facade_name("github") == "github"


@pytest.mark.parametrize(
    ("server", "tool"),
    [
        ("my.server", "tool"),  # illegal character in the server
        ("server", "tools/list"),  # illegal character in the tool
        ("a__b", "c"),  # ambiguous separator
        ("a_", "_b"),  # ambiguous separator
        ("s", "x" * 80),  # too long
        ("s", "工具"),  # non-ASCII
    ],
)
def test_unclean_names_are_sanitized_with_a_hash(server: str, tool: str) -> None:
    name = naming.tool_name(server, tool)
    assert PROVIDER_NAME.match(name)
    assert re.search(r"_[0-9a-f]{8}$", name)
    assert name == naming.tool_name(server, tool)


def test_facades_never_take_reserved_names() -> None:
    for reserved in naming.RESERVED_NAMES:
        assert naming.facade_name(reserved) != reserved


def test_names_depend_only_on_the_pair() -> None:
    # The same pair gives the same name whatever else exists: stable across turns.
    assert naming.tool_name("s", "a") == naming.tool_name("s", "a")
    assert naming.tool_name("s", "a.b") != naming.tool_name("s", "a_b")


_any_name = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=80
)
# Mostly underscores: the names that could make `server__tool` ambiguous.
_underscore_name = st.text(alphabet="a_-", min_size=1, max_size=8)


@given(
    st.lists(
        st.tuples(_any_name | _underscore_name, _any_name | _underscore_name),
        min_size=1,
        max_size=30,
        unique=True,
    )
)
def test_names_are_legal_and_collision_free(pairs: list[tuple[str, str]]) -> None:
    exposed = [naming.tool_name(server, tool) for server, tool in pairs]
    assert all(PROVIDER_NAME.match(name) for name in exposed)
    assert len(set(exposed)) == len(exposed)


def test_deduplicated_renames_only_repeats() -> None:
    assert naming.deduplicated(["a", "b", "a", "a"]) == ["a", "b", "a_2", "a_3"]
    assert naming.deduplicated(["a", "a_2", "a"]) == ["a", "a_2", "a_3"]
