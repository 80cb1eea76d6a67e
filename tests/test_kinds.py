"""core/engines/kinds.py: the launch form's table of engine kinds, and the declaration its values make."""

from __future__ import annotations

import sys

import pytest

from gpushare_tui.core.engines import declaration
from gpushare_tui.core.engines.declaration import DeclarationError
from gpushare_tui.core.engines.kinds import KIND_BY_KEY, KINDS, kind_engine


def test_the_table_offers_every_declarable_kind_once() -> None:
    assert [k.key for k in KINDS] == [*declaration.ENGINE_KINDS[:4], "command", "synthetic"]
    assert len(KIND_BY_KEY) == len(KINDS)
    for k in KINDS:
        assert k.fields and len({f.key for f in k.fields}) == len(k.fields)
        assert all(not f.choices or f.default in f.choices for f in k.fields)
    assert KIND_BY_KEY["synthetic"].defaults() == {"step_ms": "5", "work_units": "0"}


@pytest.mark.parametrize("kind", ["vllm", "sglang", "tgi"])
def test_each_preset_kinds_default_command_names_its_own_port(kind) -> None:
    (command,) = KIND_BY_KEY[kind].fields
    port = declaration.ENGINE_DEFAULT_PORTS[kind]
    assert declaration.engine_port(command.default.split()) == port


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
        ("llama-server", {}, "kind", "takes vllm, sglang, tgi or command"),
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

    assert not hasattr(launch_form, "KINDS") or launch_form.KINDS is KINDS
    assert {f.key for f in launch_form.FIELDS} >= {f.key for k in KINDS for f in k.fields}
