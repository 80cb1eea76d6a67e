"""gpushare-tui: weighted time-division sharing of one GPU between LLM servers."""

__version__ = "0.1.0"
