"""The case registry: ``@case`` declares a benchmark and its target."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import operator
import pkgutil
import re
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
}
_TARGET_RE = re.compile(r"^\s*(>=|<=|>|<)\s*([-+0-9.eE]+)\s*$")


@dataclass(frozen=True)
class Target:
    """A comparison such as ``>= 0.6`` that a case's value should meet."""

    op: str
    threshold: float

    @classmethod
    def parse(cls, text: str) -> Target:
        m = _TARGET_RE.match(text)
        if m is None:
            raise ValueError(f"bad target {text!r}: want e.g. '>= 0.6' or '< 50'")
        return cls(m.group(1), float(m.group(2)))

    def met_by(self, value: float) -> bool:
        return _OPS[self.op](value, self.threshold)

    def __str__(self) -> str:
        return f"{self.op} {self.threshold:g}"


@dataclass
class BenchContext:
    """What a case gets: the size switch, a private temp dir and a logger."""

    quick: bool
    tmp_dir: Path
    # Extra figures a case wants reported next to its value (JSON "details").
    details: dict[str, Any] = field(default_factory=dict)

    def log(self, message: str) -> None:
        print(f"  {message}", file=sys.stderr, flush=True)

    def pick(self, full: int, quick: int) -> int:
        """``quick`` under --quick, else ``full``: for sizes and counts."""
        return quick if self.quick else full


CaseFn = Callable[[BenchContext], float] | Callable[[BenchContext], Awaitable[float]]


@dataclass(frozen=True)
class Case:
    name: str
    unit: str
    target: Target
    fn: CaseFn
    description: str

    def run(self, ctx: BenchContext) -> float:
        result = self.fn(ctx)
        if inspect.isawaitable(result):
            result = asyncio.run(_await(result))
        return float(result)


async def _await(aw: Awaitable[float]) -> float:
    return await aw


CASES: dict[str, Case] = {}


def case(name: str, *, unit: str, target: str) -> Callable[[CaseFn], CaseFn]:
    """Register a benchmark case.

    The decorated function (sync or ``async``) takes a :class:`BenchContext`
    and returns the measured value as a float; ``unit`` and ``target`` (e.g.
    ``">= 0.6"``) describe it. Names must be unique.
    """
    parsed = Target.parse(target)

    def register(fn: CaseFn) -> CaseFn:
        if name in CASES:
            raise ValueError(f"benchmark case {name!r} registered twice")
        doc = inspect.getdoc(fn) or ""
        CASES[name] = Case(name, unit, parsed, fn, doc.split("\n\n")[0])
        return fn

    return register


def load_all() -> dict[str, Case]:
    """Import every module of :mod:`bench.cases`, filling :data:`CASES`."""
    import bench.cases

    for info in sorted(pkgutil.iter_modules(bench.cases.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"bench.cases.{info.name}")
    return CASES
