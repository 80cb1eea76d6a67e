"""The timeline's stroboscopic cursor: true samples of the TDM phase, one period + 1/STROBE_STEPS apart.

A TDM period is 80–400 ms, so neither the 1 s refresh nor a 10–20 Hz animation
can follow the cursor: samples land at unrelated phases and the "now" marker
looks random, or runs backwards (aliasing). A strobe turns that into a slow,
readable sweep without inventing anything: frame n shows the schedule exactly at
`sample_us(n) = n * frame_us`, with `frame_us = period_us + period_us // STROBE_STEPS`.
From one frame to the next the phase advances by one step (period / STROBE_STEPS),
so the cursor visits the whole period, in order, in STROBE_STEPS frames:
`slowdown` (26×) slower than real time, every frame a true position and holder.
Frames lie on a grid of absolute CLOCK_REALTIME µs (the phase is `now_us mod
period_us`, spec §5), so every view of one schedule shows the same frame.
A frame lasts `frame_us`: 12 Hz at an 80 ms period, 6 Hz at 160 ms, 2.4 Hz at 400 ms.
"""

from __future__ import annotations

from dataclasses import dataclass

STROBE_STEPS = 25  # frames per sweep; a step (period/25) is never wider than the narrowest window (25 ms at 400 ms)


@dataclass(frozen=True)
class Strobe:
    period_us: int

    @property
    def step_us(self) -> int:
        """How far the phase advances from one frame to the next."""
        return self.period_us // STROBE_STEPS

    @property
    def frame_us(self) -> int:
        """Time between frames: one period and one step."""
        return self.period_us + self.step_us

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
