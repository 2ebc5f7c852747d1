"""A code workflow on PostgreSQL workers, driven like a DAG.

"A code workflow runs on PostgreSQL workers like a DAG: a takeover re-runs
the function from the top on the new worker, reusing what is recorded."
And: "A worker SIGKILLed in the middle of an agent run on PostgreSQL:
another worker finishes it with the same effect counts."

Everything goes through the command line (``submit``, ``worker``, ``runs``,
``show``, ``export``, ``recover``) against a fresh database of the
session's real server (`db`), with the agent of ``workerflows.agent``: a
fake model (``think``) picks tools, two of which send effects to the fake
downstream service (the call book, `downstream`). A worker is SIGKILLed by
the test while ``open_ticket``'s effect waits at a gate (Dispatched in the
journal, the call in the book or not yet), or by itself right after its
N-th record (``KILL_AFTER``). Heartbeat 0.2 s, dead after 0.8 s, as in the
other worker tests; the timeouts are safety nets only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import psycopg
import pytest
from pgtools import expire_heartbeats, sql_in
from workerflows.agent import AGENT as AGENT_FLOW
from workerflows.agent import book_lines

from attempt_kernel import SignalSent, replay
from attempt_kernel._codec import encode_record
from attempt_kernel.postgres import set_pool, submit_run
from attempt_kernel.postgres._journal import HELD_KEYS, hold_key_head, hold_key_sql, send_key

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

TESTS = Path(__file__).parent
AGENT = "workerflows.agent:AGENT"
EDITED = "workerflows.agent:AGENT_EDITED"
SCHEMA = "attempt_kernel"  # the command line's
WORKER_FLAGS = ("--heartbeat", "0.2", "--dead-after", "300", "--until-idle")
"""Never dead by waiting: a test kills a worker, then ages its heartbeat (`expire_heartbeats`)."""
CLI_WITH_KILL = "from workerflows.agent import main; main()"

POSITIONS = [
    (1, "think"), (2, "search"), (3, "think"), (4, "send_email"),
    (5, "think"), (6, "open_ticket"), (7, "think"),
]  # fmt: skip
"""Every run of the agent, by hand from `workerflows.agent`'s doc."""

EFFECTS = Counter({"send_email@4/send": 1, "open_ticket@6/ticket": 1})
"""What the service sees of one run: each effect once."""

RESULT = {"answer": "3 tools used", "turns": 3}

# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


@pytest.fixture
def trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file where the workflow function notes each start from the top (``run pid``)."""
    path = tmp_path / "trace.txt"
    monkeypatch.setenv("AGENT_TRACE", str(path))
    return path


def environment(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(TESTS), **extra}


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "attempt_kernel", *args],
        cwd=cwd, capture_output=True, text=True, timeout=60, env=environment(),
    )  # fmt: skip


def worker(url: str, cwd: Path, target: str = AGENT, **env: str) -> subprocess.Popen[str]:
    """``attempt-kernel worker URL --workflows TARGET`` (``KILL_AFTER`` honoured), until idle."""
    return subprocess.Popen(
        [sys.executable, "-c", CLI_WITH_KILL, "worker", url, "--workflows", target, *WORKER_FLAGS],
        cwd=cwd, env=environment(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def finish(process: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
        raise AssertionError(f"worker hung:\n{out}") from None
    return process.returncode, out


def submit(url: str, cwd: Path, run: str) -> None:
    done = cli(cwd, "submit", url, AGENT, "--run", run)
    assert done.returncode == 0 and done.stdout == f"{run}\n", done.stderr


def wait_at_gate(gate: Path, process: subprocess.Popen[str], timeout: float = 60) -> None:
    """Wait until ``open_ticket``'s effect waits at the gate (the worker must still be alive)."""
    deadline = time.monotonic() + timeout
    while not (gate / "waiting").exists():
        if process.poll() is not None:
            raise AssertionError(f"the worker exited before the gate:\n{finish(process)[1]}")
        assert time.monotonic() < deadline, "safety net: the effect never reached the gate"
        time.sleep(0.02)


