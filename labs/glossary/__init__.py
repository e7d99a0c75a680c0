"""The glossary: one Markdown file per term, cross-linked, each number traced to its source.

Entries live in content/glossary/<slug>.md, each a YAML front matter block (title, aliases, section,
related, labs) and a Markdown body whose [[links]] point at other entries and whose {{placeholders}}
quote numbers from the tables in the code, never typed by hand:

- entries.py   parse an entry (PyYAML front matter), load them all, search, backlinks, links to the labs;
- facts.py     per-SM architecture facts, vendor figures, latencies, and the placeholders that quote them;
- diagrams.py  the data behind the page's two diagrams (thread hierarchy, memory hierarchy);
- checks.py    what the tests check in the words: numbers quoted beside a GPU's name, coverage of terms;
- routes.py    Home's reading routes ("What to read next").

Nothing here imports streamlit or plotly: the page draws what these functions return.
"""

from __future__ import annotations

from labs.engine.gpu import datasheet_for  # noqa: F401  (the tests name a recorded GPU's row through here)
from labs.glossary.checks import (allowed_values, covering_entry, drifted_numbers, name_key,  # noqa: F401
                                  names_index, quoted_gpu_numbers, recorded_lab_values, untraced_lesson_numbers)
from labs.glossary.diagrams import DIAGRAMS, diagram_for, human_bytes, memory_hierarchy, thread_hierarchy  # noqa: F401
from labs.glossary.entries import (GLOSSARY_DIR, LABS, PAGE_URL, PAGES_DIR, SECTION_BY_SLUG, SECTIONS,  # noqa: F401
                                   Entry, Glossary, GlossaryError, Section, lab_pages, link_markdown, load,
                                   parse_entry, parse_front_matter, term_link)
from labs.glossary.facts import (ARCH, FACTS, L2_OVER_HBM, LATENCY_CYCLES, LATENCY_SOURCE, ArchFacts,  # noqa: F401
                                 Fact, arch_for, boost_clock_ghz, render_numbers, resolve)
from labs.glossary.routes import reading_routes, ready_steps, step_targets  # noqa: F401
