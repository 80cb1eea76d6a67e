"""core/host/logtail.py: the last lines of a log, then what is appended (truncation, rotation, bursts)."""

from __future__ import annotations

import os
import threading

import pytest

from gpushare_tui.core.host.errors import GpushareError
from gpushare_tui.core.host.logtail import (
    CHUNK_BYTES,
    MAX_LINE_BYTES,
    POLL_READ_BYTES,
    LogError,
    LogFollower,
    display_line,
    open_log,
    tail_lines,
    tail_text,
)
from gpushare_tui.core.pacing.control import reported_log


def _last_lines(path: str, n: int, max_bytes: int | None = None) -> list[str]:
    return list(tail_lines(path, n, max_bytes))


def write(path, text: str | bytes, mode: str = "a") -> None:
    data = text.encode() if isinstance(text, str) else text
    with open(path, mode + "b") as f:
        f.write(data)


@pytest.fixture
def log(tmp_path):
    return str(tmp_path / "engine.log")


@pytest.mark.slow
def test_last_lines_of_a_big_file(log):
    n_lines = 300_000  # ~4 MB: many chunks
    write(log, "".join(f"line {i}\n" for i in range(n_lines)), "w")
    assert os.path.getsize(log) > 40 * CHUNK_BYTES
    assert _last_lines(log, 3) == ["line 299997", "line 299998", "line 299999"]
    assert _last_lines(log, 1) == ["line 299999"]
    assert _last_lines(log, 0) == []
    many = _last_lines(log, 20_000)  # spans several chunks read backwards
    assert many == [f"line {i}" for i in range(n_lines - 20_000, n_lines)]
    assert len(_last_lines(log, 10**9)) == n_lines
    # bounded: only whole lines within the last 30 bytes ("line 299998\nline 299999\n" is 24)
    assert _last_lines(log, 10, max_bytes=30) == ["line 299998", "line 299999"]
    assert _last_lines(log, 10, max_bytes=24) == ["line 299998", "line 299999"]  # starts exactly at a line
    assert _last_lines(log, 10, max_bytes=23) == ["line 299999"]


def test_short_and_empty_files(log):
    write(log, "", "w")
    assert _last_lines(log, 10) == []
    write(log, "only\n", "w")
    assert _last_lines(log, 10) == ["only"]
    write(log, "\n\n", "w")
    assert _last_lines(log, 10) == ["", ""]


def test_a_final_line_without_newline(log):
    write(log, "a\nb\npart", "w")
    assert _last_lines(log, 2) == ["b", "part"]  # like tail: it counts as a line
    with LogFollower(log, 2) as f:
        assert list(f.first_lines()) == ["a", "b"]  # following: held back until it ends
        assert f.poll().lines == []
        write(log, "ial\nnext\nmore")
        assert f.poll().lines == ["partial", "next"]
        assert f.poll().lines == []
        assert f.flush() == ["more"]  # when following ends
        assert f.flush() == []


def test_follow_returns_only_what_is_appended(log):
    write(log, "".join(f"old {i}\n" for i in range(100)), "w")
    with LogFollower(log, 3) as f:
        assert list(f.first_lines()) == ["old 97", "old 98", "old 99"]
        assert f.poll().lines == []
        for i in range(3):
            write(log, f"new {i}\n")
            assert f.poll().lines == [f"new {i}"]
        write(log, "x\ny\n")
        assert f.poll().lines == ["x", "y"]


def test_truncation_restarts_from_the_start(log):
    write(log, "one\ntwo\nthree\n", "w")
    with LogFollower(log, 10) as f:
        write(log, "held", "a")
        assert f.poll().lines == []
        write(log, "fresh\n", "w")  # truncated (and shorter): the held-back text is dropped
        up = f.poll()
        assert up.truncated and not up.rotated and up.lines == ["fresh"]
        write(log, "after\n")
        up = f.poll()
        assert not up.truncated and up.lines == ["after"]


def test_rotation_reads_the_old_file_to_its_end_then_the_new_one(log):
    write(log, "one\n", "w")
    with LogFollower(log, 10) as f:
        os.rename(log, log + ".1")
        write(log + ".1", "last of the old\nunfinished")  # the engine still writes to the old file
        assert f.poll().lines == ["last of the old"]  # no new file yet: the old one is still followed
        write(log, "first of the new\n", "w")
        up = f.poll()
        assert up.rotated and up.lines == ["unfinished", "first of the new"]
        write(log, "second\n")
        assert f.poll().lines == ["second"]


