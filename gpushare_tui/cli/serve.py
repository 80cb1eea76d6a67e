"""`gpushare-tui serve`: Prometheus exposition and /gpu/peers for this host (gpushare_tui/serve/)."""

from __future__ import annotations

import typer

from .common import checked_key

LISTEN_DEFAULT = "127.0.0.1:9464"  # serve.listen.DEFAULT_LISTEN, spelled here so --help imports no server


def serve(
    listen: str = typer.Option(
        LISTEN_DEFAULT, "--listen", help="HOST:PORT (or [IPv6]:PORT) to listen on; port 0 picks a free one."
    ),
    gpu_key: str | None = typer.Option(None, "--gpu-key", help="Serve only this segment."),
) -> None:
    """Serve GET /metrics (Prometheus), /gpu/peers and /healthz, read-only, until stopped."""
    key = checked_key(gpu_key)
    from ..serve.run import serve as run_serve

    run_serve(listen, key)
