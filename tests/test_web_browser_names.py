"""Run ids a browser would rewrite, in a real browser (headless Chromium, as `test_web_browser`):
a person clicks a run named ``.`` in the list, reaches its page and sends it a signal."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest

from attempt_kernel import SignalSent
from test_web import TIMEOUT, add_waiting_runs, records, start_serve
from test_web_browser import browser as browser  # the fixture: a headless Chromium
from test_web_browser import eventually

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def dots(tmp_path_factory: pytest.TempPathFactory) -> Generator[tuple[str, Path], None, None]:
    """`serve` of a log whose runs '.' and '..' wait for signal 'approve'."""
    folder = tmp_path_factory.mktemp("dots")
    log = add_waiting_runs(folder / "dots.jsonl", ".", "..")
    server, url = start_serve(folder, str(log), "--port", "0")
    try:
        yield url, log
    finally:
        server.terminate()
        server.communicate(timeout=TIMEOUT)


@pytest.mark.parametrize("run", [".", ".."])
def test_a_person_opens_a_run_named_dot_and_signals_it(browser: object, dots: tuple[str, Path], run: str) -> None:
    """The list linked to ``/runs/.``, which Chromium resolves to ``/runs/`` (``%2E`` too)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver

    assert isinstance(browser, WebDriver)
    url, log = dots
    browser.get(url)
    browser.find_element(By.LINK_TEXT, run).click()
    eventually(lambda: browser.find_element(By.ID, "run-id").text == run or None, f"the page of run {run!r}")
    form = browser.find_element(By.ID, "signal-form")
    form.find_element(By.TAG_NAME, "button").click()
    flash = eventually(lambda: browser.find_elements(By.CLASS_NAME, "flash") or None, "the flash")[0].text
    assert flash == f"Signal 'approve' sent to run {run}: recorded in the log."
    assert browser.find_element(By.ID, "run-id").text == run
    sent = [r.run for r in records(log) if isinstance(r.change, SignalSent)]
    assert run in sent
