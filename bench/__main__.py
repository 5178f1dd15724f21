"""``python -m bench [--quick] [--json PATH] [--only NAME]...``

Runs the registered cases, prints a table and optionally writes JSON. Exits 0
whether or not targets are met (figures are for people to judge); exits 1 if
any case crashed, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.registry import BenchContext, Case, load_all


@dataclass
class Outcome:
    case: Case
    value: float | None = None
    error: str | None = None
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.value is not None and self.case.target.met_by(self.value)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "value": self.value,
            "unit": self.case.unit,
            "target": str(self.case.target),
            "pass": self.passed,
        }
        if self.details:
            out["details"] = self.details
        if self.error is not None:
            out["error"] = self.error
        return out


def _run_case(case: Case, quick: bool) -> Outcome:
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-{case.name}-"))
    ctx = BenchContext(quick=quick, tmp_dir=tmp)
    outcome = Outcome(case)
    print(f"[bench] {case.name} ...", file=sys.stderr, flush=True)
    start = time.monotonic()
    try:
        value = case.run(ctx)
        if math.isnan(value):
            raise ValueError("case returned NaN")
        outcome.value = value
    except Exception as exc:
        traceback.print_exc()
        outcome.error = f"{type(exc).__name__}: {exc}"
    finally:
        outcome.seconds = time.monotonic() - start
        outcome.details = ctx.details
        shutil.rmtree(tmp, ignore_errors=True)
    status = "crashed" if outcome.error else f"{outcome.value:.4g} {case.unit}"
    print(f"[bench] {case.name}: {status} ({outcome.seconds:.1f} s)", file=sys.stderr, flush=True)
    return outcome


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}"


def format_table(outcomes: list[Outcome]) -> str:
    header = ("case", "value", "unit", "target", "pass")
    rows = [
        (
            o.case.name,
            _fmt(o.value),
            o.case.unit,
            str(o.case.target),
            "CRASH" if o.error else ("yes" if o.passed else "NO"),
        )
        for o in outcomes
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    cases = load_all()
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick", action="store_true", help="shrink every case (whole run well under 2 minutes)"
    )
    parser.add_argument(
        "--json", metavar="PATH", type=Path, help="also write the results as JSON to PATH"
    )
    parser.add_argument(
        "--only",
        metavar="NAME",
        action="append",
        choices=sorted(cases),
        help="run only this case (repeatable)",
    )
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args(argv)

    if args.list:
        for c in cases.values():
            print(f"{c.name:32} {c.target!s:>10} {c.unit:10} {c.description}")
        return 0

    selected = [cases[n] for n in args.only] if args.only else list(cases.values())
    outcomes = [_run_case(c, args.quick) for c in selected]

    print(format_table(outcomes))
    if args.json is not None:
        doc = {"quick": args.quick, "cases": {o.case.name: o.to_json() for o in outcomes}}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    crashed = [o.case.name for o in outcomes if o.error]
    if crashed:
        print(f"[bench] crashed: {', '.join(crashed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
