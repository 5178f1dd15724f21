"""JMESPath's per-element work compiled to closures, for result_query's interpreter.

A projection (`items[].id`, `items[?status=='open']`) runs the same expression once per element
of a list that may hold a hundred thousand records. The reference interpreter visits that
expression's tree for each element, about ten Python calls per node; compiled, each node is one
call of a closure, and the commonest filter test (`field == 'literal'`) is one call for both of
its nodes. The closures compute exactly what the reference interpreter does (the same
falsehood, equality, ordering and function semantics, the same functions called), and
`tests/test_result_query_closures.py` checks them against `jmespath.search` expression by
expression.

Bounds: a closure stands for a fixed number of nodes (`compile_element`'s steps), charged by
the projection per element; its only work not fixed in size is equality of lists or objects
(`equal`, charged per pair), `contains` (charged per element) and nodes it does not compile
(nested projections, slices, flattens), which it hands to the interpreter, which charges them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import jmespath.visitor

Fn = Callable[[Any], Any]
PLAIN_SCALARS = frozenset({str, int, float})
_NUMBERS = frozenset({int, float})


class Charged(Protocol):
    def charge(self, steps: int = 1) -> None: ...


class Functions(Protocol):
    def call_function(self, function_name: str, resolved_args: list[Any]) -> Any: ...

    def _func_contains(self, subject: Any, search: Any) -> bool: ...


class Interpreter(Protocol):
    """What the closures need of the interpreter: its budget, its (bounded) functions, and
    its own visit for the nodes they leave to it."""

    budget: Charged
    functions: Functions

    def visit(self, node: Any, *args: Any, **kwargs: Any) -> Any: ...


def equal(left: Any, right: Any, budget: Charged) -> bool:
    """JMESPath equality (0 and 1 are not booleans), as an iterative walk charged per pair."""
    pairs = [(left, right)]
    while pairs:
        a, b = pairs.pop()
        budget.charge()
        if a is b:
            continue
        if isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                return False
            pairs.extend(zip(a, b, strict=True))
        elif isinstance(a, dict) and isinstance(b, dict):
            if a.keys() != b.keys():
                return False
            pairs.extend((a[key], b[key]) for key in a)
        elif (
            isinstance(a, list | dict)
            or isinstance(b, list | dict)
            or isinstance(a, bool) != isinstance(b, bool)
            or a != b
        ):
            return False
    return True


def is_false(value: Any) -> bool:
    """JMESPath's falsehood (the reference's test): 0 is true, empty strings, lists and objects
    are false."""
    return value is False or value is None or value == "" or value == [] or value == {}


def identity(value: Any) -> Any:
    return value


def compile_element(interpreter: Interpreter, node: Any) -> tuple[Fn, int]:
    """A closure computing what the reference interpreter computes for `node` on a value, and
    the steps it takes (nodes it stands for), charged per element by the projection calling
    it. The nodes a filter or a projection's elements meet most (fields, literals,
    comparisons, and/or/not, indexes, multi-selects, functions) become closures; any other
    node (a nested projection, a slice, a flatten) is visited by the interpreter, which
    charges its own steps. Visiting a node takes ~10 calls; a closure takes one."""
    kind = node["type"]
    children = node.get("children", ())
    if kind == "field":
        key = node["value"]
        return (lambda v: v.get(key) if type(v) is dict else None), 1
    if kind in ("current", "identity"):
        return identity, 1
    if kind == "literal":
        literal = node["value"]
        return (lambda v: literal), 1
    if kind in ("subexpression", "index_expression", "pipe"):
        parts, steps = _compile_all(interpreter, children)
        return _chain(parts), steps + 1
    if kind == "comparator":
        return _compile_comparator(interpreter, node)
    if kind in ("and_expression", "or_expression"):
        operands: list[Any] = []
        _flatten(node, kind, operands)
        parts, steps = _compile_all(interpreter, operands)
        joined = _all_of(parts) if kind == "and_expression" else _any_of(parts)
        return joined, steps + len(operands) - 1
    if kind == "not_expression":
        inner, steps = compile_element(interpreter, children[0])
        return (lambda v: _not(inner(v))), steps + 1
    if kind == "index":
        return _index(node["value"]), 1
    if kind == "multi_select_list":
        parts, steps = _compile_all(interpreter, children)
        return (lambda v: None if v is None else [part(v) for part in parts]), steps + 1
    if kind == "multi_select_dict":
        keys = [child["value"] for child in children]
        parts, steps = _compile_all(interpreter, [child["children"][0] for child in children])
        pairs = list(zip(keys, parts, strict=True))
        return (
            lambda v: None if v is None else {key: part(v) for key, part in pairs}
        ), steps + 1 + len(pairs)
    if kind == "function_expression":
        return _compile_function(interpreter, node)
    visit = interpreter.visit
    return (lambda v: visit(node, v)), 0


def compile_condition(interpreter: Interpreter, node: Any) -> tuple[Fn, int]:
    """A predicate: whether `node` yields a true value (JMESPath's truth, `not is_false`) on a
    value, as a Python bool; for a filter, whose test needs only that. `a && b` is true when
    both are, `a || b` when either is, `!a` when `a` is not: Python's own `and`, `or` and
    `not` on the operands' predicates, with no value built between them."""
    kind = node["type"]
    if kind in ("and_expression", "or_expression"):
        operands: list[Any] = []
        _flatten(node, kind, operands)
        compiled = [compile_condition(interpreter, operand) for operand in operands]
        tests = [test for test, _ in compiled]
        steps = sum(steps for _, steps in compiled) + len(operands) - 1
        return (_both(tests) if kind == "and_expression" else _either(tests)), steps
    if kind == "not_expression":
        inner, steps = compile_condition(interpreter, node["children"][0])
        return (lambda v: not inner(v)), steps + 1
    fn, steps = compile_element(interpreter, node)
    if kind == "comparator":
        if node["value"] in ("eq", "ne"):
            return fn, steps  # already a bool
        return (lambda v: fn(v) is True), steps  # a bool, or null when not comparable
    return (lambda v: _truthy(fn(v))), steps


def _truthy(value: Any) -> bool:
    return value is True or not is_false(value)


def _both(tests: list[Fn]) -> Fn:
    if len(tests) == 2:
        first, second = tests
        return lambda v: first(v) and second(v)
    if len(tests) == 3:
        first, second, third = tests
        return lambda v: first(v) and second(v) and third(v)
    return lambda v: all(test(v) for test in tests)


def _either(tests: list[Fn]) -> Fn:
    if len(tests) == 2:
        first, second = tests
        return lambda v: first(v) or second(v)
    return lambda v: any(test(v) for test in tests)


def _compile_all(interpreter: Interpreter, nodes: Any) -> tuple[list[Fn], int]:
    compiled = [compile_element(interpreter, node) for node in nodes]
    return [fn for fn, _ in compiled], sum(steps for _, steps in compiled)


def _flatten(node: Any, kind: str, into: list[Any]) -> None:
    """The operands of a chain of `&&` (or `||`): a && b && c is the first false of a, b, c,
    or c, however it is grouped."""
    for child in node["children"]:
        if child["type"] == kind:
            _flatten(child, kind, into)
        else:
            into.append(child)


def _chain(parts: list[Fn]) -> Fn:
    if len(parts) == 2:
        first, second = parts
        return lambda v: second(first(v))

    def chained(value: Any) -> Any:
        for part in parts:
            value = part(value)
        return value

    return chained


def _all_of(parts: list[Fn]) -> Fn:
    def all_of(value: Any) -> Any:
        found = None
        for part in parts:
            found = part(value)
            if found is not True and (found is False or found is None or is_false(found)):
                return found
        return found

    return all_of


def _any_of(parts: list[Fn]) -> Fn:
    def any_of(value: Any) -> Any:
        found = None
        for part in parts:
            found = part(value)
            if found is True or not is_false(found):
                return found
        return found

    return any_of


def _not(value: Any) -> bool:
    if type(value) in _NUMBERS and value == 0:
        return False  # 0 is true in JMESPath: !0 is false
    return not value


def _index(position: int) -> Fn:
    def index(value: Any) -> Any:
        if not isinstance(value, list):
            return None
        try:
            return value[position]
        except IndexError:
            return None

    return index


def _compile_comparator(interpreter: Interpreter, node: Any) -> tuple[Fn, int]:
    operator = node["value"]
    left_node, right_node = node["children"]
    left, left_steps = compile_element(interpreter, left_node)
    right, right_steps = compile_element(interpreter, right_node)
    steps = left_steps + right_steps + 1
    if operator not in ("eq", "ne"):
        order = jmespath.visitor.TreeInterpreter.COMPARATOR_FUNC[operator]

        def ordered(value: Any) -> Any:
            a, b = left(value), right(value)
            # Ordering is defined on numbers and strings only; anything else yields null.
            if type(a) not in PLAIN_SCALARS or type(b) not in PLAIN_SCALARS:
                return None
            return order(a, b)

        return ordered, steps
    negated: bool = operator == "ne"
    literal = right_node["value"] if right_node["type"] == "literal" else None
    if left_node["type"] == "field" and type(literal) in PLAIN_SCALARS:
        # field == 'text' (or a number), a filter's commonest test, in one call: a value that
        # is not a string or number never equals a string or number (1 is not true).
        key = left_node["value"]

        def field_equals(value: Any) -> bool:
            found = value.get(key) if type(value) is dict else None
            same: bool = type(found) in PLAIN_SCALARS and found == literal
            return same != negated

        return field_equals, steps
    budget = interpreter.budget

    def equals(value: Any) -> bool:
        a, b = left(value), right(value)
        same: bool = (
            a == b if type(a) in PLAIN_SCALARS and type(b) in PLAIN_SCALARS else equal(a, b, budget)
        )
        return same != negated

    return equals, steps


def _compile_function(interpreter: Interpreter, node: Any) -> tuple[Fn, int]:
    name = node["value"]
    arguments, steps = _compile_all(interpreter, node["children"])
    functions = interpreter.functions
    call = functions.call_function
    if name == "contains" and len(arguments) == 2:
        subject_of, search_of = arguments
        contains = functions._func_contains

        def quick_contains(value: Any) -> Any:
            subject, search = subject_of(value), search_of(value)
            if type(subject) is list or type(subject) is str:
                # The types its signature accepts: checked here rather than by call_function.
                return contains(subject, search)
            return call(name, [subject, search])  # the signature's type error

        return quick_contains, steps + 1
    return (lambda v: call(name, [argument(v) for argument in arguments])), steps + 1
