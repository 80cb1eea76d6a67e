"""`gpushare-tui serve`: Prometheus exposition and /gpu/peers for this host (gpushare_tui/serve/)."""

from __future__ import annotations

import typer

from ..serve.listen import DEFAULT_LISTEN  # no server: the parser of addresses only
from .common import checked_key
from .options import AllOwnersOpt


def serve(
    listen: str = typer.Option(
        DEFAULT_LISTEN, "--listen", help="HOST:PORT (or [IPv6]:PORT) to listen on; port 0 picks a free one."
    ),
    gpu_key: str | None = typer.Option(None, "--gpu-key", help="Serve only this segment."),
    all_owners: bool = AllOwnersOpt,
) -> None:
    """Serve GET /metrics (Prometheus), /gpu/peers and /healthz, read-only, until stopped."""
    key = checked_key(gpu_key)
    from ..serve.run import serve as run_serve

    run_serve(listen, key, all_owners)
