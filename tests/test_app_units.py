"""Pure parts of the dashboard's UI: weights, timeline, colours, table cells, the launch form."""

from __future__ import annotations

import sys

import pytest
from slots import NOW, slot, snap

from gpushare_tui.app import nudged_weight
from gpushare_tui.core.engines.declaration import SourceOptions, SynthDecl
from gpushare_tui.core.engines.kinds import FORM_KINDS as KINDS
from gpushare_tui.core.engines.launcher import LaunchReply, LaunchSpec
from gpushare_tui.core.registry import abi
from gpushare_tui.dashboard.columns import (
    COLUMNS,
    FLOOR_MARK,
    GAP,
    LATENCY_KEYS,
    NAME_KEEP,
    NAME_WIDTH,
    fit_columns,
    legend,
)
from gpushare_tui.dashboard.model import EngineInfo, PeerRow, speed_pct
from gpushare_tui.widgets.help_screen import column_table, screen_text
from gpushare_tui.widgets.launch_form import COMMON, FIELDS, SLO, LaunchResult, validate_launch
from gpushare_tui.widgets.palette import SLOT_COLOURS, slot_colour, slot_rgb
from gpushare_tui.widgets.peers_table import cell_text, header_cells, row_cells
from gpushare_tui.widgets.timeline import bar_line, cursor_line
from gpushare_tui.widgets.top_bar import top_text

# -- weights -----------------------------------------------------------------


def test_nudge_steps_and_never_reaches_zero():
    w, ups = 0.25, []
    for _ in range(4):
        w = nudged_weight(w, +1)
        ups.append(w)
    assert ups == [0.5, 1.0, 2.0, 3.0]
    downs = []
    for _ in range(6):
        w = nudged_weight(w, -1)
        downs.append(w)
    assert downs == [2.0, 1.0, 0.5, 0.25, 0.125, 0.0625]
    assert nudged_weight(0.001, -1) > 0


# -- timeline ----------------------------------------------------------------


def test_timeline_windows_proportional_and_cursor_names_the_runner():
    s = snap([slot(0, 2, name="big"), slot(1, 1, name="small")])  # 2:1 -> 120 ms, [0, 80000) [80000, 120000)
    now = NOW - NOW % 120_000 + 90_000  # inside small's window
    s = snap([slot(0, 2, name="big"), slot(1, 1, name="small")], now=now)
    head, bar = cursor_line(s, 78, now).plain, bar_line(s, 78).plain  # a 60-column bar + the 18-column legend
    assert len(bar) == 78 and bar.startswith(" big 80ms")
    assert bar.index(" small") == 40  # 80 ms of 120 ms -> column 40 of 60
    assert bar[60:].strip() == "period 120 ms"
    assert head.index("▼") == 45  # 90/120 of 60 columns
    assert "now: small may run" in head


def test_timeline_without_schedule():
    alone = bar_line(snap([slot(0, 1, name="solo")]), 50).plain
    assert "solo" in alone and "unthrottled" in alone
    idle = bar_line(snap([slot(0, 1, active=0)]), 50).plain
    assert "no active members" in idle


def test_timeline_no_color_uses_fill_patterns():
    bar = bar_line(snap([slot(0, 1, name="a"), slot(1, 1, name="b")]), 80, no_color=True).plain
    assert "█" in bar and "▓" in bar  # slot 0 and slot 1 differ without colour


def test_colours_stable_by_slot():
    assert len(set(SLOT_COLOURS)) == abi.SLOT_COUNT
    assert slot_colour(3) == slot_colour(3 + abi.SLOT_COUNT)
    assert slot_rgb(0) == (0x4F, 0xC3, 0xF7)


# -- table cells ---------------------------------------------------------------


