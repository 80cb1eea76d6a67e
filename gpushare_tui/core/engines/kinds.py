"""The engine kinds a launch form offers (issue 19), as data: each kind's label, the fields it needs
(with hints and defaults) and the `run` activity it implies. A form renders KINDS and turns its values
into a checked declaration with `kind_engine` (core.declaration checks it, as `up` checks a file's),
whose `run_options()` are the `run`/`launch` options to start it with.

Commands are the engines' own (checked against their docs: docs/engines.md); nothing is added to them
except for llama-server (--port/--host/--metrics/--slots, by the supervisor)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from .declaration import (
    ACTIVITY_SOURCES,
    LLAMA_SERVER,
    DeclarationError,
    EngineDecl,
    SynthDecl,
    parse_engine,
)


@dataclass(frozen=True)
class KindField:
    key: str  # the form's field (and the value's key in `kind_engine`'s values)
    label: str
    hint: str
    default: str = ""
    choices: tuple[str, ...] = ()  # a closed set (a selector), else free text


@dataclass(frozen=True)
class EngineKindInfo:
    """One kind a form can start: `fields` in the order shown (before the common weight/name/GPU key)."""

    key: str  # core.declaration.ENGINE_KINDS, or "synthetic"
    label: str
    fields: tuple[KindField, ...]

    def defaults(self) -> dict[str, str]:
        return {f.key: f.default for f in self.fields}


def _command(default: str) -> KindField:
    return KindField("command", "Command", "the engine's command line, run as given", default)


_METRICS_URL = KindField("metrics_url", "Metrics URL", "metrics: http://127.0.0.1:PORT/metrics")
_GAUGE = KindField("gauge", "Gauge", "metrics: the gauge of work in flight")
_HEALTH_URL = KindField("health_url", "Health URL", "empty: ready at once (or http://.../health)")

KINDS: tuple[EngineKindInfo, ...] = (
    EngineKindInfo(
        LLAMA_SERVER,
        "llama-server",
        (
            KindField("binary", "Engine binary", "llama-server, or a path", "llama-server"),
            KindField("model", "Model path", "/path/to/model.gguf"),
            KindField("port", "Port", "empty: a free port"),
            KindField("extra", "Extra args", "e.g. -c 4096 -t 4"),
        ),
    ),
    EngineKindInfo("vllm", "vLLM", (_command("vllm serve MODEL --port 8000 --gpu-memory-utilization 0.45"),)),
    EngineKindInfo(
        "sglang",
        "SGLang",
        (
            _command(
                "python -m sglang.launch_server --model-path MODEL --port 30000 --enable-metrics"
                " --mem-fraction-static 0.45"
            ),
        ),
    ),
    EngineKindInfo(
        "tgi", "TGI", (_command("text-generation-launcher --model-id MODEL --port 3000 --cuda-memory-fraction 0.45"),)
    ),
    EngineKindInfo(
        "command",
        "any command (a training job, a server)",
        (
            _command("python train.py"),
            KindField(
                "activity",
                "Activity",
                "when it is working",
                "always",
                tuple(a for a in ACTIVITY_SOURCES if a != "llama"),
            ),
            _METRICS_URL,
            _GAUGE,
            _HEALTH_URL,
        ),
    ),
    EngineKindInfo(
        "synthetic",
        "synthetic (CPU work, no model)",
        (
            KindField("step_ms", "Step ms", "CPU work per decode step, in ms", f"{SynthDecl().step_ms:g}"),
            KindField("work_units", "Work units", "0: calibrate to the step", str(SynthDecl().work_units)),
        ),
    ),
)
KIND_BY_KEY = {k.key: k for k in KINDS}


def kind_engine(
    kind: str, values: Mapping[str, str], *, name: str, weight: float = 1.0, cwd: str | None = None
) -> EngineDecl:
    """The checked declaration of a vllm/sglang/tgi/command kind from a form's values (its `command`
    split as a shell would; for `command`, its activity/metrics_url/gauge/health_url); DeclarationError
    (`.field`: command, activity or health) for the first problem. llama-server and synthetic have their
    own fields (the form builds those as today)."""
    if kind not in ("vllm", "sglang", "tgi", "command"):
        raise DeclarationError("kind", kind, "kind_engine takes vllm, sglang, tgi or command")
    try:
        argv = shlex.split(values.get("command", ""))
    except ValueError as e:
        raise DeclarationError("command", values.get("command"), f"cannot split: {e}") from None
    table: dict[str, object] = {"name": name, "weight": weight, "command": argv, "kind": kind}
    if kind == "command":
        activity: dict[str, object] = {"source": values.get("activity") or "cpu"}
        activity |= {k: values[k] for k in ("metrics_url", "gauge") if values.get(k)}
        table["activity"] = activity
        table["health"] = {"url": values["health_url"]} if values.get("health_url") else "none"
    return parse_engine(table, cwd=cwd or ".")
