"""Benchmark cases. Every module in this package is imported by the runner,
so a new case is a new module here with a function decorated by
:func:`bench.registry.case`."""