def test_row_cells():
    s = snap([slot(0, 2, name="eng", busy=0.42), slot(1, 1, active=0), slot(2, 1, age_s=12)])
    rows = {p.slot: p for p in s.peers}
    managed = PeerRow("k", rows[0], True, 1234.0, EngineInfo(state="running", tok_s=55.55, solo_tok_s=111.1))
    assert len(row_cells(managed)) == len(COLUMNS)
    got = {c.key: cell_text(managed, c.key) for c in COLUMNS}
    assert got == {
        "slot": "■ 0",
        "pid": "1000",
        "name": "eng",
        "user": "-",  # pid 1000 is no process here: its user is unverifiable
        "weight": "2",
        "share": "100.0",
        "busy": "42",
        "ach": "100",
        "status": "active",
        "toks": "55.5",
        "speed": "50",
        "ttft": "-",  # no latency figures: its requests pass no front proxy
        "itl": "-",
        "reqs": "-",
        "engine": "running",
        "time": "-",
        "energy": "-",
        "hb": "<1s",
        "vram": "1234M",
        "gpu": "k",
        "class": "v1",  # a v1 peer: no Extension 1 flags
    }
    foreign = PeerRow("k", rows[1])
    assert [cell_text(foreign, k) for k in ("status", "engine", "vram", "toks", "speed")] == [
        "idle", "read-only", "-", "-", "-"
    ]  # fmt: skip
    no_solo = PeerRow("k", rows[0], True, None, EngineInfo(state="running", tok_s=55.55))
    assert cell_text(no_solo, "speed") == "-"  # solo rate not known yet
    assert cell_text(foreign, "ach") == "-"  # idle: no member of the schedule
    dead = PeerRow("k", rows[2], True)
    assert [cell_text(dead, k) for k in ("status", "hb", "engine")] == ["dead", "12s", "-"]


def test_shr_is_the_window_share_marked_when_the_floor_lifted_it():
    """SHR% is what the engine gets: at weights 100:1 its window share 90 / 10 (as the timeline, BSY% and
    ACH% show), not w ÷ Σw 99.0 / 1.0; the floored one is marked. An idle peer has no window: -."""
    s = snap([slot(0, 100), slot(1, 1), slot(2, 0.001), slot(3, 1, active=0)])
    rows = [PeerRow("k", p) for p in s.peers]
    assert [cell_text(r, "share") for r in rows] == ["80.0", f"10.0{FLOOR_MARK}", f"10.0{FLOOR_MARK}", "-"]
    assert [round(r.peer.share_pct, 1) for r in rows] == [99.0, 1.0, 0.0, 0.0]  # w ÷ Σw, kept for JSON
    plain = snap([slot(0, 2), slot(1, 1)])
    assert [cell_text(PeerRow("k", p), "share") for p in plain.peers] == ["66.7", "33.3"]  # no floor: no mark
    sort = next(c for c in COLUMNS if c.key == "share").sort
    assert sorted(rows, key=sort, reverse=True)[0].peer.slot == 0 and sort(rows[3]) < sort(rows[2])


def test_dead_and_idle_rows_show_no_stale_numbers():
    """A dead peer's last BSY% (and ACH%, TOK/S) is history, not a reading: -; an idle engine has no
    speed vs solo (0 tok/s is no speed): SPD% -, not 0."""
    s = snap([slot(0, 1, busy=0.48, age_s=700), slot(1, 1, active=0, busy=0.0), slot(2, 1, busy=0.3)])
    dead, idle, working = (PeerRow("k", p, True, None, EngineInfo("running", 0.0, 60.0)) for p in s.peers)
    assert [cell_text(dead, k) for k in ("busy", "ach", "toks", "speed", "status")] == ["-", "-", "-", "-", "dead"]
    assert [cell_text(idle, k) for k in ("busy", "toks", "speed", "status")] == ["0", "0.0", "-", "idle"]
    assert idle.speed_pct is None and dead.speed_pct is None
    assert cell_text(working, "speed") == "0"  # working, 0 tok/s: stalled, and it says so
    sort = next(c for c in COLUMNS if c.key == "busy").sort
    assert sort(dead) < sort(idle)


