"""The dashboard in a real browser: headless Debian chromium driven by
selenium, against `awa-pool dashboard` (the real command, waitress) and a
real supervisor.

An operator opens the overview, finds a failed job, reads its traceback,
presses Retry and watches it complete; pauses a queue and sees claiming
stop (the overview updating itself); hostile job data stays text; a POST
without the CSRF token is refused. Skipped, in one line, only when chromium
or chromedriver is not installed (apt install chromium chromium-driver).
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator

import pytest

from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

import awa_pool
from dashboard_helpers import enqueue, start_dashboard
from helpers import let_polls_go_by, scalar, wait_for

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                       reason="browser tests need chromium and chromedriver (apt install chromium chromium-driver)"),
]

XSS_SCRIPT = "<script>window.__xss = 1; alert('xss')</script>"
XSS_ATTR = '"><img src=x onerror="window.__xss = 2">'


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[object]:
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1000", f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


def _state(dsn: str, job_id: int) -> str:
    return scalar(dsn, "SELECT state::text FROM awa.jobs WHERE id = %s", (job_id,))


def _no_alert(driver) -> bool:
    try:
        driver.switch_to.alert
    except NoAlertPresentException:
        return True
    return False


def _waiting(browser, timeout: float) -> WebDriverWait:
    """A wait that looks again when the page it read from was replaced
    meanwhile (a form's redirect, the live fragment's refresh): an element
    found on the old page goes stale before its text is read."""
    return WebDriverWait(browser, timeout, ignored_exceptions=(StaleElementReferenceException,))


def test_an_operator_retries_a_failed_job_and_pauses_a_queue(dsn, pools, processes, browser, tmp_path):
    ok_file = tmp_path / "storage-writable"
    pools.start(app="apps.dashboard", workers=1)
    (job_id,) = enqueue(dsn, awa_pool.Job("flaky_upload", {"path": "report.pdf", "ok_file": str(ok_file)},
                                          queue="uploads", max_attempts=1))
    wait_for(lambda: _state(dsn, job_id) == "failed", timeout=30, message="the upload failing once")
    base = start_dashboard(processes, dsn)
    wait = _waiting(browser, 20)

    # the overview lists the queue and its failure
    browser.get(base + "/")
    assert browser.title.startswith("Overview")
    row = browser.find_element(By.XPATH, "//tr[td/a[text()='uploads']]")
    assert row.find_element(By.CSS_SELECTOR, "a.bad").text == "1"

    # from the failed count to the job, and its traceback
    row.find_element(By.CSS_SELECTOR, "a.bad").click()
    wait.until(lambda d: "state=failed" in d.current_url)
    browser.find_element(By.LINK_TEXT, str(job_id)).click()
    wait.until(lambda d: d.current_url.endswith(f"/jobs/{job_id}"))
    traceback = browser.find_element(By.CSS_SELECTOR, "pre.traceback").text
    assert "Traceback (most recent call last)" in traceback
    assert "ConnectionError: upload of report.pdf refused: the storage is read-only" in traceback

    # Retry: the pool runs it again, and this time it completes
    ok_file.write_text("yes")
    browser.find_element(By.XPATH, "//button[text()='Retry now']").click()
    wait.until(lambda d: "will run again" in d.find_element(By.CSS_SELECTOR, ".notice").text)

    def completed_in_page(driver) -> bool:
        driver.refresh()
        return driver.find_element(By.CSS_SELECTOR, ".page-head .badge").text == "completed"

    _waiting(browser, 30).until(completed_in_page)
    assert '"uploaded": "report.pdf"' in browser.find_element(By.XPATH, "//h2[text()='Result']/../..").text

    # Pause the queue: the overview says so, and the pool stops claiming from it
    browser.get(base + "/")
    browser.find_element(By.XPATH, "//tr[td/a[text()='uploads']]//button[text()='Pause']").click()
    wait.until(lambda d: "Queue uploads is paused" in d.find_element(By.CSS_SELECTOR, ".notice").text)
    (waiting,) = enqueue(dsn, awa_pool.Job("quick", {"n": 1}, queue="uploads"))

    def available_shown(driver) -> bool:   # the live fragment updates without a reload
        cells = driver.find_elements(By.XPATH, "//tr[td/a[text()='uploads']]/td")
        return len(cells) > 1 and cells[1].text == "1"

    refreshed_before = browser.find_element(By.ID, "live").get_attribute("data-refreshed")
    wait.until(available_shown)
    assert browser.find_element(By.ID, "live").get_attribute("data-refreshed") != refreshed_before
    # A supervisor polls at least once a second: two of its heartbeats (4 s)
    # while paused must leave the job untouched.
    let_polls_go_by(dsn, heartbeats=2)
    assert _state(dsn, waiting) == "available"
    browser.find_element(By.XPATH, "//tr[td/a[text()='uploads']]//button[text()='Resume']").click()
    wait.until(lambda d: "Queue uploads is resumed" in d.find_element(By.CSS_SELECTOR, ".notice").text)
    wait_for(lambda: _state(dsn, waiting) == "completed", timeout=30, message="the job running after resume")


def test_hostile_job_data_never_runs_and_a_post_without_csrf_is_refused(dsn, processes, browser):
    (job_id,) = enqueue(dsn, awa_pool.Job("quick", {"note": XSS_SCRIPT, "title": XSS_ATTR}, queue="uploads",
                                          tags=[XSS_ATTR], metadata={"html": XSS_SCRIPT}))
    base = start_dashboard(processes, dsn)
    wait = _waiting(browser, 20)
    for path in (f"/jobs/{job_id}", "/jobs", "/jobs?kind=quick"):
        browser.get(base + path)
        wait.until(lambda d: d.execute_script("return document.readyState") == "complete")
        assert _no_alert(browser), f"an alert opened on {path}"
        assert browser.execute_script("return window.__xss === undefined"), f"injected code ran on {path}"
        assert not browser.find_elements(By.CSS_SELECTOR, "main img"), f"an injected <img> exists on {path}"
    browser.get(base + f"/jobs/{job_id}")
    shown = browser.find_element(By.CSS_SELECTOR, "pre.json").text
    assert "<script>window.__xss = 1; alert('xss')</script>" in shown
    assert '\\"><img src=x onerror=\\"window.__xss = 2\\">' in shown

    # a POST without the CSRF token: refused, and the job is untouched
    status = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch(arguments[0], {method: 'POST', credentials: 'same-origin'}).then(r => done(r.status));",
        base + f"/jobs/{job_id}/cancel")
    assert status == 403
    browser.execute_script("document.querySelectorAll('input[name=csrf_token]').forEach(e => e.remove());"
                           "document.querySelectorAll('form[data-confirm]').forEach(f => f.removeAttribute('data-confirm'));")
    browser.find_element(By.XPATH, "//button[text()='Cancel']").click()
    wait.until(lambda d: "403" in d.title)
    assert "CSRF token is missing or stale" in browser.find_element(By.CSS_SELECTOR, ".reason").text
    assert _state(dsn, job_id) == "available"
    # and the page kept its policy: nothing was reported as blocked inline script
    logs = [entry["message"] for entry in browser.get_log("browser")]
    assert not [m for m in logs if "Content Security Policy" in m and "inline" in m], logs
