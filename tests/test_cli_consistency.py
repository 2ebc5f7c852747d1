"""The command line has no traps: `--workflows` in any order, one help for LOG|URL,
and one shape for every error (exit 2, last line `attempt-kernel CMD: error: ...`).

Each command runs in-process with a missing file, a FIFO and a missing argument;
the expected exit codes and message shapes are written out by hand.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from attempt_kernel.cli._main import _HANDLERS  # pyright: ignore[reportPrivateUsage]  # the list of commands
from attempt_kernel.cli._main import _parser  # pyright: ignore[reportPrivateUsage]  # what argparse made of argv
from attempt_kernel.cli._main import main

FLOW = "cliflows:GREETER"
OTHER = "waitflows:APPROVER"

# Every command, and whether its journal positional (or option) takes a
# postgresql:// URL beside a log file ("LOG|URL"), only a URL ("URL"), or
# neither (None: table prints the transition table, demo writes a file).
JOURNAL_ARGUMENT: dict[str, str | None] = {
    "table": None,
    "replay": "LOG|URL",
    "demo": None,
    "run": "LOG|URL",  # --log
    "recover": "LOG|URL",
    "runs": "LOG|URL",
    "show": "LOG|URL",
    "reconcile": "LOG|URL",
    "signal": "LOG|URL",
    "cancel": "LOG|URL",
    "resume": "LOG|URL",
    "export": "LOG|URL",
    "submit": "URL",
    "migrate": "URL",
    "worker": "LOG|URL",
    "pool": "URL",
    "pools": "URL",
    "serve": "LOG|URL",
}

ERROR_LINE = re.compile(r"attempt-kernel (?P<command>[a-z]+): error: (?P<message>\S.*)")


def exit_code(argv: list[str]) -> int:
    """`main`'s exit code, argparse's own (it exits with SystemExit) included."""
    try:
        return main(argv)
    except SystemExit as exited:
        assert isinstance(exited.code, int)
        return exited.code


def last_error(err: str, command: str) -> str:
    """The message of stderr's last line, which must be `attempt-kernel COMMAND: error: ...`."""
    assert "Traceback" not in err, err
    lines = err.rstrip("\n").splitlines()
    assert lines, "nothing on stderr"
    found = ERROR_LINE.fullmatch(lines[-1])
    assert found is not None, err
    assert found["command"] == command, err
    return found["message"]


def test_the_table_above_lists_every_command() -> None:
    """A command added later (say `migrate`) must be added here, and so to the tests below."""
    assert sorted(JOURNAL_ARGUMENT) == sorted(_HANDLERS)


# --------------------------------------------------------------------------
# --workflows: one MODULE:ATTR a flag, before or after the positionals
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "workflows"),
    [
        (["recover", "LOG", "--workflows", FLOW], [FLOW]),
        (["recover", "--workflows", FLOW, "LOG"], [FLOW]),
        (["recover", "--workflows", FLOW, "LOG", "--workflows", OTHER], [FLOW, OTHER]),
        (["recover", "--workflows", f"{FLOW},{OTHER}", "LOG"], [FLOW, OTHER]),
        (["recover", "--workflows", f"{FLOW}, {OTHER}", "LOG"], [FLOW, OTHER]),
        (["recover", "LOG"], []),
        (["resume", "--workflows", FLOW, "LOG", "RUN"], [FLOW]),
        (["resume", "LOG", "--workflows", FLOW, "RUN", "--workflows", OTHER], [FLOW, OTHER]),
        (["worker", "--workflows", FLOW, "LOG"], [FLOW]),
        (["worker", "LOG", "--workflows", FLOW, "--workflows", OTHER, "--until-idle"], [FLOW, OTHER]),
        (["serve", "--workflows", FLOW, "LOG"], [FLOW]),
        (["serve", "LOG", "--workflows", FLOW, "--port", "0", "--workflows", OTHER], [FLOW, OTHER]),
    ],
)  # fmt: skip
def test_workflows_goes_before_or_after_the_positionals_and_repeats(argv: list[str], workflows: list[str]) -> None:
    args = _parser().parse_args(argv)
    assert args.workflows == workflows
    assert args.command == argv[0]