def exported(url: str, cwd: Path) -> list[dict[str, object]]:
    """``export URL`` into a file that must replay clean; its records as JSON objects."""
    done = cli(cwd, "export", url)
    assert done.returncode == 0, done.stderr
    path = cwd / "exported.jsonl"
    path.write_text(done.stdout)
    assert replay(path).valid
    return [json.loads(line) for line in done.stdout.splitlines()]


def of_run(records: list[dict[str, object]], run: str, kind: str) -> list[dict[str, object]]:
    return [r for r in records if r["run"] == run and r["type"] == kind]


def positions(records: list[dict[str, object]], run: str) -> list[tuple[object, object]]:
    return [(r["position"], r["name"]) for r in of_run(records, run, "step_called")]


def moves(records: list[dict[str, object]], run: str, step: str) -> list[tuple[object, object]]:
    return [(r["attempt"], r["to"]) for r in of_run(records, run, "transition") if r["step"] == step]


def effects(book: Path, run: str) -> Counter[str]:
    """What the service saw of ``run``: calls per ``step/effect``."""
    return Counter(label.partition("/")[2] for label, _ in book_lines(book) if label.startswith(f"{run}/"))


def each_key_sent_once(book: Path) -> bool:
    return all(n == 1 for n in Counter(key for _, key in book_lines(book)).values())


def row(url: str, run: str) -> list[tuple[object, ...]]:
    return sql_in(url, SCHEMA, "SELECT done, outcome, fence FROM {s}.runs WHERE run = %s", run)


def raw_records(url: str, run: str) -> list[tuple[object, ...]]:
    return sql_in(url, SCHEMA, "SELECT seq, line FROM {s}.records WHERE run = %s ORDER BY seq", run)


def statuses(url: str, cwd: Path) -> Mapping[str, object]:
    done = cli(cwd, "runs", url, "--json")
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, object]] = json.loads(done.stdout)["runs"]
    return {str(r["run"]): r["status"] for r in rows}


def starts(trace: Path, run: str) -> list[str]:
    """The pids of the processes where the workflow function of ``run`` started from the top."""
    lines = trace.read_text().splitlines() if trace.exists() else []
    return [pid for name, pid in (line.split() for line in lines) if name == run]


# --------------------------------------------------------------------------
# One worker, no crash
# --------------------------------------------------------------------------


def test_a_submitted_code_run_is_driven_by_a_worker_and_shown_by_position(
    db: str, tmp_path: Path, downstream: Path, trace: Path
) -> None:
    """submit MODULE:ATTR, worker --workflows MODULE:ATTR: succeeded; runs, show and export agree."""
    submit(db, tmp_path, "clean")
    assert row(db, "clean") == [(False, None, 0)]
    code, out = finish(worker(db, tmp_path))
    assert code == 0, out
    assert "clean: claimed at fence 1" in out and "clean: succeeded" in out, out
    assert row(db, "clean") == [(True, "succeeded", 1)]
    runs = cli(tmp_path, "runs", db)
    assert runs.returncode == 0, runs.stderr
    [line] = [line for line in runs.stdout.splitlines() if line.startswith("clean ")]
    assert line.split()[:4] == ["clean", "agent", "succeeded", "7"]
    show = cli(tmp_path, "show", db, "clean")
    assert show.returncode == 0, show.stderr
    assert [line.split()[1] for line in show.stdout.splitlines() if line.startswith("  step ")] == [
        "think@1", "search@2", "think@3", "send_email@4", "think@5", "open_ticket@6", "think@7",
    ]  # fmt: skip
    records = exported(db, tmp_path)
    assert positions(records, "clean") == POSITIONS
    [end] = of_run(records, "clean", "run_finished")
    assert end["ok"] is True and end["result"] == RESULT
    assert effects(downstream, "clean") == EFFECTS and each_key_sent_once(downstream)
    assert len(starts(trace, "clean")) == 1


