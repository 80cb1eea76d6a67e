"""Options several commands take, declared once (their values are checked in cli/common.py)."""

from __future__ import annotations

import typer

from ..core.engines.kinds import PRESETS
from ..core.host.budgets import FOREIGN_SEGMENTS_SHOWN_MAX
from ..core.registry.abi import WEIGHT_RULE

GpuKeyOpt = typer.Option(None, "--gpu-key", help="Registry key (overrides --gpu); 1..64 of [A-Za-z0-9._-].")
GpuIndexOpt = typer.Option(None, "--gpu", help="CUDA device index whose NVML UUID is the key (default 0).")
ShareGroupOpt = typer.Option(
    None,
    "--share-group",
    envvar="GPUSHARE_GROUP",
    help="Share the segment with this group: create it 0660 for the group, join the group's (never world-writable).",
)
IntervalOpt = typer.Option(1.0, "--interval", help="Dashboard refresh in seconds (min 0.2).")
AllOwnersOpt = typer.Option(
    False,
    "--all-owners",
    help=f"Show every segment of other users (default: ours, then at most {FOREIGN_SEGMENTS_SHOWN_MAX} of theirs).",
)
ReadonlyOpt = typer.Option(False, "--readonly", help="Dashboard: disable every admin action.")
WEIGHT_HELP = f"Share weight: {WEIGHT_RULE.removeprefix('must be ')}."
# text, not a float: the one parse is abi.parse_weight's (its errors, its f32 rule); shown as the number it is
WeightOpt = typer.Option("1", "--weight", metavar="NUMBER", help=WEIGHT_HELP)
EngineNameOpt = typer.Option(None, "--name", help="Display name (default: the model file's stem).")
LoadTimeoutOpt = typer.Option(600.0, "--load-timeout", help="Seconds to wait for /health 200.")

# What "working" and "ready" mean for a supervised engine (`run`, `launch`; core/engines/declaration.resolve_sources).
ActivityOpt = typer.Option(
    None,
    "--activity",
    help="What counts as working: llama (llama-server's /metrics; its default), metrics (--metrics-url, --gauge),"
    " cpu (the process tree uses >= --cpu-cores; other commands' default), gpu (NVML), always;"
    f" or a preset: {', '.join(PRESETS)} (their in-flight gauge at http://127.0.0.1:PORT/metrics).",
)
MetricsUrlOpt = typer.Option(None, "--metrics-url", help="Prometheus endpoint of --activity metrics.")
GaugeOpt = typer.Option(None, "--gauge", help="The gauge counting work in flight (--activity metrics).")
CpuCoresOpt = typer.Option(None, "--cpu-cores", help="Cores the tree must use to count as working (default 0.25).")
HealthUrlOpt = typer.Option(None, "--health-url", help="Ready when GET URL answers 200.")
HealthPortOpt = typer.Option(None, "--health-port", help="Ready when this TCP port (127.0.0.1) accepts.")
HealthLogOpt = typer.Option(None, "--health-log", help="Ready when a line of the engine's log matches REGEX.")
NoHealthOpt = typer.Option(False, "--no-health", help="Ready at once (no readiness check).")
NoProxyOpt = typer.Option(
    False,
    "--no-proxy",
    help="An HTTP engine (llama-server, vLLM, SGLang, TGI, a command giving --port and an HTTP probe on it): serve"
    " its port itself, without"
    " the front proxy that publishes its work in flight at each request's start and end and measures its latency"
    " (DEMAND then comes from its activity source: probes, tens of ms late).",
)
# a latency target kept by the SLO governor (docs/latency.md); bounds by default: the weight to 8x it, both classes
SloTtftOpt = typer.Option(None, "--slo-ttft-p99-ms", help="Latency target: p99 time to first token, ms.")
SloItlOpt = typer.Option(None, "--slo-itl-p99-ms", help="Latency target: p99 inter-token latency, ms.")
SloWeightMinOpt = typer.Option(None, "--slo-weight-min", help="Target's bounds: the least weight (default --weight).")
SloWeightMaxOpt = typer.Option(None, "--slo-weight-max", help="Target's bounds: the most weight (default 8x --weight).")
SloClassesOpt = typer.Option(
    None, "--slo-classes", help="Target's bounds: the classes it may set (batch,interactive: both, the default)."
)
ClassOpt = typer.Option(
    "batch",
    "--class",
    help="Latency class: interactive (runs first while within its weight share) or batch (uses the rest).",
)

ENGINE_HELP = (
    "Engine: its pid (all digits), or its name when exactly one managed engine has it (an unknown name"
    " exits 1, one several engines have exits 2; both list the engines as name=pid)."
)


def complete_engine(incomplete: str) -> list[str]:
    """Shell completion of ENGINE: the names (and pids) of the managed engines that start so."""
    from ..core.pacing.control import managed_engines

    engines = managed_engines(timeout_s=0.3)
    words = [e.status.name for e in engines if e.status.name] + [str(e.ref.pid) for e in engines]
    return sorted({w for w in words if w.startswith(incomplete) and w.isprintable() and " " not in w})


EngineArg = typer.Argument(..., metavar="ENGINE", help=ENGINE_HELP, autocompletion=complete_engine)
EngineSlotOpt = typer.Option(None, "--slot", help="The engine's slot, when the pid serves several engines.")
EngineKeyOpt = typer.Option(None, "--gpu-key", help="The engine's GPU key, when its slot number repeats across keys.")
