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


# --- visitor-controlled text ------------------------------------------------------------------------
# the marks that can open a Markdown construct anywhere in a line (links, images, emphasis, code, HTML,
# entities, tables, strikethrough, Streamlit's :directives: and $math$, autolinked www. / e-mail / URLs);
# '-', '+' and '=' open one only at the start of a line (lists, rules, headings)
_ANYWHERE = re.compile(r"([\\`*_{}\[\]()!<>#|~$:@&.])")
_AT_START = re.compile(r"^([-+=])")
# Some constructs are found in the text after the escapes are resolved: GFM's web and e-mail addresses
# (https://..., www...., a@b.c) and Streamlit's :material/icons:. An invisible word joiner (U+2060) after
# every ':' that is not followed by a space, after 'www' and after '@' keeps them text.
_ADDRESS = re.compile(r"(?i)(:)(?=\S)|(www)(?=\.)|(@)")
_JOINER = "\u2060"


def plain(value, limit: int = 200) -> str:
    """Any value a visitor controls (a query parameter, a field of an uploaded file, a name, a line the
    learner's code printed) as text for a Markdown context: st.markdown, st.caption, st.warning, st.error.

    Markdown (and Streamlit's additions to it: :red[colour], :material/icons:, $LaTeX$, autolinked
    https://... and www. addresses) would turn `[log in](https://evil.example)` into a link and
    `![x](http://host/x.png)` into a request the visitor's browser makes. Here every ASCII punctuation mark
    that can open a construct is backslash-escaped (Markdown shows it as the mark itself); line breaks and
    control characters become spaces (no headings, lists or tables); the text is cut to `limit` characters.
    """
    if isinstance(value, str):
        s = value
    else:
        try:
            s = str(value)
        except ValueError:  # an int of more than 4300 digits
            s = "(a number too large to show)"
    s = " ".join("".join(ch if ch.isprintable() else " " for ch in s[:limit * 4]).split())
    if len(s) > limit:
        s = s[:limit - 1] + "…"
    s = _ADDRESS.sub(lambda m: m.group(0) + _JOINER, s)
    return _AT_START.sub(r"\\\1", _ANYWHERE.sub(r"\\\1", s))
