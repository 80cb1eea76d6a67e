"""The engine kinds, one EngineKind record each: the one place that knows a kind's label and short name,
how its command line is recognised, its default port, its in-flight gauge, its default activity and
health sources, how its command is prepared and started, and the launch form's fields for it.
Everything else asks here (core.declaration resolves a command's kind and sources with these records,
the supervisor starts an engine through its kind's record, the dashboard shows `short`); a new kind is one
more record.

The form renders FORM_KINDS and turns its values into a checked declaration with
declaration.kind_engine (checked as `up` checks a file's), whose `run_options()` are the `run`/`launch`
options to start it with. Commands are the engines' own (checked against their docs: docs/engines.md); nothing is
added to them except for llama-server (--port/--host/--metrics/--slots, by the supervisor).

Where vLLM, SGLang and TGI listen when their command gives no --port, and the gauge that counts work in flight:
  vLLM   `vllm serve` --port default 8000: https://docs.vllm.ai/en/stable/cli/serve.html (and
         https://docs.vllm.ai/en/stable/usage/metrics/: "curl http://0.0.0.0:8000/metrics");
         vllm:num_requests_running, "Number of requests currently running on GPU"
  SGLang `python -m sglang.launch_server` --port default 30000:
         https://docs.sglang.io/references/production_metrics.html ("curl http://localhost:30000/metrics");
         sglang:num_running_reqs. SGLang serves /metrics only with --enable-metrics.
  TGI    `text-generation-launcher` --port default 3000 (its Docker image sets 80):
         https://huggingface.co/docs/text-generation-inference/reference/launcher;
         tgi_batch_current_size, "Current batch size" (https://huggingface.co/docs/text-generation-inference/reference/metrics)
Each serves GET /health (200 once the model is loaded) and /metrics on that port."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

# What "this engine is working now" may be read from (core/engines/activity/ implements each).
ACTIVITY_SOURCES = ("llama", "metrics", "cpu", "gpu", "always")
DEFAULT_ACTIVITY = "cpu"  # a command's, unless another source is chosen
SYNTH_STEP_MS_DEFAULT = 5.0  # a synthetic engine's work per step, in ms (see core/engines/synthetic.py)


@dataclass(frozen=True)
class KindField:
    key: str  # the form's field (and the value's key in `kind_engine`'s values)
    label: str
    hint: str
    default: str = ""
    choices: tuple[str, ...] = ()  # a closed set (a selector), else free text


@dataclass(frozen=True)
class EngineKind:
    """One engine kind. `programs`: the program names (basenames) that run it (`program_prefix`: a name
    that starts so, llama-server-b1234); `modules`: the Python packages `python -m PKG...` runs it from.
    `activity`: its own activity source (None: none of its own, `cpu` unless another is chosen);
    `gauge`: the Prometheus gauge that counts its work in flight (a preset: `--activity KEY` is the
    metrics source with that gauge at http://127.0.0.1:PORT/metrics); `own_health`: it serves GET
    /health on its port (else ready at once, unless told). `host_flag`: the flag that sets where it
    listens and the engine's own default host (the front proxy serves its public address and moves it to an
    internal one: core/engines/fronted.py). `supervised`: started by `run` under a
    supervisor (synth and python are processes of ours, which join themselves); `rewrites_command`:
    how it is prepared and started (core/engines/start.py): its port, host, --metrics and --slots given
    by the supervisor, started once its ports are known free (llama-server), else run as given; `in_form`:
    offered by the launch form, with `fields` (before the common weight/name/GPU key). This module
    imports nothing of the package: every other module may ask it."""

    key: str
    label: str
    short: str  # the dashboard's KIND cell
    programs: tuple[str, ...] = ()
    program_prefix: bool = False
    modules: tuple[str, ...] = ()
    default_port: int | None = None
    gauge: str | None = None
    activity: str | None = None
    own_health: bool = False
    host_flag: tuple[str, str] | None = None
    supervised: bool = True
    rewrites_command: bool = False
    in_form: bool = True
    fields: tuple[KindField, ...] = ()

    @property
    def preset(self) -> bool:
        """Whether `--activity KEY` names this kind's metrics (its gauge, on its port)."""
        return self.gauge is not None

    @property
    def activity_choice(self) -> str:
        """What `run --activity` is given for this kind's default: the preset's name, else its source."""
        return self.key if self.preset else (self.activity or DEFAULT_ACTIVITY)

    def recognises(self, argv: Sequence[str]) -> bool:
        """Whether a command line runs this kind (by its program, or `python -m` one of its modules)."""
        prog = os.path.basename(argv[0]) if argv else ""
        if prog in self.programs or (self.program_prefix and prog.startswith(self.programs)):
            return True
        return prog.startswith("python") and len(argv) > 2 and argv[1] == "-m" and argv[2].split(".")[0] in self.modules

    def defaults(self) -> dict[str, str]:
        return {f.key: f.default for f in self.fields}


