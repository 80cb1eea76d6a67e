"""core/engines/declaration.py: the one validator of engine declarations, and its callers agreeing with it."""

from __future__ import annotations

import dataclasses
import math
import sys
import unicodedata

import pytest

from gpushare_tui.core.engines import declaration
from gpushare_tui.core.engines.declaration import DeclarationError, EngineDecl, SynthDecl
from gpushare_tui.core.host.errors import UsageError
from gpushare_tui.core.registry import abi
from gpushare_tui.up import config
from gpushare_tui.widgets.launch_form import validate_launch


def _name_ok(name: str) -> bool:
    return (
        bool(name.strip())
        # control, format (bidi, zero-width), surrogate and line/paragraph separator characters:
        # what a view would replace (core/host/text.py) is refused in our own names
        and not any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp") for c in name)
        and len(name.encode()) <= abi.NAME_BYTES
    )


# hypothesis is not a dependency of this project: the inputs are enumerated instead
NAMES = ["a", "synth", " x ", "é" * 24, "é" * 24 + "a", "é" * 25, "x" * 48, "x" * 49, "日本語モデル", "", "  ", "\t"]
NAMES += [f"a{chr(c)}b" for c in [*range(0, 32), 127, *range(0x80, 0xA0), 0xA0, 0x200B, 0x2028, 0x202E, 0x2066]]
NAMES += ["a\ufeffb", "a\udcffb"]


@pytest.mark.parametrize("name", NAMES, ids=repr)
def test_a_name_is_accepted_exactly_when_the_slot_holds_it_as_given(name: str) -> None:
    if _name_ok(name):
        assert declaration.check_name(name) == name
        assert abi.encode_name(name).rstrip(b"\0") == name.encode()  # never truncated
    else:
        with pytest.raises(DeclarationError) as e:
            declaration.check_name(name)
        assert e.value.field == "name"


def test_port_range() -> None:
    for n in range(-2, 70_000):
        for any_port, low in ((False, 1), (True, 0)):
            if low <= n <= 65535:
                assert declaration.check_port(str(n), any_port=any_port) == n
            else:
                with pytest.raises(DeclarationError, match=rf"^invalid --port '{n}': must be {low}\.\.65535$"):
                    declaration.check_port(str(n), any_port=any_port)


@pytest.mark.parametrize("text", ["", "abc", " 80", "80 ", "+80", "8_0", "٨٠", "1e3"])
def test_port_is_ascii_digits_only(text: str) -> None:
    with pytest.raises(DeclarationError) as e:
        declaration.check_port(text)
    assert (e.value.field, e.value.part, e.value.label) == ("command", "port", "--port")


WEIGHTS = [1, 0.5, 3, 1e-30, 1e-50, 3.4e38, 1e39, 0, -1, -0.0, math.nan, math.inf, -math.inf, True, "2", " 2", "x", ""]


@pytest.mark.parametrize("value", WEIGHTS, ids=repr)
def test_weight_is_abis_check(value: float | int | str) -> None:
    """Not a second weight check: the validator says what abi.parse_weight says."""
    try:
        expected = abi.parse_weight(value)
    except abi.BadWeightError as e:
        with pytest.raises(DeclarationError) as got:
            declaration.check_weight(value)
        assert str(got.value) == str(e) and got.value.problem == abi.WEIGHT_RULE
    else:
        assert declaration.check_weight(value) == expected and math.isfinite(expected)


def test_errors_are_usage_errors_naming_field_and_part() -> None:
    e = DeclarationError("command", "x", "no such file", part="binary")
    assert isinstance(e, UsageError) and isinstance(e, ValueError)
    assert (e.field, e.part, e.label, str(e)) == (
        "command",
        "binary",
        "engine binary",
        "invalid engine binary 'x': no such file",
    )
    assert str(DeclarationError("name", None, "missing")) == "invalid name: missing"


def test_engine_keys_are_the_declarations_fields() -> None:
    assert declaration.ENGINE_KEYS == tuple(f.metadata.get("key", f.name) for f in dataclasses.fields(EngineDecl))
    assert declaration.SYNTH_KEYS == tuple(f.name for f in dataclasses.fields(SynthDecl))
    assert config.EngineDecl is EngineDecl and config.SynthDecl is SynthDecl  # up's names for them


