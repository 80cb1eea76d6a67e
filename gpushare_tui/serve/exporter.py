"""What the server reads: a `LiveSource` (segments, NVML, control-socket status), one collect shared by
concurrent requests (single-flight, a model at most SERVE_MODEL_MAX_AGE_S old), its metrics rendered once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ..core.host.budgets import SERVE_MODEL_MAX_AGE_S
from ..dashboard.model import DashboardModel
from ..dashboard.source import LiveSource
from .exposition import render_metrics


class Exporter:
    """Models from `source` for concurrent request handlers. A request is given a model whose collect began
    at most `max_age_s` before the request asked (else it collects one; requests asking meanwhile wait for
    it and share it): 8 concurrent scrapes cost one collect, not 8 under one lock."""

    def __init__(
        self, source: LiveSource, max_age_s: float = SERVE_MODEL_MAX_AGE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.source = source
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._model: tuple[DashboardModel, float] | None = None  # (model, when its collect began)
        self._metrics: tuple[DashboardModel, bytes] | None = None
        self._render_lock = threading.Lock()
        self.collects = 0  # how many collects ran (tests, benchmarks)

    def model(self) -> DashboardModel:
        asked = self._clock()
        with self._lock:
            if self._model is not None and self._model[1] >= asked - self.max_age_s:
                return self._model[0]
            began = self._clock()
            m = self.source.collect()
            self.collects += 1
            self._model = (m, began)
            return m

    def metrics(self) -> bytes:
        """The Prometheus text of a shared model, rendered once per model."""
        m = self.model()
        with self._render_lock:
            if self._metrics is None or self._metrics[0] is not m:
                self._metrics = (m, render_metrics(lambda: m))
            return self._metrics[1]

    def close(self) -> None:
        with self._lock:
            self.source.close()
