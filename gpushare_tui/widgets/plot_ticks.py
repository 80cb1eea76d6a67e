"""Time-axis ticks for the plots: round values in one unit per axis.

Spans up to two minutes are labelled in seconds, longer ones in minutes, so an
axis never mixes `-90s` with `-1m`. The step is the smallest round one whose
labels fit the canvas (the widest label plus two columns between ticks, at
most MAX_TICKS), preferring steps that divide the span (its left end labelled, three
ticks or more).
"""

from __future__ import annotations

SECONDS_UP_TO_S = 120.0
MAX_TICKS = 7
_STEPS_S = (5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0)
_STEPS_MIN = (1.0, 2.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0)


def time_ticks(span_s: float, canvas_cols: int) -> list[tuple[float, str]]:
    """(x in seconds ≤ 0, label) from about -span_s to 0 (`now`), one unit, fitting `canvas_cols`."""
    unit, div, steps = ("s", 1.0, _STEPS_S) if span_s <= SECONDS_UP_TO_S else ("m", 60.0, _STEPS_MIN)
    span_u = span_s / div

    def ticks_at(step: float) -> list[tuple[float, str]]:
        n = int(span_u / step + 1e-9)
        return [(-k * step * div, f"-{k * step:g}{unit}" if k else "now") for k in range(n, -1, -1)]

    def fits(step: float) -> bool:
        ticks = ticks_at(step)
        widest = max(len(label) for _, label in ticks)
        return len(ticks) <= MAX_TICKS and canvas_cols * step / span_u >= widest + 2

    dividing = [s for s in steps if abs(span_u / s - round(span_u / s)) < 1e-9]
    step = next((s for s in dividing if fits(s) and len(ticks_at(s)) >= 3), None)
    step = step or next((s for s in steps if fits(s)), steps[-1])
    return ticks_at(step)
