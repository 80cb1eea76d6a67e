"""`up` config files: every error class is one line naming the file, line, engine and key, exit 2,
with nothing started; `--check` validates without starting anything."""

from __future__ import annotations

import json
import os
import textwrap
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushare_tui.cli import main as cli_main
from gpushare_tui.core.registry.abi import WEIGHT_RULE
from gpushare_tui.up import config
from gpushare_tui.up.backoff import Backoff
from gpushare_tui.up.lines import key_line
from testkit.paths import REPO

GOOD = """\
gpu_key = "@KEY@"

[[engine]]
name = "chat"
weight = 3
command = ["sh", "-c", "sleep 1", "--port", "8080"]
restart = "always"
env = { CUDA_VISIBLE_DEVICES = "0" }

[[engine]]
name = "batch"
weight = 1
synth = { step_ms = 5 }
"""

# (id, text, expected line of the error (None: no line), text the message must contain)
BAD = [
    ("syntax", 'gpu_key = "k"\n[[engine]]\nname = \n', 3, "invalid TOML"),
    ("unknown-top", 'gpu_key = "k"\ngpus = 1\n[[engine]]\nname = "a"\nsynth = {}\n', 2, "gpus: unknown key"),
    ("unknown-engine", GOOD.replace("weight = 1\n", "wieght = 1\n"), 12, "engine 'batch': wieght: unknown key"),
    ("unknown-serve", GOOD + '[serve]\nlisten = "127.0.0.1:1"\nport = 3\n', 16, "serve.port: unknown key"),
    ("unknown-synth", GOOD.replace("step_ms = 5", "steps = 5"), 13, "engine 'batch': synth: unknown key 'steps'"),
    ("duplicate-name", GOOD.replace('name = "batch"', 'name = "chat"'), 11, "engine 'chat': name: duplicate name"),
    ("weight-zero", GOOD.replace("weight = 3", "weight = 0"), 5, f"engine 'chat': weight: {WEIGHT_RULE}"),
    ("weight-negative", GOOD.replace("weight = 3", "weight = -2"), 5, f"weight: {WEIGHT_RULE}"),
    ("weight-nan", GOOD.replace("weight = 3", "weight = nan"), 5, f"weight: {WEIGHT_RULE}"),
    ("weight-inf", GOOD.replace("weight = 3", "weight = inf"), 5, f"weight: {WEIGHT_RULE}"),
    ("weight-string", GOOD.replace("weight = 3", 'weight = "3"'), 5, "weight: must be a number > 0"),
    ("command-empty", GOOD.replace('["sh", "-c", "sleep 1", "--port", "8080"]', "[]"), 6, "command: is empty"),
    ("command-not-list", GOOD.replace('["sh", "-c", "sleep 1", "--port", "8080"]', '"sh"'), 6, "array of strings"),
    ("binary-missing", GOOD.replace('["sh"', '["no-such-engine-xyz"'), 6, "engine binary 'no-such-engine-xyz': not on"),
    ("binary-relative-missing", GOOD.replace('["sh"', '["./bin/llama-server"'), 6, "llama-server': no such file"),
    ("no-command", GOOD.replace("synth = { step_ms = 5 }\n", ""), 10, "engine 'batch': command: missing"),
    ("command-and-synth", GOOD.replace("weight = 1\n", 'weight = 1\ncommand = ["sh"]\n'), 14, "not both"),
    ("no-name", GOOD.replace('name = "batch"\n', ""), 10, "engine #2: name: missing"),
    ("name-empty", GOOD.replace('name = "batch"', 'name = ""'), 11, "name: must be a non-empty string"),
    ("restart-bad", GOOD.replace('restart = "always"', 'restart = "sometimes"'), 7, "restart: must be one of"),
    ("env-bad", GOOD.replace('"0" }', "0 }"), 8, "env: must be a table of strings"),
    ("slo-negative", GOOD.replace('"always"\n', '"always"\nslo = { ttft_p99_ms = -1 }\n'), 8, "ttft_p99_ms -1: must"),
    (
        "slo-bounds",
        GOOD.replace('"always"\n', '"always"\nslo = { itl_p99_ms = 9, weight_min = 4, weight_max = 2 }\n'),
        8,
        "engine 'chat': slo: weight_min 4 is above weight_max 2",
    ),  # fmt: skip
    (
        "slo-synth",
        GOOD.replace("step_ms = 5 }\n", "step_ms = 5 }\nslo = { ttft_p99_ms = 30 }\n"),
        14,
        "goes with command",
    ),
    ("gpu-key-bad", GOOD.replace('gpu_key = "@KEY@"', 'gpu_key = "../x"'), 1, "gpu_key: use 1..64 characters of"),
    ("gpu-and-key", GOOD.replace('gpu_key = "@KEY@"', 'gpu_key = "k"\ngpu = 0'), 2, "gpu: give gpu_key or gpu"),
    ("gpu-negative", GOOD.replace("weight = 1\n", "weight = 1\ngpu = -1\n"), 13, "gpu: must be a GPU index"),
    ("port-twice", GOOD.replace("synth = { step_ms = 5 }", 'command = ["sh", "--port", "8080"]'), 13, "port 8080"),
    ("port-bad", GOOD.replace('"8080"]', '"http"]'), 6, "command: --port 'http': must be 1..65535"),
    ("serve-listen-bad", GOOD + '[serve]\nlisten = "9464"\n', 15, "serve.listen: use HOST:PORT"),
    ("no-engine", 'gpu_key = "k"\n', None, "no engine declared"),
    ("engine-not-table", 'gpu_key = "k"\nengine = 3\n', 2, "engine: must be an array of tables"),
    ("step-bad", GOOD.replace("step_ms = 5", "step_ms = 0"), 13, "synth: step_ms 0: must be between 0.05 and 10000"),
    ("load-timeout-bad", GOOD.replace("weight = 1\n", "weight = 1\nload_timeout_s = -1\n"), 13, "load_timeout_s:"),
    ("not-utf8", None, None, "not UTF-8"),
]


