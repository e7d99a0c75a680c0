"""Words from content/: read Markdown, fill {{placeholders}}, turn [[glossary links]] into page links."""

from __future__ import annotations

import functools
import re
from pathlib import Path

CONTENT = Path(__file__).resolve().parent.parent / "content"
_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z0-9_ .]+?)\s*\}\}")
_LINK = re.compile(r"\[\[([a-z0-9-]+)(?:\|([^\]]+))?\]\]")


@functools.lru_cache(maxsize=64)
def read(relative: str) -> str:
    """The text of content/<relative>, or '' if there is none."""
    path = CONTENT / relative
    return path.read_text() if path.exists() else ""


def fill(text: str, numbers: dict) -> str:
    """Replace {{name}} by numbers[name]; unknown names stay visible as '{{name}}' (a bug to notice)."""
    return _PLACEHOLDER.sub(lambda m: str(numbers.get(m.group(1), m.group(0))), text)


def link_terms(text: str) -> str:
    """[[warp]] -> [warp](glossary?term=warp); [[warp|warps]] -> [warps](glossary?term=warp)."""
    return _LINK.sub(lambda m: f"[{m.group(2) or m.group(1).replace('-', ' ')}](glossary?term={m.group(1)})", text)


def split_sections(text: str) -> dict:
    """Split Markdown by '## ' headings: {'': preamble, 'Heading': body, ...}."""
    sections, current, lines = {}, "", []
    for line in text.splitlines():
        if line.startswith("## "):
            sections[current] = "\n".join(lines).strip()
            current, lines = line[3:].strip(), []
        else:
            lines.append(line)
    sections[current] = "\n".join(lines).strip()
    return sections


def lesson(lab_name: str, numbers: dict) -> str:
    return link_terms(fill(read(f"labs/{lab_name}.md"), numbers))
