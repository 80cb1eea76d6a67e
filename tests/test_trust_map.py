"""The trust map as tests: every budget in core/host/budgets.py is named in docs/trust.md and the doc names
no budget that does not exist; every surface that takes outside input (ports, sockets, segments, files,
/proc, argv, HTTP replies) has its section in docs/trust.md and hostile tests that exist, and every module
that reads such input belongs to a surface listed here. Each check is also run on a doc with one budget or
one section taken out, to show that it fails then."""

from __future__ import annotations

import ast
import errno
import fcntl
import os
import re
import resource
import signal
import socket
from dataclasses import dataclass
from pathlib import Path

from testkit.paths import REPO

PACKAGE = REPO / "gpushare_tui"
BUDGETS = PACKAGE / "core" / "host" / "budgets.py"
TRUST = REPO / "docs" / "trust.md"
SPEC = REPO / "docs" / "registry-abi.md"


def module_constants(path: Path) -> list[str]:
    """Names of the UPPER_CASE constants a module assigns at its top level, in order."""
    names: list[str] = []
    for node in ast.parse(path.read_text()).body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        names += [t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper()]
    return names


def budget_names() -> list[str]:
    return module_constants(BUDGETS)


# A backticked UPPER_SNAKE word in the doc: the form in which it names a budget or a constant.
DOC_CONSTANT = re.compile(r"`([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)`")
# Names the doc may use that are not ours to define: the OS's (O_NOFOLLOW, SO_PEERCRED, RLIMIT_NOFILE ...).
OS_NAMES = {n for m in (os, socket, resource, signal, errno, fcntl) for n in dir(m) if n.isupper()}


def known_names() -> set[str]:
    """Every name the doc may use in backticks: our constants, environment variables read by our code
    (a string literal), the OS's constants and the spec's terms."""
    names = set(OS_NAMES)
    for path in PACKAGE.rglob("*.py"):
        names.update(module_constants(path))
        names.update(re.findall(r"[\"']([A-Z][A-Z0-9_]+)[\"']", path.read_text()))
    names.update(re.findall(r"\b([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)\b", SPEC.read_text()))
    return names


def budget_problems(budgets: list[str], doc: str, known: set[str]) -> list[str]:
    """What disagrees between the budgets and the doc (empty when they agree)."""
    named = set(DOC_CONSTANT.findall(doc))
    problems = [f"budget {b} is not named in docs/trust.md (as `{b}`)" for b in budgets if b not in named]
    problems += [
        f"docs/trust.md names `{n}`, which is neither a budget nor any name our code or the spec defines"
        for n in sorted(named - set(budgets) - known)
    ]
    return problems


def test_every_budget_is_in_the_doc_and_the_doc_names_only_budgets_that_exist() -> None:
    problems = budget_problems(budget_names(), TRUST.read_text(), known_names())
    assert not problems, "\n".join(problems)


def test_the_budget_check_fails_on_a_budget_taken_out_of_the_doc_or_one_the_code_lacks() -> None:
    budgets, doc, known = budget_names(), TRUST.read_text(), known_names()
    without = doc.replace("`CONTROL_NAME_LOOKUP_MAX`", "256 sockets")
    assert budget_problems(budgets, without, known) == [
        "budget CONTROL_NAME_LOOKUP_MAX is not named in docs/trust.md (as `CONTROL_NAME_LOOKUP_MAX`)"
    ]
    renamed = doc + "\nAt most `CONTROL_NAME_LOOKUP_LIMIT` sockets.\n"
    assert budget_problems(budgets, renamed, known) == [
        "docs/trust.md names `CONTROL_NAME_LOOKUP_LIMIT`, which is neither a budget nor any name our code or"
        " the spec defines"
    ]


# -- surfaces --------------------------------------------------------------------------------------------

# What reads input from outside our uid, found in a module's source: a listening socket or port, an HTTP
# reply, a segment, /proc, a config file, argv. A module that matches must be in a surface below.
INPUT_READS = {
    "a listening socket or port": re.compile(r"\.listen\(|\.accept\(|start_server\(|create_server\("),
    "an HTTP reply": re.compile(r"\bhttpx\.|http\.client"),
    "a segment": re.compile(r"Segment\.attach|attach_readonly\(|/dev/shm"),
    "/proc": re.compile(r"[\"']/proc\b|\bPROC\b"),
    "a config file": re.compile(r"\btomllib\b"),
    "argv": re.compile(r"\bsys\.argv\b|typer\.Typer\("),
}


