"""`attempt-kernel serve` in a real browser: headless Chromium driven through selenium.

A person opens the run list, clicks into a run that waits for a signal,
reads its timeline, sends the signal through the form and sees the run go
on (a `worker LOG` process drives the log's approver runs meanwhile, as
in production); reconciles an Indeterminate intent with its button; and
sees a hostile run name as text, with no alert. What is asserted is what
the page shows. A screenshot of the run page is saved (``tests/artifacts``
or ``$ATTEMPT_KERNEL_ARTIFACTS``). Without Chromium the test is skipped,
except when CI is set: there it must run, so a missing browser fails it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TypeVar

import pytest

from test_web import HOSTILE, TIMEOUT, add_waiting_runs, forged_outstanding, needs_reconciliation, records, start_serve

pytestmark = [pytest.mark.slow]

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
TESTS = Path(__file__).resolve().parent

T = TypeVar("T")


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI is set, so the browser tests must run: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Generator[object, None, None]:
    """A headless Chromium under chromedriver, with a profile of its own."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as error:
        _unavailable(f"selenium is not installed ({error})")
        raise
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not binary.exists():
            _unavailable(f"no {binary} (Debian: apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    profile = tmp_path_factory.mktemp("chromium-profile")
    # No outside network here: the flags keep Chromium from trying to reach it.
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", "--window-size=1280,1400",
    ):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(TIMEOUT)
    try:
        yield driver
    finally:
        driver.quit()


