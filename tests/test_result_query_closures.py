"""The sidecar's JMESPath evaluation (projections compiled to closures, query_closures.py)
against the reference implementation, `jmespath.search`, expression by expression: the same
value, or both failing. A pure function of a query and a value: no server needed."""

from __future__ import annotations

from typing import Any

import jmespath
import jmespath.exceptions
import pytest

from psych_sidecar.domain.calls import result_query
from psych_sidecar.domain.errors import PatternInvalid, PatternTooComplex

DATA: dict[str, Any] = {
    "items": [
        {
            "id": "T-1",
            "status": "open",
            "n": 0,
            "flag": True,
            "tags": ["a", "b"],
            "who": {"name": "Ana", "age": 31},
            "score": 1.5,
        },
        {"id": "T-2", "status": "closed", "n": 1, "flag": False, "tags": [], "who": None},
        {"id": "T-3", "status": "open", "n": 2, "flag": 1, "tags": ["b"], "who": {"name": "Bo"}},
        {"id": "T-4", "status": "", "n": -1, "tags": [["x"], "a"], "score": 0, "who": {}},
        None,
        "a string",
        3,
        [1, 2],
        {"id": "T-5", "status": "pending", "n": 1.0, "flag": 0, "tags": "a,b", "score": None},
    ],
    "users": {"u1": {"name": "Ana", "on": True}, "u2": {"name": "Bo", "on": False}, "u3": None},
    "numbers": [0, 1, 2, 3.5, -4, True, False, None, "5"],
    "nested": [[1, [2, 3]], [], [[4]], None, [5, None]],
    "empty": [],
}

QUERIES = [
    # filters: comparisons of fields with literals, in both orders and every operator
    "items[?status=='open'].id",
    "items[?'open'==status].id",
    "items[?status!='open'].id",
    "items[?n==`1`].id",
    "items[?n==`0`].id",
    "items[?flag==`true`].id",
    "items[?flag==`1`].id",
    "items[?n > `0`].id",
    "items[?n >= `1`].id",
    "items[?n < `1`].id",
    "items[?n <= `0`].id",
    "items[?score > `1`].id",
    "items[?status > 'c'].id",
    "items[?who.name=='Ana'].id",
    "items[?who==`{}`].id",
    "items[?who==null].id",
    "items[?tags==`[]`].id",
    'items[?tags==`["a", "b"]`].id',
    "items[?status==n].id",
    # truth: and, or, not, chains, grouping, empty values, 0
    "items[?status=='open' && n==`2`].id",
    "items[?status=='open' && n==`2` && contains(tags, 'b')].id",
    "items[?(status=='open' && n==`0`) || status=='pending'].id",
    "items[?status=='closed' || n==`2` || flag].id",
    "items[?!flag].id",
    "items[?!status].id",
    "items[?!(status=='open')].id",
    "items[?status].id",
    "items[?tags].id",
    "items[?who].id",
    "items[?n].id",
    "items[?score].id",
    "items[?`0`]",
    'items[?`""`]',
    "items[?@]",
    "items[?!@]",
    "items[?status && n].[id, n]",
    "items[?status || n].id",
    "items[*].[status && n, status || n, !status]",
    "items[*].[n == `1`, n != `1`, n < `2`]",
    # projections: fields, multi-selects, indexes, nested projections, flattening
    "items[].id",
    "items[*].id",
    "items[].who.name",
    "items[].{id: id, who: who.name}",
    "items[].[id, tags[0]]",
    "items[].tags[0]",
    "items[].tags[-1]",
    "items[].tags[]",
    "items[].tags[*]",
    "items[].tags[?@=='a']",
    "items[].tags[0][0]",
    "items[?tags[?@=='b']].id",
    "items[].tags | [0]",
    "items[].id | [1:3]",
    "items[::2].id",
    "items[1:4].n",
    "nested[]",
    "nested[][]",
    "nested[].length(@)",
    "users.*.name",
    "users.*[?on]",
    "users.*.on",
    "*.length(@)",
    "numbers[?@ > `1`]",
    "numbers[?@ == `1`]",
    "numbers[?@ == `true`]",
    "numbers[?!@]",
    "numbers[?@]",
    # functions in filters and projections
    "items[?contains(tags, 'a')].id",
    "items[?contains(status, 'pe')].id",
    'items[?contains(`["T-1", "T-3"]`, id)].id',
    "items[?contains(`[0, 1]`, n)].id",
    "items[?length(tags) > `1`].id",
    "items[?starts_with(id, 'T-')].id",
    "items[?type(n)=='number'].id",
    "items[].type(@)",
    "items[].not_null(score, n)",
    "items[?to_number(n) > `0`].id",
    "items[?id].to_string(n)",
    "items[?id].join(',', tags)",
    "sum(items[?type(n)=='number'].n)",
    "max_by(items[?type(n)=='number'], &n).id",
    "sort_by(items[?id], &id)[].id",
    "map(&id, items[?id])",
    "length(items[?status=='open'])",
    "items[?id].merge(@, {extra: `1`})",
    "items[?contains(tags, `1`)]",
    "empty[?a]",
    "empty[].a",
    "missing[?a]",
    "missing[].a",
    "items[0].tags[?@]",
    # failures: wrong types and arities, in a filter and in a projection
    "items[?contains(n, 'a')].id",
    "items[?id].length(n)",
    "items[?length(n) > `0`]",
    "items[?id].join(',', n)",
    "items[?starts_with(id)]",
    "items[?status < n].id",
    "numbers[?@ > '1']",
]


def _reference(query: str, value: Any) -> tuple[str, Any]:
    try:
        return "ok", jmespath.search(query, value)
    except (jmespath.exceptions.JMESPathError, TypeError, ValueError):
        return "error", None


def _sidecar(query: str, value: Any) -> tuple[str, Any]:
    compiled = result_query.compile_query(query)
    try:
        return "ok", result_query.evaluate_value(compiled, value, lambda: False)
    except (PatternInvalid, PatternTooComplex):
        return "error", None


@pytest.mark.parametrize("query", QUERIES)
def test_the_compiled_evaluation_yields_what_the_reference_does(query: str) -> None:
    expected = _reference(query, DATA)
    got = _sidecar(query, DATA)
    assert got == expected
    # `1 == true` is false in JMESPath, though Python's `1 == True` holds: compare types too.
    assert repr(got) == repr(expected)


def test_a_filter_over_many_records_checks_its_budget_as_it_goes() -> None:
    # The caller has given up: the first check (after STEPS_BETWEEN_CHECKS steps, well within
    # the records) ends the query, as running out of CPU time would.
    many = {"items": [{"id": i} for i in range(100_000)]}
    compiled = result_query.compile_query("items[?id > `5`].id")
    with pytest.raises(PatternTooComplex):
        result_query.evaluate_value(compiled, many, lambda: True)
