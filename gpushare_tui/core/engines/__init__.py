"""Engines: what a supervisor or pacer runs (llama-server, the synthetic engine)."""