def test_a_table_of_every_key_parses_to_the_declaration(tmp_path) -> None:
    engine = tmp_path / "engine"
    engine.write_text("#!/bin/sh\n")
    engine.chmod(0o755)
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    table = {
        "name": "chat",
        "weight": 2,
        "command": ["./engine", "-m", "m.gguf", "--port", "8080"],
        "restart": "never",
        "env": {"B": "2", "A": "1"},
        "gpu_key": "k",
        "load_timeout_s": 5,
        "class": "interactive",
    }
    decl = declaration.parse_engine(table, cwd=str(tmp_path))
    assert decl == EngineDecl(
        "chat",
        2.0,
        ("./engine", "-m", "m.gguf", "--port", "8080"),
        None,
        "never",
        (("A", "1"), ("B", "2")),
        "k",
        None,
        5.0,
        "interactive",
    )
    assert declaration.engine_port(decl.command) == 8080
    synth = declaration.parse_engine({"name": "s", "synth": {"step_ms": 2, "work_units": 7}}, cwd=str(tmp_path))
    assert synth.synth == SynthDecl(2.0, 7) and synth.command == ()


def test_command_problems_names_each_part(tmp_path) -> None:
    not_exec = tmp_path / "llama-server"  # -m is a model for llama-server only
    not_exec.write_text("")
    problems = declaration.command_problems(
        [str(not_exec), "--model", str(tmp_path / "none.gguf"), "--port=0"], cwd=str(tmp_path)
    )
    assert [(p.part, p.problem) for p in problems] == [
        ("binary", "not executable"),
        ("model", "no such file"),
        ("port", "must be 1..65535"),
    ]
    assert [p.part for p in declaration.command_problems(["no-such-program-xyz"])] == ["binary"]
    assert declaration.command_problems([sys.executable, "-m", "http.server", "--port", "8000"]) == []
    assert declaration.command_problems(["sh", "-c", "true"]) == []  # no -m, no --port: nothing more to check


BAD_NAMES = [
    "",
    "   ",
    "é" * 25,
    "tab\there",
    "bell\x07",
    "del\x7f",
    "c1\x85x",
]  # (the form strips what str.strip does, \x85 included)


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_every_caller_rejects_the_same_names(name: str, tmp_path) -> None:
    """up's file, the launch form and synth/run/launch's --name: one rule (run/launch: see test_cli)."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(config.ConfigError, match=r": engine (#1|'.*'): name: "):
        config.parse({"engine": [{"name": name, "synth": {}}]}, str(tmp_path / "f.toml"))
    _, errors = validate_launch(
        {"binary": "/bin/true", "model": str(model), "weight": "1", "gpu_key": "k", "name": name}
    )
    if name.strip():  # the form's empty name means "the model file's"
        assert set(errors) == {"name"}
    with pytest.raises(DeclarationError, match="^invalid --name "):
        declaration.check_name(name, label="--name")


def test_synth_rejects_a_name_it_used_to_truncate(gpu_key: str, capsys) -> None:
    from gpushare_tui.cli import main

    name = "é" * 25
    assert main(["synth", "--weight", "1", "--gpu-key", gpu_key, "--name", name, "--duration", "0.1"]) == 2
    assert capsys.readouterr() == ("", f"gpushare-tui: invalid --name {name!r}: must be at most 48 bytes (UTF-8)\n")


def test_class_is_interactive_or_batch_and_batch_by_default(tmp_path) -> None:
    """The latency class (spec §7): `class = "interactive"` in `up`, batch when not given; anything else
    is a DeclarationError on field `class` (up's file:line names the key)."""
    assert declaration.check_class("interactive") == "interactive" and declaration.check_class("batch") == "batch"
    assert declaration.parse_engine({"name": "s", "synth": {}}, cwd=str(tmp_path)).klass == "batch"
    for bad in ("Interactive", "", None, 1, "realtime"):
        with pytest.raises(DeclarationError) as e:
            declaration.parse_engine({"name": "s", "synth": {}, "class": bad}, cwd=str(tmp_path))
        assert e.value.field == "class" and "must be one of interactive, batch" in str(e.value)
    with pytest.raises(DeclarationError, match="invalid --class 'x'"):
        declaration.check_class("x", label="--class")