def test_a_burst_beyond_the_read_bound_skips_ahead(log):
    write(log, "start\n", "w")
    with LogFollower(log, 10, max_read_bytes=1000) as f:
        assert list(f.first_lines()) == ["start"]
        write(log, "".join(f"burst {i:05d}\n" for i in range(10_000)))  # 120 kB
        up = f.poll()
        assert up.skipped_bytes > 100_000
        assert up.lines[-1] == "burst 09999"
        assert all(line.startswith("burst ") and len(line) == 11 for line in up.lines)  # no cut line
        assert sum(len(line) + 1 for line in up.lines) <= 1000
        write(log, "calm\n")
        up = f.poll()
        assert up.lines == ["calm"] and up.skipped_bytes == 0


@pytest.mark.slow
def test_a_big_append_is_read_over_several_polls_without_loss(log):
    write(log, "", "w")
    with LogFollower(log, 10) as f:
        lines = [f"append {i:06d}" for i in range(300_000)]  # ~4 MB: several polls' worth
        write(log, "".join(s + "\n" for s in lines))
        got: list[str] = []
        polls = 0
        while True:
            up = f.poll()
            got += up.lines
            polls += 1
            assert sum(len(s) + 1 for s in up.lines) <= POLL_READ_BYTES + 15  # + the line a read cut
            if not up.more:
                break
        assert got == lines and polls >= 4


def test_first_lines_are_bounded_too(log):
    write(log, "".join(f"l{i}\n" for i in range(100_000)), "w")
    with LogFollower(log, 10**6, max_read_bytes=100) as f:
        assert list(f.first_lines())[-1] == "l99999" and sum(len(s) + 1 for s in f.first_lines()) <= 100


def test_an_endless_line_comes_in_pieces(log):
    write(log, "", "w")
    with LogFollower(log, 10) as f:
        write(log, b"x" * (2 * MAX_LINE_BYTES + 5))
        assert f.poll().lines == ["x" * MAX_LINE_BYTES] * 2
        write(log, "\n")
        assert f.poll().lines == ["xxxxx"]


def test_crlf_and_invalid_utf8(log):
    write(log, b"dos\r\nbad \xff\xfe end\n\xc3\xa9t\xc3\xa9\n", "w")
    assert _last_lines(log, 5) == ["dos", "bad \ufffd\ufffd end", "été"]


def test_display_line_neutralises_terminal_sequences():
    assert display_line("a\tb \x1b]2;OWNED\x07 \x1b[2J\x9b") == "a       b \ufffd]2;OWNED\ufffd \ufffd[2J\ufffd"


def test_only_regular_files_are_opened(tmp_path, log):
    write(log, "real\n", "w")
    link = str(tmp_path / "link.log")
    os.symlink(log, link)
    fifo = str(tmp_path / "fifo.log")
    os.mkfifo(fifo)
    cases = {
        link: f"log {link} is a symbolic link (not followed)",
        fifo: f"log {fifo} is not a regular file",  # and no wait for a writer
        str(tmp_path): f"log {tmp_path} is not a regular file",
        "/dev/zero": "log /dev/zero is not a regular file",
        str(tmp_path / "missing.log"): f"log file {tmp_path / 'missing.log'} does not exist",
        log + "/x": f"cannot read log file {log}/x: Not a directory",
    }
    for path, message in cases.items():
        done: list[str] = []

        def attempt(path: str = path, done: list[str] = done) -> None:
            for call in (lambda: _last_lines(path, 5), lambda: LogFollower(path, 5), lambda: open_log(path)):
                try:
                    call()
                except LogError as e:
                    done.append(str(e))

        t = threading.Thread(target=attempt, daemon=True)
        t.start()
        t.join(5)
        assert done == [message] * 3, path
    fd_count = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        with pytest.raises(LogError):
            _last_lines(fifo, 1)
    assert len(os.listdir("/proc/self/fd")) == fd_count  # nothing left open


def test_reported_log():
    assert reported_log(7, {"ok": True, "log": "/x/e.log"}) == "/x/e.log"
    for reply in ({"ok": True}, {"ok": True, "log": None}, {"ok": True, "log": ""}, {"ok": True, "log": 3}):
        with pytest.raises(GpushareError) as e:
            reported_log(7, reply)
        assert str(e.value) == "engine 7 reports no log file (its output goes to a terminal or a pipe)"


def test_tail_text_for_an_error_message(log, tmp_path):
    write(log, "".join(f"line {i}\n" for i in range(100)) + "\n  \nlast words   \n\n", "w")
    assert tail_text(log, 3) == "line 98\nline 99\nlast words"  # blank lines skipped, trailing blanks cut
    assert tail_text(log) == "\n".join([*(f"line {i}" for i in range(86, 100)), "last words"])  # 15 by default
    assert tail_text(log, 5, max_bytes=27) == "line 99\nlast words"  # only whole lines within the bound
    assert tail_text(log, 5, max_bytes=26) == "last words"
    assert tail_text(str(tmp_path / "missing.log")) == ""
    os.symlink(log, tmp_path / "link.log")
    assert tail_text(str(tmp_path / "link.log")) == ""  # not followed, like every log read here
    write(log, "", "w")
    assert tail_text(log) == ""
