"""A real browser: the app served on localhost, Debian's Chromium loads every page and screenshots it."""

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from labs import all_labs

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "tests" / "artifacts" / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")]

# url path -> text that must appear once the page has rendered
PAGES = {"": "The labs", "gpu": "Datasheet table"}
PAGES.update({lab.name: lab.summary[:60] for lab in all_labs() if (ROOT / "pages" / f"{lab.name}.py").exists()})
if (ROOT / "pages" / "glossary.py").exists():
    PAGES["glossary"] = "Glossary"
if (ROOT / "pages" / "scorecard.py").exists():
    PAGES["scorecard"] = "Model scorecard"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


@contextlib.contextmanager
def start_server(extra_env=None):
    """Serve the app on a free localhost port; yields (url, process)."""
    port = free_port()
    env = {**os.environ, "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false", **(extra_env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless=true",
                             f"--server.port={port}", "--server.address=127.0.0.1"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("the app did not start within 120 s")
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server():
    with start_server() as (url, _proc):
        yield url


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        yield b
        b.close()


@pytest.mark.parametrize("path", list(PAGES))
def test_page_loads_in_chromium_without_errors(server, browser, path):
    page = browser.new_page(viewport={"width": 1400, "height": 3200})  # tall: Streamlit scrolls inside the page
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{server}/{path}", wait_until="domcontentloaded", timeout=60_000)
    page.get_by_text(PAGES[path], exact=False).first.wait_for(timeout=90_000)
    # the script has finished when Streamlit's "running" indicator is gone
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=120_000)
    page.wait_for_timeout(1500)  # let charts draw
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{path or 'home'}.png"), full_page=True)
    assert page.locator("[data-testid='stException']").count() == 0, f"{path}: the page shows an exception"
    assert not errors, f"{path}: JavaScript errors {errors}"
    page.close()


def test_predict_then_run_in_the_browser(server, browser):
    """A learner on a predict-first link writes a guess, locks it in, and sees it scored beside the model."""
    page = browser.new_page(viewport={"width": 1400, "height": 3200})
    page.goto(f"{server}/roofline?predict=1", wait_until="domcontentloaded", timeout=60_000)
    page.get_by_text("Write down your prediction").first.wait_for(timeout=90_000)
    assert page.locator(".js-plotly-plot").count() == 0
    field = page.get_by_label("Your prediction (TFLOP/s)")
    field.fill("0.4")
    field.press("Enter")
    page.get_by_role("button", name="Lock in").click()
    page.get_by_text("you: 0.4 TFLOP/s").first.wait_for(timeout=60_000)
    page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
    page.screenshot(path=str(ARTIFACTS / "predict-then-run.png"))
    assert page.locator("[data-testid='stException']").count() == 0
    page.close()


def test_a_shared_lab_link_opened_first_gets_the_grouped_navigation(browser):
    """On a fresh server the first request is a lab's link: it must get app.py's navigation (Learn, Labs...),
    not Streamlit's list of the files in pages/."""
    with start_server() as (url, _proc):
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        page.goto(f"{url}/roofline", wait_until="domcontentloaded", timeout=60_000)
        page.get_by_text(PAGES["roofline"], exact=False).first.wait_for(timeout=90_000)
        nav = page.locator("[data-testid='stSidebarNav']")
        nav.get_by_text("Learn", exact=True).first.wait_for(timeout=60_000)
        assert nav.get_by_text("app", exact=True).count() == 0, "the sidebar lists the files in pages/"
        assert page.locator("[data-testid='stException']").count() == 0
        page.close()
