"""`metrics`: a Prometheus gauge that counts work in flight, at a URL (vLLM's, SGLang's, TGI's: the
`gauge` of their records in core/engines/kinds.py). Only the gauge's sample lines are found (a byte search) and
parsed, never the rest of the exposition, and the probe rate backs off by what a probe costs
(ProbeCost, budgets.SAMPLED_PROBE_CPU_FRACTION); the gauge's samples are summed over their labels
(one per model served)."""

from __future__ import annotations

from collections.abc import Callable

from ...host import probe
from ...host.budgets import SAMPLED_PROBE_CPU_FRACTION
from ...host.clock import mono_us
from .base import ActivitySource, ProbeCost, Tick

IDLE_PROBE_US = 50_000  # raise `active` within ~100 ms of the first request
# While active: the last probe showing work dates it, so a finished engine is released within
# ACTIVE_PROBE_US + the 2 s activity window of its last work at worst (<= 2.5 s: issue 19's target).
# A gauge is answered by the engine's HTTP front end (not its inference loop, as llama-server's is),
# so 4 probes a second cost it little.
ACTIVE_PROBE_US = 250_000


def gauge_value(text: str | bytes, gauge: str) -> float | None:
    """The sum of `gauge`'s samples in Prometheus text `text` (`NAME{LABELS} VALUE [TIMESTAMP]` lines
    of that name); None when it has none, or one of them does not parse (an engine still starting,
    or not a Prometheus endpoint). Only those lines are looked at: the cost is a byte search of the
    text plus the gauge's own lines."""
    data = text.encode() if isinstance(text, str) else text
    name = gauge.encode()
    total: float | None = None
    pos = 0 if data.startswith(name) else _line_start(data, name, 0)
    while pos >= 0:
        end = data.find(b"\n", pos)
        end = len(data) if end < 0 else end
        rest = data[pos + len(name) : end]
        if rest[:1] == b"{":
            close = _labels_end(rest)
            if close < 0:
                return None
            rest = rest[close + 1 :]
        elif rest[:1] not in (b" ", b"\t"):  # another metric whose name starts with the gauge's (NAME_total)
            pos = _line_start(data, name, end)
            continue
        fields = rest.split()
        try:
            value = float(fields[0])
        except (IndexError, ValueError):
            return None
        total = (total or 0.0) + value
        pos = _line_start(data, name, end)
    return total


def _line_start(data: bytes, name: bytes, start: int) -> int:
    """Where the next line that begins with `name` begins, at or after `start`; -1 if none."""
    at = data.find(b"\n" + name, start)
    return at + 1 if at >= 0 else -1


def _labels_end(rest: bytes) -> int:
    """The index of the `}` closing the label set `rest` opens with (quoted values may hold `}` and
    escapes); -1 if it is not closed."""
    quoted = escaped = False
    for i in range(1, len(rest)):
        c = rest[i]
        if escaped:
            escaped = False
        elif c == 0x5C:  # backslash
            escaped = quoted
        elif c == 0x22:  # double quote
            quoted = not quoted
        elif c == 0x7D and not quoted:  # }
            return i
    return -1


class GaugeActivity(ActivitySource):
    """Working while the gauge is > 0 (`in_flight`), dated at the probe that saw it."""

    name = "metrics"

    def __init__(
        self,
        url: str,
        gauge: str,
        trusted: Callable[[], bool] | None = None,
        cpu_fraction: float = SAMPLED_PROBE_CPU_FRACTION,
    ) -> None:
        super().__init__()
        self.url, self.gauge, self._trusted = url, gauge, trusted
        self._client = probe.new_client()
        self._attempt_us: int | None = None
        self.cost = ProbeCost(cpu_fraction)

    def poll(self, tick: Tick) -> None:
        interval = self.cost.interval_us(ACTIVE_PROBE_US if tick.active else IDLE_PROBE_US)
        if self._attempt_us is not None and tick.now_us - self._attempt_us < interval:
            return
        if not tick.may_probe():
            return
        self._attempt_us = tick.now_us
        self.cost.start()
        try:
            status, body = probe.get(self._client, self.url)
            value = gauge_value(body, self.gauge) if status == 200 else None
        except probe.ProbeError:
            return
        finally:
            self.cost.stop()
        if value is None:
            return
        if self._trusted is not None and not self._trusted():  # another process answered: not the engine's work
            self.in_flight = False
            return
        self.in_flight = value > 0
        if self.in_flight:
            self.last_us = mono_us()

    def close(self) -> None:
        self._client.close()
