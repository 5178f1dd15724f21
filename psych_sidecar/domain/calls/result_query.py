"""JMESPath queries over a stored tool result's JSON, evaluated in bounded time and memory.

The language is JMESPath (jmespath.org), evaluated by the reference Python implementation
(the `jmespath` package): it selects, filters, projects, slices and counts, and has no loops
or recursion of its own, so its work is bounded by the query and the value it runs on. The
query comes from a model or a host and the JSON from an MCP server, all untrusted, so that
bound is enforced here rather than assumed (docs/security.md):

- The query is at most MAX_QUERY_CHARS characters; the JSON it runs on at most
  MAX_QUERY_SOURCE_BYTES bytes (parsed by pydantic-core's parser, which refuses nesting
  deeper than 200 levels; nothing here recurses on the value).
- Evaluation is pure Python in the calling thread, where no timeout can interrupt it, so the
  interpreter interrupts itself: every node it visits is a step, and every
  STEPS_BETWEEN_CHECKS steps it checks this thread's CPU time against
  QUERY_CPU_BUDGET_SECONDS and whether the caller gave up. Every loop of the evaluation
  (projections, filters, functions taking an expression such as sort_by and map) visits a
  node per element, so the checks come at least that often.
- Projections and filters, where a query spends its time (one expression per element of a
  list of records), evaluate their per-element expression as closures compiled from its
  nodes (`query_closures.py`: the reference's semantics, ~10x fewer Python calls); they charge
  the steps it stands for per element, a chunk of elements at a time, checking as above
  before each chunk.
- What a step cannot see is work inside one C call: comparing or serializing values, and
  joining strings. A multi-select (`[@, @]`) repeated down a pipe shares one value many times,
  so such a value can stand for exponentially more JSON than was visited. So `==`, `!=` and
  contains() compare by an iterative walk charged step by step; to_string() and the query's
  own result are measured by a walk that stops at MAX_QUERY_RESULT_UNITS before any
  serialization; join() refuses to build a string over MAX_QUERY_STRING_CHARS. The other
  functions (sort, max, min, sum, avg on numbers or strings; keys, values, merge, reverse,
  length) cost at most linear time in values the steps already paid for.

A query that parses badly or fails on the value (a function given the wrong type, an unknown
function) is PATTERN_INVALID; one over a bound is PATTERN_TOO_COMPLEX; a result whose content
is not one JSON document is FIELD_INVALID. Each is a tool error for the model.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import jmespath
import jmespath.exceptions
import jmespath.functions
import jmespath.visitor
import pydantic_core

from psych_sidecar.domain.calls.query_closures import (
    PLAIN_SCALARS,
    Fn,
    compile_condition,
    compile_element,
    equal,
    identity,
)
from psych_sidecar.domain.calls.validation import json_within
from psych_sidecar.domain.errors import PatternInvalid, PatternTooComplex, field_invalid

MAX_QUERY_CHARS = 1024
# The largest JSON a query parses. Parsed, JSON takes about ten times its bytes in memory;
# 32 MiB keeps one query under half a gigabyte at worst (a 20 MB result: ~0.3 s to parse).
MAX_QUERY_SOURCE_BYTES = 32 << 20
# What a parsed document takes in memory per byte of its JSON, as the cache of parsed results
# (ToolOutputReader) counts it: a listing of 120,000 small records (19.6 MB) took 3.1 times its
# size parsed (tracemalloc; pydantic-core shares repeated keys and short strings), rounded up.
PARSED_BYTES_PER_SOURCE_BYTE = 4
# CPU time (this thread's) one query may spend evaluating, as a grep may spend scanning.
QUERY_CPU_BUDGET_SECONDS = 5.0
# How often the evaluation looks at the clock: a check costs about a step's time x 100.
STEPS_BETWEEN_CHECKS = 4096
# The largest result a query may yield, in `json_within` units (a character of a string or
# key, one per scalar and per member): about as much JSON as the largest source.
MAX_QUERY_RESULT_UNITS = MAX_QUERY_SOURCE_BYTES
# The longest string join() may build.
MAX_QUERY_STRING_CHARS = MAX_QUERY_SOURCE_BYTES


class _OverBudget(Exception):
    """The evaluation ran out of CPU time, or its caller gave up (internal to this module)."""


class _Budget:
    """Steps taken, and a check of the CPU clock and the caller every STEPS_BETWEEN_CHECKS."""

    def __init__(self, stop: Callable[[], bool]) -> None:
        self._stop = stop
        self._began = time.thread_time()
        self.steps = 0
        self.next_check = STEPS_BETWEEN_CHECKS

    def charge(self, steps: int = 1) -> None:
        self.steps += steps
        if self.steps >= self.next_check:
            self.check()

    def check(self) -> None:
        self.next_check = self.steps + STEPS_BETWEEN_CHECKS
        if self._stop() or time.thread_time() - self._began > QUERY_CPU_BUDGET_SECONDS:
            raise _OverBudget


def _check_size(value: Any, what: str) -> None:
    if not json_within(value, MAX_QUERY_RESULT_UNITS):
        raise _TooLarge(
            f"{what} is larger than {MAX_QUERY_RESULT_UNITS} characters of JSON; "
            "select fewer fields or slice it ([:100])"
        )


class _TooLarge(Exception):
    """A value the query built is over a size bound (internal to this module)."""


class _BoundedFunctions(jmespath.functions.Functions):
    """JMESPath's functions, with those that walk or build values inside one C call bounded."""

    def __init__(self, budget: _Budget) -> None:
        self._budget = budget

    @jmespath.functions.signature({"types": ["array", "string"]}, {"types": []})
    def _func_contains(self, subject: Any, search: Any) -> bool:
        if isinstance(subject, str):
            return isinstance(search, str) and search in subject
        self._budget.charge(len(subject))
        if isinstance(search, str):
            # A string equals only a string: C's `in` compares in constant time per element.
            return search in subject
        return any(equal(item, search, self._budget) for item in subject)

    @jmespath.functions.signature({"types": []})
    def _func_to_string(self, arg: Any) -> str:
        if isinstance(arg, str):
            return arg
        _check_size(arg, "to_string()'s argument")
        return json.dumps(arg, separators=(",", ":"), ensure_ascii=False, default=str)

    @jmespath.functions.signature({"types": ["string"]}, {"types": ["array-string"]})
    def _func_join(self, separator: str, array: list[str]) -> str:
        self._budget.charge(len(array))
        length = sum(map(len, array)) + len(separator) * max(len(array) - 1, 0)
        if length > MAX_QUERY_STRING_CHARS:
            raise _TooLarge(
                f"join() would build a string of {length} characters, more than "
                f"{MAX_QUERY_STRING_CHARS}"
            )
        return separator.join(array)


