"""30 learners at once: the app served on localhost, 30 browser sessions opening pages and starting runs.

Checks: no page shows an error, every session gets its result (a live result on a GPU; the model and
recorded runs without one), no two timed GPU regions overlap (the runner's enter/exit log), and the
server's memory comes back to its level after the first wave of sessions once the second wave closes.
"""

import asyncio
import os
import re
import time
from pathlib import Path

import pytest

from labs import all_labs, gpu
from tests.test_browser import CHROMIUM, LAUNCH_ARGS, start_server

ROOT = Path(__file__).resolve().parent.parent
SESSIONS = int(os.environ.get("ROOFLINE_LOAD_SESSIONS", "30"))
WAIT_MS = int(os.environ.get("ROOFLINE_LOAD_WAIT_MS", "600000"))  # per step, generous for a 2-core CI machine
ARTIFACTS = ROOT / "tests" / "artifacts" / "screenshots"
LAB_PAGES = [lab for lab in all_labs() if (ROOT / "pages" / f"{lab.name}.py").exists()]
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")]


def rss_mb(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", text).group(1)) / 1024


async def one_learner(browser, url: str, i: int, live: bool) -> str:
    lab = LAB_PAGES[i % len(LAB_PAGES)]
    context = await browser.new_context(viewport={"width": 1200, "height": 900})
    page = await context.new_page()
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        await page.goto(f"{url}/", wait_until="domcontentloaded", timeout=WAIT_MS)
        await page.get_by_text("The labs").first.wait_for(timeout=WAIT_MS)
        await page.goto(f"{url}/{lab.name}", wait_until="domcontentloaded", timeout=WAIT_MS)
        await page.get_by_text(lab.summary[:40]).first.wait_for(timeout=WAIT_MS)
        if live:  # start a run with the lab's defaults
            await page.get_by_role("button", name=re.compile("^Run on")).first.click()
        # the result (live, or the model and recorded runs without a GPU) ends with its table and downloads
        await page.get_by_role("button", name="Download CSV").first.wait_for(state="attached", timeout=WAIT_MS)
        assert await page.locator("[data-testid='stException']").count() == 0, f"session {i}: exception on {lab.name}"
        assert not errors, f"session {i}: JavaScript errors {errors}"
        print(f"session {i:2d} done: {lab.name}", flush=True)
        return lab.name
    except Exception as exc:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(ARTIFACTS / f"load-session-{i}-{lab.name}.png"))
        raise AssertionError(f"session {i} on the {lab.name} page: {exc}") from None
    finally:
        await context.close()


async def wave(url: str, live: bool) -> list:
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        try:
            return await asyncio.gather(*(one_learner(browser, url, i, live) for i in range(SESSIONS)))
        finally:
            await browser.close()


def overlapping_regions(log_path: Path) -> list:
    depth, bad = 0, []
    for line in log_path.read_text().splitlines() if log_path.exists() else []:
        stamp, event, label = line.split()[:3]
        depth += 1 if event == "enter" else -1
        if depth not in (0, 1):
            bad.append(line)
    return bad


def test_thirty_learners_at_once(tmp_path):
    live = gpu.detect().available
    log = tmp_path / "runner.log"
    with start_server({"ROOFLINE_RUNNER_LOG": str(log)}) as (url, proc):
        started = time.time()
        first = asyncio.run(wave(url, live))
        assert len(first) == SESSIONS
        time.sleep(3)
        after_first = rss_mb(proc.pid)
        second = asyncio.run(wave(url, live))
        assert len(second) == SESSIONS
        time.sleep(3)
        after_second = rss_mb(proc.pid)
        elapsed = time.time() - started
    assert not overlapping_regions(log), "two timed GPU regions overlapped"
    if live:
        assert log.read_text().count(" enter ") >= 1
    # the second wave must not leave memory behind: closed sessions are released
    assert after_second < after_first * 1.15 + 100, (after_first, after_second)
    print(f"2 x {SESSIONS} sessions in {elapsed:.0f} s; server RSS {after_first:.0f} -> {after_second:.0f} MB")
