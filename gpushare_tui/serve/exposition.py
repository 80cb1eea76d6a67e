"""Prometheus exposition of a `DashboardModel`: one renderer for `GET /metrics` and
`--once --format prometheus`.

Base units (seconds, bytes, 0-1 ratios). Peer series carry `gpu_key`, `slot`, `pid`, `name`.
A dead peer (heartbeat older than abi.ALIVE_US) keeps only `gpushare_peer_alive` (0) and its
heartbeat age until it is evicted; every other series of it disappears.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ..core.observe.latency import HISTOGRAM_NAMES
from ..dashboard.model import DashboardModel, GpuView, PeerRow

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PEER_LABELS = ["gpu_key", "slot", "pid", "name", "user"]  # user: of its pid (spec §8.1), "" when not verifiable
GPU_LABELS = ["gpu_key"]
MIB = 2**20

# name -> help: every metric the exporter can emit (deploy/grafana-dashboard.json is checked against it)
PEER_METRICS = {
    "gpushare_peer_weight": "Configured share weight of the peer.",
    "gpushare_peer_share_ratio": "Configured share of the GPU (weight / sum of the schedule members' weights), 0-1.",
    "gpushare_peer_window_share_ratio": (
        "Share of the schedule period that is the peer's window (the share with the 10% floor), 0-1."
    ),
    "gpushare_peer_busy_ratio": "Fraction of its recent time the peer was busy decoding, 0-1.",
    "gpushare_peer_active": "1 when the peer is active (a member of the schedule when alive), else 0.",
    "gpushare_peer_alive": "1 when the peer's heartbeat is fresh, 0 when it is stale (dead, not yet evicted).",
    "gpushare_peer_heartbeat_age_seconds": "Age of the peer's last heartbeat.",
    "gpushare_peer_window_seconds": "Length of the peer's window in the schedule period.",
    "gpushare_peer_achieved_share_ratio": "Achieved share: busy time over the sum of the members' busy time, 0-1.",
    "gpushare_peer_gpu_memory_bytes": "GPU memory used by the peer's process (NVML).",
}
ENGINE_METRICS = {
    "gpushare_engine_tokens_per_second": "Decode rate of a managed engine (its control socket's status).",
    "gpushare_engine_state": "State of a managed engine: 1 for the state it is in.",
    "gpushare_engine_info": "1 for a managed engine, labelled with its kind and activity source (empty: unknown).",
    "gpushare_engine_signal_lateness_p50_seconds": "Median lateness of the supervisor's SIGCONT/SIGSTOP.",
    "gpushare_engine_signal_lateness_p99_seconds": "99th percentile lateness of the supervisor's SIGCONT/SIGSTOP.",
    "gpushare_engine_signal_lateness_max_seconds": "Largest lateness of the supervisor's SIGCONT/SIGSTOP.",
}
GPU_METRICS = {
    "gpushare_schedule_period_seconds": "Length of the schedule period (absent when unthrottled).",
    "gpushare_peers": "Alive peers registered in the segment.",
    "gpushare_gpu_utilization_ratio": "Device utilisation (NVML), 0-1.",
    "gpushare_gpu_memory_used_bytes": "Device memory in use (NVML).",
    "gpushare_gpu_memory_total_bytes": "Device memory in total (NVML).",
}
HOST_METRICS = {"gpushare_segment_errors": "Segments that could not be read at this scrape."}
# Extension 1 (spec §7): only for peers that implement it; `class` is "interactive" or "batch"
EXT1_PEER_METRICS = {
    "gpushare_peer_demand": "1 while an Extension-1 peer has work in flight (DEMAND), else 0.",
    "gpushare_peer_priority": "1 while an Extension-1 peer holds priority (interactive, within its share), else 0.",
}
EXT1_PEER_LABELS = [*PEER_LABELS, "class"]
EXT1_GPU_METRICS = {
    "gpushare_schedule_ext1": "1 when the Extension-1 schedule applies (priority or not), 0 on §5 (v1).",
}
# Accounting counters (core.accounting): a peer's busy counter is its slot's busy_total_us (source="counter":
# since it joined, so a serve restart restarts nothing) or busy_ppm integrated between scrapes for a v1 peer
# (source="busy_ppm": since this serve first saw it). The energy and GPU counters start at 0 in each serve.
ACCOUNTING_METRICS = {
    "gpushare_peer_busy_seconds_total": "Device time the peer spent busy (source: counter = its busy_total_us "
    "since it joined; busy_ppm = its busy fraction integrated since this exporter first saw it).",
    "gpushare_peer_energy_joules_total": "Device energy attributed to the peer (by its busy time in each "
    "interval) since this exporter first saw it.",
    "gpushare_gpu_busy_seconds_total": "Sum of the peers' busy time since this exporter started.",
    "gpushare_user_busy_seconds_total": "Device time of one user's peers (the real uid of each peer's pid; "
    'user="?": not verifiable here) since this exporter started.',
    "gpushare_gpu_idle_energy_joules_total": "Device energy not attributed to any peer (the idle fraction) since "
    "this exporter started; only where an energy counter exists (NVML, or RAPL on a CPU host).",
}
# Latency as clients see it (core.observe.latency): engines behind a front proxy, peer labels. The histograms
# have vLLM's names (after our prefix) and buckets, cumulative since the engine's supervisor started (a restart of
# it is a counter reset; a `serve` restart changes nothing: they are read from the engine); the p50/p99 gauges
# are over the last minute, the same figures as `--once --json`, `status` and the dashboard (the governor's).
LATENCY_HISTOGRAMS = {
    "gpushare_engine_time_to_first_token_seconds": "Time to first token: request body received -> first token "
    "chunk relayed (2xx replies; measured at the engine's front proxy).",
    "gpushare_engine_inter_token_latency_seconds": "Gap between two relayed chunks of a streamed reply after its "
    "first token (2xx replies).",
    "gpushare_engine_e2e_request_latency_seconds": "Request body received -> response end (2xx replies).",
}
LATENCY_FIGURE_HISTOGRAM = {figure: f"gpushare_engine_{name}" for figure, name in HISTOGRAM_NAMES.items()}
assert set(LATENCY_FIGURE_HISTOGRAM.values()) == set(LATENCY_HISTOGRAMS)
LATENCY_COUNTERS = {
    "gpushare_engine_requests_total": "Requests answered through the engine's front proxy, by status class "
    '(2xx..5xx; "none": no response head), since its supervisor started.',
}
LATENCY_GAUGES = {
    **{
        f"gpushare_engine_{figure}_{q}_seconds": f"{label} over the last minute, {q}."
        for figure, label in (("ttft", "Time to first token"), ("itl", "Inter-token gap"), ("e2e", "End-to-end time"))
        for q in ("p50", "p99")
    },
    "gpushare_engine_requests_per_second": "2xx replies per second over the last minute.",
    "gpushare_engine_requests_in_flight": "Requests whose body was received and whose response has not ended.",
    "gpushare_engine_requests_waiting": "Requests in flight with no response head yet.",
}
SLO_METRICS = {
    "gpushare_engine_slo_ttft_p99_target_seconds": "The engine's TTFT p99 target (its slo).",
    "gpushare_engine_slo_itl_p99_target_seconds": "The engine's inter-token p99 target (its slo).",
    "gpushare_engine_slo_ttft_attained_ratio": "Requests within the TTFT target over the last minute, 0-1.",
    "gpushare_engine_slo_itl_attained_ratio": "Inter-token gaps within the ITL target over the last minute, 0-1.",
    "gpushare_engine_slo_unreachable": "1 while the engine's target is missed at the top of its governor's bounds.",
}
SLO_GPU_METRICS = {
    "gpushare_gpu_slo_unreachable_engines": "Engines on the GPU whose target is unreachable at their bounds "
    "(targets that cannot all hold).",
}
# Every counter and histogram, by when it starts from 0 again (deploy/README.md says the same: a test checks it).
COUNTER_RESETS = {
    **dict.fromkeys(LATENCY_COUNTERS, "supervisor"),
    **dict.fromkeys(LATENCY_HISTOGRAMS, "supervisor"),
    "gpushare_peer_busy_seconds_total": "serve (busy_ppm) / never (counter)",
    "gpushare_peer_energy_joules_total": "serve",
    "gpushare_gpu_busy_seconds_total": "serve",
    "gpushare_user_busy_seconds_total": "serve",
    "gpushare_gpu_idle_energy_joules_total": "serve",
}
METRIC_NAMES = frozenset(
    {
        **PEER_METRICS,
        **ENGINE_METRICS,
        **GPU_METRICS,
        **HOST_METRICS,
        **EXT1_PEER_METRICS,
        **EXT1_GPU_METRICS,
        **ACCOUNTING_METRICS,
        **LATENCY_HISTOGRAMS,
        **LATENCY_COUNTERS,
        **LATENCY_GAUGES,
        **SLO_METRICS,
        **SLO_GPU_METRICS,
    }
)


def _gauge(name: str, helps: dict[str, str], labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, helps[name], labels=labels)


def _counter(name: str, labels: list[str]) -> CounterMetricFamily:
    return CounterMetricFamily(name, ACCOUNTING_METRICS[name], labels=labels)


def _accounting(model: DashboardModel) -> list[Metric]:
    """The accounting counters of every alive peer and GPU (absent where nothing is known)."""
    busy = _counter("gpushare_peer_busy_seconds_total", [*PEER_LABELS, "source"])
    energy = _counter("gpushare_peer_energy_joules_total", PEER_LABELS)
    gpu_busy = _counter("gpushare_gpu_busy_seconds_total", GPU_LABELS)
    user_busy = _counter("gpushare_user_busy_seconds_total", [*GPU_LABELS, "user"])
    idle = _counter("gpushare_gpu_idle_energy_joules_total", GPU_LABELS)
    for g in model.gpus:
        if g.account is None:
            continue
        gpu_busy.add_metric([g.gpu_key], g.account.busy_s)
        for user, busy_s in g.account.users:
            user_busy.add_metric([g.gpu_key, user], busy_s)
        if g.account.idle_energy_j is not None:
            idle.add_metric([g.gpu_key], g.account.idle_energy_j)
        for r in g.rows:
            a = r.account
            if a is None or not r.peer.alive:
                continue
            if a.busy_s is not None:
                busy.add_metric([*_peer_labels(g, r), a.source], a.busy_s)
            if a.energy_j is not None:
                energy.add_metric(_peer_labels(g, r), a.energy_j)
    return [busy, energy, gpu_busy, user_busy, idle]


def _peer_labels(g: GpuView, r: PeerRow) -> list[str]:
    p = r.peer
    return [g.gpu_key, str(p.slot), str(p.pid), p.name, p.user or ""]


def families(model: DashboardModel) -> list[Metric]:
    """Every metric family for `model`, in a fixed order (families without samples included)."""
    peer = {n: _gauge(n, PEER_METRICS, PEER_LABELS) for n in PEER_METRICS}
    labelled = ("gpushare_engine_state", "gpushare_engine_info")
    engine = {n: _gauge(n, ENGINE_METRICS, PEER_LABELS) for n in ENGINE_METRICS if n not in labelled}
    state = _gauge("gpushare_engine_state", ENGINE_METRICS, [*PEER_LABELS, "state"])
    info = _gauge("gpushare_engine_info", ENGINE_METRICS, [*PEER_LABELS, "kind", "activity"])
    gpu = {n: _gauge(n, GPU_METRICS, GPU_LABELS) for n in GPU_METRICS}
    ext1 = {n: _gauge(n, EXT1_PEER_METRICS, EXT1_PEER_LABELS) for n in EXT1_PEER_METRICS}
    ext1_gpu = _gauge("gpushare_schedule_ext1", EXT1_GPU_METRICS, GPU_LABELS)
    for g in model.gpus:
        ext1_gpu.add_metric([g.gpu_key], 1 if g.snapshot.schedule_mode != "v1" else 0)
        for r in g.rows:
            _add_ext1_peer(ext1, _peer_labels(g, r), r)
        snap = g.snapshot
        if snap.period_ms is not None:
            gpu["gpushare_schedule_period_seconds"].add_metric([g.gpu_key], snap.period_ms / 1000)
        gpu["gpushare_peers"].add_metric([g.gpu_key], sum(1 for p in snap.peers if p.alive))
        dev = g.device
        if dev is not None:
            for name, value in (
                ("gpushare_gpu_utilization_ratio", None if dev.util_pct is None else dev.util_pct / 100),
                ("gpushare_gpu_memory_used_bytes", None if dev.mem_used_mib is None else dev.mem_used_mib * MIB),
                ("gpushare_gpu_memory_total_bytes", None if dev.mem_total_mib is None else dev.mem_total_mib * MIB),
            ):
                if value is not None:
                    gpu[name].add_metric([g.gpu_key], value)
        achieved = dict(g.achieved_pct)
        for r in g.rows:
            _add_peer(peer, engine, state, _peer_labels(g, r), r, achieved.get(r.peer.slot))
            if r.peer.alive and r.engine is not None and r.engine.error is None:
                info.add_metric([*_peer_labels(g, r), r.engine.kind or "", r.engine.activity or ""], 1)
    errors = GaugeMetricFamily("gpushare_segment_errors", HOST_METRICS["gpushare_segment_errors"])
    errors.add_metric([], len(model.errors))
    accounting = _accounting(model)
    latency = _latency(model)
    return [
        *peer.values(), *engine.values(), state, info, *gpu.values(), errors, *ext1.values(), ext1_gpu, *accounting,
        *latency,
    ]  # fmt: skip


def _latency(model: DashboardModel) -> list[Metric]:
    """The latency families of every live managed engine that reports figures (see LATENCY_HISTOGRAMS); a
    histogram only when the engine's is well formed (HistogramReport.valid: a reply may hold anything)."""
    hists = {n: HistogramMetricFamily(n, LATENCY_HISTOGRAMS[n], labels=PEER_LABELS) for n in LATENCY_HISTOGRAMS}
    requests = CounterMetricFamily(
        "gpushare_engine_requests_total", LATENCY_COUNTERS["gpushare_engine_requests_total"],
        labels=[*PEER_LABELS, "status"],
    )  # fmt: skip
    gauges = {n: _gauge(n, LATENCY_GAUGES, PEER_LABELS) for n in LATENCY_GAUGES}
    slo = {n: _gauge(n, SLO_METRICS, PEER_LABELS) for n in SLO_METRICS}
    unreachable_engines = _gauge("gpushare_gpu_slo_unreachable_engines", SLO_GPU_METRICS, GPU_LABELS)
    for g in model.gpus:
        unreachable = 0
        for r in g.rows:
            e = r.engine
            if not r.peer.alive or e is None or e.error is not None:
                continue
            labels = _peer_labels(g, r)
            lat = e.latency
            if lat is not None:
                for figure, name in LATENCY_FIGURE_HISTOGRAM.items():
                    h = lat.histogram(figure)
                    if h is not None and h.valid():
                        assert h.le is not None and h.counts is not None and h.sum_s is not None
                        buckets = [(_le(b), float(n)) for b, n in zip(h.le, h.counts)] + [("+Inf", float(h.counts[-1]))]
                        hists[name].add_metric(labels, buckets, h.sum_s)
                for cls, n in lat.status_totals():
                    if n is not None:
                        requests.add_metric([*labels, cls], n)
                for figure in ("ttft", "itl", "e2e"):
                    for q in ("p50", "p99"):
                        ms = getattr(lat, f"{figure}_{q}_ms")
                        if ms is not None:
                            gauges[f"gpushare_engine_{figure}_{q}_seconds"].add_metric(labels, round(ms / 1000, 6))
                for name, value in (
                    ("gpushare_engine_requests_per_second", lat.req_s),
                    ("gpushare_engine_requests_in_flight", lat.in_flight),
                    ("gpushare_engine_requests_waiting", lat.waiting),
                ):
                    if value is not None:
                        gauges[name].add_metric(labels, value)
            t = e.slo
            if t is None:
                continue
            for name, value, scale in (
                ("gpushare_engine_slo_ttft_p99_target_seconds", t.ttft_p99_ms, 1e-3),
                ("gpushare_engine_slo_itl_p99_target_seconds", t.itl_p99_ms, 1e-3),
                ("gpushare_engine_slo_ttft_attained_ratio", t.ttft_attained_pct, 1e-2),
                ("gpushare_engine_slo_itl_attained_ratio", t.itl_attained_pct, 1e-2),
            ):
                if value is not None:
                    slo[name].add_metric(labels, value * scale)
            slo["gpushare_engine_slo_unreachable"].add_metric(labels, 1 if t.state == "unreachable" else 0)
            unreachable += t.state == "unreachable"
        if any(r.engine is not None and r.engine.slo is not None for r in g.rows):
            unreachable_engines.add_metric([g.gpu_key], unreachable)
    return [*hists.values(), requests, *gauges.values(), *slo.values(), unreachable_engines]


