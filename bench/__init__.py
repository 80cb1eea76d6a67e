"""Benchmarks that print tables (run from the repository root: python -m bench.NAME)."""
