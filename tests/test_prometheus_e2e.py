"""End to end: a real Prometheus scrapes two workers and fires AttemptKernelIndeterminate.

A worker (``attempt-kernel worker URL --metrics-port``) dispatches an effect
that blocks (``waitflows.BLOCKED``: it waits for a file the test never
makes) and is SIGKILLed there; the test ages its heartbeat in the database
(no waiting for its lease to run out), and a second worker takes the run over and, with
no reconciler to ask, ends the attempt Indeterminate. Prometheus (Debian's
``prometheus``, a temporary config and storage, a private port) scrapes
both every second, loads the shipped rules, and the test polls its HTTP API
until the gauge is above zero and the alert fires. The API's answers are
saved to ``tests/artifacts/prometheus-e2e.json``.

Without a prometheus binary the test is skipped, except when CI is set:
there it must run, so a missing binary fails it.
"""

from __future__ import annotations

import gc
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from pgtools import expire_heartbeats

from attempt_kernel.postgres import DEFAULT_SCHEMA
from attempt_kernel.postgres._worker import submit_run

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

TESTS = Path(__file__).parent
ARTIFACTS = TESTS / "artifacts"
PATIENCE = 120.0
"""Seconds the test waits for each thing it polls for, at most (never a bound it asserts)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def prometheus_binary() -> str:
    found = shutil.which("prometheus") or ("/usr/bin/prometheus" if Path("/usr/bin/prometheus").is_file() else None)
    if found is None:
        reason = "no prometheus binary; install it (Debian: apt-get install prometheus)"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set, so the Prometheus end-to-end test must run: {reason}", pytrace=False)
        pytest.skip(reason)
    return found


def get_json(url: str) -> Any:  # noqa: ANN401  # the API's JSON, looked into by each test
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.loads(answer.read())


def get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        text: str = answer.read().decode()
        return text


def poll(what: str, check: Callable[[], dict[str, object] | None]) -> dict[str, object]:
    """Ask ``check`` every half second until it returns an answer; fail after `PATIENCE`."""
    deadline = time.monotonic() + PATIENCE
    last = "no answer yet"
    while time.monotonic() < deadline:
        try:
            found = check()
        except urllib.error.HTTPError as error:  # listening, not ready: /-/ready answers 503
            # The error holds the response and its socket. Close it now and keep
            # only its text: an error kept in a local of this frame is a cycle
            # (error -> traceback -> frame -> error) that only the garbage
            # collector frees, and it warns of the unclosed socket in whatever
            # test it runs during (a ResourceWarning, an error under -W error).
            with error:
                last = f"HTTP {error.code} {error.reason}"
        except OSError as error:  # not listening yet
            last = repr(error)
        else:
            if found is not None:
                return found
        time.sleep(0.5)
    pytest.fail(f"waited {PATIENCE} s for {what}; last: {last}")



@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, list[int], Path]]:
    """A Prometheus scraping two metrics ports every second, with the shipped rules loaded.

    Yields its base URL, the two ports it scrapes and its log; stopped and its folder removed after.
    """
    binary = prometheus_binary()
    rules = Path(str(resources.files("attempt_kernel") / "alerts" / "attempt-kernel.rules.yml"))
    ports = [free_port(), free_port()]
    home = tmp_path / "prometheus"
    home.mkdir()
    config = home / "prometheus.yml"
    config.write_text(
        json.dumps(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(rules)],
                "scrape_configs": [
                    {
                        "job_name": "attempt-kernel",
                        "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports]}],
                    }
                ],
            }
        )
    )
    web = free_port()
    log = home / "prometheus.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={home / 'data'}",
                f"--web.listen-address=127.0.0.1:{web}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{web}"
    try:
        poll("Prometheus to be ready", lambda: {"ready": True} if get_text(f"{base}/-/ready") else None)
        yield base, ports, log
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(home, ignore_errors=True)


def start_worker(url: str, port: int, gate: Path, out: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(TESTS), "WAIT_GATE": str(gate)}
    with out.open("w") as sink:
        return subprocess.Popen(
            [
                sys.executable, "-m", "attempt_kernel", "worker", url, "--workflows", "waitflows:BLOCKED",
                "--heartbeat", "0.2", "--dead-after", "300", "--metrics-port", str(port),
            ],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )  # fmt: skip


def query(base: str, promql: str) -> Any:  # noqa: ANN401  # the API's JSON
    return get_json(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))


def result_of(answer: Any) -> list[Any]:  # noqa: ANN401  # the API's JSON
    data = answer["data"]
    found = data["result"] if "result" in data else data["alerts"]
    assert isinstance(found, list)
    return found  # pyright: ignore[reportUnknownVariableType]  # JSON from the API


def test_polling_a_server_that_answers_503_leaves_no_socket_for_the_garbage_collector() -> None:
    """`poll` against a server that is listening but not ready (Prometheus's /-/ready
    answers 503 while it starts) closes each error's response: none is left in a
    cycle for a later test's garbage collection to warn about."""
    answers = [503, 503, 200]

    class NotReadyYet(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status = answers.pop(0) if len(answers) > 1 else answers[0]
            body = b"ready\n" if status == 200 else b"not ready\n"
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002  # the base class's name
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotReadyYet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        ready = poll("the server to be ready", lambda: {"ready": True} if get_text(f"{base}/-/ready") else None)
        assert ready == {"ready": True}
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    assert answers == [200], "the server was asked fewer than three times: no 503 was polled through"
    unraisable: list[str] = []
    before = sys.unraisablehook
    sys.unraisablehook = lambda seen: unraisable.append(f"{seen.exc_value!r} in {seen.object!r}")
    try:
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")  # seen here, whatever -W says
            gc.collect()
    finally:
        sys.unraisablehook = before
    assert [str(w.message) for w in warned if issubclass(w.category, ResourceWarning)] == []
    assert unraisable == []


def test_a_takeover_that_ends_indeterminate_fires_the_alert(
    prometheus: tuple[str, list[int], Path], db: str, tmp_path: Path
) -> None:
    """Gauge above zero and AttemptKernelIndeterminate firing, as Prometheus itself reports them."""
    base, (first_port, second_port), prometheus_log = prometheus
    gate = tmp_path / "gate"
    gate.mkdir()
    submit_run(db, "blocked", "r1")
    first_out, second_out = tmp_path / "first.out", tmp_path / "second.out"
    first = start_worker(db, first_port, gate, first_out)
    second: subprocess.Popen[bytes] | None = None
    try:
        poll("the effect to be dispatched", lambda: {"waiting": True} if (gate / "waiting").exists() else None)
        page = get_text(f"http://127.0.0.1:{first_port}/metrics")
        assert re.search(r"^attempt_kernel_claims_total\{.*\} 1\.0$", page, re.M), page
        first.send_signal(signal.SIGKILL)  # mid-effect: Dispatched, no outcome
        first.wait(timeout=60)
        assert len(expire_heartbeats(db, DEFAULT_SCHEMA)) == 1  # dead now, by the database's clock
        second = start_worker(db, second_port, gate, second_out)

        def gauge_up() -> dict[str, object] | None:
            answer = query(base, "attempt_kernel_indeterminate_attempts > 0")
            return answer if result_of(answer) else None

        def alert_firing() -> dict[str, object] | None:
            answer = get_json(f"{base}/api/v1/alerts")
            firing = [
                a for a in result_of(answer)
                if a["state"] == "firing" and a["labels"]["alertname"] == "AttemptKernelIndeterminate"
            ]  # fmt: skip
            return answer if firing else None

        gauge = poll("the Indeterminate gauge above zero", gauge_up)
        alerts = poll("AttemptKernelIndeterminate to fire", alert_firing)
        series = query(base, 'ALERTS{alertname="AttemptKernelIndeterminate",alertstate="firing"}')
        takeovers = query(base, "attempt_kernel_takeovers_total")
        ended = query(base, 'attempt_kernel_attempts_total{state="Indeterminate"}')
        ARTIFACTS.mkdir(exist_ok=True)
        saved = {
            "attempt_kernel_indeterminate_attempts > 0": gauge,
            "/api/v1/alerts": alerts,
            'ALERTS{alertname="AttemptKernelIndeterminate",alertstate="firing"}': series,
            "attempt_kernel_takeovers_total": takeovers,
            'attempt_kernel_attempts_total{state="Indeterminate"}': ended,
        }
        (ARTIFACTS / "prometheus-e2e.json").write_text(json.dumps(saved, indent=2) + "\n")
        print(json.dumps(saved, indent=2))
        [sample] = result_of(gauge)
        assert sample["metric"]["journal"] == db and sample["value"][1] == "1", sample
        assert result_of(series), series
        assert [s["value"][1] for s in result_of(takeovers)] == ["1"], takeovers
        # the second worker's recovery ended the orphan: it counted it (the first is gone)
        assert [s["value"][1] for s in result_of(ended)] == ["1"], ended
    except BaseException:
        for out in (first_out, second_out, prometheus_log):
            if out.exists():
                print(f"--- {out.name}\n{out.read_text()}")
        raise
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