def test_submit_from_python_queues_a_code_run_a_worker_drives(
    db: str, tmp_path: Path, downstream: Path
) -> None:
    """`submit_run` (what the command line calls) with the workflow's name: the same run."""
    assert submit_run(db, AGENT_FLOW.name, "py-1", {"topic": "delay"}) == "py-1"
    code, out = finish(worker(db, tmp_path))
    assert code == 0 and "py-1: succeeded" in out, out
    records = exported(db, tmp_path)
    assert positions(records, "py-1") == POSITIONS
    [search] = [r for r in of_run(records, "py-1", "result") if r["step"] == "search@2"]
    assert search["value"] == {"hits": 3, "query": "delay"}
    assert effects(downstream, "py-1") == EFFECTS


# --------------------------------------------------------------------------
# SIGKILL inside the agent's effect: a takeover finishes it
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gate_at", "found"),
    [
        pytest.param("after-call", "Confirmed", id="the-service-had-the-call"),
        pytest.param("before-call", "Rejected", id="the-service-had-not"),
    ],
)
def test_a_worker_killed_inside_the_agents_effect_is_taken_over_and_each_effect_is_sent_once(
    db: str, tmp_path: Path, downstream: Path, trace: Path, gate_at: str, found: str
) -> None:
    """SIGKILL while open_ticket's effect is Dispatched; the taker (fence 2) runs the function
    again from the top, answers positions 1-5 from the journal, asks the reconciler, finishes."""
    submit(db, tmp_path, "clean")
    assert finish(worker(db, tmp_path))[0] == 0
    submit(db, tmp_path, "r1")
    gate = tmp_path / "gate"
    gate.mkdir()
    doomed = worker(db, tmp_path, AGENT_GATE=str(gate), AGENT_GATE_AT=gate_at)
    wait_at_gate(gate, doomed)
    doomed.send_signal(signal.SIGKILL)
    code, out = finish(doomed)
    assert code == -signal.SIGKILL, out
    before = raw_records(db, "r1")
    records = exported(db, tmp_path)
    assert [r["to"] for r in of_run(records, "r1", "intent") if r["step"] == "open_ticket@6"] == ["Dispatched"]
    assert effects(downstream, "r1") == (
        EFFECTS if gate_at == "after-call" else Counter({"send_email@4/send": 1})
    )
    assert row(db, "r1") == [(False, None, 1)]
    assert len(expire_heartbeats(db, SCHEMA)) == 1

    code, out = finish(worker(db, tmp_path))
    assert code == 0, out
    assert "r1: taken over from worker" in out and "at fence 2" in out, out
    assert "r1 open_ticket@6#1: Running -> Cancelled" in out and "r1: succeeded" in out, out
    [key] = {r["key"] for r in of_run(exported(db, tmp_path), "r1", "intent_planned") if r["step"] == "open_ticket@6"}
    answer = "it happened (intent Confirmed)" if found == "Confirmed" else "it did not happen (intent Rejected)"
    told = [line.split(" ", 1)[1] for line in out.splitlines() if "asked the reconciler" in line]
    assert told == [
        f"INFO    r1 open_ticket@6#1: asked the reconciler about 'ticket' ({key}): {answer}"
    ], out
    assert "think@1" not in out and "send_email@4" not in out, out  # answered from the journal
    assert row(db, "r1") == [(True, "succeeded", 2)]
    assert raw_records(db, "r1")[: len(before)] == before  # the taker only appended
    [killed, taker] = starts(trace, "r1")
    assert killed == str(doomed.pid) and taker != killed  # from the top, once per worker

    records = exported(db, tmp_path)  # replays clean
    assert positions(records, "r1") == positions(records, "clean") == POSITIONS
    [asked] = of_run(records, "r1", "reconciled")
    assert (asked["step"], asked["attempt"], asked["to"], asked["by"]) == ("open_ticket@6", 1, found, "reconciler")
    assert moves(records, "r1", "open_ticket@6") == [
        (1, "Running"), (1, "Cancelled"), (2, "Running"), (2, "Succeeded"),
    ]  # fmt: skip
    for step in ("think@1", "search@2", "think@3", "send_email@4", "think@5"):
        assert moves(records, "r1", step) == [(1, "Running"), (1, "Succeeded")], step
    [end] = of_run(records, "r1", "run_finished")
    assert end["result"] == RESULT
    assert effects(downstream, "r1") == effects(downstream, "clean") == EFFECTS
    assert each_key_sent_once(downstream)