def eventually(check: Callable[[], T | None], what: str, timeout: float = TIMEOUT) -> T:
    """``check()`` once it returns something, polling; fails naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def artifacts() -> Path:
    folder = Path(os.environ.get("ATTEMPT_KERNEL_ARTIFACTS") or TESTS / "artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Generator[tuple[str, Path], None, None]:
    """`serve` of a log holding trip-1 (needs reconciliation), a-1 and a hostile-named run
    (both wait for 'approve'), with a `worker` process driving the approver runs."""
    folder = tmp_path_factory.mktemp("site")
    log = needs_reconciliation(folder)
    add_waiting_runs(log, "a-1", HOSTILE)
    shutil.copy(TESTS / "waitflows.py", folder / "waitflows.py")
    worker = subprocess.Popen(
        [sys.executable, "-m", "attempt_kernel", "worker", str(log), "--workflows", "waitflows:APPROVER"],
        cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    server, url = start_serve(folder, str(log), "--port", "0")
    try:
        yield url, log
    finally:
        for process in (server, worker):
            process.send_signal(signal.SIGTERM)
        for process in (server, worker):
            process.communicate(timeout=TIMEOUT)
        assert server.returncode == 0


def no_alert(driver: object) -> None:
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.remote.webdriver import WebDriver

    assert isinstance(driver, WebDriver)
    try:
        text = driver.switch_to.alert.text
    except NoAlertPresentException:
        return
    raise AssertionError(f"an alert opened: {text!r}")


def test_a_person_signals_a_waiting_run_and_sees_it_go_on(browser: object, site: tuple[str, Path]) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver

    assert isinstance(browser, WebDriver)
    url, _ = site
    browser.get(url)
    table = browser.find_element(By.ID, "runs").text
    assert "a-1 approver waiting for signal 'approve'" in table
    assert "trip-1 trip-planner needs-reconciliation" in table
    browser.find_element(By.LINK_TEXT, "a-1").click()
    eventually(lambda: browser.find_element(By.ID, "run-id").text == "a-1" or None, "the run page")
    timeline = browser.find_element(By.ID, "timeline")
    texts = [t.text for t in timeline.find_elements(By.TAG_NAME, "text")]
    assert "ask@1" in texts and "@2 wait for 'approve'" in texts
    assert "#1 Succeeded" in texts and "waiting" in texts
    for word in ("Succeeded", "Failed", "Indeterminate", "Cancelled", "TimedOut", "Running", "Pending", "wait"):
        assert word in texts  # the legend
    shot = artifacts() / "run-page.png"
    shot.write_bytes(browser.get_screenshot_as_png())
    print(f"screenshot of the run page: {shot}")

    form = browser.find_element(By.ID, "signal-form")
    assert form.find_element(By.NAME, "name").get_attribute("value") == "approve"
    form.find_element(By.NAME, "payload").send_keys('{"by": "ada"}')
    form.find_element(By.TAG_NAME, "button").click()
    flash = eventually(lambda: browser.find_elements(By.CLASS_NAME, "flash") or None, "the flash")[0].text
    assert flash.startswith("Signal 'approve' sent to run a-1: ")

    def succeeded() -> bool | None:
        browser.refresh()
        return browser.find_element(By.ID, "run-status").text == "succeeded" or None

    eventually(succeeded, "a-1 to succeed once the worker takes the signal in")
    signals = browser.find_element(By.ID, "signals").text
    assert "approve" in signals and '{"by":"ada"}' in signals and "the wait @2" in signals
    texts = [t.text for t in browser.find_element(By.ID, "timeline").find_elements(By.TAG_NAME, "text")]
    assert "took signal #1" in texts
    (artifacts() / "run-page-after.png").write_bytes(browser.get_screenshot_as_png())
    no_alert(browser)


def test_a_person_reconciles_an_indeterminate_intent_with_its_button(
    browser: object, site: tuple[str, Path]
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver

    assert isinstance(browser, WebDriver)
    url, _ = site
    browser.get(url)
    browser.find_element(By.LINK_TEXT, "trip-1").click()
    eventually(lambda: browser.find_element(By.ID, "run-id").text == "trip-1" or None, "the run page")
    assert "#1 Indeterminate" in browser.find_element(By.ID, "timeline").text
    intents = browser.find_element(By.ID, "intents")
    assert "reserve-seat" in intents.text and "Dispatched" in intents.text
    intents.find_element(By.NAME, "note").send_keys("the airline has no booking")
    intents.find_element(By.XPATH, ".//button[normalize-space()='Reject: it did not']").click()
    flash = eventually(lambda: browser.find_elements(By.CLASS_NAME, "flash") or None, "the flash")[0].text
    assert "of run trip-1: Rejected (it did not happen)" in flash

    def rejected() -> bool | None:
        browser.refresh()
        text = browser.find_element(By.ID, "intents").text
        return ("Rejected" in text and "Reject: it did not" not in text) or None

    eventually(rejected, "the intent to show Rejected")
    assert "by operator: the airline has no booking" in browser.find_element(By.ID, "intents").text


def test_a_hostile_run_name_shows_as_text_and_runs_nothing(browser: object, site: tuple[str, Path]) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver

    assert isinstance(browser, WebDriver)
    url, _ = site
    browser.get(url)
    no_alert(browser)
    browser.find_element(By.LINK_TEXT, HOSTILE).click()
    eventually(lambda: browser.find_element(By.ID, "run-id").text == HOSTILE or None, "the hostile run's page")
    no_alert(browser)
    assert browser.find_elements(By.TAG_NAME, "script") == []
    assert HOSTILE in browser.title


def test_a_key_with_a_line_break_and_a_nul_is_reconciled_by_its_button_in_a_browser(
    browser: object, tmp_path: Path
) -> None:
    """A browser sends an attribute's line break back as CRLF and a NUL as U+FFFD: the
    button of such a key (a hand-built log's) was refused as an unknown key. The form
    carries the key percent-encoded, and the reconcile records the key exactly."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver

    from attempt_kernel import IntentReconciled

    assert isinstance(browser, WebDriver)
    key = "k\n\x00\udc80<b>"
    log = forged_outstanding(tmp_path / "forged.jsonl", "f-1", key)
    server, url = start_serve(tmp_path, str(log), "--port", "0")
    try:
        browser.get(url + "runs/f-1")
        browser.find_element(By.ID, "intents").find_element(
            By.XPATH, ".//button[normalize-space()='Reject: it did not']"
        ).click()
        flash = eventually(lambda: browser.find_elements(By.CLASS_NAME, "flash") or None, "the flash")[0].text
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=TIMEOUT)
    assert flash == "Intent k\\n\\x00\\udc80<b> of run f-1: Rejected (it did not happen), recorded in the log."
    [done] = [r.change for r in records(log) if isinstance(r.change, IntentReconciled)]
    assert done.key == key
