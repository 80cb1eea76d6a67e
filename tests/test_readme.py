"""The README is the front door: at most 150 lines, its command table is the CLI's commands (every row a command
that exists, every command a row), and every relative link in it and in docs/ resolves (the file, and the
#anchor to a heading of that file)."""

from __future__ import annotations

import re
from pathlib import Path

from testkit.paths import REPO

README = REPO / "README.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def cli_commands() -> set[str]:
    from gpushare_tui.cli.typer_app import app

    return {c.name or c.callback.__name__ for c in app.registered_commands if c.callback is not None}


def table_commands(text: str) -> tuple[set[str], bool]:
    """The commands the `## Commands` table names (its rows' first cells: `gpushare-tui COMMAND ...`), and whether
    it has the row of the bare `gpushare-tui` (the dashboard)."""
    section = text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    named: set[str] = set()
    bare = False
    for row in section.splitlines():
        cell = re.match(r"\|\s*`gpushare-tui([^`]*)`", row)
        if cell is None:
            continue
        words = cell.group(1).split()
        if not words or words[0].startswith("-"):
            bare = bare or not words
            continue
        named.add(words[0])
    return named, bare


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(h) for h in HEADING.findall(text)}


def broken_links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text())
    problems = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http(s):, mailto:: not ours to check here
            continue
        file_part, _, anchor = target.partition("#")
        where = (path.parent / file_part).resolve() if file_part else path
        if not where.exists():
            problems.append(f"{path.name}: {target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            problems.append(f"{path.name}: {target}: no heading #{anchor} in {where.name}")
    return problems


def test_the_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= 150


def test_the_command_table_is_the_clis_commands() -> None:
    named, bare = table_commands(README.read_text())
    assert bare, "the dashboard (`gpushare-tui` alone) has no row"
    assert named == cli_commands(), (
        f"in the table, not a command: {sorted(named - cli_commands())}; "
        f"a command, not in the table: {sorted(cli_commands() - named)}"
    )


def test_every_relative_link_resolves() -> None:
    pages = [README, *sorted((REPO / "docs").glob("*.md"))]
    problems = [p for page in pages for p in broken_links(page)]
    assert not problems, "\n".join(problems)


def test_the_checks_fail_on_a_bad_readme(tmp_path: Path) -> None:
    """The table check names a missing command and an unknown one; the link check a missing file and anchor."""
    text = README.read_text()
    cut = "\n".join(line for line in text.splitlines() if not line.startswith("| `gpushare-tui class"))
    named, _ = table_commands(cut.replace("`gpushare-tui serve", "`gpushare-tui serves"))
    assert "class" not in named and "serves" in named
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# A heading: `here`\n")
    page.write_text("[a](missing.md) [b](there.md#nowhere) [c](there.md#a-heading-here) [d](https://x.example)\n")
    assert broken_links(page) == [
        "page.md: missing.md: no such file",
        "page.md: there.md#nowhere: no heading #nowhere in there.md",
    ]