def test_what_the_reconciler_answered_is_logged_when_taking_up_the_code_run_fails_after_asking(
    db: str, tmp_path: Path, downstream: Path
) -> None:
    """The taker runs the agent's function again and asks open_ticket's reconciler, which
    moves the run's lease on as it answers (another worker's claim): the taking up fails with
    LeaseLost, and what the reconciler said, a fact about the ticket service, was logged
    nowhere. It is logged at WARNING, saying the takeover did not complete; the next
    takeover asks again and logs its own answer."""
    submit(db, tmp_path, "r1")
    gate = tmp_path / "gate"
    gate.mkdir()
    doomed = worker(db, tmp_path, AGENT_GATE=str(gate), AGENT_GATE_AT="before-call")
    wait_at_gate(gate, doomed)
    doomed.send_signal(signal.SIGKILL)
    assert finish(doomed)[0] == -signal.SIGKILL
    assert len(expire_heartbeats(db, SCHEMA)) == 1
    sql_in(db, SCHEMA, "INSERT INTO {s}.workers (id, host, pid, dead) VALUES ('gone', 'test', 0, true)")
    code, out = finish(worker(db, tmp_path, AGENT_ASK_MOVES_LEASE=db))
    assert code == 0, out
    [key] = {r["key"] for r in of_run(exported(db, tmp_path), "r1", "intent_planned") if r["step"] == "open_ticket@6"}
    told = [line.split(" ", 1)[1] for line in out.splitlines() if "asked the reconciler" in line]
    assert told == [
        f"WARNING r1 open_ticket@6#1: asked the reconciler about 'ticket' ({key}): it did not happen"
        " (intent Rejected); the takeover did not complete, so the journal may not hold this answer",
        f"INFO    r1 open_ticket@6#1: asked the reconciler about 'ticket' ({key}): it did not happen (intent Rejected)",
    ], out
    assert row(db, "r1") == [(True, "succeeded", 4)]
    assert each_key_sent_once(downstream)


def test_a_worker_stopped_by_sigterm_inside_the_effect_hands_the_run_back_and_another_finishes_it(
    db: str, tmp_path: Path, downstream: Path
) -> None:
    """SIGTERM at the gate: after the grace the reconciler is asked, the attempt ends Cancelled,
    the row is released; the next worker claims it at fence 2 and the ticket is not sent again."""
    submit(db, tmp_path, "t1")
    gate = tmp_path / "gate"
    gate.mkdir()
    stopped = worker(db, tmp_path, AGENT_GATE=str(gate))
    wait_at_gate(gate, stopped)
    stopped.send_signal(signal.SIGTERM)
    code, out = finish(stopped)
    assert code == 0 and "t1: stopped and released" in out, out
    assert sql_in(db, SCHEMA, "SELECT done, owner IS NULL, fence FROM {s}.runs") == [(False, True, 1)]
    code, out = finish(worker(db, tmp_path))
    assert code == 0 and "t1: claimed at fence 2" in out and "t1: succeeded" in out, out
    records = exported(db, tmp_path)
    assert positions(records, "t1") == POSITIONS
    assert moves(records, "t1", "open_ticket@6") == [
        (1, "Running"), (1, "Cancelled"), (2, "Running"), (2, "Succeeded"),
    ]  # fmt: skip
    assert effects(downstream, "t1") == EFFECTS and each_key_sent_once(downstream)


# Right after record N of a crash-free run (43 records; see the first test's
# journal): 4 the start with think@1's call, created and admitted (one
# statement), 19 send_email@4's call, created and admitted, 21 send
# Dispatched (not sent yet), 22 send Confirmed, 24 send_email@4's result and
# Succeed, 34 ticket Dispatched, 42 think@7 Succeeded (every attempt ended,
# no run end yet).
@pytest.mark.parametrize("n", [4, 19, 21, 22, 24, 34, 42])
def test_a_worker_killed_after_record_n_is_taken_over_with_the_same_positions_and_effects(
    db: str, tmp_path: Path, downstream: Path, n: int
) -> None:
    submit(db, tmp_path, "r1")
    code, out = finish(worker(db, tmp_path, KILL_AFTER=str(n)))
    assert code == -signal.SIGKILL and f"killed after record {n} " in out, out
    before = raw_records(db, "r1")
    assert len(before) == n
    assert len(expire_heartbeats(db, SCHEMA)) == 1
    code, out = finish(worker(db, tmp_path))
    assert code == 0 and "r1: taken over from worker" in out, out
    assert row(db, "r1") == [(True, "succeeded", 2)]
    assert raw_records(db, "r1")[:n] == before
    records = exported(db, tmp_path)
    assert positions(records, "r1") == POSITIONS
    ok = Counter(r["step"] for r in of_run(records, "r1", "transition") if r["to"] == "Succeeded")
    assert set(ok.values()) == {1} and len(ok) == 7
    assert effects(downstream, "r1") == EFFECTS and each_key_sent_once(downstream)


