"""Every lab lesson reads like a course (issue 34): it leads with what you will learn, the idea, what to try and a
question to answer; why the model misses goes into one "Behind the model" section, shown collapsed, in plain words:
no commit ids, script paths, run times or dates (a lab notebook's marks)."""

import re
from pathlib import Path

import pytest

from tests.test_pages import open_page
from ui import text

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "content" / "labs").glob("*.md"))
LEADING = ["What you will learn", "The idea", "What to try", "A question"]
BEHIND = "Behind the model"
LONG_LESSONS = ["matmul", "attention"]  # the two that once ended in ~1,500 words of investigation notes

NOTEBOOK_MARKS = {
    "a commit id": re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b"),
    "a script path": re.compile(r"\bscripts/"),
    "a time in UTC": re.compile(r"\bUTC\b|\b\d{1,2}:\d{2}\b"),
    "a date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    "a round of the investigation": re.compile(r"\bround (one|two|three|four|five|\d)\b", re.I),
    "the model's own history": re.compile(r"\buntil the model\b", re.I),
    "a doubled comma": re.compile(r",,"),
}


def headings(path: Path) -> list:
    return [line[3:].strip() for line in path.read_text().splitlines() if line.startswith("## ")]


def words(markdown: str) -> int:
    return len(markdown.split())


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_lesson_leads_with_learn_idea_try_and_a_question(lesson):
    found = headings(lesson)
    missing = [h for h in LEADING if h not in found]
    assert not missing, f"{lesson.name} lacks {missing}"
    at = [found.index(h) for h in LEADING]
    assert at == sorted(at), f"{lesson.name}: {LEADING} out of order in {found}"
    assert at[0] == 0, f"{lesson.name} does not open with 'What you will learn'"
    question = text.split_sections(lesson.read_text())["A question"]
    assert "?" in question, f"{lesson.name}: 'A question' asks none"


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_behind_the_model_is_one_section_after_the_lesson(lesson):
    found = headings(lesson)
    assert found.count(BEHIND) <= 1, f"{lesson.name} has {found.count(BEHIND)} '{BEHIND}' sections"
    if BEHIND in found:
        assert found.index(BEHIND) > found.index("A question"), f"{lesson.name}: '{BEHIND}' before the question"


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_lesson_holds_no_lab_notebook_marks(lesson):
    body = lesson.read_text()
    found = {what: sorted(set(m.group(0) for m in rx.finditer(body))) for what, rx in NOTEBOOK_MARKS.items()}
    found = {what: hits for what, hits in found.items() if hits}
    assert not found, f"{lesson.name}: {found}"


def test_the_notebook_check_catches_what_it_should():
    for line in ("fixed in 3f9c2ab", "see scripts/repredict.py", "the run of 19:38 UTC", "recorded on 2026-11-23",
                 "in round four", "until the model counted wavefronts", "floor,, the"):
        assert any(rx.search(line) for rx in NOTEBOOK_MARKS.values()), line
    for line in ("0.75x cuBLAS at N = 3072 on an H100", "a 1024 x 1024 tile", "128 KiB of shared memory",
                 "a deadbeef value", "N = 2048"):
        assert not any(rx.search(line) for rx in NOTEBOOK_MARKS.values()), line


@pytest.mark.parametrize("lab", LONG_LESSONS)
def test_long_lessons_are_short_and_put_the_model_behind_an_expander(lab):
    sections = text.split_sections((ROOT / "content" / "labs" / f"{lab}.md").read_text())
    assert BEHIND in sections, f"{lab}.md has no '{BEHIND}' section"
    # the lesson proper: every section but the one behind the expander and those the page shows beside a chart
    lesson = [body for title, body in sections.items() if title != BEHIND and not title.startswith(("Near", "Why"))]
    assert sum(map(words, lesson)) < 900, f"{lab}.md: {sum(map(words, lesson))} words before '{BEHIND}'"
    assert words(sections[BEHIND]) < 700, f"{lab}.md: '{BEHIND}' runs {words(sections[BEHIND])} words"

    at = open_page(f"pages/{lab}.py")
    assert not at.exception, [e.value for e in at.exception]
    behind = [e for e in at.expander if e.label == BEHIND]
    assert len(behind) == 1, [e.label for e in at.expander]
    assert behind[0].proto.expanded is False, "'Behind the model' is shown open"
    shown = " ".join(m.value for m in at.markdown)
    assert "{{" not in shown, "a placeholder was left unfilled"
    assert words(" ".join(m.value for m in behind[0].markdown)) > 100  # the section's text is inside it
