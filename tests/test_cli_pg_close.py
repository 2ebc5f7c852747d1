"""Reading commands on a URL close the journal's connections when they are done.

In-process, so that a connection left for the garbage collector shows as
the ResourceWarning psycopg gives it (an unclosed journal once leaked two
connections per `export` or `replay` of a URL).
"""

from __future__ import annotations

import gc
import warnings

import pytest

from attempt_kernel import RunStarted
from attempt_kernel.cli import main
from attempt_kernel.postgres import PgJournal

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize("command", ["export", "replay"])
def test_a_reading_command_on_a_url_leaves_no_connection_open(
    db: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with PgJournal(db) as journal:
        journal.append("r1", RunStarted(workflow="w", input=None))
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main([command, db]) == 0
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
    out = capsys.readouterr().out
    assert '"run":"r1"' in out if command == "export" else "verdict: valid" in out
