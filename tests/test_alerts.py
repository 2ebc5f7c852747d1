"""The shipped alerting rules: valid for Prometheus, and their promtool unit tests pass.

Runs the real ``promtool`` (Debian: apt-get install prometheus). Without it
these tests are skipped, except when CI is set: there they must run, so a
missing promtool fails them (the same rule as the PostgreSQL server's).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TESTS = Path(__file__).parent
UNIT_TESTS = sorted((TESTS / "prometheus").glob("*.test.yml"))


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        reason = "no promtool on PATH; install prometheus (Debian: apt-get install prometheus)"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set, so the alerting rules must be checked: {reason}", pytrace=False)
        pytest.skip(reason)
    return found


def shipped_rules() -> Path:
    rules = resources.files("attempt_kernel") / "alerts" / "attempt-kernel.rules.yml"
    assert rules.is_file(), "the rules are package data of attempt_kernel"
    return Path(str(rules))


def test_the_rules_are_package_data() -> None:
    """The rules file is found inside the installed package, not only in the repository."""
    assert shipped_rules().read_text().startswith("# Alerting rules for attempt-kernel")


def test_promtool_checks_the_shipped_rules() -> None:
    """`promtool check rules` accepts the file and finds both alerts."""
    done = subprocess.run(
        [promtool(), "check", "rules", str(shipped_rules())], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 2 rules found" in done.stdout + done.stderr


def test_the_unit_tests_name_the_shipped_rules() -> None:
    """Each unit test file loads the rules from the package, not a copy."""
    assert UNIT_TESTS
    for path in UNIT_TESTS:
        assert "../../src/attempt_kernel/alerts/attempt-kernel.rules.yml" in path.read_text()


@pytest.mark.parametrize("unit", UNIT_TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(unit: Path) -> None:
    """`promtool test rules`: each alert fires, and stays silent, when the test says."""
    done = subprocess.run(
        [promtool(), "test", "rules", unit.name],
        cwd=unit.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


EXAMPLE_LOG = TESTS.parent / "examples" / "checkout.jsonl"


def test_promtool_accepts_what_replay_metrics_and_the_gauges_page_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`promtool check metrics` reads the Prometheus text format, as node_exporter's textfile
    collector does: a counter's TYPE and HELP name its samples (``..._total``), or the
    counter is read as an untyped series with no help."""
    from attempt_kernel._metrics import metrics_app
    from attempt_kernel.cli._main import main

    assert main(["replay", "--metrics", str(EXAMPLE_LOG)]) == 0
    pages = {"replay --metrics": capsys.readouterr().out, "/metrics": metrics_app(str(EXAMPLE_LOG))()[0].decode()}
    for name, page in pages.items():
        checked = subprocess.run(
            [promtool(), "check", "metrics"], input=page, capture_output=True, text=True, timeout=60
        )
        assert (name, checked.returncode, checked.stdout + checked.stderr) == (name, 0, "")
