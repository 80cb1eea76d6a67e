"""One display-text rule (core/host/text.py `printable`): control characters, Unicode format
characters (bidi overrides and isolates, zero-width ones), lone surrogates and line separators are
replaced by U+FFFD in every terminal view; `--json` keeps the text, escaped (\\uXXXX)."""

from __future__ import annotations

import json
import os

import pytest

from gpushare_tui.cli.common import error_line
from gpushare_tui.cli.control_cmds import _status_value
from gpushare_tui.core.engines.declaration import DeclarationError, check_name
from gpushare_tui.core.host.clock import wall_us
from gpushare_tui.core.host.logtail import display_line
from gpushare_tui.core.host.text import printable
from gpushare_tui.core.pacing.control import StatusReply
from gpushare_tui.core.registry import abi
from gpushare_tui.core.registry.segment import Segment
from gpushare_tui.dashboard.source import LiveSource

RLO = "\u202e"  # right-to-left override: "abc\u202edcba" shows as "abcabcd"
FORMAT_CHARS = [
    "\u202a",  # LRE
    "\u202b",  # RLE
    "\u202c",  # PDF
    "\u202d",  # LRO
    RLO,
    "\u2066",  # LRI
    "\u2067",  # RLI
    "\u2068",  # FSI
    "\u2069",  # PDI
    "\u200e",  # LRM
    "\u200f",  # RLM
    "\u061c",  # ALM
    "\u200b",  # zero-width space
    "\u200c",  # ZWNJ
    "\u200d",  # ZWJ
    "\u2060",  # word joiner
    "\ufeff",  # BOM / ZWNBSP
    "\u00ad",  # soft hyphen
    "\u2028",  # line separator (Zl)
    "\u2029",  # paragraph separator (Zp)
    "\udcff",  # a lone surrogate: an undecodable byte
]
HOSTILE_NAME = f"gpt{RLO}exe.txt\u2066x\u200by"  # what a peer writes to disguise its row


@pytest.mark.parametrize("c", FORMAT_CHARS, ids=lambda c: f"U+{ord(c):04X}")
def test_printable_replaces_format_characters(c: str) -> None:
    assert printable(f"a{c}b") == "a\ufffdb"


def test_printable_keeps_text() -> None:
    arabic = "\u0645\u0631\u062d\u0628\u0627"  # right-to-left letters are text, not format characters
    for text in ("plain name-1.2", f"caf\u00e9 \u4e2d\u6587 {arabic}", "\u00a0nbsp", "emoji \U0001f600"):
        assert printable(text) == text


def _hostile_peer(seg: Segment, name: str, slot: int = 0) -> None:
    seg.cas_pid(slot, 0, os.getpid())
    seg.write_slot_fields(
        slot, boot_us=1, weight=1.0, active=1, heartbeat_us=wall_us(), busy_ppm=0, name_raw=abi.encode_name(name)
    )


@pytest.mark.slow
def test_the_views_of_a_peer_named_with_format_characters(gpu_key: str, cli) -> None:
    with Segment.create_or_attach(gpu_key) as seg:
        _hostile_peer(seg, HOSTILE_NAME)
        table = cli("--once", "--gpu-key", gpu_key)
        doc = cli("--once", "--json", "--gpu-key", gpu_key)
        source = LiveSource(gpu_key)  # the dashboard's (and serve's) source
        try:
            model = source.collect()
        finally:
            source.close()
    shown = "gpt\ufffdexe.txt\ufffdx\ufffdy"
    # --once table
    assert table.returncode == 0, table.stderr
    assert not any(c in table.stdout for c in FORMAT_CHARS) and shown in table.stdout
    # --once --json: the bytes kept, escaped as \\uXXXX (no raw format character in the text)
    assert doc.returncode == 0 and doc.stdout.isascii()
    assert "\\u202e" in doc.stdout
    assert json.loads(doc.stdout)["gpus"][0]["peers"][0]["name"] == HOSTILE_NAME
    # the dashboard's rows (and serve's /gpu/peers and /metrics, from the same source)
    (row,) = model.rows()
    assert row.peer.name == shown


def test_error_lines_status_and_logs(capsys: pytest.CaptureFixture[str]) -> None:
    error_line(f"engine 1: no engine named {HOSTILE_NAME}\n--- tail ---\nline {RLO}2")
    err = capsys.readouterr().err
    assert not any(c in err for c in FORMAT_CHARS)
    assert err == "gpushare-tui: engine 1: no engine named gpt\ufffdexe.txt\ufffdx\ufffdy\n--- tail ---\nline \ufffd2\n"
    shown = _status_value(StatusReply(name=HOSTILE_NAME), "name", HOSTILE_NAME)  # `status`
    assert shown == "gpt\ufffdexe.txt\ufffdx\ufffdy"
    assert display_line(f"token {RLO}\t1") == "token \ufffd 1"  # tab to column 8  # `logs`


def test_our_own_names_may_not_carry_format_characters() -> None:
    with pytest.raises(DeclarationError, match="format characters"):
        check_name(f"chat{RLO}")
