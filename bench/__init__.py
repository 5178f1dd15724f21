"""Benchmark harness for psych-sidecar: ``python -m bench`` from the repo root.

Cases live in :mod:`bench.cases`, one module each, registered with
:func:`bench.registry.case`. See bench/README.md.
"""

from bench.registry import CASES, BenchContext, Target, case

__all__ = ["CASES", "BenchContext", "Target", "case"]