def test_a_worker_killed_right_after_the_run_end_leaves_nothing_to_take_over(
    db: str, tmp_path: Path, downstream: Path
) -> None:
    """Record 43 (the end) goes in with the close of the row: the next worker finds nothing."""
    submit(db, tmp_path, "r1")
    code, out = finish(worker(db, tmp_path, KILL_AFTER="43"))
    assert code == -signal.SIGKILL and "killed after record 43 (seq 43), row closed" in out, out
    assert row(db, "r1") == [(True, "succeeded", 1)]
    code, out = finish(worker(db, tmp_path))
    assert code == 0 and "taken over" not in out and "runs closed: 0" in out, out
    assert effects(downstream, "r1") == EFFECTS


# --------------------------------------------------------------------------
# Divergence: edited code takes the run over
# --------------------------------------------------------------------------


def test_edited_code_that_diverges_on_a_takeover_writes_nothing_and_closes_the_row_diverged(
    db: str, tmp_path: Path, downstream: Path, trace: Path
) -> None:
    """Started by AGENT, its worker killed in open_ticket's effect; a worker with AGENT_EDITED
    (same name) takes it over, diverges at position 4, writes nothing, closes the row as
    "diverged" (so no worker claims it again) and exits normally; `recover --workflows AGENT`
    finishes it, each effect sent once."""
    submit(db, tmp_path, "d1")
    gate = tmp_path / "gate"
    gate.mkdir()
    doomed = worker(db, tmp_path, AGENT_GATE=str(gate))
    wait_at_gate(gate, doomed)
    doomed.send_signal(signal.SIGKILL)
    assert finish(doomed)[0] == -signal.SIGKILL
    before = raw_records(db, "d1")
    assert len(expire_heartbeats(db, SCHEMA)) == 1

    code, out = finish(worker(db, tmp_path, EDITED))
    assert code == 0, out
    assert out.count("d1: taken over from worker") == 1 and "d1: claimed" not in out, out
    assert (
        "d1: run 'd1' diverged at position 4: the log holds step 'send_email' (arguments sha256:"
        in out
    ), out
    assert "nothing was written for this run and nothing was sent" in out, out
    assert raw_records(db, "d1") == before
    assert row(db, "d1") == [(True, "diverged", 2)]
    assert len(starts(trace, "d1")) == 2  # the edited function ran, from the top, and stopped
    assert effects(downstream, "d1") == EFFECTS  # no chat post
    assert statuses(db, tmp_path) == {"d1": "interrupted"}

    # Another edited worker has nothing to claim: the run is not taken again and again.
    code, out = finish(worker(db, tmp_path, EDITED))
    assert code == 0 and "d1:" not in out and "runs closed: 0" in out, out
    assert raw_records(db, "d1") == before

    recovered = cli(tmp_path, "recover", db, "--workflows", AGENT)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert "resuming run d1 (workflow agent)" in recovered.stdout and "verdict: valid" in recovered.stdout
    assert raw_records(db, "d1")[: len(before)] == before
    assert statuses(db, tmp_path) == {"d1": "succeeded"}
    records = exported(db, tmp_path)
    assert positions(records, "d1") == POSITIONS
    [asked] = of_run(records, "d1", "reconciled")
    assert (asked["step"], asked["to"]) == ("open_ticket@6", "Confirmed")
    [end] = of_run(records, "d1", "run_finished")
    assert end["result"] == RESULT
    assert effects(downstream, "d1") == EFFECTS and each_key_sent_once(downstream)


