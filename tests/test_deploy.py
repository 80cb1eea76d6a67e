"""deploy/: the Grafana dashboard asks only for metrics the exporter has; the systemd unit runs `serve`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from gpushare_tui.serve.exposition import COUNTER_RESETS, METRIC_NAMES, families
from testkit.paths import REPO

DEPLOY = REPO / "deploy"
METRIC = re.compile(r"\bgpushare_[a-z0-9_]+\b")


def _exprs(node: object) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k in ("expr", "query") and isinstance(v, str)] + [
            e for v in node.values() for e in _exprs(v)
        ]
    if isinstance(node, list):
        return [e for v in node for e in _exprs(v)]
    return []


def test_grafana_dashboard_metrics_exist() -> None:
    dash = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exprs = [e for e in _exprs(dash) if e != "prometheus"]  # the datasource variable's query is a type
    assert len(exprs) >= 10
    used = {m for e in exprs for m in METRIC.findall(e)}
    assert all(METRIC.search(e) for e in exprs), [e for e in exprs if not METRIC.search(e)]
    assert used - METRIC_NAMES == set()
    accounting = {"gpushare_peer_busy_seconds_total", "gpushare_gpu_busy_seconds_total"}
    accounting |= {"gpushare_peer_energy_joules_total", "gpushare_gpu_idle_energy_joules_total"}
    assert accounting <= used  # the counters, through rate() / increase()
    assert all(re.search(r"\b(rate|increase)\(" + m, e) for e in exprs for m in accounting if m in e)
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for what in ("share", "busy", "achieved", "tokens/s", "period", "peers", "device time by", "energy by engine"):
        assert what in titles


def test_every_counter_says_what_restarts_it() -> None:
    """Every counter and histogram `serve` exports is in COUNTER_RESETS and has a row of deploy/README.md's table
    (`gpushare_user_busy_seconds_total` once went down at a `serve` restart with no word about it there)."""
    from test_golden import fixed_model  # a model with every kind of series: accounts, latency, SLO

    kinds = {f.name + ("_total" if f.type == "counter" else ""): f.type for f in families(fixed_model())}
    assert {n for n, t in kinds.items() if t in ("counter", "histogram")} == set(COUNTER_RESETS)
    readme = (DEPLOY / "README.md").read_text()
    section = readme.split("### Counters, and what restarts them from 0", 1)[1].split("\n\n", 2)[1]
    rows = [line for line in section.splitlines() if line.startswith("| `gpushare_")]
    for name, when in COUNTER_RESETS.items():
        (row,) = [row for row in rows if f"`{name}`" in row.split(" | ")[0]]
        said = row.split(" | ")[-1]  # its "starts from 0 again when" cell says the same as COUNTER_RESETS
        assert ("`serve` restarts" in said) == ("serve" in when), (name, said)
        assert ("supervisor" in said) == (when == "supervisor"), (name, said)


def test_systemd_unit_runs_serve() -> None:
    unit = (DEPLOY / "gpushare-tui-serve.service").read_text()
    exec_start = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
    assert exec_start.split()[1:3] == ["serve", "--listen"]
    assert "[Install]" in unit and "NoNewPrivileges=yes" in unit


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_unit_parses() -> None:
    """systemd-analyze reads every line (a missing ExecStart binary on this host is all it may say)."""
    unit = str(DEPLOY / "gpushare-tui-serve.service")
    r = subprocess.run(["systemd-analyze", "verify", unit], capture_output=True, text=True, timeout=60)
    problems = [ln for ln in (r.stdout + r.stderr).splitlines() if "gpushare-tui-serve.service" in ln]
    assert [ln for ln in problems if "is not executable" not in ln] == []


def test_container_notes() -> None:
    notes = (DEPLOY / "README.md").read_text()
    assert "--ipc=host" in notes and "/dev/shm" in notes and "hostIPC: true" in notes and "DaemonSet" in notes


def test_the_socket_unit_hands_one_port_to_a_run_service() -> None:
    sock = (DEPLOY / "gpushare-llama.socket").read_text().splitlines()
    listens = [ln.split("=", 1)[1] for ln in sock if ln.startswith("ListenStream=")]
    assert len(listens) == 1 and "Accept=no" in sock  # one socket, handed to one service (LISTEN_FDS=1)
    unit = (DEPLOY / "gpushare-llama.service").read_text()
    exec_start = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
    argv = exec_start.split("=", 1)[1].split()
    assert argv[1] == "run" and "--no-proxy" not in argv and "--port" not in argv  # the socket's port is the one
    assert "Requires=gpushare-llama.socket" in unit
