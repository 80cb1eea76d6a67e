"""Our own arguments are text: an invalid UTF-8 byte in argv is one line and exit 2, for every
command and every string argument (Python hands such bytes on as lone surrogates); the engine's
argv after `--` is not ours and passes through."""

from __future__ import annotations

import os
import subprocess

import pytest

from gpushare_tui.cli import main
from gpushare_tui.cli.common import check_argv_text
from gpushare_tui.core.engines.declaration import DeclarationError, check_name
from testkit.cli import cli_argv

BAD = os.fsdecode(b"\xff")  # what sys.argv holds for the byte 0xff: "\udcff"

# every command, each string argument it takes (an option's value or a positional) made invalid
CASES = [
    ["synth", "--weight", "1", "--name", BAD],
    ["synth", "--weight", BAD],
    ["synth", "--weight", "1", "--gpu-key", "k" + BAD],
    ["synth", "--weight", "1", "--share-group", BAD],
    ["synth", "--weight", "1", "--class", BAD],
    ["synth", "--weight", "1", "--status-file", "/tmp/" + BAD],
    ["synth", "--weight", "1", "--busy-idle", BAD],
    ["run", "--weight", "1", "--name", BAD, "--", "true"],
    ["run", "--weight", "1", "--health-log", BAD, "--", "true"],
    ["run", "--weight", "1", "--metrics-url", BAD, "--", "true"],
    ["launch", "--weight", "1", "--name", "a" + BAD, "--", "true"],
    ["launch", "--weight", "1", "--activity", BAD, "--", "true"],
    ["status", BAD],
    ["status", "x", "--gpu-key", BAD],
    ["weight", BAD, "2"],
    ["weight", "x", BAD],
    ["class", "x", BAD],
    ["stop", BAD],
    ["logs", BAD],
    ["demo", "--gpu-key", BAD],
    ["serve", "--listen", BAD],
    ["up", "/tmp/" + BAD + ".toml"],
    ["--once", "--gpu-key", BAD],
    ["--gpu-key", BAD],
    ["--remote", "http://" + BAD],
    [BAD],
]


def _case_id(argv: list[str]) -> str:
    return " ".join(w.encode("utf-8", "surrogateescape").decode("latin-1") for w in argv)


@pytest.mark.parametrize("argv", CASES, ids=_case_id)
def test_an_invalid_utf8_argument_is_one_line_and_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and "not valid UTF-8" in err, err
    assert "\\xff" in err  # the byte is named, escaped: nothing undecodable reaches the terminal


def test_synth_with_an_invalid_name_in_a_real_process() -> None:
    """The finding as reported: `gpushare-tui synth --name $'\\xff'` in a shell."""
    r = subprocess.run(
        [*cli_argv("synth", "--weight", "1", "--gpu-key", "argv-text-unmade", "--name"), b"\xff"],
        capture_output=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert r.stdout == b""
    assert r.stderr == b"gpushare-tui: argument 7 is not valid UTF-8 text: b'\\xff'\n"


def test_the_engines_argv_after_the_separator_passes_through() -> None:
    check_argv_text(["run", "--weight", "1", "--", "./engine", "/models/" + BAD])  # no error
    with pytest.raises(Exception, match="argument 3"):
        check_argv_text(["run", "--name", BAD, "--", "./engine"])


def test_a_name_with_a_lone_surrogate_from_json_is_refused() -> None:
    """A control request's JSON can spell "\\udcff" too: the name check refuses it as text."""
    with pytest.raises(DeclarationError, match="valid UTF-8"):
        check_name("a" + BAD)
