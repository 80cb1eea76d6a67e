"""Engines that are not llama-server, for tests and benchmarks (stdlib only, each run as a script:
`sys.executable PATH ARGS`): paths here, behaviour in each file's docstring."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent
HTTP_ENGINE = str(HERE / "http_engine.py")
TREE_ENGINE = str(HERE / "tree_engine.py")
