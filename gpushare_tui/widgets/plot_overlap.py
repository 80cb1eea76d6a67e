"""Lines that coincide take turns, so each stays visible.

A terminal cell shows one line's colour (or marker): two peers at the same
share would draw as one line, the last drawn. Here every line is sampled at
each braille dot column; where several land within half a cell of each other
they share those columns in turn (peer A, peer B, A, B … two cells each), so
the overlap reads as a striped line in both colours (both slot digits under
NO_COLOR). Lines that never meet are kept as they are (cheap to draw).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from ..dashboard.history import Series

TURN = 4  # samples (braille dot columns) per turn: two cells, so that one cell at least is the
# line's own wherever plotext's cell boundaries fall
MIN_JOINED = 4  # owned runs shorter than this are drawn as dots (one scatter call per line)


@dataclass(frozen=True)
class Stroke:
    """What to draw for one line: `joined` points as a line, else as dots."""

    slot: int
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    joined: bool


def _at(s: Series, x: float) -> float | None:
    """The line's value at x (linear between its points), None outside them."""
    xs = s.xs
    if not xs or x < xs[0] or x > xs[-1]:
        return None
    i = bisect_left(xs, x)
    if xs[i] == x or i == 0:
        return s.ys[i]
    x0, x1, y0, y1 = xs[i - 1], xs[i], s.ys[i - 1], s.ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def interleave(series: tuple[Series, ...], span_s: float, cols: int, rows: int) -> list[Stroke]:
    """Strokes for `series` on a canvas of cols × rows cells (x from -span_s to 0, y 0..100)."""
    n = max(2, 2 * cols)
    xs = [-span_s + (k + 0.5) * span_s / n for k in range(n)]
    tol = 100 / max(1, 2 * rows)
    ys = [[_at(s, x) for x in xs] for s in series]
    owns = [[y is not None for y in line] for line in ys]
    shared = [False] * len(series)
    for k in range(n):
        present = sorted((y, s.slot, i) for i, s in enumerate(series) if (y := ys[i][k]) is not None)
        group: list[int] = []
        for j, (y, _slot, i) in enumerate(present):
            if group and y - present[j - 1][0] >= tol:
                _take_turns(group, k, owns, shared)
                group = []
            group.append(i)
        _take_turns(group, k, owns, shared)
    out: list[Stroke] = []
    for i, s in enumerate(series):
        if not shared[i]:
            out.append(Stroke(s.slot, s.xs, s.ys, True))
            continue
        dots_x: list[float] = []
        dots_y: list[float] = []
        run: list[tuple[float, float]] = []  # the owned (x, y) samples in a row (an owned sample has a y)
        for k in [*range(n), n]:
            y = ys[i][k] if k < n and owns[i][k] else None
            if y is not None:
                run.append((xs[k], y))
                continue
            if len(run) >= MIN_JOINED:
                out.append(Stroke(s.slot, tuple(x for x, _ in run), tuple(y for _, y in run), True))
            else:
                dots_x += [x for x, _ in run]
                dots_y += [y for _, y in run]
            run = []
        if dots_x:
            out.append(Stroke(s.slot, tuple(dots_x), tuple(dots_y), False))
    return out


def _take_turns(group: list[int], k: int, owns: list[list[bool]], shared: list[bool]) -> None:
    """Lines of one group (close at sample k) own k in turn, TURN samples each."""
    if len(group) < 2:
        return
    owner = group[(k // TURN) % len(group)]
    for i in group:
        shared[i] = True
        owns[i][k] = i == owner
