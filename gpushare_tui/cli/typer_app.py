"""The typer application: every command, registered here, and the one place where typer's
own command-line errors (unknown option, missing value, ...) become one line and exit 2."""

from __future__ import annotations

import typer

from . import control_cmds, dashboard, demo, engines, gc, logs, serve, synth, up
from .common import ExitCode, error_line

app = typer.Typer(
    add_completion=True,  # --install-completion / --show-completion [bash|zsh|fish|powershell]
    # plain help: typer's rich panels draw a `<bool>` type beside every flag
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
    help=(
        "Share one GPU fairly between LLM servers, and watch it.\n\n"
        "Exit codes: 0 ok, 1 runtime error, 2 usage error, 128+N a start-up cut short by signal N."
    ),
)
app.callback(invoke_without_command=True)(dashboard.dashboard)
app.command()(synth.synth)
app.command(context_settings=engines.CONTEXT, options_metavar=engines.USAGE)(engines.run)
app.command(context_settings=engines.CONTEXT, options_metavar=engines.USAGE)(engines.launch)
app.command()(control_cmds.status)
app.command(context_settings=control_cmds.VALUE_CONTEXT)(control_cmds.weight)
app.command("class")(control_cmds.klass)
app.command()(control_cmds.stop)
app.command(context_settings=logs.CONTEXT)(logs.logs)
app.command()(demo.demo)
app.command()(serve.serve)
app.command()(up.up)
app.command()(gc.gc)


def run_app(argv: list[str]) -> int:
    """Run the typer application on `argv`; its exit code. Our own errors (GpushareError) pass
    through to the entry point; typer's command-line errors are shown here."""
    try:
        code = app(args=argv, standalone_mode=False)
    except typer.Abort:
        return ExitCode.INTERRUPTED
    except Exception as e:
        problem = _command_line_error(e, argv)
        if problem is None:
            raise
        error_line(problem[0])
        return problem[1]
    return code if isinstance(code, int) else ExitCode.OK


def _command_line_error(e: Exception, argv: list[str] | None = None) -> tuple[str, int] | None:
    """(one line, exit code) for an error typer raised parsing the command line, else None.

    typer vendors click privately (typer._click), so its exception classes are no public name
    to catch; they are known by the interface typer.BadParameter documents instead:
    `format_message()`, `exit_code` (2 for a usage error) and, on a usage error, `ctx`."""
    fmt, code = getattr(e, "format_message", None), getattr(e, "exit_code", None)
    if not callable(fmt) or not isinstance(code, int) or isinstance(code, bool):
        return None
    msg = fmt()
    if code != ExitCode.USAGE:
        return msg, code
    number = _not_a_number(e, msg, argv or [])
    if number is not None:  # as every other bad value: `invalid --opt 'VALUE': PROBLEM`
        return number, code
    ctx = getattr(e, "ctx", None)
    sub = ctx.info_name if ctx is not None and ctx.parent is not None else ""
    return f"{msg} (see: gpushare-tui {sub + ' ' if sub else ''}--help)", code


# typer's words when an option's value is not of its type (a number, an integer), and ours for it
_TYPE_PROBLEMS = (("valid integer", "must be an integer"), ("valid number", "must be a number"))


def _not_a_number(e: Exception, msg: str, argv: list[str]) -> str | None:
    """`invalid --opt 'VALUE': must be a number` for a value typer could not convert to its option's number
    type (the value as given on `argv`, before any `--`), else None."""
    problem = next((ours for theirs, ours in _TYPE_PROBLEMS if theirs in msg), None)
    opts = getattr(getattr(e, "param", None), "opts", None)
    if problem is None or not isinstance(opts, list):
        return None
    words = argv[: argv.index("--")] if "--" in argv else argv
    for i, word in enumerate(words):
        for opt in opts:
            if word == opt and i + 1 < len(words):
                return f"invalid {opt} {words[i + 1]!r}: {problem}"
            if word.startswith(opt + "="):
                return f"invalid {opt} {word.split('=', 1)[1]!r}: {problem}"
    return None