def test_the_sort_arrow_touches_the_label_of_the_column_it_sorts():
    """Not in the blank between two columns (`WGT▼ SHR%` read as sorted by WGT): in the sorted column's
    padding, beside its label, which is underlined; with no padding, in the blank just before the label."""
    widths = {c.key: c.width for c in COLUMNS}

    def header(key: str, reverse: bool = True) -> tuple[str, tuple[int, str] | None]:
        cells, mark = header_cells(key, reverse, widths[key])
        i = [c.key for c in COLUMNS].index(key)
        assert "underline" in str(cells[i].style) or any("underline" in str(sp.style) for sp in cells[i].spans)
        return cells[i].plain, mark

    assert header("share") == ("▼SHR%", None)  # right-justified, width 5: the arrow is its pad
    assert header("weight", False) == ("▲WGT", None)
    assert header("name") == ("NAME▼", None)  # left-justified: after the label
    assert header("busy") == ("BSY%", ([c.key for c in COLUMNS].index("busy"), "▼"))  # no pad: the gap before
    cells, _ = header_cells("share", True, 5)
    assert sum("▼" in c.plain or "▲" in c.plain for c in cells) == 1


def test_top_bar_counts_live_peers_in_the_singular_too():
    assert "1 GPU segment · 1 peer " in top_text(NOW, 1, 1, 1.0, False, "h").plain + " "
    assert "2 GPU segments · 2 peers " in top_text(NOW, 2, 2, 1.0, False, "h").plain + " "
    assert "0 peers" in top_text(None, 0, 0, 1.0, False, "h").plain


def test_every_column_is_defined_in_the_help_and_the_legend_keeps_to_the_less_obvious():
    """The help screen defines every column from the columns' own text (one place: a new column is
    defined by adding it), and what "strobe N× slower" means."""
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(column_table())
    shown = console.export_text()
    for c in COLUMNS:
        assert c.help, c.key
        assert any(line.startswith(c.label + " ") for line in shown.splitlines()), c.label
    assert "10%" in shown and FLOOR_MARK in shown and "sum past 100" in shown and "activity window" in shown
    text = screen_text()
    assert "strobe N× slower" in text and "17-65×" in text
    assert legend().startswith("SHR% ") and "HB" not in legend()


def test_columns_fit_the_width_dropping_the_least_useful_first():
    """Every column that matters fits at 80 terminal columns (78 inside the border, 77 with a vertical
    scrollbar); below 98 USER goes (each GPU's per-user line still names the users), GPU first of the rest,
    then VRAM, then HB, while NAME would get less than NAME_KEEP; NAME takes
    what is left. A column with nothing to show (VRAM without NVML, the latency columns while no engine reports
    latency) goes before any other. With latency: REQ/S first, ITL99 with USER, TTFT99 after GPU."""
    must = [c.key for c in COLUMNS if not c.drop]
    acct = {"energy", "time", "user"}  # ENERGY goes first, then TIME and CLS; USER (each GPU's per-user line stays)
    lat = set(LATENCY_KEYS)
    cases = (
        (77, lat, {"gpu", "vram", "hb", "class"} | acct | lat),
        (85, lat, {"gpu", "vram", "class"} | acct | lat),
        (97, lat, {"gpu", "class"} | acct | lat),
        (97, set(), {"gpu", "class", "itl", "reqs"} | acct),  # latency known: TTFT99 outlives GPU
        (120, set(), {"class", "energy", "user", "itl", "reqs"}),  # TTFT99 before TIME, HB, VRAM and GPU
        (130, set(), {"class", "energy", "reqs"}),
    )
    cases += ((200, set(), set()), (200, {"vram"}, {"vram"}), (200, {"energy"}, {"energy"}), (200, lat, lat))
    for available, empty, dropped in cases:
        shown, name = fit_columns(available, frozenset(empty))
        keys = [c.key for c in shown]
        assert set(must) <= set(keys) and {c.key for c in COLUMNS} - set(keys) == dropped, available
        assert sum(c.width + GAP for c in shown if c.key != "name") + name + GAP <= available
        assert name >= (NAME_KEEP if available >= 77 else NAME_WIDTH[0])
    assert fit_columns(200)[1] == NAME_WIDTH[1]
    assert [c.key for c in fit_columns(40)[0]] == must  # narrower still: only the optional ones go


def test_speed_pct_is_tok_s_over_solo():
    assert speed_pct(50.0, 200.0) == 25.0
    assert speed_pct(None, 200.0) is None and speed_pct(50.0, None) is None and speed_pct(50.0, 0.0) is None
    assert EngineInfo(tok_s=30.0, solo_tok_s=60.0).speed_pct == 50.0


