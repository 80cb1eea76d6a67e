"""The dashboard's data: sources (segments, NVML, control sockets) and the immutable view model.

Data flows one way: a source builds a `model.DashboardModel`; the App (`app.py`)
hands it to the widgets, which only render it. Nothing here imports Textual.
"""

MIN_INTERVAL_S = 0.2  # the fastest refresh: the CLI checks --interval against it, the App enforces it
