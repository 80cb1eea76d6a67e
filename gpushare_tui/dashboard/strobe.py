"""The timeline's stroboscopic cursor: true samples of the TDM phase, whole periods + 1/STROBE_STEPS apart.

A TDM period is 80–400 ms, so neither the 1 s refresh nor a 10–20 Hz animation
can follow the cursor: samples land at unrelated phases and the "now" marker
looks random, or runs backwards (aliasing). A strobe turns that into a slow,
readable sweep without inventing anything: frame n shows the schedule exactly at
`sample_us(n) = n * frame_us`, with `frame_us = k * period_us + step_us` and
`step_us = period_us // STROBE_STEPS`. From one frame to the next the phase
advances by one step, so the cursor visits the whole period, in order, in
STROBE_STEPS frames: `slowdown` times slower than real time, every frame a
true position and holder. `k`, the whole periods per frame, is the fewest that
keep frames at least MIN_FRAME_US apart: each frame costs a screen update
(2-4 ms of CPU whatever changed: Textual walks every visible widget), and the
refresh-cost budget (3% of a core with 4 GPUs) allows a few per second, not
12 (bench.dashboard_cost: 12 frames/s cost 5.5% of a core, 4/s about 1.4%).
So: 80 ms period → k = 4, 3.1 frames/s, 65× slower; 160 ms → k = 2, 3 frames/s,
33×; 240 ms → 3.9 frames/s, 17×; 400 ms → 2.4 frames/s, 17×; never above
4 frames/s; a sweep takes 4.1–7.8 s. Frames lie on a grid of absolute CLOCK_REALTIME µs (the
phase is `now_us mod period_us`, spec §5), so every view of one schedule shows
the same frame.
"""

from __future__ import annotations

from dataclasses import dataclass

STROBE_STEPS = 16  # frames per sweep; a step (period/16) is never wider than the narrowest window (25 ms at 400 ms)
MIN_FRAME_US = 250_000  # at most 4 frames/s per timeline


@dataclass(frozen=True)
class Strobe:
    period_us: int

    @property
    def step_us(self) -> int:
        """How far the phase advances from one frame to the next."""
        return self.period_us // STROBE_STEPS

    @property
    def periods_per_frame(self) -> int:
        """Whole periods between frames: the fewest (at least 1) that keep frames MIN_FRAME_US apart."""
        return max(1, -(-(MIN_FRAME_US - self.step_us) // self.period_us))

    @property
    def frame_us(self) -> int:
        """Time between frames: whole periods and one step."""
        return self.periods_per_frame * self.period_us + self.step_us

    @property
    def slowdown(self) -> float:
        """Real time ÷ the cursor's apparent speed."""
        return self.frame_us / self.step_us

    def frame(self, now_us: int) -> int:
        """The latest frame at or before now_us."""
        return now_us // self.frame_us

    def sample_us(self, frame: int) -> int:
        """The instant frame `frame` shows (CLOCK_REALTIME µs)."""
        return frame * self.frame_us

    def until_next_us(self, now_us: int) -> int:
        """µs from now_us to the next frame (> 0)."""
        return (self.frame(now_us) + 1) * self.frame_us - now_us
