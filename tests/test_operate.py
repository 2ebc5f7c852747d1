"""Operating a user's own workflow through the command line.

Every test drives ``python -m attempt_kernel`` in a subprocess whose current
folder is a temporary copy of ``tests/flows/orders.py`` (the CLI imports
``MODULE:ATTR`` from there). That module's fake downstream service,
``calls.jsonl``, books every effect call and deduplicates nothing, so the
tests count what was really sent. Expected values are written by hand;
idempotency keys, which nobody can write by hand, are read from the
downstream's book, never from the code under test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sessions import workflow_in

from attempt_kernel import (
    Admit,
    AttemptCreated,
    AttemptTransitioned,
    DomainStateSet,
    EffectUnknown,
    Indeterminate,
    Job,
    OrphanEnded,
    Pending,
    RunControl,
    Running,
    RunLogWriter,
    RunStarted,
    Step,
    StepContext,
    Workflow,
    WorkflowError,
    load_workflow,
    recover_log,
    run_jobs,
)

pytestmark = pytest.mark.slow

FLOW = Path(__file__).parent / "flows" / "orders.py"
TARGET = "orders:orders"
LOG = "orders.jsonl"
LOCK_ERROR = "another process is writing this log"


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def cli(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``attempt-kernel ARGS`` in ``cwd``, with the flow's knobs set only as given."""
    environ = {k: v for k, v in os.environ.items() if k not in ("CRASH_DURING", "RECONCILER")}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "attempt_kernel", *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


def crash(cwd: Path, effect: str, *args: str, **env: str) -> None:
    """``run`` the orders flow and let it die by SIGKILL inside ``effect``."""
    done = cli(cwd, "run", TARGET, *args, CRASH_DURING=effect, **env)
    assert done.returncode == -9, done.stderr


def calls(cwd: Path) -> list[dict[str, Any]]:
    """Every effect call the fake downstream service saw, in order."""
    book = cwd / "calls.jsonl"
    if not book.exists():
        return []
    return [json.loads(line) for line in book.read_text().splitlines()]


def sent(cwd: Path, effect: str) -> list[str]:
    """The keys ``effect`` was called with, once per call."""
    return [c["key"] for c in calls(cwd) if c["effect"] == effect]


def show_json(cwd: Path, run: str, log: str = LOG) -> dict[str, Any]:
    done = cli(cwd, "show", log, run, "--json")
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def statuses(cwd: Path, log: str = LOG) -> dict[str, str]:
    done = cli(cwd, "runs", log, "--json")
    assert done.returncode == 0, done.stderr
    return {r["run"]: r["status"] for r in json.loads(done.stdout)["runs"]}


def attempt(doc: dict[str, Any], step: str, number: int) -> dict[str, Any]:
    """One attempt of one step in a `show --json` document."""
    [found] = [s for s in doc["steps"] if s["step"] == step]
    [entry] = [a for a in found["attempts"] if a["attempt"] == number]
    result: dict[str, Any] = entry
    return result


def load_orders(folder: Path) -> Workflow:
    """The orders workflow, imported in this process from ``folder``'s copy."""
    return workflow_in(folder / "orders.py", "orders", "operate_orders")


def make_flow_folder(folder: Path) -> Path:
    shutil.copy(FLOW, folder / "orders.py")
    return folder


@pytest.fixture
def flow(tmp_path: Path) -> Path:
    """A folder holding a copy of the orders flow, where the CLI runs."""
    return make_flow_folder(tmp_path)


@pytest.fixture
def indeterminate(flow: Path) -> Path:
    """orders-1 crashed inside email-receipt (no reconciler) and was recovered:
    its send-receipt attempt is Indeterminate and the run needs reconciliation."""
    crash(flow, "email-receipt", "--input", '{"amount_cents": 700}')
    assert cli(flow, "recover", LOG, "--workflows", TARGET).returncode == 0
    assert statuses(flow) == {"orders-1": "needs-reconciliation"}
    return flow


async def _cancel_at_once(control: RunControl) -> None:
    control.cancel()


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One log with a run of every finished and unfinished standing (read only).

    orders-1 succeeded, orders-2 failed, orders-3 needs reconciliation,
    orders-4 cancelled (through the Python API), orders-5 interrupted.
    """
    folder = make_flow_folder(tmp_path_factory.mktemp("zoo"))
    assert cli(folder, "run", TARGET, "--input", '{"amount_cents": 500}').returncode == 0
    assert cli(folder, "run", TARGET, "--input", '{"fail": true}').returncode == 1
    crash(folder, "email-receipt", "--input", '{"amount_cents": 700}')
    assert cli(folder, "recover", LOG, "--workflows", TARGET).returncode == 0
    workflow = load_orders(folder)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)  # the flow books its calls in the current folder
        with RunLogWriter(folder / LOG) as writer:
            [report] = run_jobs(
                writer,
                [Job(workflow=workflow, run="orders-4", supervise=_cancel_at_once)],
            )
    assert report.status == "cancelled"
    crash(folder, "charge-card", "--input", '{"amount_cents": 900}')
    return folder


@pytest.fixture
def held(zoo: Path) -> Iterator[Path]:
    """The zoo's log while this process holds its writer lock."""
    with RunLogWriter(zoo / LOG, create=False):
        yield zoo