def held_by_a_process(url: str, run: str) -> bool:
    """Does a process (`RunHolds`) hold ``run``'s key, or wait for it, now?"""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT " + hold_key_sql("%(run)s::text") + " = ANY (" + HELD_KEYS + ")",
            {"hold": hold_key_head(SCHEMA), "run": run},
        ).fetchone()
    return row == (True,)


def crashed_d1_past_its_divergence_and_b1_at_its_start(db: str, tmp_path: Path) -> Path:
    """Two crashed runs for `recover URL` with the edited code: d1, killed past send_email@4
    (where the edited code diverges), and b1, killed after its start; returns the second
    gate, made for b1's resumed step to wait at."""
    first_gate, second_gate = tmp_path / "gate-1", tmp_path / "gate-2"
    first_gate.mkdir()
    second_gate.mkdir()
    doomed = subprocess.Popen(
        [sys.executable, "-c", CLI_WITH_KILL, "run", AGENT, "--log", db, "--run", "d1"],
        cwd=tmp_path, env=environment(AGENT_GATE=str(first_gate)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    wait_at_gate(first_gate, doomed)  # past send_email@4: edited code diverges there
    doomed.send_signal(signal.SIGKILL)
    assert finish(doomed)[0] == -signal.SIGKILL
    early = subprocess.run(
        [sys.executable, "-c", CLI_WITH_KILL, "run", AGENT, "--log", db, "--run", "b1"],
        cwd=tmp_path, env=environment(KILL_AFTER="1"), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert early.returncode == -signal.SIGKILL, early.stdout + early.stderr  # its start only
    return second_gate


def test_recover_url_lets_go_of_a_run_whose_code_diverged_while_it_drives_others(
    db: str, tmp_path: Path, downstream: Path
) -> None:
    """`recover URL` held a run whose code diverged until it exited, though it would
    write nothing more for it: while it drove its other runs (here one waiting at a
    gate), a `recover` with the code the run started with left the run alone ("another
    process drives it"), and no worker could claim it. It lets go of the run as soon as
    the divergence is known now: that second `recover` finishes it meanwhile."""
    second_gate = crashed_d1_past_its_divergence_and_b1_at_its_start(db, tmp_path)
    before = raw_records(db, "d1")
    with subprocess.Popen(
        [sys.executable, "-m", "attempt_kernel", "recover", db, "--workflows", EDITED],
        cwd=tmp_path, env=environment(AGENT_GATE=str(second_gate)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as recovering:  # fmt: skip
        try:
            wait_at_gate(second_gate, recovering)  # b1 runs on under the edited code
            assert held_by_a_process(db, "b1")
            deadline = time.monotonic() + 60  # waits for the event; bounds nothing
            while held_by_a_process(db, "d1"):
                assert time.monotonic() < deadline, "recover never let go of the run that diverged"
                time.sleep(0.02)
            other = cli(tmp_path, "recover", db, "--workflows", AGENT)
        finally:
            (second_gate / "open").touch()
        out, err = recovering.communicate(timeout=60)
    assert other.returncode == 0, other.stdout + other.stderr
    assert "resuming run d1 (workflow agent)" in other.stdout, other.stdout
    assert "recover: leaving run b1 alone: another process (run or recover) drives it" in other.stdout, other.stdout
    assert recovering.returncode == 2, out + err
    assert "run 'd1' diverged at position 4" in err, err
    assert raw_records(db, "d1")[: len(before)] == before
    assert statuses(db, tmp_path) == {"b1": "succeeded", "d1": "succeeded"}
    assert effects(downstream, "d1") == EFFECTS
    assert effects(downstream, "b1") == Counter({"post_chat@4/chat": 1, "open_ticket@6/ticket": 1})
    assert each_key_sent_once(downstream)


def waits_for_its_send_key(url: str, run: str) -> bool:
    """Does a session wait for ``run``'s send key now (`RunHolds.let_go`, behind a sender)?"""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks AS l WHERE l.locktype = 'advisory' AND NOT l.granted"
            " AND l.objsubid = 1 AND ((l.classid::bigint << 32) | l.objid::bigint) = %s)",
            (send_key(SCHEMA, run),),
        ).fetchone()
    return row == (True,)


def finished(url: str, run: str) -> bool:
    """Does the journal hold ``run``'s end?"""
    for _, line in raw_records(url, run):
        assert isinstance(line, bytes), line
        if json.loads(line)["type"] == "run_finished":
            return True
    return False


def test_recover_url_drives_its_other_runs_while_the_let_go_of_a_diverged_run_waits_for_a_sender(
    db: str, tmp_path: Path, downstream: Path
) -> None:
    """`recover URL` let go of a run whose code diverged on its event loop's thread, and the
    let-go waits for a sender whose transaction holds the run's send key: every other run
    it drove stood still meanwhile. It lets go on a thread of its own now: b1 finishes
    while the let-go of d1 still waits, and once the sender commits, the let-go records
    what it sent before `recover` exits."""
    second_gate = crashed_d1_past_its_divergence_and_b1_at_its_start(db, tmp_path)
    with psycopg.connect(db, autocommit=True) as sender:
        with sender.transaction():  # a sender to d1, as `deliver_pg` is, in the middle of its transaction
            sender.execute("SELECT pg_advisory_xact_lock(%s)", (send_key(SCHEMA, "d1"),))
            signalled = SignalSent(name="approve", payload={}, id="sig-1")
            sender.execute(
                "INSERT INTO attempt_kernel.inbox (run, line) VALUES (%s, %s)",
                ("d1", encode_record(1, time.time_ns() // 1000, "d1", signalled)),
            )
            recovering = subprocess.Popen(
                [sys.executable, "-m", "attempt_kernel", "recover", db, "--workflows", EDITED],
                cwd=tmp_path, env=environment(AGENT_GATE=str(second_gate)),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            try:
                deadline = time.monotonic() + 60  # waits for each event; bounds nothing
                while not waits_for_its_send_key(db, "d1"):
                    assert recovering.poll() is None, "recover exited before it let go of d1"
                    assert time.monotonic() < deadline, "recover never began to let go of d1"
                    time.sleep(0.02)
                (second_gate / "open").touch()  # b1 may end now
                while not finished(db, "b1"):
                    assert time.monotonic() < deadline, "b1 never finished while the let-go of d1 waited"
                    time.sleep(0.02)
                assert waits_for_its_send_key(db, "d1")  # the let-go waits on, behind the sender
            except BaseException:
                recovering.kill()
                recovering.communicate()
                raise
        out, err = recovering.communicate(timeout=60)  # the sender committed: the let-go goes on
    assert recovering.returncode == 2, out + err
    assert "run 'd1' diverged at position 4" in err, err
    assert "recover: d1: took in SignalSent from the inbox (recorded)" in out, out
    assert not held_by_a_process(db, "d1")
    assert statuses(db, tmp_path) == {"b1": "succeeded", "d1": "interrupted"}
    assert effects(downstream, "b1") == Counter({"post_chat@4/chat": 1, "open_ticket@6/ticket": 1})


# --------------------------------------------------------------------------
# Pools
# --------------------------------------------------------------------------


def test_a_code_workflows_pooled_step_holds_a_slot_of_the_shared_pool_on_a_worker(
    db: str, tmp_path: Path, downstream: Path
) -> None:
    """open_ticket names pool tickets (1 slot): while it waits at the gate, the slot is held."""
    set_pool(db, "tickets", 1)
    done = cli(tmp_path, "submit", db, "workerflows.agent:AGENT_POOLED", "--run", "p1")
    assert done.returncode == 0, done.stderr
    gate = tmp_path / "gate"
    gate.mkdir()
    running = worker(db, tmp_path, "workerflows.agent:AGENT_POOLED", AGENT_GATE=str(gate))
    try:
        wait_at_gate(gate, running)
        pools = cli(tmp_path, "pools", db)
    finally:
        (gate / "open").touch()
        code, out = finish(running)
    assert code == 0 and "p1: succeeded" in out, out
    assert pools.stdout == "pool tickets: 1 slots, 1 held\n", pools.stdout