LLAMA_SERVER = "llama-server"
COMMAND = "command"
SYNTH = "synth"


def _command(default: str) -> KindField:
    return KindField("command", "Command", "the engine's command line, run as given", default)


def _preset(
    key: str, label: str, port: int, gauge: str, program: str, tail: str, host_flag: tuple[str, str], **recognised
) -> EngineKind:
    """A served engine with a Prometheus gauge and a /health of its own on `port` (vLLM, SGLang, TGI)."""
    line = f"{program} --port {port} {tail}"
    return EngineKind(
        key,
        label,
        key,
        default_port=port,
        gauge=gauge,
        activity="metrics",
        own_health=True,
        host_flag=host_flag,
        fields=(_command(line),),
        **recognised,
    )


KINDS: tuple[EngineKind, ...] = (
    EngineKind(
        LLAMA_SERVER,
        "llama-server",
        "llama",
        programs=(LLAMA_SERVER,),
        program_prefix=True,
        rewrites_command=True,
        activity="llama",
        own_health=True,
        fields=(
            KindField("binary", "Engine binary", "llama-server, or a path", "llama-server"),
            KindField("model", "Model path", "/path/to/model.gguf"),
            KindField("port", "Port", "empty: a free port"),
            KindField("extra", "Extra args", "e.g. -c 4096 -t 4"),
        ),
    ),
    _preset(
        "vllm",
        "vLLM",
        8000,
        "vllm:num_requests_running",
        "vllm serve MODEL",
        "--gpu-memory-utilization 0.45",
        ("--host", "0.0.0.0"),
        programs=("vllm",),
        modules=("vllm",),
    ),
    _preset(
        "sglang",
        "SGLang",
        30000,
        "sglang:num_running_reqs",
        "python -m sglang.launch_server --model-path MODEL",
        "--enable-metrics --mem-fraction-static 0.45",
        ("--host", "127.0.0.1"),
        modules=("sglang",),
    ),
    _preset(
        "tgi",
        "TGI",
        3000,
        "tgi_batch_current_size",
        "text-generation-launcher --model-id MODEL",
        "--cuda-memory-fraction 0.45",
        ("--hostname", "0.0.0.0"),
        programs=("text-generation-launcher",),
    ),
    EngineKind(
        COMMAND,
        "any command (a training job, a server)",
        "cmd",
        fields=(
            _command("python train.py"),
            KindField("activity", "Activity", "when it is working", "always", ACTIVITY_SOURCES[1:]),
            KindField("metrics_url", "Metrics URL", "metrics: http://127.0.0.1:PORT/metrics"),
            KindField("gauge", "Gauge", "metrics: the gauge of work in flight"),
            KindField("health_url", "Health URL", "empty: ready at once (or http://.../health)"),
        ),
    ),
    EngineKind(
        SYNTH,
        "synthetic (CPU work, no model)",
        SYNTH,
        supervised=False,
        fields=(
            KindField(
                "step_ms",
                "Step ms",
                "work per decode step, in ms at the reference rate",
                f"{SYNTH_STEP_MS_DEFAULT:g}",
            ),
            KindField("work_units", "Work units", "empty: step_ms's; 0: calibrate to the step here", ""),
        ),
    ),
    # an in-process GpuShare (examples/): reports itself, never started by us
    EngineKind("python", "a Python process (GpuShare)", "py", supervised=False, in_form=False),
)
KIND_BY_KEY = {k.key: k for k in KINDS}
KIND_ALIASES = {"synthetic": SYNTH}  # the form's name for synth before one name was kept
FORM_KINDS = tuple(k for k in KINDS if k.in_form)
SUPERVISED_KINDS = tuple(k.key for k in KINDS if k.supervised)  # what `up`'s `kind` key may name
PRESETS = {k.key: k for k in KINDS if k.preset}


def kind_named(name: object) -> EngineKind | None:
    """The kind of that key (or an alias of one), else None."""
    if not isinstance(name, str):
        return None
    return KIND_BY_KEY.get(KIND_ALIASES.get(name, name))


def kind(key: str) -> EngineKind:
    """The kind of a key known to be one (KeyError otherwise)."""
    return KIND_BY_KEY[KIND_ALIASES.get(key, key)]


def command_kind(argv: Sequence[str]) -> str:
    """The supervised kind a command line shows: llama-server, vllm, sglang, tgi, else `command`."""
    return next((k.key for k in KINDS if k.supervised and k.recognises(argv)), COMMAND)


def is_llama_server(argv: Sequence[str]) -> bool:
    """Whether a command's program is llama-server (the one engine whose arguments we add to)."""
    return KIND_BY_KEY[LLAMA_SERVER].recognises(argv)