@dataclass(frozen=True)
class Surface:
    """Input from outside: the doc section (its heading's start) that says what it promises, the modules that
    read it (paths under gpushare_tui/), and the hostile tests (tests/FILE::FUNCTION) that try it."""

    name: str
    section: str
    modules: tuple[str, ...]
    hostile_tests: tuple[str, ...]


SURFACES = (
    Surface(
        "control sockets (a unix socket per engine)",
        "Control sockets, `launch` and the CLI's requests",
        ("core/pacing/control.py",),
        (
            "test_hostile_control.py::test_another_uid_is_closed_with_no_reply_even_with_loosened_modes",
            "test_hostile_control.py::test_idle_flood_keeps_threads_bounded",
            "test_hostile_control.py::test_status_cli_gives_up_on_a_sustained_flood_in_one_line",
        ),
    ),
    Surface(
        "argv",
        "The command line (argv)",
        ("cli/__init__.py", "cli/typer_app.py"),
        ("test_cli_argv_text.py::test_an_invalid_utf8_argument_is_one_line_and_exit_2",),
    ),
    Surface(
        "serve's port (HTTP clients)",
        "`gpushare-tui serve` against hostile clients",
        ("serve/server.py",),
        ("test_serve.py::test_hostile_clients", "test_serve.py::test_healthz_under_slowloris"),
    ),
    Surface(
        "a remote host's HTTP replies",
        "`--remote URL` (the dashboard and `--once`) against a hostile host",
        ("dashboard/remote.py",),
        (
            "test_hostile_remote.py::test_once_remote_against_a_drip_host_is_bounded",
            "test_hostile_remote.py::test_fuzz_any_bytes",
        ),
    ),
    Surface(
        "a supervised engine's HTTP replies (/metrics, /health)",
        "A supervised engine's own endpoints and log",
        ("core/host/probe.py",),
        ("test_hostile_engine.py::test_a_huge_exposition_costs_the_supervisor_little",),
    ),
    Surface(
        "who listens on the engine's port (the kernel's socket tables)",
        "Who answers on the engine's port",
        ("core/host/sockets.py",),
        (
            "test_hostile_engine.py::test_a_squatter_on_the_health_port_is_named_and_never_ready",
            "test_hostile_engine.py::test_a_squatters_gauge_never_paces_the_engine",
        ),
    ),
    Surface(
        "an engine's process tree (/proc)",
        "An engine's descendants that leave its process group",
        ("core/engines/activity/tree.py", "core/engines/process_group.py", "core/engines/synthetic.py"),
        (
            "test_hostile_engine.py::test_a_descendant_that_leaves_the_group_is_paced_and_ended_with_the_engine",
            "test_edges.py::test_threads_are_read_and_a_gone_or_crowded_process_is_unknown",
        ),
    ),
    Surface(
        "a supervisor's death (the watchdog's /proc walk)",
        "A supervisor's death",
        ("core/engines/watchdog.py",),
        ("test_hostile_engine.py::test_kill_9_of_a_launched_supervisor_ends_its_engine",),
    ),
    Surface(
        "the front proxy's port (HTTP clients)",
        "The front proxy on a supervised engine's port",
        ("core/engines/front_proxy.py", "core/engines/proxy_process.py"),
        (
            "test_front_proxy.py::test_a_head_that_drips_gets_408_and_a_silent_connection_is_closed",
            "test_front_proxy.py::test_at_the_cap_the_oldest_idle_connection_makes_room",
            "test_front_proxy.py::test_an_engines_malformed_chunked_body_ends_the_clients_connection",
            "test_c_relay.py::test_a_client_gets_the_same_bytes_through_the_c_relay_as_through_the_loop",
            "test_c_relay.py::test_a_client_that_stops_reading_holds_a_bounded_part_of_the_proxys_memory",
            "test_c_relay.py::test_a_client_that_leaves_mid_stream_ends_the_engines_connection",
            "test_c_relay.py::test_any_response_head_comes_the_same_through_the_c_relays_request_as_through_the_loop",
            "test_c_relay.py::test_an_engine_that_refuses_or_does_not_answer_the_connect_gets_a_502",
        ),
    ),
    Surface(
        "a listening socket handed down (systemd's LISTEN_FDS, up's --listen-fd)",
        "A listening socket handed down",
        ("core/host/listen_fds.py",),
        (
            "test_listen_fds.py::test_a_bad_count_for_us_is_one_clear_error",
            "test_listen_fds.py::test_what_is_no_listening_tcp_socket_is_refused",
            "test_listen_fds.py::test_run_on_a_bad_socket_from_systemd_exits_2_with_one_line",
        ),
    ),
    Surface(
        "files and directories (config files, logs, the runtime and state directories)",
        "Files and directories",
        ("up/config.py", "up/lines.py", "core/host/paths.py", "core/host/logfiles.py"),
        (
            "test_hostile_paths.py::test_up_check_refuses_hostile_files",
            "test_hostile_paths.py::test_root_never_writes_a_log_through_the_attackers_state_dir",
            "test_hostile_paths.py::test_an_untrusted_runtime_dir_is_fallen_back_from",
            "test_log_files.py::test_a_log_path_that_is_a_link_is_never_followed_nor_rotated",
        ),
    ),
    Surface(
        "segments in /dev/shm",
        "Segment readers",
        (
            "core/registry/segment.py",
            "core/registry/gc.py",
            "core/observe/snapshot.py",
            "cli/gc.py",
            "demo.py",
        ),
        (
            "test_hostile_segment.py::test_truncated_under_readers_is_an_error_row_never_sigbus",
            "test_hostile_segments_flood.py::test_arbitrary_bytes_are_an_error_row_or_a_snapshot_within_budget",
            "test_gc.py::test_gc_never_touches_another_users_segment",
        ),
    ),
    Surface(
        "other users' processes (/proc/<pid>/status)",
        "Other users' processes",
        ("core/observe/users.py",),
        ("test_users_real.py::test_a_status_longer_than_the_budget_is_unverifiable_and_read_no_further",),
    ),
)


