"""`gpushare-tui demo`: synthetic engines and the dashboard on them (gpushare_tui/demo.py)."""

from __future__ import annotations

import math

import typer

from ..core.host.errors import UsageError
from .common import checked_interval, checked_key
from .options import IntervalOpt


def demo(
    interval: float = IntervalOpt,
    readonly: bool = typer.Option(False, "--readonly", help="Disable every admin action."),
    gpu_key: str | None = typer.Option(None, "--gpu-key", help="Demo segment key (default demo-<pid>)."),
    history: float = typer.Option(120.0, "--history", help="Seconds of history in the plots."),
) -> None:
    """Try it without a GPU: three synthetic engines (weights 2/1/1) and the dashboard on them."""
    key = checked_key(gpu_key)
    interval = checked_interval(interval)
    if not math.isfinite(history) or history < 10:
        raise UsageError(f"invalid --history {history}: at least 10 seconds")
    from ..demo import run_demo

    run_demo(interval_s=interval, readonly=readonly, key=key, history_s=history)