class _BoundedInterpreter(jmespath.visitor.TreeInterpreter):
    """The reference tree interpreter, charging a step per node visited, and comparing by
    `equal`; the per-element work of projections is compiled to closures (`query_closures`)."""

    def __init__(self, budget: _Budget) -> None:
        self.functions = _BoundedFunctions(budget)
        super().__init__(jmespath.visitor.Options(custom_functions=self.functions))
        self.budget = budget
        self._methods: dict[str, Any] = {}
        # Each projection's per-element expression, compiled once per evaluation (keyed by the
        # node's id: the parsed expression outlives the evaluation).
        self._compiled: dict[tuple[int, Any], tuple[Fn, int]] = {}

    def visit_projection(self, node: Any, value: Any) -> Any:
        base = self.visit(node["children"][0], value)
        if not isinstance(base, list):
            return None
        return self._project(base, node["children"][1])

    def visit_value_projection(self, node: Any, value: Any) -> Any:
        base = self.visit(node["children"][0], value)
        if not isinstance(base, dict):
            return None
        return self._project(list(base.values()), node["children"][1])

    def visit_filter_projection(self, node: Any, value: Any) -> Any:
        base = self.visit(node["children"][0], value)
        if not isinstance(base, list):
            return None
        keep, keep_steps = self._compiled_once(node["children"][2], compile_condition)
        each, each_steps = self._compiled_once(node["children"][1], compile_element)
        collected: list[Any] = []
        for chunk in self._chunks(base, keep_steps):
            kept = list(filter(keep, chunk))
            if each is identity:
                collected += [e for e in kept if e is not None]
            else:
                self.budget.charge(len(kept) * each_steps)
                collected += [found for e in kept if (found := each(e)) is not None]
        return collected

    def _project(self, elements: list[Any], node: Any) -> list[Any]:
        each, steps = self._compiled_once(node, compile_element)
        collected: list[Any] = []
        for chunk in self._chunks(elements, steps):
            collected += [found for e in chunk if (found := each(e)) is not None]
        return collected

    def _chunks(self, elements: list[Any], steps: int) -> Iterator[list[Any]]:
        """The elements in chunks of about STEPS_BETWEEN_CHECKS steps, each charged (and the
        clock checked when due) before it is evaluated."""
        size = max(STEPS_BETWEEN_CHECKS // steps, 1)
        for start in range(0, len(elements), size):
            chunk = elements[start : start + size]
            self.budget.charge(len(chunk) * steps)
            yield chunk

    def _compiled_once(
        self, node: Any, compile_node: Callable[[Any, Any], tuple[Fn, int]]
    ) -> tuple[Fn, int]:
        key = (id(node), compile_node)
        found = self._compiled.get(key)
        if found is None:
            fn, steps = compile_node(self, node)
            # Charged per element: at least a step, so that a loop checks the clock.
            found = self._compiled[key] = (fn, max(steps, 1))
        return found

    def visit_comparator(self, node: Any, value: Any) -> Any:
        operator = node["value"]
        if operator != "eq" and operator != "ne":
            return super().visit_comparator(node, value)
        left_node, right_node = node["children"]
        left, right = self.visit(left_node, value), self.visit(right_node, value)
        if type(left) in PLAIN_SCALARS and type(right) in PLAIN_SCALARS:
            # Strings and numbers (not booleans: 1 is not true in JMESPath) compare in C,
            # in time bounded by their size: the common case of a filter, kept quick.
            same = left == right
        else:
            same = equal(left, right, self.budget)
        return same == (operator == "eq")

    def visit(self, node: Any, *args: Any, **kwargs: Any) -> Any:
        # The base class's dispatch, with the step counted inline: this runs once per node
        # per element, so a call less here is a third of the evaluation's time.
        budget = self.budget
        budget.steps += 1
        if budget.steps >= budget.next_check:
            budget.check()
        kind = node["type"]
        method = self._methods.get(kind)
        if method is None:
            method = self._methods[kind] = getattr(self, f"visit_{kind}", self.default_visit)
        return method(node, *args, **kwargs)


def _invalid(detail: str) -> PatternInvalid:
    return PatternInvalid(f"query: {detail}", field="query", detail=detail)


def _too_complex(detail: str) -> PatternTooComplex:
    return PatternTooComplex(f"query: {detail}", field="query", detail=detail)


def compile_query(query: str) -> Any:
    """The parsed query, or PATTERN_INVALID."""
    if len(query) > MAX_QUERY_CHARS:
        raise _invalid(f"longer than {MAX_QUERY_CHARS} characters")
    try:
        return jmespath.compile(query)
    except jmespath.exceptions.JMESPathError as error:
        raise _invalid(f"not a valid JMESPath expression: {_one_line(error)}") from None
    except RecursionError:
        raise _invalid("nested too deeply") from None


def check_source_size(byte_length: int) -> None:
    """PATTERN_TOO_COMPLEX when a result is too large to parse for a query (checked before
    its bytes are read)."""
    if byte_length > MAX_QUERY_SOURCE_BYTES:
        raise _too_complex(
            f"the result holds {byte_length} bytes of JSON, more than the "
            f"{MAX_QUERY_SOURCE_BYTES} a query runs on; use grep, or offset and limit"
        )


def parsed_bytes(source_bytes: int) -> int:
    """The memory a JSON document of `source_bytes` takes parsed, as estimated for the cache of
    parsed results (an estimate from its size: measuring the value would cost a walk of it)."""
    return source_bytes * PARSED_BYTES_PER_SOURCE_BYTE


def parse_source(data: bytes) -> Any:
    """A result's JSON for a query, or FIELD_INVALID (not JSON) / PATTERN_TOO_COMPLEX (too
    large)."""
    check_source_size(len(data))
    try:
        # Refuses nesting deeper than 200 levels itself; nothing here recurses on the value.
        value = pydantic_core.from_json(data)
    except ValueError as error:
        raise field_invalid(
            "query",
            f"the result is not JSON ({_one_line(error)}); use grep, or offset and limit",
        ) from None
    return value


def evaluate_value(compiled: Any, value: Any, stop: Callable[[], bool]) -> Any:
    """What the query yields on `value` (within MAX_QUERY_RESULT_UNITS)."""
    budget = _Budget(stop)
    try:
        found = _BoundedInterpreter(budget).visit(compiled.parsed, value)
        _check_size(found, "the query's result")
    except _OverBudget:
        raise _too_complex(
            f"evaluating it took more than {QUERY_CPU_BUDGET_SECONDS:g} s of CPU; filter "
            "before sorting or projecting, or query a slice ([:1000])"
        ) from None
    except _TooLarge as error:
        raise _too_complex(str(error)) from None
    except RecursionError:
        raise _invalid("nested too deeply") from None
    except (jmespath.exceptions.JMESPathError, TypeError, ValueError) as error:
        # A function given a value of the wrong type, an unknown function, a wrong arity.
        raise _invalid(f"cannot be evaluated on this result: {_one_line(error)}") from None
    return found


def evaluate(compiled: Any, value: Any, stop: Callable[[], bool]) -> str:
    """What the query yields on `value`, as compact JSON text."""
    found = evaluate_value(compiled, value, stop)
    return json.dumps(found, separators=(",", ":"), ensure_ascii=False, default=str)


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())[:300]
