"""Reading routes: Home's "What to read next", one ordered route per kind of user."""

from __future__ import annotations

import re
from pathlib import Path

from labs.glossary.entries import _LINK, PAGES_DIR

_STEP = re.compile(r"^\s*\d+\.\s+(.*)$")
_PAGE_LINK = re.compile(r"\[([^\]]+)\]\(([a-z0-9_]+)(?:\?[^)]*)?\)")


def reading_routes(markdown: str) -> tuple[str, list[tuple[str, list[str]]]]:
    """('intro', [(route title, [step, ...]), ...]) from a section whose '### ' headings are routes and
    whose numbered list items are the steps, in order."""
    intro, routes = [], []
    for line in markdown.splitlines():
        if line.startswith("### "):
            routes.append((line[4:].strip(), []))
        elif routes and _STEP.match(line):
            routes[-1][1].append(_STEP.match(line).group(1).strip())
        elif not routes and line.strip():
            intro.append(line.strip())
    return " ".join(intro), routes


def step_targets(step: str) -> tuple[list[str], list[str]]:
    """(app pages linked as [words](page), glossary slugs linked as [[slug]]) in one step of a route."""
    pages = [m.group(2) for m in _PAGE_LINK.finditer(step)]
    return pages, [m.group(1) for m in _LINK.finditer(step)]


def ready_steps(steps: list[str], pages_dir: Path = PAGES_DIR) -> list[str]:
    """The steps whose linked pages all exist: a route may name a lab whose page is still being built,
    and a learner should never follow a link to a page that is not there."""
    special = {"glossary"}  # pages served under another file name or url
    return [step for step in steps
            if all(page in special or (pages_dir / f"{page}.py").exists() for page in step_targets(step)[0])]
