"""gpushare-tui: weighted time-division sharing of one GPU between LLM servers.

Public API: `from gpushare_tui import GpuShare` (see gpushare_tui.api). It is imported on first
use, so `import gpushare_tui` (the headless `--once` path) stays cheap.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["GpuShare", "__version__"]

TYPE_CHECKING = False  # typing's, without importing typing: --once starts without it (issue 28)
if TYPE_CHECKING:
    from .api import GpuShare


def __getattr__(name: str) -> object:
    if name == "GpuShare":
        from .api import GpuShare

        return GpuShare
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
