"""Issue 34 in a real browser (Debian's Chromium, 1366 px wide, no GPU): on every page no plotly annotation or
legend overlaps another (or an axis title, or a label the points) or is cut at the figure's edge; the sidebar
lists every page, none behind "View more"; and a newcomer's path, step by step: Home -> a lab -> predict -> the run (recorded) -> the
workbench -> a verdict."""

from pathlib import Path

import pytest

from tests.test_browser import ARTIFACTS, CHROMIUM, PAGES, browser, server  # noqa: F401

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")]
WIDTH = 1366
ALL_PAGES = {**PAGES, "workbench": "Kernel workbench"}

# every drawn chart: the figure's box, its annotations' boxes, its legend's, its axis titles'
BOXES = """() => [...document.querySelectorAll('.js-plotly-plot')].map(plot => {
  const box = el => { const r = el.getBoundingClientRect();
                      return {x0: r.left, y0: r.top, x1: r.right, y1: r.bottom, w: r.width, h: r.height}; };
  const title = plot.querySelector('.g-gtitle');
  const legend = plot.querySelector('g.legend');
  return {figure: box(plot), title: title ? title.textContent : '',
          notes: [...plot.querySelectorAll('g.annotation')].map(
              g => ({text: g.textContent, ...box(g.querySelector('.annotation-text-g') || g)})),
          legend: legend && legend.querySelector('rect.bg') ? box(legend.querySelector('rect.bg')) : null,
          axes: [...plot.querySelectorAll('.g-xtitle, .g-ytitle')].map(g => ({text: g.textContent, ...box(g)})),
          points: [...plot.querySelectorAll('.scatterlayer path.point')].map(box)};
})"""


def overlap(a: dict, b: dict, slack: float = 1.0) -> bool:
    return (min(a["x1"], b["x1"]) - max(a["x0"], b["x0"]) > slack
            and min(a["y1"], b["y1"]) - max(a["y0"], b["y0"]) > slack)


def outside(inner: dict, outer: dict, slack: float = 1.0) -> bool:
    """Past the outer box by more than `slack` px (a negative slack: closer to its edge than that)."""
    return inner["x0"] < outer["x0"] - slack or inner["x1"] > outer["x1"] + slack or \
        inner["y0"] < outer["y0"] - slack or inner["y1"] > outer["y1"] + slack


def problems(chart: dict) -> list:
    """What overlaps or is cut in one chart."""
    found, fig = [], chart["figure"]
    notes = [n for n in chart["notes"] if n["w"] > 0 and n["h"] > 0 and n["text"].strip()]
    legend = chart["legend"] if chart["legend"] and chart["legend"]["w"] > 0 else None
    for i, a in enumerate(notes):
        if outside(a, fig, slack=-2):  # a label flush with the edge has lost its last letters to it
            found.append(f"label {a['text']!r} cut at the figure's edge")
        for b in notes[i + 1:]:
            if overlap(a, b):
                found.append(f"labels {a['text']!r} and {b['text']!r} overlap")
        if legend and overlap(a, legend):
            found.append(f"label {a['text']!r} overlaps the legend")
        covered = [p for p in chart.get("points", []) if p["w"] > 0 and overlap(a, p, slack=2.0)]
        if covered:
            found.append(f"label {a['text']!r} covers {len(covered)} data points")
    if legend:
        if outside(legend, fig):
            found.append("legend cut at the figure's edge")
        for axis in chart["axes"]:
            if axis["w"] > 0 and overlap(legend, axis):
                found.append(f"legend overlaps the axis title {axis['text']!r}")
    return [f"{chart['title'] or 'untitled chart'}: {p}" for p in found]


def wait_until_idle(page) -> None:
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=180_000)


def open_page(browser, url: str, height: int = 2400):  # noqa: F811
    page = browser.new_page(viewport={"width": WIDTH, "height": height})
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(url, wait_until="domcontentloaded", timeout=60_000)
    return page, errors


