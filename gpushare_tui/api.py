"""The public API for Python engines: `GpuShare` (implemented in core/pacing/share.py, where the
synthetic engine uses it too)."""

from __future__ import annotations

from .core.pacing.share import SCHEDULE_REREAD_US, GpuShare

__all__ = ["GpuShare", "SCHEDULE_REREAD_US"]
