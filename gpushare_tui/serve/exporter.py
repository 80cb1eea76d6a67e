"""What the server reads: a `LiveSource` (segments, NVML, control-socket status) asked for a fresh
model at every request, one request at a time (a source serves one thread)."""

from __future__ import annotations

import threading

from ..dashboard.model import DashboardModel
from ..dashboard.source import LiveSource


class Exporter:
    """Fresh models from `source` for concurrent request handlers (serialised: no background polling)."""

    def __init__(self, source: LiveSource) -> None:
        self.source = source
        self._lock = threading.Lock()

    def model(self) -> DashboardModel:
        with self._lock:
            return self.source.collect()

    def close(self) -> None:
        with self._lock:
            self.source.close()
