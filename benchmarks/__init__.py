"""Benchmarks: scripts that measure specbound on a machine and write records to results/ (see
README.md). Run one from the repository root as a module, e.g.
``python -m benchmarks.engine.bench_engine --help``; each imports ``benchmarks.record``."""
