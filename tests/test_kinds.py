"""core/engines/kinds.py: the launch form's table of engine kinds, and the declaration its values make."""

from __future__ import annotations

import sys

import pytest

from gpushare_tui.core.engines import declaration
from gpushare_tui.core.engines.declaration import DeclarationError, kind_engine
from gpushare_tui.core.engines.kinds import (
    FORM_KINDS,
    KIND_BY_KEY,
    KINDS,
    SUPERVISED_KINDS,
    command_kind,
    kind,
    kind_named,
)


def test_the_table_offers_every_declarable_kind_once() -> None:
    assert [k.key for k in FORM_KINDS] == [*SUPERVISED_KINDS, "synth"]
    assert len(KIND_BY_KEY) == len(KINDS)
    for k in FORM_KINDS:
        assert k.fields and len({f.key for f in k.fields}) == len(k.fields)
        assert all(not f.choices or f.default in f.choices for f in k.fields)
    assert KIND_BY_KEY["synth"].defaults() == {"step_ms": "5", "work_units": ""}


def test_synth_has_one_name_and_the_old_one_is_an_alias() -> None:
    """`synth` is the kind's one name (status, the dashboard, the form); `synthetic`, the form's old one, too."""
    assert kind_named("synthetic") is kind_named("synth") is kind("synthetic") is KIND_BY_KEY["synth"]
    assert "synthetic" not in KIND_BY_KEY and kind_named("nope") is None and kind_named(None) is None


@pytest.mark.parametrize("key", ["vllm", "sglang", "tgi"])
def test_each_preset_kinds_default_command_names_its_own_port_and_is_recognised(key) -> None:
    (command,) = KIND_BY_KEY[key].fields
    argv = command.default.split()
    assert declaration.engine_port(argv) == KIND_BY_KEY[key].default_port
    assert command_kind(argv) == key


def test_a_preset_kinds_sources_come_from_its_record() -> None:
    """The port, gauge and health a preset resolves to are its record's, and nothing else's."""
    for k in KINDS:
        if not k.preset:
            continue
        sources = declaration.resolve_sources(("x",), declaration.SourceOptions(activity=k.key))
        assert (sources.kind, sources.port, sources.activity.gauge) == (k.key, k.default_port, k.gauge)
        assert sources.activity.metrics_url == f"http://127.0.0.1:{k.default_port}/metrics"
        assert sources.health.url == f"http://127.0.0.1:{k.default_port}/health"


def test_no_module_outside_the_registry_names_a_kinds_port_gauge_or_program() -> None:
    """Each kind lives in one record (core/engines/kinds.py): its default port, gauge and program are
    written there only (docs, tests and the registry itself aside)."""
    import pathlib
    import re

    import gpushare_tui

    package = pathlib.Path(gpushare_tui.__file__).parent
    words = set()
    for k in KINDS:
        words |= {str(k.default_port)} if k.default_port else set()
        words |= {k.gauge} if k.gauge else set()
        words |= {p for p in k.programs if p != k.key} | {f"{m}." for m in k.modules}  # a key names the kind
    found = []
    for path in package.rglob("*.py"):
        if path.name == "kinds.py" and path.parent.name == "engines":
            continue
        text = path.read_text()
        found += [f"{path.relative_to(package)}: {w}" for w in words if re.search(rf"(?<![\w.-]){re.escape(w)}", text)]
    assert not found, found


def test_a_preset_kind_runs_with_its_preset() -> None:
    e = kind_engine("vllm", {"command": f"{sys.executable} -c pass --port 8001"}, name="v")
    assert (e.engine_kind, e.run_options().activity) == ("vllm", "vllm")
    assert e.command == (sys.executable, "-c", "pass", "--port", "8001")


def test_a_command_runs_with_the_chosen_source_and_health() -> None:
    e = kind_engine("command", {"command": f"{sys.executable} -c pass", "activity": "always"}, name="job")
    opts = e.run_options()
    assert (opts.activity, opts.no_health) == ("always", True)
    e = kind_engine(
        "command",
        {
            "command": f"{sys.executable} -c pass",
            "activity": "metrics",
            "metrics_url": "http://127.0.0.1:9/metrics",
            "gauge": "g",
            "health_url": "http://127.0.0.1:9/health",
        },
        name="srv",
    )
    opts = e.run_options()
    assert (opts.activity, opts.gauge, opts.health_url) == ("metrics", "g", "http://127.0.0.1:9/health")


@pytest.mark.parametrize(
    ("kind", "values", "field", "needle"),
    [
        ("vllm", {"command": "no-such-vllm-xyz serve m"}, "command", "not on PATH"),
        ("vllm", {"command": "'unclosed"}, "command", "cannot split"),
        ("command", {"command": "sh", "activity": "metrics"}, "activity", "needs a metrics URL"),
        ("command", {"command": "sh", "health_url": "localhost:1"}, "health", "http:// or https://"),
        ("llama-server", {}, "kind", "takes vllm, sglang, tgi, command"),
    ],
)
def test_bad_values_name_their_field(kind, values, field, needle) -> None:
    with pytest.raises(DeclarationError, match=needle) as e:
        kind_engine(kind, values, name="x")
    assert e.value.field == field


def test_the_table_is_ui_free_and_the_forms_only_one() -> None:
    """core/engines/kinds.py imports no UI; the launch form renders it and keeps no table of its own."""
    import subprocess

    code = (
        "import sys, gpushare_tui.core.engines.kinds; sys.exit(any(m.split('.')[0] == 'textual' for m in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
    from gpushare_tui.widgets import launch_form

    assert not hasattr(launch_form, "KINDS")
    assert {f.key for f in launch_form.FIELDS} >= {f.key for k in FORM_KINDS for f in k.fields}
