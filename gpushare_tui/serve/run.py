"""The life of `gpushare-tui serve`: bind, say where, serve until SIGINT/SIGTERM."""

from __future__ import annotations

import sys

from ..core.host.lifecycle import TERMINATION_SIGNALS, on_signals, termination_deferred
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
    """Serve until SIGTERM, SIGINT or SIGHUP (then return, whenever it comes). The first stderr line
    names the URL (port 0 resolved)."""

    def stop(_signum: int) -> None:
        raise KeyboardInterrupt

    server: ExporterServer | None = None
    try:
        # until the loop handles them; at the end of the start-up's section if it comes then (at once: a signal
        # whose start-up exit was swallowed, lifecycle.guard_startup)
        on_signals(stop)
        with termination_deferred():
            server = open_server(listen, gpu_key, all_owners)
            host = server.server_address[0]
            note = "" if is_loopback(host) else "  (not loopback: reachable from other hosts)"
            print(f"gpushare-tui serve: listening on {server.url}{note}", file=sys.stderr, flush=True)
        server.serve_forever(stop_signals=TERMINATION_SIGNALS)
    except KeyboardInterrupt:
        pass  # a signal before the loop handles it
    finally:
        on_signals(lambda _signum: None)  # stopping already (the loop's handlers are gone with it)
        if server is not None:
            server.server_close()
            server.exporter.close()
