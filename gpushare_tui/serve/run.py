"""The life of `gpushare-tui serve`: bind, say where, serve until SIGINT/SIGTERM."""

from __future__ import annotations

import signal
import sys

from ..core.host.lifecycle import on_signals
from ..dashboard.source import LiveSource
from .exporter import Exporter
from .listen import bind_error, is_loopback, parse_listen
from .server import ExporterServer


def open_server(listen: str, gpu_key: str | None = None, all_owners: bool = False) -> ExporterServer:
    """A bound server for `--listen` (UsageError / GpushareError: one line) over this host's segments
    (other users' beyond a cap counted, not read, unless `all_owners`)."""
    host, port = parse_listen(listen)
    exporter = Exporter(LiveSource(gpu_key, all_owners=all_owners))
    try:
        return ExporterServer((host, port), exporter)
    except OSError as e:
        exporter.close()
        raise bind_error(host, port, e) from None


def serve(listen: str, gpu_key: str | None = None, all_owners: bool = False) -> None:
    """Serve until SIGINT or SIGTERM (then return). The first stderr line names the URL (port 0 resolved)."""

    def stop(_signum: int) -> None:
        raise KeyboardInterrupt

    on_signals(stop, (signal.SIGTERM,))  # until the loop handles it (SIGINT is a KeyboardInterrupt already)
    server = open_server(listen, gpu_key, all_owners)
    host = server.server_address[0]
    note = "" if is_loopback(host) else "  (not loopback: reachable from other hosts)"
    print(f"gpushare-tui serve: listening on {server.url}{note}", file=sys.stderr, flush=True)

    try:
        server.serve_forever(stop_signals=(signal.SIGINT, signal.SIGTERM))
    except KeyboardInterrupt:
        pass  # a SIGINT before the loop handles it
    finally:
        server.server_close()
        server.exporter.close()
