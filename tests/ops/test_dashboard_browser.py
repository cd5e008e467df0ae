"""``dopool dashboard`` in a real headless browser, beside a live runtime holding the store.

Debian's chromium (``/usr/bin/chromium``), driven by playwright's sync API through that
executable (never a browser playwright downloads). Without either the test skips, unless
``DOPOOL_REQUIRE_BROWSER=1`` (CI's), which makes it fail naming what is missing.
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

from dopool import EventContext, RetryPolicy, Runtime

if TYPE_CHECKING:  # (imported at run time by playwright_or_skip, if it is there)
    from playwright.sync_api import Dialog

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
# What runs chromium headless as root in a container, quietly and offline.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REQUIRE = "DOPOOL_REQUIRE_BROWSER"
TIMEOUT = 60.0
PNG = b"\x89PNG\r\n\x1a\n"


def playwright_or_skip() -> ModuleType:
    """playwright's sync API, if it and the system's chromium are here."""
    missing = [] if CHROMIUM.exists() else [f"{CHROMIUM} (apt-get install chromium)"]
    try:
        from playwright import sync_api
    except ImportError:
        missing.append("playwright (dopool's dev extra)")
    if missing:
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(f"{REQUIRE}=1, but missing: {', '.join(missing)}")
        pytest.skip(f"no browser to drive: missing {', '.join(missing)}")
    return sync_api


class Held:
    """A handler that dead-letters a poisoned event (its error holding markup) and holds
    every other one until released, counting the starts."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = 0
        self._cond = threading.Condition()

    def __call__(self, ctx: EventContext) -> None:
        if ctx.event.get("poison"):
            raise ValueError(f"poisoned <b>{ctx.event['n']}</b>")  # markup, shown as text
        with self._cond:
            self.started += 1
            self._cond.notify_all()
        assert self.release.wait(TIMEOUT)

    def wait_started(self, count: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self.started >= count, TIMEOUT), self.started


@contextmanager
def dashboard(store: Path, log: Path) -> Iterator[str]:
    """``dopool dashboard STORE --port 0 --allow-control`` in a process of its own; the URL
    it prints. It is terminated (killed if it lingers) on the way out."""
    command = [sys.executable, "-m", "dopool", "dashboard", str(store)]
    with log.open("w") as errors:
        server = subprocess.Popen(
            [*command, "--port", "0", "--allow-control"],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert server.stdout is not None
        for line in server.stdout:
            lines.put(line)
        lines.put("")  # the end

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        first = lines.get(timeout=TIMEOUT)
        url = re.search(r"http://127\.0\.0\.1:\d+/", first)
        assert url is not None, (first, log.read_text())
        yield url[0]
    finally:
        server.terminate()
        try:
            server.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        reader.join(TIMEOUT)  # (it reads to the end the process's exit made)
        assert server.stdout is not None
        server.stdout.close()


def test_the_page_reads_a_live_store_and_pauses_its_pool(store_path: Path, tmp_path: Path) -> None:
    sync_api = playwright_or_skip()
    expect = sync_api.expect
    held = Held()
    with Runtime(store_path) as runtime:
        try:
            jobs = runtime.define("jobs", execute=held, concurrency=2)
            retry = RetryPolicy(max_attempts=1)
            mail = runtime.define("mail", execute=held, concurrency=1, retry=retry)
            mail.enqueue({"poison": True, "n": 7})
            assert mail.join(TIMEOUT)
            jobs.enqueue_many([{"n": n} for n in range(10)])
            held.wait_started(2)  # one running on each instance, eight waiting behind them
            with (
                dashboard(store_path, tmp_path / "dashboard.log") as url,
                sync_api.sync_playwright() as driver,
            ):
                browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
                try:
                    page = browser.new_page(viewport={"width": 1280, "height": 900})
                    asked: list[str] = []

                    def confirm(dialog: Dialog) -> None:
                        asked.append(dialog.message)
                        dialog.accept()

                    page.on("dialog", confirm)
                    page.goto(url)
                    row = page.locator('tr[data-pool="jobs"]')
                    expect(row).to_be_visible(timeout=TIMEOUT * 1000)
                    shown = row.locator('td[data-field="pending"]').inner_text()
                    assert int(shown.replace(",", "")) == jobs.status().pending == 10
                    expect(row.locator('td[data-field="running"]')).to_have_text("2")
                    expect(row.locator('td[data-field="state"]')).to_have_text("active")

                    page.locator('tr[data-pool="mail"] a.pool').click()
                    letter = page.locator('tr[data-letter="mail:0:0"]')
                    expect(letter).to_contain_text("ValueError: poisoned <b>7</b>")
                    assert letter.locator("b").count() == 0  # no element made of it
                    traceback = page.locator('tr.detail pre[data-field="traceback"]').first
                    expect(traceback).to_contain_text("in __call__")
                    page.locator('tr[data-pool="jobs"] a.pool').click()
                    expect(page.locator("#detail-name")).to_have_text("jobs")
                    expect(page.locator("tr[data-instance]")).to_have_count(2)
                    shot = page.screenshot(path=tmp_path / "dashboard.png", full_page=True)
                    assert shot.startswith(PNG)
                    assert (tmp_path / "dashboard.png").read_bytes() == shot

                    page.locator('#pool-actions button[data-action="pause"]').click()
                    expect(row.locator('td[data-field="state"]')).to_have_text(
                        "paused", timeout=TIMEOUT * 1000
                    )
                    assert asked == [
                        'Pause pool "jobs" (all its instances)? Nothing more starts on them '
                        "until resumed."
                    ]
                    expect(page.locator("#message")).to_have_text("paused jobs (2 instances)")
                finally:
                    browser.close()
            status = jobs.status()
            assert status.paused
            assert [instance.state for instance in status.instances] == ["paused", "paused"]
        finally:
            held.release.set()  # the two running handlers finish; the pause starts no other
