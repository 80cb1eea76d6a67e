"""`up`'s kind, activity and health keys (issue 19): each parses to the declaration `run` gets as its
options, and every bad value is one line naming file:line, the engine and the key (`up --check`, a
real subprocess)."""

from __future__ import annotations

import pytest

from gpushare_tui.core.engines import declaration, spawn
from gpushare_tui.core.engines.declaration import (
    ActivitySpec,
    DeclarationError,
    EngineDecl,
    HealthSpec,
    SourceOptions,
    parse_engine,
)
from gpushare_tui.core.engines.kinds import SUPERVISED_KINDS, kind
from testkit.cli import run_cli, run_cli_here
from testkit.engines import engine_command

ENGINE = engine_command("http_engine", "--port", "18123")


def _engine(**keys: object):
    return parse_engine({"name": "e", "command": ENGINE, **keys}, cwd=".")


@pytest.mark.parametrize(
    ("keys", "kind", "activity", "health"),
    [
        ({}, "command", None, None),
        ({"activity": "cpu"}, "command", ActivitySpec("cpu"), None),
        ({"activity": "always"}, "command", ActivitySpec("always"), None),
        ({"activity": "vllm"}, "vllm", ActivitySpec("vllm"), None),
        ({"kind": "sglang"}, "sglang", None, None),
        ({"activity": {"source": "cpu", "cpu_cores": 1.5}}, "command", ActivitySpec("cpu", cpu_cores=1.5), None),
        (
            {"activity": {"metrics_url": "http://127.0.0.1:9/metrics", "gauge": "g"}},
            "command",
            ActivitySpec("metrics", "http://127.0.0.1:9/metrics", "g"),
            None,
        ),
        ({"health": "none"}, "command", None, HealthSpec("none")),
        (
            {"health": {"url": "http://127.0.0.1:9/health"}},
            "command",
            None,
            HealthSpec("http", url="http://127.0.0.1:9/health"),
        ),
        ({"health": {"port": 9}}, "command", None, HealthSpec("tcp", port=9)),
        ({"health": {"log": "^ready"}}, "command", None, HealthSpec("log", log_regex="^ready")),
        ({"kind": "tgi", "health": "http"}, "tgi", None, HealthSpec("http")),
    ],
)
def test_activity_health_and_kind_parse(keys, kind, activity, health) -> None:
    e = _engine(**keys)
    assert (e.engine_kind, e.activity, e.health) == (kind, activity, health)


def test_kind_is_derived_from_the_command_and_synth() -> None:
    llama = parse_engine({"name": "l", "command": ["sh", "-m", "x"]}, cwd=".")
    assert llama.engine_kind == "command"
    assert parse_engine({"name": "s", "synth": {}}, cwd=".").engine_kind == "synth"
    assert _engine(activity="llama").engine_kind == "llama-server"


def test_run_options_carry_the_declaration_and_the_kinds_default() -> None:
    assert _engine().run_options() == SourceOptions()
    opts = _engine(activity={"source": "vllm", "metrics_url": "http://h:1/metrics"}, health={"port": 1}).run_options()
    assert (opts.activity, opts.metrics_url, opts.gauge, opts.health_port) == (
        "vllm",
        "http://h:1/metrics",
        None,
        1,
    )
    assert _engine(kind="command").run_options().activity == "cpu"
    assert _engine(kind="tgi").run_options().activity == "tgi"
    assert _engine(health="none").run_options().no_health is True
    argv = spawn.run_argv(
        ENGINE,
        gpu_key="k",
        weight=1.0,
        sources=_engine(activity={"gauge": "g", "metrics_url": "http://h:1/m"}, health={"log": "up"}).run_options(),
    )
    tail = argv[argv.index("run") + 1 : argv.index("--")]
    assert tail[tail.index("--activity") + 1] == "metrics" and tail[tail.index("--gauge") + 1] == "g"
    assert tail[tail.index("--metrics-url") + 1] == "http://h:1/m" and tail[tail.index("--health-log") + 1] == "up"
    assert "--no-health" not in tail and "--cpu-cores" not in tail
    assert "--no-health" in spawn.run_argv(
        ENGINE, gpu_key="k", weight=1.0, sources=_engine(health="none").run_options()
    )


def test_a_changed_activity_or_health_is_a_restart_not_a_reweight() -> None:
    base = _engine(activity="cpu")
    assert base.same_but_weight(_engine(activity="cpu", weight=3))
    assert not base.same_but_weight(_engine(activity="always"))
    assert not base.same_but_weight(_engine(activity="cpu", health="none"))
    assert not base.same_but_weight(_engine(activity={"source": "cpu", "cpu_cores": 2}))