# --------------------------------------------------------------------------
# run MODULE:ATTR
# --------------------------------------------------------------------------


def test_run_exits_0_when_the_run_succeeded(flow: Path) -> None:
    """A run whose steps all succeed prints its report and exits 0."""
    done = cli(flow, "run", TARGET, "--input", '{"amount_cents": 700}')
    assert done.returncode == 0, done.stderr
    assert "run orders-1 (workflow orders):" in done.stdout
    assert "  charge        Succeeded     attempts 1" in done.stdout
    assert "  send-receipt  Succeeded     attempts 1" in done.stdout
    assert "run status: succeeded" in done.stdout


def test_run_exits_1_when_the_run_did_not_succeed(flow: Path) -> None:
    """A step that raises fails the run: exit 1, status failed, its dependent never sent."""
    done = cli(flow, "run", TARGET, "--input", '{"fail": true}')
    assert done.returncode == 1, done.stderr
    assert "run status: failed" in done.stdout
    assert calls(flow) == []


def test_run_records_the_input_in_its_start_record(flow: Path) -> None:
    """--input is written, as given, into the run's run_started record."""
    assert cli(flow, "run", TARGET, "--input", '{"amount_cents": 700, "tags": ["a"]}').returncode == 0
    first = json.loads((flow / LOG).read_text().splitlines()[0])
    assert first["type"] == "run_started"
    assert first["run"] == "orders-1"
    assert first["input"] == {"amount_cents": 700, "tags": ["a"]}


def test_steps_see_the_input_as_ctx_input(flow: Path) -> None:
    """Both steps' effects see the run's input through ctx.input."""
    assert cli(flow, "run", TARGET, "--input", '{"amount_cents": 700}').returncode == 0
    assert [(c["effect"], c["input"]) for c in calls(flow)] == [
        ("charge-card", {"amount_cents": 700}),
        ("email-receipt", {"amount_cents": 700}),
    ]


def test_default_run_ids_are_the_workflow_name_and_the_next_number(flow: Path) -> None:
    """Three runs without --run are orders-1, orders-2 and orders-3."""
    for _ in range(3):
        assert cli(flow, "run", TARGET).returncode == 0
    assert statuses(flow) == {
        "orders-1": "succeeded",
        "orders-2": "succeeded",
        "orders-3": "succeeded",
    }


def test_default_log_is_the_workflow_name_dot_jsonl(flow: Path) -> None:
    """Without --log the run is appended to orders.jsonl in the current folder."""
    assert cli(flow, "run", TARGET).returncode == 0
    assert sorted(p.name for p in flow.iterdir() if p.is_file()) == [
        "calls.jsonl",
        "orders.jsonl",
        "orders.py",
    ]


# --------------------------------------------------------------------------
# Run ids are unique in a log (docs/contracts.md)
# --------------------------------------------------------------------------


def test_a_finished_run_id_runs_nothing_and_prints_the_recorded_report(flow: Path) -> None:
    """`run --run orders-1` after it succeeded sends no effect, writes nothing, exits 0."""
    assert cli(flow, "run", TARGET, "--run", "orders-1").returncode == 0
    before = (flow / LOG).read_bytes()
    done = cli(flow, "run", TARGET, "--run", "orders-1")
    assert done.returncode == 0, done.stderr
    assert "run orders-1 already finished in orders.jsonl; nothing was run again." in done.stdout
    assert "  charge        Succeeded     attempts 1" in done.stdout
    assert "run status: succeeded" in done.stdout
    assert (flow / LOG).read_bytes() == before
    assert [c["effect"] for c in calls(flow)] == ["charge-card", "email-receipt"]


def test_a_finished_failed_run_id_exits_1_with_its_recorded_report(flow: Path) -> None:
    """Re-running a run that failed runs nothing and still says it did not succeed."""
    assert cli(flow, "run", TARGET, "--input", '{"fail": true}').returncode == 1
    before = (flow / LOG).read_bytes()
    done = cli(flow, "run", TARGET, "--run", "orders-1")
    assert done.returncode == 1, done.stderr
    assert "run status: failed" in done.stdout
    assert (flow / LOG).read_bytes() == before


