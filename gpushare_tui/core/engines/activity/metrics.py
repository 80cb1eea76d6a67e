"""`metrics`: a Prometheus gauge that counts work in flight, at a URL (vLLM's
`vllm:num_requests_running`, SGLang's `sglang:num_running_reqs`, TGI's `tgi_batch_current_size`:
declaration.METRICS_GAUGE_PRESETS). The exposition is parsed with prometheus_client's parser; the
gauge's samples are summed over their labels (one per model served)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from ...host import probe
from ...host.clock import mono_us
from .base import ActivitySource, Tick

IDLE_PROBE_US = 50_000  # raise `active` within ~100 ms of the first request
# While active: the last probe showing work dates it, so a finished engine is released within
# ACTIVE_PROBE_US + the 2 s activity window of its last work at worst (<= 2.5 s: issue 19's target).
# A gauge is answered by the engine's HTTP front end (not its inference loop, as llama-server's is),
# so 4 probes a second cost it little.
ACTIVE_PROBE_US = 250_000


def gauge_value(text: str, gauge: str) -> float | None:
    """The sum of `gauge`'s samples in Prometheus text `text`; None when it has none (or the text
    does not parse: an engine still starting, or not a Prometheus endpoint)."""
    total: float | None = None
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == gauge:
                    total = (total or 0.0) + float(sample.value)
    except (ValueError, TypeError, IndexError, KeyError):
        return None
    return total


class GaugeActivity(ActivitySource):
    """Working while the gauge is > 0 (`in_flight`), dated at the probe that saw it."""

    name = "metrics"

    def __init__(self, url: str, gauge: str, trusted: Callable[[], bool] | None = None) -> None:
        super().__init__()
        self.url, self.gauge, self._trusted = url, gauge, trusted
        self._client = probe.new_client()
        self._attempt_us: int | None = None

    def poll(self, tick: Tick) -> None:
        interval = ACTIVE_PROBE_US if tick.active else IDLE_PROBE_US
        if self._attempt_us is not None and tick.now_us - self._attempt_us < interval:
            return
        if not tick.may_probe():
            return
        self._attempt_us = tick.now_us
        try:
            status, body = probe.get(self._client, self.url)
        except probe.ProbeError:
            return
        value = gauge_value(body.decode("utf-8", "replace"), self.gauge) if status == 200 else None
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