@pytest.mark.parametrize(
    ("argv", "value"),
    [
        (["recover", "--workflows", "cliflows", "LOG"], "cliflows"),
        (["recover", "LOG", "--workflows", ":GREETER"], ":GREETER"),
        (["resume", "LOG", "RUN", "--workflows", "cliflows:"], "cliflows:"),
        (["worker", "LOG", "--workflows", f"{FLOW},"], ""),
        (["serve", "LOG", "--workflows", "cliflows.GREETER"], "cliflows.GREETER"),
    ],
)  # fmt: skip
def test_a_workflows_value_without_a_colon_is_a_usage_error_naming_it(
    argv: list[str], value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert exit_code(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: attempt-kernel {argv[0]} ")
    assert last_error(err, argv[0]) == (
        f"argument --workflows: {value!r} is not MODULE:ATTR (for example flows:orders; give one a"
        " flag: --workflows a:x --workflows b:y)"
    )


def test_the_old_form_of_several_values_after_one_flag_is_refused_not_misread(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`recover LOG --workflows a:x b:y` names b:y as an unrecognized argument; nothing runs."""
    assert exit_code(["recover", "LOG", "--workflows", FLOW, OTHER]) == 2
    assert last_error(capsys.readouterr().err, "recover") == f"unrecognized arguments: {OTHER}"


@pytest.mark.parametrize("before", [True, False], ids=["flag-first", "log-first"])
def test_recover_runs_with_the_flag_on_either_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], before: bool
) -> None:
    log = tmp_path / "empty.jsonl"
    log.write_bytes(b"")
    flags = ["--workflows", FLOW, "--workflows", OTHER]
    argv = ["recover", *flags, str(log)] if before else ["recover", str(log), *flags]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        f"recover: nothing to do: {log} ends cleanly and every run in it has finished; the log was not changed\n"
    )


def test_worker_given_two_workflows_serves_both(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "empty.jsonl"
    log.write_bytes(b"")
    assert main(["worker", "--workflows", FLOW, str(log), "--workflows", OTHER, "--until-idle"]) == 0
    assert capsys.readouterr().out == (
        f"worker: serving the runs of {log} (approver, greeter)\n"
        "worker: idle; no unfinished run of these workflows is left\n"
    )


# --------------------------------------------------------------------------
# LOG|URL: one metavar and one help wherever a URL is taken
# --------------------------------------------------------------------------


@pytest.mark.parametrize("command", sorted(JOURNAL_ARGUMENT))
def test_help_says_which_commands_take_a_postgresql_url(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code([command, "--help"]) == 0
    out = capsys.readouterr().out
    usage = out.split("\n\n", 1)[0]
    kind = JOURNAL_ARGUMENT[command]
    if kind is None:
        assert "LOG|URL" not in out
        if command == "demo":
            assert "--log PATH" in usage
            assert "a file, not a postgresql:// URL" in " ".join(out.split())
        return
    assert kind in usage
    text = " ".join(out.split())  # the same words, however wide the terminal
    if kind == "LOG|URL":
        if command == "run":
            assert "--log LOG|URL" in usage
            assert "or a PostgreSQL journal's postgresql:// URL" in text
        else:
            assert "LOG|URL a run log file, or a PostgreSQL journal's postgresql:// URL" in text
        assert "URL|LOG" not in out
    else:
        assert "LOG" not in usage
        assert "URL a PostgreSQL journal's postgresql:// URL (this command has no log file form)" in text


def test_cancel_help_lists_the_refusals_the_readme_table_lists(capsys: pytest.CaptureFixture[str]) -> None:
    """A second cancel is refused (its cancel is recorded already): the README's table said
    so, `cancel --help` listed only an unknown or finished run."""
    assert exit_code(["cancel", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "Exit 0, or 2 for an unknown or finished run, one whose cancel is recorded already,"
        " or other usage or I/O errors (nothing is written then)."
    ) in text, text
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    [row] = [line for line in readme.splitlines() if line.startswith("| `attempt-kernel cancel ")]
    assert row.endswith(
        "| 0, 2 usage or I/O error, an unknown or finished run, one whose cancel is recorded already"
        " (nothing written) |"
    ), row


def test_migrate_help_says_the_other_commands_read_only_the_default_schema(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`migrate --schema S` made tables that no other command reads (none takes --schema):
    `runs URL` then listed nothing and `worker URL` served an empty journal in the default
    schema, while the help said only "the PostgreSQL schema of the journal"."""
    assert exit_code(["migrate", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "--schema S the PostgreSQL schema of the journal (default attempt_kernel); the other"
        " commands read and write attempt_kernel only, so a journal in another schema is for"
        " Python programs that pass schema=S (PgJournal, Worker, run_worker, submit_run, migrate)"
    ) in text, text


# --------------------------------------------------------------------------
# Errors: a missing file, a FIFO, a missing argument
# --------------------------------------------------------------------------

# With {f} where the journal goes. demo and run create a missing log, so
# theirs is in a missing folder; submit, pool and pools take only a URL.
WITH_A_FILE: dict[str, list[str] | None] = {
    "table": None,
    "replay": ["replay", "{f}"],
    "demo": ["demo", "--log", "{f}"],
    "run": ["run", FLOW, "--log", "{f}"],
    "recover": ["recover", "{f}"],
    "runs": ["runs", "{f}"],
    "show": ["show", "{f}", "r-1"],
    "reconcile": ["reconcile", "{f}", "--key", "k", "--confirmed"],
    "signal": ["signal", "{f}", "r-1", "go"],
    "cancel": ["cancel", "{f}", "r-1"],
    "resume": ["resume", "{f}", "r-1"],
    "export": ["export", "{f}"],
    "submit": ["submit", "{f}", FLOW],
    "migrate": ["migrate", "{f}"],
    "worker": ["worker", "{f}", "--workflows", FLOW, "--until-idle"],
    "pool": ["pool", "{f}", "llm", "--slots", "1"],
    "pools": ["pools", "{f}"],
    "serve": ["serve", "{f}", "--port", "0"],
}
URL_ONLY = {"submit", "migrate", "pool", "pools"}

MISSING_ARGUMENT: dict[str, tuple[list[str], str]] = {
    "table": (["table", "--format"], "argument --format: expected one argument"),
    "replay": (["replay"], "the following arguments are required: LOG|URL"),
    "demo": (["demo", "--seed"], "argument --seed: expected one argument"),
    "run": (["run"], "the following arguments are required: MODULE:ATTR"),
    "recover": (["recover", "--workflows", FLOW], "the following arguments are required: LOG|URL"),
    "runs": (["runs", "--json"], "the following arguments are required: LOG|URL"),
    "show": (["show", "a.jsonl"], "the following arguments are required: RUN"),
    "reconcile": (["reconcile", "a.jsonl", "--key", "k"], "one of the arguments --confirmed --rejected is required"),
    "signal": (["signal", "a.jsonl", "r-1"], "the following arguments are required: NAME"),
    "cancel": (["cancel", "a.jsonl"], "the following arguments are required: RUN"),
    "resume": (["resume", "a.jsonl", "--workflows", FLOW], "the following arguments are required: RUN"),
    "export": (["export", "--run", "r-1"], "the following arguments are required: LOG|URL"),
    "submit": (["submit", "postgresql://db/jobs"], "the following arguments are required: MODULE:ATTR"),
    "migrate": (["migrate", "--schema", "s1"], "the following arguments are required: URL"),
    "worker": (["worker", "a.jsonl"], "the following arguments are required: --workflows"),
    "pool": (["pool", "postgresql://db/jobs", "llm"], "the following arguments are required: --slots"),
    "pools": (["pools"], "the following arguments are required: URL"),
    "serve": (["serve", "--workflows", FLOW], "the following arguments are required: LOG|URL"),
}


def test_the_error_tables_list_every_command() -> None:
    assert sorted(WITH_A_FILE) == sorted(MISSING_ARGUMENT) == sorted(_HANDLERS)


def _argv(command: str, path: Path) -> list[str]:
    template = WITH_A_FILE[command]
    assert template is not None
    return [str(path) if part == "{f}" else part for part in template]


@pytest.mark.parametrize("command", sorted(c for c, argv in WITH_A_FILE.items() if argv is not None))
def test_a_missing_file_exits_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    folder = tmp_path / "nowhere" if command in ("demo", "run") else tmp_path
    missing = folder / "missing.jsonl"
    assert exit_code(_argv(command, missing)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before a word is printed
    message = last_error(captured.err, command)
    if command in URL_ONLY:
        assert message == f"{command} works on a PostgreSQL journal: give a postgresql:// URL, not {str(missing)!r}"
    elif command == "serve":
        assert message == f"no run log file {str(missing)!r} (serve reads a log that exists)"
    elif command in ("demo", "run"):  # they create the log: what is missing is its folder
        assert message == f"{folder}: no such folder (the log's folder must exist)"
    else:
        assert message == f"{missing}: no such file"
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing was created


@pytest.mark.parametrize("command", sorted(c for c, argv in WITH_A_FILE.items() if argv is not None))
def test_a_fifo_exits_2_without_blocking(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    assert exit_code(_argv(command, fifo)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    message = last_error(captured.err, command)
    if command in URL_ONLY:
        assert message == f"{command} works on a PostgreSQL journal: give a postgresql:// URL, not {str(fifo)!r}"
    else:
        assert message.startswith(f"{fifo}: is a FIFO (named pipe), not a run log"), message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe.jsonl"]


@pytest.mark.parametrize("command", sorted(MISSING_ARGUMENT))
def test_a_missing_argument_exits_2_with_the_usage_and_one_error_line(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, expected = MISSING_ARGUMENT[command]
    assert exit_code(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"usage: attempt-kernel {command} ")
    assert last_error(captured.err, command) == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--log", "postgresql://ak:secret@db/jobs"],
         "demo writes a run log file, not a PostgreSQL journal: 'postgresql://ak@db/jobs'"),
        (["run", "cliflows", "--log", "x.jsonl"], "'cliflows' is not MODULE:ATTR (for example flows:orders)"),
        (["signal", "{f}", "r-1", "go", "--payload", "{oops"],
         "--payload is not JSON: Expecting property name enclosed in double quotes at line 1 column 2 (character 1)"),
    ],
    ids=["demo-url", "run-target", "signal-payload"],
)  # fmt: skip
def test_an_error_found_after_parsing_has_the_same_last_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    log = tmp_path / "a.jsonl"
    log.write_bytes(b"")
    assert exit_code([str(log) if part == "{f}" else part for part in argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert last_error(captured.err, argv[0]) == message
    assert log.read_bytes() == b""


def test_run_with_an_empty_id_creates_no_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "new.jsonl"
    assert main(["run", FLOW, "--log", str(log), "--run", ""]) == 2
    assert last_error(capsys.readouterr().err, "run") == "--run needs a non-empty id"
    assert list(tmp_path.iterdir()) == []


NOWHERE = "postgresql://nobody:secret@127.0.0.1:1/none"
"""A URL whose server cannot be reached: nothing listens on port 1 (refused at once)."""

UNREACHABLE: dict[str, list[str] | None] = {
    "table": None,
    "demo": None,
    "replay": ["replay", NOWHERE],
    "run": ["run", FLOW, "--log", NOWHERE],
    "recover": ["recover", NOWHERE],
    "runs": ["runs", NOWHERE],
    "show": ["show", NOWHERE, "r-1"],
    "reconcile": ["reconcile", NOWHERE, "--key", "k", "--confirmed"],
    "signal": ["signal", NOWHERE, "r-1", "go"],
    "cancel": ["cancel", NOWHERE, "r-1"],
    "resume": ["resume", NOWHERE, "r-1"],
    "export": ["export", NOWHERE],
    "submit": ["submit", NOWHERE, FLOW],
    "migrate": ["migrate", NOWHERE],
    "worker": ["worker", NOWHERE, "--workflows", FLOW, "--reconnect-for", "0"],
    "pool": ["pool", NOWHERE, "llm", "--slots", "1"],
    "pools": ["pools", NOWHERE],
    "serve": ["serve", NOWHERE, "--port", "0"],
}


def test_the_unreachable_table_lists_every_command() -> None:
    assert sorted(UNREACHABLE) == sorted(_HANDLERS)


@pytest.mark.parametrize("command", sorted(c for c, argv in UNREACHABLE.items() if argv is not None))
def test_an_unreachable_database_exits_3_naming_host_and_database(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = UNREACHABLE[command]
    assert argv is not None
    assert exit_code(argv) == 3
    captured = capsys.readouterr()
    assert "secret" not in captured.out + captured.err
    message = last_error(captured.err, command)
    if command == "worker":  # it gave up reconnecting, after --reconnect-for 0 seconds
        assert message.startswith("database unavailable: PostgreSQL at 127.0.0.1:1, database none"), message
    else:
        assert message.startswith("cannot connect to PostgreSQL at 127.0.0.1:1, database none"), message


def test_serve_a_url_with_workflows_is_a_usage_error_not_a_flag_ignored(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """On a PostgreSQL journal, Resume hands a run to the journal's workers, so `serve URL`
    has no use for --workflows: refused, naming why, before anything is imported or a
    database asked (this URL names no server)."""
    assert exit_code(["serve", "postgresql://ak@localhost:1/jobs", "--workflows", "no_such_module:flow"]) == 2
    assert last_error(capsys.readouterr().err, "serve") == (
        "--workflows is for a log file: on a PostgreSQL journal, Resume hands a run to the"
        " journal's workers, which load its workflow; serve the URL without it"
    )