def test_an_unfinished_run_id_is_refused_pointing_at_recover(flow: Path) -> None:
    """After a SIGKILL, `run --run orders-1` exits 2 naming the recover command; nothing sent."""
    crash(flow, "charge-card")
    before = (flow / LOG).read_bytes()
    done = cli(flow, "run", TARGET, "--run", "orders-1")
    assert done.returncode == 2
    assert (
        "has not finished; resume it with"
        " `attempt-kernel recover orders.jsonl --workflows orders:orders`"
    ) in done.stderr
    assert (flow / LOG).read_bytes() == before
    assert len(sent(flow, "charge-card")) == 1


def test_an_unfinished_run_id_of_another_workflow_is_refused_naming_that_workflow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`run cliflows:GREETER --run a-1`, where a-1 is a waiting run of workflow 'approver':
    the hint named `--workflows cliflows:GREETER`, which recover then refuses (a-1 belongs
    to 'approver'). It names the run's own workflow now (its MODULE:ATTR is not known here)."""
    from attempt_kernel.cli._main import main
    from test_cli_waits import waiting_log

    log = waiting_log(tmp_path / "a.jsonl")
    before = log.read_bytes()
    assert main(["run", "cliflows:GREETER", "--log", str(log), "--run", "a-1"]) == 2
    assert capsys.readouterr().err == (
        f"attempt-kernel run: error: run 'a-1' is already in {log} and has not finished, and it is a run"
        " of workflow 'approver', not 'greeter'; resume it with"
        f" `attempt-kernel recover {log} --workflows MODULE:ATTR` (MODULE:ATTR: your workflow approver),"
        " or pick another --run\n"
    )
    assert log.read_bytes() == before


def test_two_demos_started_together_never_pick_the_same_run_id(tmp_path: Path) -> None:
    """Two demos launched at once on a log holding trip-1: distinct ids, a valid log."""
    log = tmp_path / "demo.jsonl"
    assert cli(tmp_path, "demo", "--log", str(log)).returncode == 0
    command = [sys.executable, "-m", "attempt_kernel", "demo", "--log", str(log)]
    racers = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [racer.communicate(timeout=60) for racer in racers]
    codes = [racer.returncode for racer in racers]
    for code, (_, err) in zip(codes, outputs):
        # The loser of the lock race is refused, never given a taken id.
        assert code == 0 or (code == 2 and LOCK_ERROR in err), err
    ids = [r["run"] for r in json.loads(cli(tmp_path, "runs", str(log), "--json").stdout)["runs"]]
    assert ids == ["trip-1", "trip-2", "trip-3"][: 1 + codes.count(0)]
    assert cli(tmp_path, "replay", str(log)).returncode == 0


# --------------------------------------------------------------------------
# recover LOG [--workflows MODULE:ATTR]...
# --------------------------------------------------------------------------


def test_recover_without_workflows_refuses_a_users_run_naming_the_flag(flow: Path) -> None:
    """The orders run is not the demo's: exit 2, the message names --workflows, no byte written."""
    crash(flow, "charge-card")
    before = (flow / LOG).read_bytes()
    done = cli(flow, "recover", LOG)
    assert done.returncode == 2
    assert "run 'orders-1' belongs to workflow 'orders'" in done.stderr
    assert "pass it with --workflows MODULE:ATTR" in done.stderr
    assert (flow / LOG).read_bytes() == before


def test_recover_with_workflows_resumes_the_run_to_its_end(flow: Path) -> None:
    """Given the workflow, recover finishes the crashed run: succeeded, log valid, exit 0."""
    crash(flow, "charge-card", RECONCILER="happened")
    done = cli(flow, "recover", LOG, "--workflows", TARGET, RECONCILER="happened")
    assert done.returncode == 0, done.stderr
    assert "resuming run orders-1 (workflow orders)" in done.stdout
    assert "run status: succeeded" in done.stdout
    assert "verdict: valid" in done.stdout
    assert statuses(flow) == {"orders-1": "succeeded"}
    assert len(sent(flow, "email-receipt")) == 1


