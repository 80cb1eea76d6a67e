"""When a supervised engine last decoded, from /metrics probes and its CPU time (pure)."""

from __future__ import annotations

from . import abi


class EngineActivity:
    """Tracks `last_us`, the latest time the engine is known to have been decoding.

    A probe showing a request in flight dates activity at the probe. A probe showing
    only that `n_decode_total` rose since the previous probe (up to 1 s earlier while
    active) dates it at that previous probe: the decode happened somewhere in between,
    and dating it at the later probe kept a finished engine active up to 1 s too long.
    CPU time only carries activity a probe raised: an idle engine answering probes on
    a loaded box can show a burst of ticks, which must not pace its peers.
    Times are monotonic µs (the engine's own intervals: a wall-clock step must not
    keep an idle engine active).
    """

    def __init__(self, idle_probe_us: int = 50_000, active_probe_us: int = 1_000_000) -> None:
        self.last_us: int | None = None  # never seen decoding
        self.idle_probe_us = idle_probe_us  # raise `active` within ~100 ms of the first decode
        self.active_probe_us = active_probe_us  # each probe costs a decoding engine throughput
        self._decode_total: float | None = None
        self._probe_us: int | None = None  # the last answered probe
        self._attempt_us: int | None = None  # the last probe sent, answered or not

    def probe_due(self, now_us: int, active: bool) -> bool:
        """Whether to probe /metrics now. The cadence follows `active` as it is now,
        not as it was at the last probe: an engine that went idle (whoever dropped
        the flag) is probed at the idle cadence at once."""
        interval = self.active_probe_us if active else self.idle_probe_us
        return self._attempt_us is None or now_us - self._attempt_us >= interval

    def probe_sent(self, now_us: int) -> None:
        self._attempt_us = now_us

    def on_probe(self, now_us: int, n_decode_total: float, requests_processing: float) -> None:
        if requests_processing > 0:
            self.last_us = now_us
        elif self._probe_us is not None and self._decode_total is not None and n_decode_total > self._decode_total:
            self.last_us = self._probe_us if self.last_us is None else max(self.last_us, self._probe_us)
        self._decode_total, self._probe_us = n_decode_total, now_us

    def on_cpu(self, now_us: int, busy: bool, active: bool) -> None:
        """`busy`: the engine used >= CPU_ACTIVE_CORES while running; `active`: our slot's flag."""
        if busy and active:
            self.last_us = now_us

    def is_active(self, now_us: int) -> bool:
        return self.last_us is not None and now_us - self.last_us <= abi.ACTIVITY_WINDOW_US
