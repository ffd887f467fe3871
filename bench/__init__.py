"""Benchmarks: ``bench/run`` (see docs/benchmarks.md)."""
