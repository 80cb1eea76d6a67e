"""`gpushare-tui serve`: this host's segments over HTTP, read-only.

`GET /metrics` (Prometheus text exposition, `exposition.py`), `GET /gpu/peers` (the seed's JSON,
`peers.py`) and `GET /healthz`, served by a bounded asyncio HTTP server (`server.py`) from the dashboard's
data layer (`dashboard.source.LiveSource`), one collect shared by concurrent requests (`exporter.py`).
Nothing here imports UI code. Budgets: core/host/budgets.py; promises: docs/trust.md.
"""
