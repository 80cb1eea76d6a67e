"""`gpushare-tui gc [--dry-run]`: remove our own registry segments that hold no live slot (core/registry/gc.py)."""

from __future__ import annotations

import typer

from ..core.host.errors import GpushareError


def gc(
    dry_run: bool = typer.Option(False, "--dry-run", "-n", help="Print what would be removed; remove nothing."),
    shm_dir: str | None = typer.Option(None, "--shm-dir", hidden=True),  # tests: a directory of their own
) -> None:
    """Remove our own /dev/shm segments that hold no live slot (never another user's, never one with a
    live slot or a running holder, never through a symlink; a group-shared one is left to its group).

    One line per segment of ours, removed or kept and why; other users' segments are counted only.
    Exit 0, also when nothing was removed; 1 only when the directory cannot be read."""
    from ..core.host.clock import wall_us
    from ..core.host.text import counted, printable
    from ..core.registry.gc import collect_garbage

    try:
        report = collect_garbage(wall_us, dry_run=dry_run, shm_dir=shm_dir)
    except OSError as e:
        raise GpushareError(f"cannot list {shm_dir or '/dev/shm'}: {e.strerror or e}") from None
    for v in report.verdicts:
        name = printable(v.name)
        if v.removable:
            print(f"{'would remove' if dry_run else 'removed'} {name}: {v.why}")
        else:
            print(f"kept {name}: {printable(v.why)}")
    if report.others_left:
        print(f"{counted(report.others_left, 'segment')} of other users left alone")
    if not report.verdicts and not report.others_left:
        print("no /opencoti-gpu-* segments")