def doc_headings(doc: str) -> list[str]:
    return [line.lstrip("#").strip() for line in doc.splitlines() if re.match(r"#{2,4} ", line)]


def functions_in(test_file: Path) -> set[str]:
    if not test_file.is_file():
        return set()
    tree = ast.parse(test_file.read_text())
    return {
        n.name
        for n in tree.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name.startswith("test_")
    }


def surface_problems(surfaces: tuple[Surface, ...], doc: str) -> list[str]:
    """What the map lacks: a section, a module, a hostile test (empty when every surface has them)."""
    problems: list[str] = []
    headings = doc_headings(doc)
    for s in surfaces:
        if not any(h.startswith(s.section) for h in headings):
            problems.append(f"{s.name}: no section {s.section!r} in docs/trust.md")
        problems += [
            f"{s.name}: module gpushare_tui/{m} does not exist" for m in s.modules if not (PACKAGE / m).is_file()
        ]
        if not s.hostile_tests:
            problems.append(f"{s.name}: no hostile test")
        for node in s.hostile_tests:
            file, func = node.split("::")
            if func not in functions_in(REPO / "tests" / file):
                problems.append(f"{s.name}: hostile test tests/{node} does not exist")
    return problems


def unmapped_input_readers(surfaces: tuple[Surface, ...]) -> list[str]:
    """Modules that read outside input (INPUT_READS) but belong to no surface."""
    mapped = {m for s in surfaces for m in s.modules}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "core/host/budgets.py" or rel in mapped:
            continue
        text = path.read_text()
        kinds = [kind for kind, pattern in INPUT_READS.items() if pattern.search(text)]
        if kinds:
            found.append(f"gpushare_tui/{rel} reads {', '.join(kinds)} and belongs to no surface of {__name__}")
    return found


def test_every_surface_has_its_section_and_hostile_tests() -> None:
    problems = surface_problems(SURFACES, TRUST.read_text())
    assert not problems, "\n".join(problems)


def test_every_module_that_reads_outside_input_belongs_to_a_surface() -> None:
    problems = unmapped_input_readers(SURFACES)
    assert not problems, "\n".join(problems)


def test_the_surface_check_fails_on_a_section_taken_out_of_the_doc_or_a_surface_unlisted() -> None:
    doc = TRUST.read_text()
    without = doc.replace("### `--remote URL` (the dashboard", "### Remote hosts (the dashboard")
    assert surface_problems(SURFACES, without) == [
        "a remote host's HTTP replies: no section '`--remote URL` (the dashboard and `--once`) against a hostile"
        " host' in docs/trust.md"
    ]
    unlisted = tuple(s for s in SURFACES if s.section != "Files and directories")
    assert [line.split(" reads ")[0] for line in unmapped_input_readers(unlisted)] == [
        "gpushare_tui/core/host/logfiles.py",
        "gpushare_tui/up/config.py",
        "gpushare_tui/up/lines.py",
    ]
    renamed = tuple(
        Surface(s.name, s.section, s.modules, ("test_gc.py::test_gone",)) if s.section == "Segment readers" else s
        for s in SURFACES
    )
    assert surface_problems(renamed, doc) == [
        "segments in /dev/shm: hostile test tests/test_gc.py::test_gone does not exist"
    ]
