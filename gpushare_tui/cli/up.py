"""`gpushare-tui up FILE`: the engines declared in FILE, owned by this process (gpushare_tui/up/)."""

from __future__ import annotations

import sys

import typer


def up(
    file: str = typer.Argument(..., help="The config file (TOML): gpu_key or gpu, [serve], [[engine]] tables."),
    check: bool = typer.Option(False, "--check", help="Validate FILE and exit (0 valid, 2 invalid); start nothing."),
    reload: bool = typer.Option(False, "--reload", help="Tell the running `up` for FILE to re-read it (SIGHUP)."),
) -> None:
    """Run the engines declared in FILE: restart them on failure, re-weight them live on SIGHUP."""
    from ..up.owner import Up
    from ..up.owner import check as check_file

    if check and reload:
        from ..core.host.errors import UsageError

        raise UsageError("give --check or --reload, not both")
    if check or reload:
        cfg, keys = check_file(file)
        if check:
            names = ", ".join(f"{d.name} (weight {d.weight:g}, key {keys[d.name]})" for d in cfg.engines)
            print(f"{file}: ok: {names}{'; serve on ' + cfg.serve.listen if cfg.serve else ''}")
            return
        from ..up.lock import signal_reload

        pid = signal_reload(file)
        print(f"{file}: reload signalled to up pid {pid}", file=sys.stderr)
        return
    raise typer.Exit(Up(file).run())
