"""The command line's own plumbing: the headless recogniser, exit codes and one-line errors."""

from __future__ import annotations

import pytest

from gpushare_tui.cli import main
from gpushare_tui.cli.once import headless_args


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--once"], (None, False)),
        (["--json", "--once"], (None, True)),
        (["--once", "--gpu-key", "k", "--json"], ("k", True)),
        (["--once", "--gpu-key=k"], ("k", False)),
        (["--once", "--gpu-key", "a", "--gpu-key", "b"], ("b", False)),  # the last wins, as in click
        (["--once", "--gpu-key", "--json"], ("--json", False)),  # the next word is the value, as in click
        (["--once", "--gpu-key="], ("", False)),
        (["--gpu-key", "--once"], None),  # "--once" is the key here: not a snapshot
        (["--once", "--gpu-key"], None),  # a missing value: typer's error
        (["--once", "--interval", "1"], None),
        (["--once", "-h"], None),
        (["--once", "synth"], None),
        (["--json"], None),
        ([], None),
    ],
)
def test_headless_args(argv: list[str], expected: tuple | None) -> None:
    assert headless_args(argv) == expected


@pytest.mark.parametrize(
    "argv, fragment, sub",
    [
        (["weight", "1"], "missing argument 'value'", "weight "),
        (["synth", "--gpu-key", "k"], "missing option '--weight'", "synth "),
        (["weight", "1", "-1"], "no such option", "weight "),
        (["no-such-command"], "no such command 'no-such-command'", ""),
        (["--once", "--gpu-key"], "'--gpu-key' requires an argument", ""),
    ],
)
def test_typer_errors_are_one_line_and_exit_2(argv: list[str], fragment: str, sub: str, capsys) -> None:
    """typer's own parse errors (their wording is click's, and varies between versions)."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    (line,) = err.splitlines()
    assert out == "" and line.startswith("gpushare-tui: ") and fragment in line.lower()
    assert line.endswith(f" (see: gpushare-tui {sub}--help)")


BAD_KEY = "invalid gpu key '../x': use 1..64 characters of [A-Za-z0-9._-]"


@pytest.mark.parametrize(
    "argv, line",
    [
        (["--once", "--gpu-key", "../x"], BAD_KEY),  # the headless path
        (["--once", "--interval", "0.1", "--gpu-key", "../x"], BAD_KEY),  # typer's path, the same line
        (["--json"], "--json needs --once"),
        (["--interval", "0.1"], "invalid --interval 0.1: at least 0.2 seconds"),
        (["demo", "--interval", "nan"], "invalid --interval nan: at least 0.2 seconds"),
        (["synth", "--weight", "0", "--gpu-key", "k"], "invalid weight '0': must be a finite number > 0"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(argv: list[str], line: str, capsys) -> None:
    assert main(argv) == 2
    assert capsys.readouterr() == ("", f"gpushare-tui: {line}\n")


def test_runtime_error_exits_1(capsys, runtime_dir: str) -> None:
    assert main(["status", "4000999"]) == 1
    assert capsys.readouterr().err.splitlines() == ["gpushare-tui: no process 4000999"]


def test_help_comes_from_typer(capsys) -> None:
    assert main(["--once", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--once" in out and "synth" in out and "Exit codes: 0 ok, 1 runtime error, 2 usage error." in out