# -- launch form -----------------------------------------------------------------


def test_validate_launch_builds_the_launch_spec(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    spec, errors = validate_launch(
        {
            "binary": "/bin/true",
            "model": str(model),
            "weight": "0.5",
            "gpu_key": "GPU-1",
            "extra": "--ctx-size 8192 --flag 'a b'",
        }
    )
    assert errors == {}
    assert spec == LaunchSpec(
        ("/bin/true", "-m", str(model), "--ctx-size", "8192", "--flag", "a b"),
        "GPU-1",
        0.5,
        name=None,
        sources=SourceOptions(activity="llama"),  # the kind says llama-server, its binary's name does not
    )
    _, errors = validate_launch(
        {"binary": "/bin/true", "model": str(model), "weight": "1", "gpu_key": "k", "name": "é" * 25}
    )
    assert "48 bytes" in errors["name"]


def test_launch_result_summary():
    reply = LaunchReply(4242, 8081, "127.0.0.1", "/tmp/e.log", 0, 77, "/tmp/s.log")
    assert LaunchResult(reply).summary() == (
        "engine pid 4242 port 8081 (slot 0)\nengine log /tmp/e.log\nsupervisor pid 77 log /tmp/s.log"
    )
    err = LaunchResult(error="engine exited", log_tail="\n".join(f"l{i}" for i in range(20)))
    lines = err.summary().splitlines()
    assert not err.ok and lines[0] == "engine exited" and lines[-1] == "l19" and len(lines) == 8
    assert LaunchResult(error="no such binary").summary() == "no such binary"


def test_validate_launch_of_a_synthetic_engine_checks_its_fields_in_core_declaration():
    synth = {"kind": "synthetic", "step_ms": "2.5", "work_units": "0", "weight": "3", "gpu_key": "k"}
    spec, errors = validate_launch(synth)
    assert errors == {}
    assert spec == LaunchSpec((), "k", 3.0, name="synth", synth=SynthDecl(2.5, 0))
    # "synthetic" is an alias of the kind's one name; work units left empty: step_ms's work at the reference rate
    spec, errors = validate_launch({**synth, "kind": "synth", "work_units": ""})
    assert errors == {} and spec is not None and spec.synth == SynthDecl(2.5, None)
    spec, errors = validate_launch(
        {"kind": "synthetic", "step_ms": "nan", "work_units": "1.5", "weight": "0", "name": "x" * 49, "gpu_key": ""}
    )
    assert spec is None and set(errors) == {"step_ms", "work_units", "weight", "name", "gpu_key"}
    assert errors["step_ms"] == "nan: must be between 0.05 and 10000"  # text that is a number: the number
    assert errors["work_units"] == "'1.5': must be an integer >= 0 (0: calibrate to step_ms)"
    # the llama-server's fields are not the synthetic engine's: a stale binary is no error
    spec, errors = validate_launch({**synth, "binary": "/nope", "work_units": "7"})
    assert errors == {} and spec is not None and spec.synth == SynthDecl(2.5, 7)
    assert validate_launch({"kind": "ollama"})[1] == {
        "kind": "'ollama': not one of llama-server, vllm, sglang, tgi, command, synth"
    }


def test_the_form_renders_core_kinds_table():
    """The form composes every core/engines/kinds.py kind's fields once by key (vllm/sglang/tgi/command share
    `command`), then the common ones; it keeps no table of its own."""
    keys = [f.key for f in FIELDS]
    assert len(keys) == len(set(keys)) and keys[-4 - len(SLO) : -len(SLO)] == ["weight", "class", "name", "gpu_key"]
    assert {f.key for k in KINDS for f in k.fields} | {f.key for f in (*COMMON, *SLO)} == set(keys)
    (klass,) = (f for f in COMMON if f.key == "class")
    assert (klass.choices, klass.default) == (("interactive", "batch"), "batch")


# each kind: values that launch, and one bad value (field, what its inline error says)
PY = sys.executable
KIND_CASES = {
    "llama-server": ({"binary": "DIR/llama-server", "model": "DIR/m.gguf"}, ("model", "no such file")),
    "vllm": ({"command": f"{PY} -c pass --port 8001"}, ("command", "cannot split")),
    "sglang": ({"command": f"{PY} -c pass"}, ("command", "not on PATH")),
    "tgi": ({"command": f"{PY} -c pass --port 3001"}, ("command", "must be 1..65535")),
    "command": ({"command": f"{PY} -c pass", "activity": "cpu"}, ("activity", "needs a metrics URL")),
    "synth": ({"step_ms": "2", "work_units": "0"}, ("step_ms", "must be between")),
}
BAD = {
    "llama-server": {"model": "/nonexistent/m.gguf"},
    "vllm": {"command": "vllm serve 'unclosed"},
    "sglang": {"command": "no-such-sglang-xyz --port 30000"},
    "tgi": {"command": f"{PY} --port 99999"},
    "command": {"activity": "metrics"},
    "synth": {"step_ms": "0"},
}


@pytest.mark.parametrize("kind", [k.key for k in KINDS])
def test_each_kind_validates_to_a_launch_spec_or_inline_errors(kind, tmp_path):
    assert set(KIND_CASES) == {k.key for k in KINDS}
    good, (field, needle) = KIND_CASES[kind]
    good = {k: v.replace("DIR", str(tmp_path)) for k, v in good.items()}
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    (tmp_path / "llama-server").write_text("#!/bin/sh\n")
    (tmp_path / "llama-server").chmod(0o755)
    common = {"kind": kind, "weight": "2", "class": "interactive", "gpu_key": "k", "name": ""}
    spec, errors = validate_launch({**common, **good})
    assert errors == {} and spec is not None
    assert (spec.gpu_key, spec.weight, spec.klass) == ("k", 2.0, "interactive")
    if kind == "synth":
        assert spec.synth == SynthDecl(2.0, 0) and spec.engine_argv == ()
    elif kind == "llama-server":
        assert spec.engine_argv == (good["binary"], "-m", good["model"]) and spec.sources == SourceOptions()
    else:  # through declaration.kind_engine: the command as given, its activity/health as `run` options
        assert spec.engine_argv[0] == PY and spec.name is None and spec.synth is None
        assert spec.sources.activity == ("cpu" if kind == "command" else kind)
        assert spec.sources.no_health == (kind == "command")
    spec, errors = validate_launch({**common, **good, **BAD[kind], "class": "urgent", "weight": "0"})
    assert spec is None and set(errors) == {field, "class", "weight"}, errors
    assert needle in errors[field]
    assert errors["class"] == "'urgent': must be one of interactive, batch"
    # no class given: batch (the default, as `launch`)
    spec, _ = validate_launch({**common, **good, "class": ""})
    assert spec is not None and spec.klass == "batch"


def test_a_command_kinds_health_url_error_is_at_its_field():
    base = {"kind": "command", "command": f"{PY} -c pass", "activity": "always", "weight": "1", "gpu_key": "k"}
    _, errors = validate_launch({**base, "health_url": "localhost:1", "name": "é" * 25})
    assert set(errors) == {"health_url", "name"} and "http:// or https://" in errors["health_url"]
    spec, _ = validate_launch({**base, "health_url": "http://127.0.0.1:9/health", "name": "job"})
    assert spec is not None and spec.name == "job" and spec.sources.health_url == "http://127.0.0.1:9/health"


def test_a_synthetic_launch_summary_has_no_port_or_supervisor():
    reply = LaunchReply(4242, 0, "", "/tmp/synth.log", 3, 4242, "/tmp/synth.log")
    assert LaunchResult(reply).summary() == "synthetic engine pid 4242 (slot 3)\nlog /tmp/synth.log"


def test_accounting_cells():
    from gpushare_tui.core.observe.accounting import SOURCE_BUSY_PPM, SOURCE_COUNTER, PeerAccount
    from gpushare_tui.dashboard.columns import fmt_busy_time, fmt_wh

    assert [fmt_busy_time(s) for s in (None, 0.4, 59.9, 3723.5, 999 * 3600 + 1, 1000 * 3600, 2.0**64 / 1e6)] == [
        "-", "0:00:00", "0:00:59", "1:02:03", "999:00:01", "1000h", "huge"
    ]  # fmt: skip
    assert [fmt_wh(j) for j in (None, 0.0, 36.0, 3600 * 123.4, 3600 * 123_456)] == ["-", "0.00", "0.01", "123", "123k"]
    p = snap([slot(0, 1)]).peers[0]
    assert cell_text(PeerRow("k", p, account=PeerAccount(SOURCE_COUNTER, 61.0, 7200.0)), "time") == "0:01:01"
    assert cell_text(PeerRow("k", p, account=PeerAccount(SOURCE_COUNTER, 61.0, 7200.0)), "energy") == "2.00"
    assert cell_text(PeerRow("k", p, account=PeerAccount(SOURCE_BUSY_PPM, 61.0, None)), "time") == "~0:01:01"
    assert cell_text(PeerRow("k", p, account=PeerAccount(SOURCE_BUSY_PPM, None, None)), "time") == "-"


def test_the_forms_latency_target_is_run_and_launchs_options_checked_as_theirs():
    """The SLO fields are `run`/`launch`'s --slo-* options (EngineOptions' fields, SloDecl.run_options()'s keys),
    offered for every supervised kind (not synth: no front proxy), checked by declaration.check_slo as theirs; a
    bad value is one message at its field and nothing is built."""
    from dataclasses import fields

    from gpushare_tui.cli.engines import EngineOptions
    from gpushare_tui.core.engines.declaration import SloDecl, check_slo

    keys = [f.key for f in SLO]
    assert keys == [f.name for f in fields(EngineOptions) if f.name.startswith("slo_")]
    assert keys == list(SloDecl().run_options())
    base = {"kind": "command", "command": f"{PY} -c pass", "activity": "always", "weight": "2", "gpu_key": "k"}
    spec, errors = validate_launch(base)
    assert errors == {} and spec is not None and spec.slo is None  # nothing given: no target
    given = {"slo_ttft_p99_ms": "250", "slo_weight_max": "6", "slo_classes": "interactive"}
    spec, errors = validate_launch({**base, **given})
    assert errors == {} and spec is not None
    assert (
        spec.slo
        == check_slo("250", None, None, "6", "interactive")
        == SloDecl(250.0, None, None, 6.0, ("interactive",))
    )
    assert "--slo-ttft-p99-ms" in spec.argv() and "--slo-classes" in spec.argv()  # what `run` is given
    both = {"slo_itl_p99_ms": "40", "slo_classes": "batch,interactive"}  # the selector's default: no request
    spec, errors = validate_launch({**base, **both})
    assert spec is not None and spec.slo == SloDecl(None, 40.0)
    for bad, field, message in (
        ({"slo_ttft_p99_ms": "fast"}, "slo_ttft_p99_ms", "'fast': must be a number > 0"),
        ({"slo_itl_p99_ms": "-1"}, "slo_itl_p99_ms", "-1.0: must be a number > 0"),
        ({"slo_weight_max": "4"}, "slo_ttft_p99_ms", "an SLO needs ttft_p99_ms or itl_p99_ms"),
        ({"slo_classes": "interactive"}, "slo_ttft_p99_ms", "an SLO needs ttft_p99_ms or itl_p99_ms"),
        ({"slo_ttft_p99_ms": "100", "slo_weight_min": "4", "slo_weight_max": "2"}, "slo_weight_max", "above"),
        ({"slo_ttft_p99_ms": "100", "slo_classes": "fast"}, "slo_classes", "one or both of batch, interactive"),
    ):
        spec, errors = validate_launch({**base, **bad})
        assert spec is None and list(errors) == [field] and message in errors[field], (bad, errors)
    # a synthetic engine has no target: its SLO fields are not read
    synth = {"kind": "synth", "step_ms": "2", "weight": "1", "gpu_key": "k", "slo_ttft_p99_ms": "fast"}
    spec, errors = validate_launch(synth)
    assert errors == {} and spec is not None and spec.slo is None
