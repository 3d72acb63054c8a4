"""The browser viewer in headless Chromium: one session of a ``latsim serve`` page, its run
folder's files back.

For ``tests/test_browser.py`` and ``bench/record_browser.py``. Uses the system's
``chromium`` and ``chromedriver`` (Debian packages ``chromium`` and ``chromium-driver``,
one version, so they match; ``.ci/run`` installs them) through Selenium (the test extra);
selenium-manager never runs, since it would download a driver.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
#: Chromium's switches: headless, no GPU, a fixed window (the page's canvas fits).
SWITCHES = ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
            "--window-size=1000,1000", "--mute-audio", "--no-first-run",
            "--disable-extensions")


def missing() -> str | None:
    """Why a headless session cannot run here (None where it can)."""
    absent = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if absent:
        return (f"needs {' and '.join(absent)} (Debian: apt-get install chromium "
                "chromium-driver; .ci/run installs them)")
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "needs selenium (the test extra)"
    return None


def chromium_driver() -> Any:
    """A headless Chromium under the system's chromedriver."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in SWITCHES:
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(20)
    driver.set_script_timeout(10)
    return driver


def wait_for(driver: Any, script: str, timeout: float) -> object:
    """Poll ``script`` in the page every 0.2 s until it returns something true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = driver.execute_script(script)
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"no {script!r} within {timeout:g} s; page state: "
                         f"{driver.find_element('id', 'state').text!r}")


@dataclass(frozen=True)
class BrowserSession:
    """What one page session left: its final state line, its summary, its run folder's
    files (``window.latsimRecords``, None for a failed session), and the page's clock
    against this process's ``perf_counter`` (server minus page, bracketed by a script
    round trip: ``(low, high)``)."""

    state: str
    summary: dict
    files: dict[str, str] | None
    offset_bounds: tuple[float, float]

    def write(self, run_dir: Path) -> Path:
        """The run folder's files under ``run_dir`` (made), as the page offered them."""
        if self.files is None:
            raise RuntimeError(f"the session left no run folder: {self.summary}")
        run_dir.mkdir(parents=True, exist_ok=True)
        for name, text in self.files.items():
            (run_dir / name).write_text(text, newline="")
        return run_dir


def run_session(driver: Any, url: str, duration: float, ready_timeout: float = 15.0
                ) -> BrowserSession:
    """Open the page at ``url`` (one that starts at once: a ``trace`` in it), wait for its
    session to start and end (``duration`` plus 20 s), and read what it left."""
    driver.get(url)
    wait_for(driver, "return window.latsimViewer && window.latsimViewer.ready"
             " && window.latsimViewer.ready.session", ready_timeout)
    wait_for(driver, "return window.latsimDone === true", duration + 20)
    before = time.perf_counter()
    page = float(driver.execute_script("return performance.now() / 1000"))
    after = time.perf_counter()
    summary = json.loads(driver.find_element("id", "latsim-summary").text)
    files = driver.execute_script("return window.latsimRecords")
    state = driver.find_element("id", "state").text
    return BrowserSession(state, summary, files, (before - page, after - page))


def replay(driver: Any, port: int, token: str, trace: tuple[float, ...], duration: float,
           playout_delay: float, K: int = 4) -> BrowserSession:
    """One session of the page a ``latsim serve`` on loopback ``port`` serves, replaying
    ``trace`` (condition times, s) over ``duration`` s at playout delay ``playout_delay``;
    the driver is quit afterwards."""
    times = ",".join(f"{t:g}" for t in trace)
    try:
        return run_session(driver, f"http://127.0.0.1:{port}/?token={token}&trace={times}"
                           f"&duration={duration:g}&K={K}&D={playout_delay:g}", duration)
    finally:
        driver.quit()
