"""Helpers for tests and benchmarks (need the `test` extra; not part of the installed package)."""