def _write(tmp_path, text: str | None, key: str) -> str:
    path = tmp_path / "gpushare.toml"
    if text is None:
        path.write_bytes(b'name = "\xff"\n')
    else:
        path.write_text(text.replace("@KEY@", key))
    return str(path)


@pytest.mark.parametrize(("text", "line", "needle"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
@pytest.mark.parametrize("how", ["--check", "run"])
def test_config_error_is_one_line_exit_2(tmp_path, gpu_key, runtime_dir, capsys, text, line, needle, how) -> None:
    path = _write(tmp_path, text, gpu_key)
    argv = ["up", "--check", path] if how == "--check" else ["up", path]
    assert cli_main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    (msg,) = err.splitlines()
    prefix = f"gpushare-tui: {path}:{line}: " if line else f"gpushare-tui: {path}: "
    assert msg.startswith(prefix), msg
    assert needle in msg, msg


def test_missing_file_is_one_line_exit_2(tmp_path, capsys) -> None:
    path = str(tmp_path / "nope.toml")
    assert cli_main(["up", "--check", path]) == 2
    assert capsys.readouterr().err.splitlines() == [f"gpushare-tui: {path}: cannot read: No such file or directory"]


def test_check_accepts_a_good_file_and_starts_nothing(tmp_path, gpu_key, runtime_dir, capsys) -> None:
    path = _write(tmp_path, GOOD, gpu_key)
    assert cli_main(["up", "--check", path]) == 0
    out = capsys.readouterr().out
    assert out.strip() == f"{path}: ok: chat (weight 3, key {gpu_key}), batch (weight 1, key {gpu_key})"
    cfg = config.load(path)
    chat, batch = cfg.engines
    assert chat.command[0] == "sh" and chat.restart == "always" and dict(chat.env) == {"CUDA_VISIBLE_DEVICES": "0"}
    assert batch.synth == config.SynthDecl(5.0, None) and batch.restart == "on-failure" and batch.weight == 1.0


def test_gpu_index_without_nvml_names_the_engine(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU visible: index 0 has no key here
    path = tmp_path / "g.toml"
    path.write_text('gpu = 0\n[[engine]]\nname = "a"\nsynth = {}\n')
    assert cli_main(["up", "--check", str(path)]) == 2
    (msg,) = capsys.readouterr().err.splitlines()
    assert msg.startswith(f"gpushare-tui: {path}: engine 'a': gpu 0: no GPU 0"), msg


def test_same_but_weight() -> None:
    a = config.EngineDecl("a", 1.0, ("x",))
    assert a.same_but_weight(config.EngineDecl("a", 5.0, ("x",)))
    assert not a.same_but_weight(config.EngineDecl("a", 1.0, ("y",)))
    assert not a.same_but_weight(config.EngineDecl("a", 1.0, ("x",), restart="never"))


def test_key_line_finds_keys_in_engine_blocks() -> None:
    text = textwrap.dedent(GOOD)
    assert key_line(text, "engine", "weight", 1) == 12
    assert key_line(text, "engine", "env", 0) == 8
    assert key_line(text, "engine", "missing", 1) == 10  # the block's header
    assert key_line(text, None, "gpu_key") == 1
    assert key_line(text, "engine", "name", 5) is None


def test_backoff_doubles_to_60_s_and_resets_after_5_min_healthy() -> None:
    b = Backoff()
    assert [b.on_exit(0.5) for _ in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert b.crash_loop
    assert b.on_exit(300.0) == 1 and not b.crash_loop
    assert b.on_exit(299.0) == 2


def test_deploy_examples_are_valid(tmp_path, capsys, monkeypatch) -> None:
    """The README's examples: the synth one as is, the llama one with a llama-server on PATH and its
    models (relative to the file) in place."""
    deploy = REPO / "deploy"
    assert cli_main(["up", "--check", str(deploy / "synth.toml")]) == 0
    fake = tmp_path / "bin" / "llama-server"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    example = tmp_path / "gpushare.toml"
    example.write_text((deploy / "gpushare.toml").read_text())
    with pytest.raises(config.ConfigError, match=r"engine 'chat': command: model 'models/chat.gguf': no such file"):
        config.load(str(example))
    (tmp_path / "models").mkdir()
    for model in ("chat.gguf", "batch.gguf"):
        (tmp_path / "models" / model).write_bytes(b"GGUF")
    cfg = config.load(str(example))
    assert [(e.name, e.weight) for e in cfg.engines] == [("chat", 3.0), ("batch", 1.0)] and cfg.gpu == 0


@pytest.mark.parametrize("raw", ["", "not json", "[]", '{"config": "f"}', '{"config": "f", "pid": 1, "weight": "x"}'])
def test_owner_env_malformed_is_no_owner_and_is_not_inherited(monkeypatch, raw) -> None:
    from gpushare_tui.core.registry import ownership

    monkeypatch.setenv(ownership.ENV, raw)
    assert ownership.Owner.from_env() is None
    assert ownership.ENV not in os.environ


def test_owner_env_round_trip_and_wrapped_handlers(monkeypatch) -> None:
    import os

    from gpushare_tui.core.registry import ownership

    r, w = os.pipe()
    monkeypatch.setenv(ownership.ENV, ownership.Owner("/x/g.toml", 42, 3.0, 2, w).to_env())
    owner = ownership.Owner.from_env()
    assert owner == ownership.Owner("/x/g.toml", 42, 3.0, 2, w) and ownership.ENV not in os.environ
    calls = []
    h = owner.wrap({"stop": lambda q: calls.append("stop") or {}, "set_weight": lambda q: {"weight": q["weight"]}})
    h["set_weight"]({"weight": 5.0})
    assert owner.config_weight == 3.0  # a live edit is not the file's
    h["set_weight"]({"weight": 4.0, "config": True})
    assert owner.config_weight == 4.0  # a reload is
    h["stop"]({})
    assert calls == ["stop"] and os.read(r, 10) == ownership.STOP_EVENT
    assert owner.status_fields() == {
        "owner": "up",
        "owner_pid": 42,
        "config": "/x/g.toml",
        "config_weight": 4.0,
        "restarts": 2,
    }
    os.close(r)
    os.close(w)


# (listen, whether serve accepts it): `up --check` must agree, since `up` starts `serve --listen` with it
LISTEN = [
    ("0.0.0.0:0", True),  # port 0: any free port
    ("127.0.0.1:0", True),
    ("localhost:0", True),
    ("myhost:9464", False),  # a name: never resolved
    ("9464", False),
    (":9464", False),
    ("127.0.0.1:70000", False),
    ("127.0.0.1:-1", False),
    ("127.0.0.1:http", False),
    ("[::1", False),
]


@pytest.mark.parametrize(("listen", "ok"), LISTEN)
def test_serve_listen_is_checked_as_serve_checks_it(tmp_path, gpu_key, runtime_dir, capsys, listen, ok) -> None:
    from gpushare_tui.serve.run import open_server

    path = _write(tmp_path, GOOD + f'[serve]\nlisten = "{listen}"\n', gpu_key)
    assert cli_main(["up", "--check", path]) == (0 if ok else 2)
    up_out, up_err = capsys.readouterr()
    if ok:
        assert up_out.strip().endswith(f"; serve on {listen}") and up_err == ""
        server = open_server(listen, gpu_key)  # serve's own start: parses and binds
        server.server_close()
        server.exporter.close()
        return
    (up_line,) = up_err.splitlines()
    assert up_line.startswith(f"gpushare-tui: {path}:15: serve.listen: "), up_line
    assert cli_main(["serve", "--listen", listen, "--gpu-key", gpu_key]) == 2
    (serve_line,) = capsys.readouterr().err.splitlines()
    assert serve_line.startswith(f"gpushare-tui: invalid --listen {listen!r}: ")
    problem = serve_line.split(": ", 2)[2]
    assert up_line.endswith(f"serve.listen: {problem}, got {listen!r}"), (up_line, serve_line)


# -- fuzzing the loader (hypothesis): arbitrary bytes or TOML in, a config or one ConfigError out ----------


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
_KEYS = [*config.TOP_KEYS, "name", "weight", "command", "synth", "restart", "env", "gpu_key", "gpu", "listen", "x"]
_scalars = (
    st.text(max_size=12)
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.booleans()
    | st.sampled_from(["sh", "always", "never", "on-failure", "127.0.0.1:0", "--port", "8080", "@K@"])
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(_KEYS), inner, max_size=4),
    max_leaves=12,
)
_tables = st.dictionaries(st.sampled_from(_KEYS), _values, max_size=6)
_documents = st.fixed_dictionaries(
    {},
    optional={
        "gpu_key": st.sampled_from(["@K@", "", "../x"]) | _values,
        "gpu": _values,
        "share_group": _values,
        "serve": _values,
        "engine": st.lists(_tables, max_size=18) | _values,
        "x": _values,
    },
)


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if v != v else ("inf" if v > 0 else "-inf") if v in (float("inf"), float("-inf")) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a TOML basic string (no lone surrogates: st.text has none)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    assert isinstance(v, dict)
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"


def _toml_document(doc: dict) -> str:
    top = [f"{k} = {_toml_value(v)}" for k, v in doc.items() if k != "engine" or not _is_tables(v)]
    tables = [
        "[[engine]]\n" + "".join(f"{json.dumps(k)} = {_toml_value(x)}\n" for k, x in t.items())
        for t in (doc["engine"] if _is_tables(doc.get("engine")) else [])
    ]
    return "\n".join(top) + "\n" + "\n".join(tables)


def _is_tables(v: object) -> bool:
    return isinstance(v, list) and all(isinstance(t, dict) for t in v) and bool(v)


def _load_or_one_error(path: str) -> None:
    """The contract: a valid UpConfig, or a ConfigError of one line starting `PATH:` (then the line
    where one is known); any other exception fails the test."""
    try:
        cfg = config.load(path)
    except config.ConfigError as e:
        msg = str(e)
        assert msg.startswith(f"{path}:") and "\n" not in msg, msg
        return
    assert isinstance(cfg, config.UpConfig) and cfg.engines
    per_key = Counter(config.declared_key(e, cfg.gpu_key, cfg.gpu) for e in cfg.engines)
    assert max(per_key.values()) <= 16


@FUZZ
@given(raw=st.binary(max_size=2048))
def test_fuzz_arbitrary_bytes(tmp_path, raw: bytes) -> None:
    path = tmp_path / "fuzz.toml"
    path.write_bytes(raw)
    _load_or_one_error(str(path))


@FUZZ
@given(doc=_documents)
def test_fuzz_arbitrary_toml_documents(tmp_path, gpu_key: str, doc: dict) -> None:
    text = _toml_document(doc).replace("@K@", gpu_key)
    path = tmp_path / "fuzz.toml"
    path.write_text(text)
    _load_or_one_error(str(path))


def test_deep_nesting_is_one_error(tmp_path) -> None:
    path = tmp_path / "deep.toml"
    path.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(config.ConfigError, match=rf"^{path}"):
        config.load(str(path))