def _le(bound: float) -> str:
    """A bucket's `le` as Prometheus clients write it (0.005, 10.0)."""
    return repr(float(bound))


def _add_ext1_peer(ext1: dict[str, GaugeMetricFamily], labels: list[str], r: PeerRow) -> None:
    """DEMAND and priority of an alive Extension-1 peer, labelled with its class (a v1 peer has neither)."""
    p = r.peer
    if not p.alive or p.klass is None:
        return
    ext1["gpushare_peer_demand"].add_metric([*labels, p.klass], 1 if p.demand else 0)
    ext1["gpushare_peer_priority"].add_metric([*labels, p.klass], 1 if p.priority else 0)


def _add_peer(
    peer: dict[str, GaugeMetricFamily],
    engine: dict[str, GaugeMetricFamily],
    state: GaugeMetricFamily,
    labels: list[str],
    r: PeerRow,
    achieved_pct: float | None,
) -> None:
    p = r.peer
    peer["gpushare_peer_alive"].add_metric(labels, 1 if p.alive else 0)
    if p.heartbeat_age_ms is not None:
        peer["gpushare_peer_heartbeat_age_seconds"].add_metric(labels, p.heartbeat_age_ms / 1000)
    if not p.alive:
        return
    if p.weight is not None:
        peer["gpushare_peer_weight"].add_metric(labels, p.weight)
    peer["gpushare_peer_share_ratio"].add_metric(labels, p.share_pct / 100)
    if p.window_pct is not None:
        peer["gpushare_peer_window_share_ratio"].add_metric(labels, p.window_pct / 100)
    peer["gpushare_peer_busy_ratio"].add_metric(labels, p.busy_pct / 100)
    peer["gpushare_peer_active"].add_metric(labels, 1 if p.active else 0)
    if p.window_us is not None:
        peer["gpushare_peer_window_seconds"].add_metric(labels, (p.window_us[1] - p.window_us[0]) / 1e6)
    if achieved_pct is not None:
        peer["gpushare_peer_achieved_share_ratio"].add_metric(labels, achieved_pct / 100)
    if r.vram_mib is not None:
        peer["gpushare_peer_gpu_memory_bytes"].add_metric(labels, r.vram_mib * MIB)
    e = r.engine
    if e is None or e.error is not None:
        return
    if e.tok_s is not None:
        engine["gpushare_engine_tokens_per_second"].add_metric(labels, e.tok_s)
    if e.state is not None:
        state.add_metric([*labels, e.state], 1)
    late = e.lateness
    if late is not None:
        for name, us in (
            ("gpushare_engine_signal_lateness_p50_seconds", late.p50_us),
            ("gpushare_engine_signal_lateness_p99_seconds", late.p99_us),
            ("gpushare_engine_signal_lateness_max_seconds", late.max_us),
        ):
            if us is not None:
                engine[name].add_metric(labels, us / 1e6)


class ModelCollector(Collector):
    """A custom collector: each `collect()` (each scrape) asks `model()` for a fresh model."""

    def __init__(self, model: Callable[[], DashboardModel]) -> None:
        self._model = model

    def collect(self) -> Iterator[Metric]:
        yield from families(self._model())


def render_metrics(model: Callable[[], DashboardModel]) -> bytes:
    """The text exposition of a fresh `model()`: the body of `GET /metrics`, and `--once --format prometheus`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ModelCollector(model))
    return generate_latest(registry)
