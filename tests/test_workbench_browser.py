"""The workbench in a real browser: Chromium types a kernel into the code editor, runs it and sees the
verdict, which survives a reload; then 30 learners submit at once and are all answered, one timing at a
time (the runner's enter/exit log shows no overlap)."""

import asyncio
import concurrent.futures
import re
import time
from pathlib import Path

import pytest

from labs.workbench import get_exercise
from tests.test_browser import ARTIFACTS, CHROMIUM, LAUNCH_ARGS, browser, server, start_server  # noqa: F401
from tests.test_load import SESSIONS, WAIT_MS, overlapping_regions

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")]
EDITOR = "iframe[title*='code_editor']"


def wait_until_idle(page) -> None:
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=180_000)


def test_type_a_kernel_run_it_and_see_the_verdict(server, browser):  # noqa: F811
    page = browser.new_page(viewport={"width": 1400, "height": 2400})
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{server}/workbench?exercise=add", wait_until="domcontentloaded", timeout=60_000)
    page.get_by_text("Kernel workbench").first.wait_for(timeout=90_000)
    editor = page.frame_locator(EDITOR).first
    editor.locator(".ace_content").wait_for(timeout=60_000)
    wait_until_idle(page)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "workbench.png"), full_page=True)
    assert editor.locator(".ace_gutter-cell").count() > 10  # line numbers
    assert editor.locator(".ace_keyword").count() > 0  # Python highlighting

    editor.locator(".ace_content").click()
    page.keyboard.press("Control+A")
    page.keyboard.press("Delete")
    page.keyboard.insert_text(get_exercise("add").solution())  # typed into the editor (no auto-indent)
    editor.get_by_text("Run", exact=True).click()
    page.get_by_text("Correct on every check case").first.wait_for(timeout=180_000)
    page.screenshot(path=str(ARTIFACTS / "workbench-verdict.png"), full_page=True)
    assert page.locator("[data-testid='stException']").count() == 0

    url = page.url
    assert re.search(r"[?&]s=", url) and "exercise=add" in url
    page.reload(wait_until="domcontentloaded")  # a new Streamlit session: the code and the verdict come back
    page.get_by_text("Correct on every check case").first.wait_for(timeout=90_000)
    # the editor fills its iframe after the verdict has rendered: wait for the code itself, not just the element
    from playwright.sync_api import expect

    expect(page.frame_locator(EDITOR).first.locator(".ace_content")).to_contain_text("BLOCK = 1024", timeout=60_000)
    assert not errors, errors
    page.close()


async def one_submission(browser, url: str, i: int) -> float:
    context = await browser.new_context(viewport={"width": 1200, "height": 1600})
    page = await context.new_page()
    started = time.monotonic()
    try:
        await page.goto(f"{url}/workbench?exercise=add", wait_until="domcontentloaded", timeout=WAIT_MS)
        await page.get_by_role("button", name="Run", exact=True).wait_for(timeout=WAIT_MS)
        await page.get_by_role("button", name="Run", exact=True).click()
        await page.get_by_text("Correct on every check case").first.wait_for(timeout=WAIT_MS)
        assert await page.locator("[data-testid='stException']").count() == 0, f"learner {i}: exception"
        return time.monotonic() - started
    except Exception as exc:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(ARTIFACTS / f"workbench-load-{i}.png"))
        raise AssertionError(f"learner {i}: {exc}") from None
    finally:
        await context.close()


async def everyone(url: str) -> list:
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        chromium = await p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        try:
            return await asyncio.gather(*(one_submission(chromium, url, i) for i in range(SESSIONS)))
        finally:
            await chromium.close()


def test_thirty_learners_submit_at_once(tmp_path):
    log = tmp_path / "runner.log"
    with start_server({"ROOFLINE_RUNNER_LOG": str(log)}) as (url, _proc):
        # a thread of its own: the module's synchronous Playwright (the test above) keeps an event loop here
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            seconds = pool.submit(lambda: asyncio.run(everyone(url))).result()
    assert len(seconds) == SESSIONS
    assert not overlapping_regions(log), "two timed regions overlapped"
    assert log.read_text().count(" enter workbench:add ") == SESSIONS  # every submission took its turn
    print(f"{SESSIONS} submissions answered; slowest after {max(seconds):.0f} s")