@pytest.mark.parametrize("path", list(ALL_PAGES))
def test_no_label_or_legend_overlaps_or_is_cut_at_1366_px(server, browser, path):  # noqa: F811
    page, errors = open_page(browser, f"{server}/{path}", height=6000)  # tall: every chart drawn at once
    page.get_by_text(ALL_PAGES[path], exact=False).first.wait_for(timeout=90_000)
    wait_until_idle(page)
    if path not in ("", "workbench", "glossary"):  # every other page draws charts without a GPU
        page.locator(".js-plotly-plot .main-svg").first.wait_for(timeout=90_000)
    page.wait_for_timeout(2000)  # let plotly lay its charts out
    charts = page.evaluate(BOXES)
    assert charts or path in ("", "workbench", "glossary"), f"/{path}: no chart drawn"
    found = [p for chart in charts if chart["figure"]["w"] > 0 for p in problems(chart)]
    if found:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"overlap-{path or 'home'}.png"), full_page=True)
    assert not found, f"/{path}: " + "; ".join(found)
    assert not errors, errors
    page.close()


def test_the_sidebar_lists_every_page(server, browser):  # noqa: F811
    import re

    page, _ = open_page(browser, f"{server}/", height=768)  # a laptop's screen
    nav = page.locator("[data-testid='stSidebarNav']")
    nav.get_by_text("Learn", exact=True).first.wait_for(timeout=90_000)
    wait_until_idle(page)
    links = nav.locator("a")
    assert links.count() >= len(ALL_PAGES), [links.nth(i).inner_text() for i in range(links.count())]
    assert page.get_by_text(re.compile(r"View \d* ?more|View less")).count() == 0, "pages hidden behind 'View more'"
    for title in ("Roofline", "Training memory", "Kernel workbench", "Glossary"):
        assert nav.get_by_text(title, exact=True).first.is_visible(), title
    page.close()


def test_a_newcomers_path_from_home_to_a_verdict(server, browser):  # noqa: F811
    page, errors = open_page(browser, f"{server}/")
    # 1. Home: the route first, then the labs
    page.get_by_text("How to use it").first.wait_for(timeout=90_000)
    route = page.get_by_role("heading", name="How to use it").first.bounding_box()
    labs = page.get_by_role("heading", name="The labs").first.bounding_box()
    assert route["y"] < labs["y"], "Home's route sits below the lab cards"
    # 2. a lab, from its card
    page.locator("[data-testid='stMain'] [data-testid='stPageLink-NavLink']").get_by_text("Roofline", exact=True) \
        .first.click()
    page.get_by_text("Predict, then run.").first.wait_for(timeout=90_000)
    wait_until_idle(page)
    assert page.get_by_text("No CUDA GPU found").count() == 1  # said once
    # 3. predict
    field = page.get_by_label("Your prediction (TFLOP/s)")
    field.fill("0.4")
    field.press("Enter")
    page.get_by_role("button", name="Lock in").click()
    # 4. the run: without a GPU, the recorded run of a real GPU is what the guess is scored against
    page.get_by_text("you: 0.4 TFLOP/s").first.wait_for(timeout=60_000)
    page.get_by_text("recorded").first.wait_for(timeout=60_000)
    page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
    page.screenshot(path=str(ARTIFACTS / "newcomer-1-lab.png"))
    # 5. the workbench, from the sidebar
    page.locator("[data-testid='stSidebarNav']").get_by_text("Kernel workbench", exact=True).click()
    page.get_by_text("No GPU on this machine").first.wait_for(timeout=90_000)
    wait_until_idle(page)
    # 6. a verdict: the starter as it comes, run, checked and its launch modelled on the H100
    page.get_by_role("button", name="Run", exact=True).click()
    page.get_by_text("Correct on every check case").first.wait_for(timeout=300_000)
    page.get_by_text("your launch:").first.wait_for(timeout=60_000)
    assert page.get_by_text("programs of 1 warp").count() >= 1
    assert page.get_by_text("H100 SXM").count() >= 1
    page.screenshot(path=str(ARTIFACTS / "newcomer-2-verdict.png"), full_page=True)
    assert page.locator("[data-testid='stException']").count() == 0
    assert not errors, errors
    page.close()
