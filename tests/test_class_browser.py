"""The class in Chromium: two learners join, submit a kernel and answer a lab's question; the instructor's board
ranks both and the poll holds both answers; a name written as HTML stays text and never runs."""

import csv
import io
import re
from pathlib import Path

import pytest

from tests.test_browser import CHROMIUM, LAUNCH_ARGS, start_server

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")]
WAIT = 240_000
EVIL = "<img src=x onerror=\"alert('xss')\">"


def finished(page) -> None:
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=WAIT)


def test_two_learners_join_submit_predict_and_the_board_ranks_them(tmp_path):
    from playwright.sync_api import sync_playwright

    db = tmp_path / "class.sqlite3"
    env = {"ROOFLINE_DB": str(db), "ROOFLINE_INSTRUCTOR_KEY": "instructor-key-for-the-test"}
    from labs.classroom.store import Store

    code = Store(str(db)).create_class("browser")
    dialogs = []
    with start_server(env) as (url, _proc), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        for name, guess in (("Ada", "0.5"), (EVIL, "2")):
            context = browser.new_context(viewport={"width": 1400, "height": 2400})
            page = context.new_page()
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(f"{url}/class", wait_until="domcontentloaded", timeout=WAIT)
            page.get_by_label("Class code (your instructor shows it)").fill(code.lower())
            page.get_by_label("Display name (the class board shows it)").fill(name)
            page.get_by_role("button", name="Join").click()
            page.get_by_text(f"You are {name} in class {code}.").wait_for(timeout=WAIT)  # the name, as text
            assert re.search(r"[?&]s=[A-Za-z0-9_-]{20,}", page.url)  # the key kept in the address
            for _ in range(120):  # the page's script keeps the key in a cookie
                if any(c["name"] == "roofline_class_key" for c in context.cookies()):
                    break
                page.wait_for_timeout(250)
            else:
                pytest.fail("the class key never reached a cookie")
            # a fresh page load without the key in the address: the cookie says who this is
            page.goto(f"{url}/workbench?exercise=add", wait_until="domcontentloaded", timeout=WAIT)
            page.get_by_role("button", name="Load our solution").click()
            finished(page)
            page.get_by_role("button", name="Run", exact=True).click()
            verdict = page.locator("[data-testid='stAlert']").filter(has_text=re.compile("^(Correct|Wrong|Not run|You have)"))
            verdict.first.wait_for(timeout=WAIT)
            assert verdict.first.inner_text().startswith("Correct on every check case"), verdict.first.inner_text()
            page.goto(f"{url}/roofline?predict=1", wait_until="domcontentloaded", timeout=WAIT)
            field = page.get_by_label("Your prediction (TFLOP/s)")
            field.fill(guess)
            field.press("Enter")
            page.get_by_role("button", name="Lock in").click()
            page.get_by_text(f"you: {guess} TFLOP/s").first.wait_for(timeout=WAIT)
            assert page.locator("img[src='x']").count() == 0
            context.close()
        store = Store(str(db))
        assert {s["name"] for s in store.submissions(code, "add")} == {"Ada", EVIL}
        context = browser.new_context(viewport={"width": 1400, "height": 2400}, accept_downloads=True)
        page = context.new_page()
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(f"{url}/class?key=instructor-key-for-the-test", wait_until="domcontentloaded", timeout=WAIT)
        page.get_by_text(f"Class code: {code}").wait_for(timeout=WAIT)
        finished(page)
        assert "key=" not in page.url
        with page.expect_download(timeout=WAIT) as download:
            page.get_by_role("button", name="Download the board (CSV)").click()
        board = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text())))
        assert sorted((r["rank"], r["status"]) for r in board) == [("1", "correct"), ("2", "correct")]
        assert {r["learner"] for r in board} == {"Ada", EVIL}
        page.get_by_role("tab", name="Prediction poll").click()
        page.get_by_text("2 answer(s)").first.wait_for(timeout=WAIT)
        page.get_by_role("tab", name="Board").click()
        page.get_by_role("combobox", name="Open a learner's code and history").click()
        page.get_by_role("option", name=EVIL).wait_for(timeout=WAIT)  # the name as an option's text
        page.get_by_role("option", name=EVIL).click()
        page.get_by_text("def add").first.wait_for(timeout=WAIT)  # the learner's code, one click away
        assert page.locator("img[src='x']").count() == 0 and page.locator("[data-testid='stException']").count() == 0
        page.screenshot(path=str(tmp_path / "board.png"), full_page=True)
        browser.close()
    assert dialogs == [], f"a learner's name ran as script: {dialogs}"
