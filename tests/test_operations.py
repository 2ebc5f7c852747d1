"""The operations module's resume, liveness and run ids, on a file log and on PostgreSQL.

Signal, cancel and reconcile have their own tests (test_operate.py,
test_inbox.py, test_cli_waits.py); here: `resume_run` and the questions an
action asks first (`held_runs`, `next_run_id`). A refusal leaves the log's
bytes as they were.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from typing_extensions import LiteralString

from attempt_kernel import (
    JSON,
    Executor,
    OperationRefused,
    RunContext,
    RunLogWriter,
    StepContext,
    read_log,
    reconcile_intent,
    resume_run,
    send_signal,
    workflow,
)
from attempt_kernel.cli._main import main
from attempt_kernel._ledger import Ledger
from attempt_kernel._operations import held_runs, next_run_id
from attempt_kernel.postgres._deliver import resume_pg
from attempt_kernel.postgres._worker import submit_run
from test_cli_waits import waiting_log
from waitflows import APPROVER, NAPPER


def _q(text: LiteralString, schema: str) -> sql.Composed:
    return sql.SQL(text).format(s=sql.Identifier(schema))


def _ledger(path: Path) -> Ledger:
    ledger = Ledger()
    ledger.feed(read_log(path))
    return ledger


def test_a_signalled_run_that_no_process_drives_is_resumed_to_its_end(tmp_path: Path) -> None:
    log = waiting_log(tmp_path / "a.jsonl", "a-1")
    send_signal(log, "a-1", "approve", {"ok": True})
    said = resume_run(log, "a-1", [APPROVER])
    assert said == "run 'a-1' was resumed and ended succeeded"
    assert _ledger(log).runs["a-1"].status == "succeeded"


async def _pay_without_an_answer(ctx: StepContext) -> JSON:
    async def perform(key: str) -> JSON:
        raise TimeoutError("the bank did not answer")  # sent, maybe: the intent stays Dispatched

    return await ctx.effect("pay", perform)


@workflow("unsure")
async def _unsure(run: RunContext) -> JSON:
    return await run.step("pay", _pay_without_an_answer)


def test_resume_leaves_alone_another_run_reconciled_since_it_ended(tmp_path: Path) -> None:
    """Another run that ended needing reconciliation and was reconciled since is
    unfinished again (`recover` resumes it): `resume_run` of one run leaves it as
    it is, though its workflow was not given."""
    log = waiting_log(tmp_path / "a.jsonl", "a-1")

    async def go() -> None:
        with RunLogWriter(log) as writer:
            report = await Executor(writer).run(_unsure, "u-1")
            assert report.status == "needs-reconciliation"

    asyncio.run(go())
    [key] = _ledger(log).runs["u-1"].outstanding()
    reconcile_intent(log, key, confirmed=True, result={"paid": True})
    assert _ledger(log).runs["u-1"].standing() == "interrupted"
    send_signal(log, "a-1", "approve", {"ok": True})
    before = [item for item in read_log(log) if getattr(item, "run", None) == "u-1"]
    said = resume_run(log, "a-1", [APPROVER])
    assert said == "run 'a-1' was resumed and ended succeeded"
    after = [item for item in read_log(log) if getattr(item, "run", None) == "u-1"]
    assert after == before
    assert _ledger(log).runs["u-1"].standing() == "interrupted"


def test_a_finished_run_is_refused_and_the_log_is_unchanged(tmp_path: Path) -> None:
    log = waiting_log(tmp_path / "a.jsonl", "a-1")
    send_signal(log, "a-1", "approve")
    resume_run(log, "a-1", [APPROVER])
    before = log.read_bytes()
    with pytest.raises(OperationRefused, match=r"^run 'a-1' has finished \(succeeded\); nothing was written$"):
        resume_run(log, "a-1", [APPROVER])
    assert log.read_bytes() == before


def test_an_unknown_run_is_refused(tmp_path: Path) -> None:
    log = waiting_log(tmp_path / "a.jsonl", "a-1")
    before = log.read_bytes()
    with pytest.raises(OperationRefused, match=r"^no run 'zz' in .*a\.jsonl; nothing was written$"):
        resume_run(log, "zz", [APPROVER])
    assert log.read_bytes() == before


def test_resume_run_given_a_mapping_of_workflows_says_it_takes_the_workflows(tmp_path: Path) -> None:
    """resume_run takes the workflows, as resume_log does; a name mapping (what recover_log
    takes) ended in "AttributeError: 'str' object has no attribute 'name'". Nothing written."""
    log = waiting_log(tmp_path / "a.jsonl", "a-1")
    before = log.read_bytes()
    with pytest.raises(TypeError) as caught:
        resume_run(log, "a-1", {"approver": APPROVER})  # type: ignore[dict-item]  # pyright: ignore[reportArgumentType]
    assert str(caught.value) == (
        "resume_run: workflows must be the workflows themselves ([w, ...]), got 'approver', a str"
        " (a dict's key?): pass the mapping's .values()"
    )
    assert log.read_bytes() == before


@pytest.mark.parametrize(("folder", "quoted"), [("logs", "{log}"), ("my logs", "'{log}'")], ids=["plain", "space"])
def test_a_run_whose_workflow_is_not_loaded_is_refused_with_the_command_that_resumes_it(
    tmp_path: Path, folder: str, quoted: str
) -> None:
    """The command is one to paste into a shell: a path with a space in it is quoted."""
    (tmp_path / folder).mkdir()
    log = waiting_log(tmp_path / folder / "a.jsonl", "a-1")
    before = log.read_bytes()
    with pytest.raises(OperationRefused) as refused:
        resume_run(log, "a-1", [NAPPER])
    assert str(refused.value) == (
        f"run 'a-1' belongs to workflow 'approver', which was not loaded; resume it with"
        f" `attempt-kernel recover {quoted.format(log=log)} --workflows MODULE:ATTR`; nothing was written"
    )
    assert log.read_bytes() == before


def test_a_log_another_process_writes_is_refused(tmp_path: Path) -> None:
    log = waiting_log(tmp_path / "a.jsonl", "a-1")
    before = log.read_bytes()
    with RunLogWriter(log):
        assert held_runs(log) is None
        with pytest.raises(OperationRefused, match="a process drives .* now"):
            resume_run(log, "a-1", [APPROVER])
    assert held_runs(log) == frozenset()
    assert log.read_bytes() == before


def test_resume_from_the_command_line_exits_2_on_a_refusal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = waiting_log(tmp_path / "a.jsonl", "a-1")
    assert main(["resume", str(log), "zz"]) == 2
    assert capsys.readouterr().err == f"attempt-kernel resume: error: no run 'zz' in {log}; nothing was written\n"


def test_next_run_id_counts_the_workflows_runs_and_skips_ids_taken(tmp_path: Path) -> None:
    log = waiting_log(tmp_path / "a.jsonl", "approver-2")
    ledger = _ledger(log)
    # one run of approver: the next is approver-2, which is taken, so approver-3
    assert next_run_id(ledger, "approver") == "approver-3"
    assert next_run_id(ledger, "napper") == "napper-1"


# --------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------


@pytest.mark.postgres
def test_a_queued_run_is_made_claimable_and_an_unknown_one_refused(pg_url: str, schema: str) -> None:
    submit_run(pg_url, "approver", "q-1", schema=schema)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(_q("UPDATE {s}.runs SET wake_at = 'infinity' WHERE run = 'q-1'", schema))
    said = resume_pg(pg_url, "q-1", schema=schema)
    assert said == "run 'q-1' is claimable now: a worker of its workflow takes it up at its next claim"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute(_q("SELECT wake_at, owner, done FROM {s}.runs WHERE run = 'q-1'", schema)).fetchone()
    assert row == (None, None, False)
    with pytest.raises(OperationRefused, match=r"^no run 'zz' in the journal; nothing was changed$"):
        resume_pg(pg_url, "zz", schema=schema)


@pytest.mark.postgres
def test_a_run_held_by_a_live_worker_is_refused(pg_url: str, schema: str) -> None:
    submit_run(pg_url, "approver", "q-1", schema=schema)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(_q("INSERT INTO {s}.workers (id, host, pid) VALUES ('w-1', 'h', 1)", schema))
        conn.execute(_q("UPDATE {s}.runs SET owner = 'w-1', fence = 1 WHERE run = 'q-1'", schema))
    with pytest.raises(OperationRefused, match=r"^a live worker drives run 'q-1' now; nothing was changed$"):
        resume_pg(pg_url, "q-1", schema=schema)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute(_q("SELECT owner FROM {s}.runs WHERE run = 'q-1'", schema)).fetchone()
    assert row == ("w-1",)
