"""`gpushare-tui gc KEY... | --match PATTERN | --all [--dry-run]`: remove our own registry segments that hold
no live slot (core/registry/gc.py), only those named: a user sharing a uid with another job collects its own
keys and leaves the other job's alone."""

from __future__ import annotations

import typer

from ..core.host.errors import GpushareError, UsageError

SAY_WHICH = (
    "name the segments to collect: gc KEY..., gc --match PATTERN (e.g. 'test-*'), or gc --all "
    "(every segment of yours without a live slot); gc --dry-run shows what --all would remove"
)


def gc(
    keys: list[str] | None = typer.Argument(None, metavar="KEY", help="The gpu keys whose segments to collect."),
    match: str | None = typer.Option(
        None, "--match", help="Collect the segments whose key matches this shell pattern (* ? [...]); quote it."
    ),
    every: bool = typer.Option(False, "--all", help="Collect every segment of yours without a live slot."),
    dry_run: bool = typer.Option(False, "--dry-run", "-n", help="Print what would be removed; remove nothing."),
    shm_dir: str | None = typer.Option(None, "--shm-dir", hidden=True),  # tests: a directory of their own
) -> None:
    """Remove your own /dev/shm segments that hold no live slot: the KEYs named, those matching --match, or
    --all (one of the three; --dry-run alone previews --all). Never another user's, never one with a live
    slot or a running holder, never through a symlink; a group-shared one is left to its group.

    One line per segment of ours, removed or kept and why; other users' segments are counted only.
    Exit 0, also when nothing was removed; 1 only when the directory cannot be read."""
    from ..core.host.clock import wall_us
    from ..core.host.text import counted, printable
    from ..core.registry.abi import segment_name, validate_gpu_key
    from ..core.registry.gc import EVERY, Selection, check_match, collect_garbage

    named = tuple(validate_gpu_key(k) for k in keys or ())
    if sum((bool(named), match is not None, every)) > 1:
        raise UsageError("give one of KEY..., --match PATTERN and --all")
    if named:
        selection = Selection(keys=named)
    elif match is not None:
        selection = Selection(match=check_match(match))
    elif every or dry_run:
        selection = EVERY
    else:
        raise UsageError(SAY_WHICH)
    try:
        report = collect_garbage(wall_us, dry_run=dry_run, shm_dir=shm_dir, selection=selection)
    except OSError as e:
        raise GpushareError(f"cannot list {shm_dir or '/dev/shm'}: {e.strerror or e}") from None
    for v in report.verdicts:
        name = printable(v.name)
        if v.removable:
            print(f"{'would remove' if dry_run else 'removed'} {name}: {v.why}")
        else:
            print(f"kept {name}: {printable(v.why)}")
    for key in report.missing:
        print(f"no segment {segment_name(key)}")
    if report.others_left:
        print(f"{counted(report.others_left, 'segment')} of other users left alone")
    if not report.verdicts and not report.others_left and not report.missing:
        print("no /opencoti-gpu-* segments" if selection.all else f"no segment's key matches {match!r}")
