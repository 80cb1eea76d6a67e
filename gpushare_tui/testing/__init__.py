"""Helpers for tests and benchmarks (need the `test` extra)."""