# (id, engine keys as TOML text, what the one line must say after `engine 'e': `)
BAD = [
    (
        "source-unknown",
        'activity = "bogus"',
        "activity: must be one of llama, metrics, cpu, gpu, always, vllm, sglang, tgi, got 'bogus'",
    ),
    ("source-not-text", "activity = 3", 'activity: must be a source name or a table, e.g. activity = "cpu"'),
    ("metrics-no-url", 'activity = "metrics"', "activity: needs a metrics URL"),
    (
        "metrics-bad-url",
        'activity = { metrics_url = "ftp://h/m", gauge = "g" }',
        "needs a metrics URL (http://HOST:PORT/metrics), got 'ftp://h/m'",
    ),
    ("metrics-no-gauge", 'activity = { metrics_url = "http://h:1/metrics" }', "activity: needs the gauge"),
    ("preset-bad-url", 'activity = { source = "vllm", metrics_url = "h:1" }', "needs a metrics URL"),
    ("unknown-key", 'activity = { source = "cpu", cores = 2 }', "activity: unknown key 'cores'"),
    ("cores-zero", 'activity = { source = "cpu", cpu_cores = 0 }', "cpu_cores must be a number of cores > 0, got 0.0"),
    (
        "cores-text",
        'activity = { source = "cpu", cpu_cores = "2" }',
        "cpu_cores must be a number of cores > 0, got '2'",
    ),
    ("cores-not-cpu", 'activity = { source = "always", cpu_cores = 1 }', "cpu_cores goes with source cpu (not always)"),
    ("gauge-not-metrics", 'activity = { source = "cpu", gauge = "g" }', "metrics_url and gauge go with source metrics"),
    (
        "preset-of-other-kind",
        'kind = "vllm"\nactivity = "sglang"',
        "activity: is the preset of another kind than 'vllm'",
    ),
    ("kind-unknown", 'kind = "ollama"', "kind: must be one of llama-server, vllm, sglang, tgi, command, got 'ollama'"),
    ("health-unknown", 'health = "maybe"', 'health: must be "none", "http" or'),
    ("health-tcp-bare", 'health = "tcp"', "health: needs its value: health = { port = 8080 }, got 'tcp'"),
    ("health-log-bare", 'health = "log"', 'needs its value: health = { log = "ready" }'),
    ("health-http-command", 'health = "http"', "a command has no /health of its own"),
    ("health-url-bad", 'health = { url = "localhost:8000/health" }', "health: must be an http:// or https:// URL"),
    ("health-port-bad", "health = { port = 70000 }", "health: needs a TCP port 1..65535, got 70000"),
    ("health-port-text", 'health = { port = "80" }', "health: needs a TCP port 1..65535, got '80'"),
    ("health-two", 'health = { port = 80, log = "x" }', "health: give one of url, port, log"),
    ("health-regex-bad", 'health = { log = "(" }', "health: is not a valid regular expression"),
    ("health-unknown-key", 'health = { path = "/h" }', "health: unknown key 'path'"),
]


@pytest.mark.slow
def test_check_names_file_line_engine_and_key_for_each_bad_value(tmp_path, gpu_key) -> None:
    """`up --check` per bad value: one line on stderr, exit 2. The first in a real process, the others in this
    one (what `up --check` says is the subject, not its start-up: 23 processes took ~27 s on loaded workers)."""
    for i, (case, keys, needle) in enumerate(BAD):
        path = tmp_path / f"{case}.toml"
        command = ", ".join(f'"{a}"' for a in ENGINE)
        path.write_text(f'gpu_key = "{gpu_key}"\n\n[[engine]]\nname = "e"\ncommand = [{command}]\n{keys}\n')
        line = 6 + keys.count("\n")  # the key's own line: the last one written
        r = run_cli("up", "--check", str(path), timeout=60) if i == 0 else run_cli_here("up", "--check", str(path))
        assert (r.returncode, r.stdout) == (2, ""), (case, r.stderr)
        (msg,) = r.stderr.splitlines()
        assert msg.startswith(f"gpushare-tui: {path}:{line}: engine 'e': "), (case, msg)
        assert needle in msg, (case, msg)


def test_synth_takes_no_sources() -> None:
    with pytest.raises(DeclarationError, match="goes with command") as e:
        parse_engine({"name": "s", "synth": {}, "activity": "cpu"}, cwd=".")
    assert e.value.field == "activity"


def test_every_declared_kind_has_a_default_activity() -> None:
    for key in SUPERVISED_KINDS:
        choice = kind(key).activity_choice
        assert choice in declaration.ACTIVITY_CHOICES
        assert EngineDecl("e", command=("x",), kind=key).run_options().activity == choice


def test_the_any_engine_pages_toml_checks(tmp_path, monkeypatch, capsys) -> None:
    """docs/any-engine.md: its `up` example passes `up --check` with its programs on PATH."""
    from gpushare_tui.cli import main as cli_main
    from testkit.paths import REPO

    section = (REPO / "docs" / "any-engine.md").read_text()
    toml = section.split("```toml\n", 1)[1].split("```", 1)[0]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for program in ("vllm", "python"):
        (bin_dir / program).write_text("#!/bin/sh\n")
        (bin_dir / program).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    path = tmp_path / "gpushare.toml"
    path.write_text('gpu_key = "readme-any-engine"\n' + toml)
    assert cli_main(["up", "--check", str(path)]) == 0, capsys.readouterr().err