def cli_unwritable(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`cli`, with the log unable to grow by a byte: the first record written fails."""
    import resource
    import signal

    size = (cwd / LOG).stat().st_size

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    environ = {k: v for k, v in os.environ.items() if k not in ("CRASH_DURING", "RECONCILER")}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "attempt_kernel", *args], cwd=cwd, env=environ, preexec_fn=limited,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("command", "what"),
    [
        (["recover", LOG], "this recover"),
        (["resume", LOG, "orders-1"], "this resume"),
        (["worker", LOG, "--until-idle"], "the worker's recovery"),
    ],
)
def test_a_reconcilers_answer_is_printed_when_the_write_after_it_fails(
    flow: Path, command: list[str], what: str
) -> None:
    """The bank said the charge happened, then recording it failed (the log could not
    grow): the command exits 2 with the write's error, and says first what the bank
    answered, since the log does not hold it. The log is unchanged."""
    crash(flow, "charge-card")
    before = (flow / LOG).read_bytes()
    [key] = sent(flow, "charge-card")
    done = cli_unwritable(flow, *command, "--workflows", TARGET, RECONCILER="happened")
    assert done.returncode == 2, done.stdout + done.stderr
    name = command[0]
    assert done.stderr.splitlines()[0] == (
        f"attempt-kernel {name}: warning: orders-1 charge#1: asked the reconciler about 'charge-card'"
        f" ({key}): it happened (intent Confirmed); {what} did not complete, so the journal may not"
        " hold this answer"
    )
    assert done.stderr.splitlines()[1].startswith(f"attempt-kernel {name}: error: orders.jsonl: write of record")
    assert len(done.stderr.splitlines()) == 2
    assert (flow / LOG).read_bytes() == before


def test_resume_says_what_the_reconciler_answered_and_which_keys_to_reconcile(flow: Path) -> None:
    """`resume` of a run that crashed inside its charge, whose reconciler cannot tell,
    prints the answer with its reason, the orphan's end, and the key to reconcile with the
    command that does it (it printed only `ended needs-reconciliation`)."""
    crash(flow, "charge-card")
    [key] = sent(flow, "charge-card")
    done = cli(flow, "resume", LOG, "orders-1", "--workflows", TARGET, RECONCILER="unknown")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"resume: asked the reconciler of orders-1 / charge #1 about charge-card ({key}): unknown (the test said so)",
        f"resume: ended orphaned attempt orders-1 / charge #1: Running -> Indeterminate (outstanding intent keys: {key})",
        f"resume: run 'orders-1' was resumed and ended needs-reconciliation (outstanding intent keys: {key});"
        " once the downstream system says what happened, `attempt-kernel reconcile orders.jsonl --key KEY"
        " --confirmed|--rejected` records it for each key",
    ]


def test_resume_json_lists_what_the_reconcilers_answered_and_the_orphans_ended(flow: Path) -> None:
    """`resume --json` carries `asked` and `orphans_ended`, as `recover --json` does."""
    crash(flow, "charge-card")
    [key] = sent(flow, "charge-card")
    done = cli(flow, "resume", LOG, "orders-1", "--workflows", TARGET, "--json", RECONCILER="happened")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "log": LOG,
        "run": "orders-1",
        "resumed": "run 'orders-1' was resumed and ended succeeded",
        "asked": [{
            "run": "orders-1", "step": "charge", "attempt": 1, "intent": "charge-card", "key": key,
            "finding": "happened", "reason": None,
        }],
        "orphans_ended": [{
            "run": "orders-1", "step": "charge", "attempt": 1, "from": "Running", "to": "Cancelled",
            "outstanding_keys": [],
        }],
    }  # fmt: skip


# --------------------------------------------------------------------------
# runs LOG [--json]
# --------------------------------------------------------------------------


def test_runs_json_gives_every_status_by_its_word(zoo: Path) -> None:
    """succeeded, failed, needs-reconciliation, cancelled and interrupted, one per run."""
    assert statuses(zoo) == {
        "orders-1": "succeeded",
        "orders-2": "failed",
        "orders-3": "needs-reconciliation",
        "orders-4": "cancelled",
        "orders-5": "interrupted",
    }


def test_runs_json_gives_workflow_attempts_and_domain_state(zoo: Path) -> None:
    """Each run object carries its workflow, attempt count and last domain state."""
    doc = json.loads(cli(zoo, "runs", LOG, "--json").stdout)
    assert doc["violations"] == 0
    assert [(r["run"], r["workflow"], r["attempts"], r["domain_state"]) for r in doc["runs"]] == [
        ("orders-1", "orders", 2, "done"),
        ("orders-2", "orders", 1, None),
        ("orders-3", "orders", 2, "receipting"),
        ("orders-4", "orders", 1, "charging"),
        ("orders-5", "orders", 1, "charging"),
    ]
    assert doc["runs"][4]["ended"] is None
    assert all(r["ended"] is not None for r in doc["runs"][:4])


def test_runs_text_has_one_line_per_run(zoo: Path) -> None:
    """The table's columns: id, workflow, status, attempts, started, ended, domain state."""
    done = cli(zoo, "runs", LOG)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == [
        "RUN", "WORKFLOW", "STATUS", "ATTEMPTS", "STARTED", "ENDED", "DOMAIN", "STATE",
    ]  # fmt: skip
    rows = [line.split() for line in lines[1:]]
    assert [(r[0], r[1], r[2], r[3], r[6]) for r in rows] == [
        ("orders-1", "orders", "succeeded", "2", "done"),
        ("orders-2", "orders", "failed", "1", "-"),
        ("orders-3", "orders", "needs-reconciliation", "2", "receipting"),
        ("orders-4", "orders", "cancelled", "1", "charging"),
        ("orders-5", "orders", "interrupted", "1", "charging"),
    ]
    assert rows[4][5] == "-"


def test_runs_says_running_while_another_process_holds_the_writer_lock(held: Path) -> None:
    """An unfinished run is `running` while a writer holds the log; finished ones keep their word."""
    assert statuses(held) == {
        "orders-1": "succeeded",
        "orders-2": "failed",
        "orders-3": "needs-reconciliation",
        "orders-4": "cancelled",
        "orders-5": "running",
    }


# --------------------------------------------------------------------------
# show LOG RUN [--json]
# --------------------------------------------------------------------------


def test_show_text_lists_attempts_causes_and_intents_with_keys(zoo: Path) -> None:
    """The needs-reconciliation run step by step, its outstanding intent under its key."""
    [key] = [
        c["key"]
        for c in calls(zoo)
        if c["effect"] == "email-receipt" and c["input"] == {"amount_cents": 700}
    ]
    done = cli(zoo, "show", LOG, "orders-3")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("run orders-3 (workflow orders): needs-reconciliation\n")
    assert '  input: {"amount_cents":700}\n' in out
    assert "  domain state: receipting\n" in out
    assert "  step charge\n    attempt 1  Succeeded\n" in out
    assert '      result: {"charge":"ch-1"}\n' in out
    assert "  step send-receipt\n    attempt 1  Indeterminate\n" in out
    assert "Running -> Indeterminate (Cancel(intent_dispatched=True))" in out
    assert f"      intent email-receipt  key {key}  Dispatched\n" in out


def test_show_json_lists_attempt_states_causes_errors_and_intents(zoo: Path) -> None:
    """show --json: the failed run's attempt, its moves and error; the crashed run's intent."""
    failed = show_json(zoo, "orders-2")
    assert (failed["run"], failed["workflow"], failed["status"]) == ("orders-2", "orders", "failed")
    first = attempt(failed, "charge", 1)
    assert first["state"] == "Failed"
    assert [(m["from"], m["cause"], m["to"]) for m in first["moves"]] == [
        ("Pending", "Admit", "Running"),
        ("Running", "Fail", "Failed"),
    ]
    assert first["error"] == "RuntimeError: card declined by the test"
    assert first["intents"] == []
    crashed = show_json(zoo, "orders-5")
    assert crashed["status"] == "interrupted"
    [intent] = attempt(crashed, "charge", 1)["intents"]
    [key] = [c["key"] for c in calls(zoo) if c["input"] == {"amount_cents": 900}]
    assert (intent["intent"], intent["key"], intent["state"]) == ("charge-card", key, "Dispatched")


def test_reconcile_of_an_unknown_key_while_a_writer_holds_the_log_writes_nothing(held: Path) -> None:
    """reconcile goes through the inbox while the log is held, but a key no intent
    carries is refused first: exit 2, the log's bytes unchanged, no inbox made."""
    before = (held / LOG).read_bytes()
    done = cli(held, "reconcile", LOG, "--key", "ak1-any", "--rejected")
    assert done.returncode == 2
    assert done.stderr == "attempt-kernel reconcile: error: no intent with key 'ak1-any' is outstanding in orders.jsonl\n"
    assert (held / LOG).read_bytes() == before
    assert not (held / f"{LOG}.inbox").exists()


def test_show_of_an_unknown_run_exits_2(zoo: Path) -> None:
    """A run id the log does not hold is a usage error naming it."""
    done = cli(zoo, "show", LOG, "orders-99")
    assert done.returncode == 2
    assert "no run 'orders-99' in orders.jsonl" in done.stderr
    assert done.stdout == ""


# --------------------------------------------------------------------------
# reconcile LOG --key KEY (--confirmed [--result JSON] | --rejected) [--note TEXT]
# --------------------------------------------------------------------------


def test_reconcile_an_unknown_key_exits_2_and_writes_nothing(indeterminate: Path) -> None:
    """A key no intent carries: exit 2 naming it, the log's bytes unchanged."""
    before = (indeterminate / LOG).read_bytes()
    done = cli(indeterminate, "reconcile", LOG, "--key", "ak1-nope", "--rejected")
    assert done.returncode == 2
    assert "no intent with key 'ak1-nope'" in done.stderr
    assert (indeterminate / LOG).read_bytes() == before


def test_reconcile_a_key_that_is_not_outstanding_exits_2_and_writes_nothing(
    indeterminate: Path,
) -> None:
    """charge-card was Confirmed by the run itself: nothing to reconcile."""
    [key] = sent(indeterminate, "charge-card")
    before = (indeterminate / LOG).read_bytes()
    done = cli(indeterminate, "reconcile", LOG, "--key", key, "--confirmed")
    assert done.returncode == 2
    assert f"{key!r}" in done.stderr and "is not outstanding" in done.stderr
    assert (indeterminate / LOG).read_bytes() == before


def test_reconciling_a_key_a_second_time_exits_2_and_writes_nothing(indeterminate: Path) -> None:
    """Once an operator rejected email-receipt, a later --confirmed for it is refused."""
    [key] = sent(indeterminate, "email-receipt")
    assert cli(indeterminate, "reconcile", LOG, "--key", key, "--rejected").returncode == 0
    before = (indeterminate / LOG).read_bytes()
    done = cli(indeterminate, "reconcile", LOG, "--key", key, "--confirmed")
    assert done.returncode == 2
    assert (
        f"intent {key!r} ('email-receipt' of step 'send-receipt') is not outstanding: it is"
        " Rejected"
    ) in done.stderr
    assert (indeterminate / LOG).read_bytes() == before


def test_reconcile_confirmed_and_rejected_together_exits_2_and_writes_nothing(
    indeterminate: Path,
) -> None:
    """--confirmed and --rejected exclude each other."""
    [key] = sent(indeterminate, "email-receipt")
    before = (indeterminate / LOG).read_bytes()
    done = cli(indeterminate, "reconcile", LOG, "--key", key, "--confirmed", "--rejected")
    assert done.returncode == 2
    assert "not allowed with argument" in done.stderr
    assert (indeterminate / LOG).read_bytes() == before


def test_reconcile_result_without_confirmed_exits_2_and_writes_nothing(
    indeterminate: Path,
) -> None:
    """A rejected effect has no result: --result with --rejected is refused."""
    [key] = sent(indeterminate, "email-receipt")
    before = (indeterminate / LOG).read_bytes()
    done = cli(indeterminate, "reconcile", LOG, "--key", key, "--rejected", "--result", '{"a": 1}')
    assert done.returncode == 2
    assert "--result goes with --confirmed" in done.stderr
    assert (indeterminate / LOG).read_bytes() == before


def test_reconcile_keeps_replay_valid_and_show_lists_who_decided(indeterminate: Path) -> None:
    """replay is valid before and after; show --json gives the record's by and note."""
    [key] = sent(indeterminate, "email-receipt")
    assert cli(indeterminate, "replay", LOG).returncode == 0
    done = cli(
        indeterminate, "reconcile", LOG, "--key", key, "--rejected",
        "--note", "mail provider has nothing",
    )
    assert done.returncode == 0, done.stderr
    after = cli(indeterminate, "replay", LOG)
    assert after.returncode == 0, after.stdout
    assert "verdict: valid" in after.stdout
    first = attempt(show_json(indeterminate, "orders-1"), "send-receipt", 1)
    assert first["state"] == "Indeterminate"  # docs/contracts.md, "Reconciliation": never rewritten
    [intent] = first["intents"]
    assert (intent["key"], intent["state"]) == (key, "Rejected")
    last = intent["changes"][-1]
    assert (last["from"], last["cause"], last["to"]) == ("Dispatched", "Reject", "Rejected")
    assert (last["reconciled_by"], last["note"]) == ("operator", "mail provider has nothing")
    text = cli(indeterminate, "show", LOG, "orders-1").stdout
    assert "reconciled by operator: mail provider has nothing" in text


def test_replay_names_a_reconciled_run_as_needing_recover(indeterminate: Path) -> None:
    """Once nothing is outstanding, replay lists the run as unfinished, for recover."""
    [key] = sent(indeterminate, "email-receipt")
    assert cli(indeterminate, "reconcile", LOG, "--key", key, "--rejected").returncode == 0
    out = cli(indeterminate, "replay", LOG).stdout
    assert "unfinished runs: 1 (`attempt-kernel recover` resumes them)\n  run orders-1\n" in out
    assert statuses(indeterminate) == {"orders-1": "interrupted"}


def test_recover_after_a_rejection_sends_the_effect_again_under_the_same_key(
    indeterminate: Path,
) -> None:
    """Rejected: recover resumes the run and send-receipt's attempt 2 calls email again."""
    [key] = sent(indeterminate, "email-receipt")
    assert cli(indeterminate, "reconcile", LOG, "--key", key, "--rejected").returncode == 0
    done = cli(indeterminate, "recover", LOG, "--workflows", TARGET)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "  send-receipt  Succeeded     attempts 2" in done.stdout
    assert "run status: succeeded" in done.stdout
    assert sent(indeterminate, "email-receipt") == [key, key]
    assert len(sent(indeterminate, "charge-card")) == 1
    assert statuses(indeterminate) == {"orders-1": "succeeded"}


def test_recover_after_a_confirmation_reuses_the_result_and_never_calls_again(
    indeterminate: Path,
) -> None:
    """Confirmed with a result: attempt 2 succeeds with that result, email is not called again."""
    [key] = sent(indeterminate, "email-receipt")
    done = cli(
        indeterminate, "reconcile", LOG, "--key", key, "--confirmed",
        "--result", '{"message_id": "m-found-by-operator"}',
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    resumed = cli(indeterminate, "recover", LOG, "--workflows", TARGET)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "run status: succeeded" in resumed.stdout
    assert sent(indeterminate, "email-receipt") == [key]
    second = attempt(show_json(indeterminate, "orders-1"), "send-receipt", 2)
    assert (second["state"], second["result"]) == ("Succeeded", {"message_id": "m-found-by-operator"})
    assert second["intents"] == []


# --------------------------------------------------------------------------
# Reconcilers (docs/contracts.md, "Recovery")
# --------------------------------------------------------------------------


def test_a_reconciler_that_finds_the_effect_ends_the_orphan_cancelled(flow: Path) -> None:
    """happened: the intent is Confirmed by the reconciler first, the orphan Cancelled, no re-send."""
    crash(flow, "charge-card")
    [key] = sent(flow, "charge-card")
    done = cli(flow, "recover", LOG, "--workflows", TARGET, RECONCILER="happened")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = show_json(flow, "orders-1")
    first = attempt(doc, "charge", 1)
    assert first["state"] == "Cancelled"
    [intent] = first["intents"]
    assert (intent["key"], intent["state"]) == (key, "Confirmed")
    assert intent["changes"][-1]["reconciled_by"] == "reconciler"
    assert attempt(doc, "charge", 2)["result"] == {"charge": "ch-from-reconciler"}
    assert sent(flow, "charge-card") == [key]


def test_a_reconciler_that_finds_nothing_ends_the_orphan_cancelled_and_resends(flow: Path) -> None:
    """not happened: Rejected by the reconciler, the orphan Cancelled, charge-card sent again."""
    crash(flow, "charge-card")
    [key] = sent(flow, "charge-card")
    done = cli(flow, "recover", LOG, "--workflows", TARGET, RECONCILER="not-happened")
    assert done.returncode == 0, done.stdout + done.stderr
    first = attempt(show_json(flow, "orders-1"), "charge", 1)
    assert first["state"] == "Cancelled"
    [intent] = first["intents"]
    assert intent["state"] == "Rejected"
    assert intent["changes"][-1]["reconciled_by"] == "reconciler"
    assert sent(flow, "charge-card") == [key, key]


def test_a_reconciler_that_raises_counts_as_unknown(
    flow: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """recover_log: the raising reconciler's answer is unknown and the orphan ends Indeterminate."""
    crash(flow, "charge-card")
    [key] = sent(flow, "charge-card")
    monkeypatch.setenv("RECONCILER", "raise")
    writer, recovery = recover_log(flow / LOG, {"orders": load_orders(flow)}, reconciler_deadline=0.2)
    writer.close()
    assert [a.finding for a in recovery.asked] == [
        EffectUnknown(reason="the reconciler raised ConnectionError: the bank is down")
    ]
    assert recovery.orphans == (
        OrphanEnded(
            run="orders-1", step="charge", attempt=1,
            from_state=Running(), to_state=Indeterminate(), outstanding=(key,),
        ),
    )  # fmt: skip


def test_a_reconciler_that_hangs_past_its_deadline_counts_as_unknown(
    flow: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """recover_log with a 0.2 s deadline gives up on a hanging reconciler: Indeterminate.

    The hanging reconciler would answer "the test said so" after 30 s; the
    answer recorded is the deadline's, so recovery did not wait for it.
    """
    crash(flow, "charge-card")
    monkeypatch.setenv("RECONCILER", "hang")
    writer, recovery = recover_log(flow / LOG, {"orders": load_orders(flow)}, reconciler_deadline=0.2)
    writer.close()
    assert [a.finding for a in recovery.asked] == [
        EffectUnknown(reason="the reconciler ran past its 0.2 s deadline")
    ]
    assert [o.to_state for o in recovery.orphans] == [Indeterminate()]
    assert attempt(show_json(flow, "orders-1"), "charge", 1)["state"] == "Indeterminate"


# --------------------------------------------------------------------------
# Domain step states (docs/contracts.md)
# --------------------------------------------------------------------------


async def _nothing(ctx: StepContext) -> None:
    return None


def test_load_workflow_refuses_a_step_naming_an_undeclared_state() -> None:
    """The error names the step and the undeclared state."""
    with pytest.raises(WorkflowError) as caught:
        load_workflow(
            "orders",
            [Step(name="charge", run=_nothing, domain_states=("charging", "shipped"))],
            domain_states=["charging"],
        )
    assert "step 'charge'" in str(caught.value)
    assert "domain state 'shipped' is not declared by the workflow" in str(caught.value)


def test_setting_an_undeclared_state_fails_the_attempt(flow: Path) -> None:
    """ctx.set_state("shipped") fails the charge attempt before its effect: exit 1."""
    done = cli(flow, "run", TARGET, "--input", '{"state": "shipped"}')
    assert done.returncode == 1, done.stderr
    first = attempt(show_json(flow, "orders-1"), "charge", 1)
    assert first["state"] == "Failed"
    assert "domain state 'shipped' is not declared by the workflow" in first["error"]
    assert calls(flow) == []


def test_show_gives_the_current_domain_state(zoo: Path) -> None:
    """show reports the last domain state a step set, run by run."""
    assert [show_json(zoo, run)["domain_state"] for run in ("orders-1", "orders-3", "orders-5")] == [
        "done",
        "receipting",
        "charging",
    ]


def test_a_logged_undeclared_domain_state_is_a_replay_violation(tmp_path: Path) -> None:
    """A forged domain_state record naming an undeclared state: replay exits 1 and names it."""
    log = tmp_path / "forged.jsonl"
    with RunLogWriter(log) as writer:
        writer.append("r", RunStarted(workflow="orders", domain_states=("charging",)))
        writer.append("r", AttemptCreated(step="charge", attempt=1))
        writer.append(
            "r",
            AttemptTransitioned(
                step="charge", attempt=1, from_state=Pending(), cause=Admit(), to_state=Running()
            ),
        )
        writer.append("r", DomainStateSet(step="charge", attempt=1, state="shipped"))
    done = cli(tmp_path, "replay", str(log))
    assert done.returncode == 1
    assert "violations: 1" in done.stdout
    assert (
        "domain state 'shipped' set by step 'charge' is not declared by the run's workflow"
        " (declared: charging)"
    ) in done.stdout
    assert "verdict: valid" not in done.stdout


# --------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_such_flows:orders", "cannot import module 'no_such_flows' (for no_such_flows:orders)"),
        ("orders:shipments", "module 'orders' has no attribute 'shipments'"),
        ("orders:CALLS", "orders:CALLS is a PosixPath, not a Workflow"),
    ],
)
def test_a_bad_import_path_exits_2_naming_module_and_attribute(
    flow: Path, target: str, message: str
) -> None:
    """No module, no attribute, or not a Workflow: exit 2, one clear line, no traceback, no log."""
    done = cli(flow, "run", target)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert not (flow / LOG).exists()


def test_input_that_is_not_json_exits_2_naming_the_position(flow: Path) -> None:
    """`{"amount_cents": }` fails at line 1 column 18 (character 17); nothing is run."""
    done = cli(flow, "run", TARGET, "--input", '{"amount_cents": }')
    assert done.returncode == 2
    assert "--input is not JSON: Expecting value at line 1 column 18 (character 17)" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (flow / LOG).exists()
    assert calls(flow) == []


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["replay", LOG], "unfinished runs: 1 (`attempt-kernel recover` resumes them)\n  run orders-5"),
        (["runs", LOG], "orders-5  orders    running "),
        (["show", LOG, "orders-1"], "run orders-1 (workflow orders): succeeded\n"),
    ],
    ids=["replay", "runs", "show"],
)
def test_reading_commands_work_while_a_writer_holds_the_log(
    held: Path, command: list[str], expected: str
) -> None:
    """replay, runs and show only read: a held lock does not stop them."""
    done = cli(held, *command)
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout


@pytest.mark.parametrize(
    "command",
    [
        ["run", TARGET, "--input", '{"amount_cents": 1}'],
        ["recover", LOG, "--workflows", TARGET],
    ],
    ids=["run", "recover"],
)
def test_writing_commands_are_refused_while_a_writer_holds_the_log(
    held: Path, command: list[str]
) -> None:
    """run and recover meet the lock: exit 2 with the lock error, nothing written."""
    before = (held / LOG).read_bytes()
    calls_before = calls(held)
    done = cli(held, *command)
    assert done.returncode == 2
    assert f"orders.jsonl: {LOCK_ERROR}; two writers would interleave records" in done.stderr
    assert (held / LOG).read_bytes() == before
    assert calls(held) == calls_before
