"""Entries: one Markdown file per term under content/glossary/, its YAML front matter, links and search.

    ---
    title: Warp
    aliases: [warps, SIMT group]
    section: programming-model
    related: [thread, warp-scheduler, warp-divergence]
    labs: [divergence]
    ---
    Body in Markdown. [[thread]] or [[thread-block|a block]] links another entry;
    {{H100 SXM.sm_count}} quotes a number (labs/glossary/facts.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from labs.glossary.facts import render_numbers

ROOT = Path(__file__).resolve().parents[2]  # the repository
GLOSSARY_DIR = ROOT / "content" / "glossary"
PAGES_DIR = ROOT / "pages"
PAGE_URL = "glossary"  # the glossary page's url_path in app.py: links are "glossary?term=<slug>"


class GlossaryError(ValueError):
    """A malformed entry file, with the file and the problem."""


# --------------------------------------------------------------------------------------------
# Sections and labs
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Section:
    slug: str
    title: str
    blurb: str


SECTIONS: tuple[Section, ...] = (
    Section("device-hardware", "Device hardware", "What is on the chip: SMs, cores, caches, memory."),
    Section("programming-model", "Programming model", "How CUDA names the work and the memory it runs on."),
    Section("host-software", "Host software and tools", "Compilers, libraries, runtimes and profilers."),
    Section("performance", "Performance", "Why a kernel runs at the speed it does."),
    Section("numerics", "Numerics", "Number formats, and what precision costs and buys."),
    Section("techniques", "Techniques", "Ways to move fewer bytes or do fewer launches."),
    Section("operations", "Operations", "The kernels deep learning spends its time in."),
    Section("llm-workloads", "LLM workloads", "Serving and training language models on GPUs."),
    Section("multi-gpu", "Beyond one GPU", "Links, networks and ways to split work over many GPUs."),
)
SECTION_BY_SLUG = {s.slug: s for s in SECTIONS}

# The labs an entry can point at ("try it live"); the page shows a link when pages/<lab>.py exists.
LABS: dict[str, str] = {
    "roofline": "Roofline",
    "coalescing": "Coalescing",
    "matmul": "Matmul: tiles, waves and alignment",
    "matmul_ladder": "Matmul ladder: naive, tiled, Triton, cuBLAS",
    "hopper": "Hopper matmul anatomy",
    "hierarchy": "Memory hierarchy",
    "precision": "Lower precision",
    "divergence": "Warp divergence",
    "fusion": "Kernel fusion",
    "launch": "Launch overhead",
    "recompute": "Recomputation",
    "attention": "FlashAttention",
    "inference": "Inference: prefill vs decode",
    "transfers": "Host transfers: PCIe",
    "collectives": "Collectives and parallelism",
    "trainmem": "Training memory",
}


_LINK = re.compile(r"\[\[([a-z0-9-]+)(?:\|([^\]]+))?\]\]")


# --------------------------------------------------------------------------------------------
# Entries
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    slug: str
    title: str
    aliases: tuple
    section: str
    related: tuple
    labs: tuple
    body: str  # Markdown as written, with [[links]] and {{placeholders}}
    text: str  # body with numbers filled and links replaced by their words: what a reader reads
    sources: tuple  # where the numbers came from
    missing: tuple  # placeholders that named nothing (a test fails on them)
    links: tuple  # slugs linked from the body, in order of first appearance
    path: str = ""
    _search: str = field(default="", repr=False, compare=False)

    @property
    def words(self) -> int:
        return len(_WORD.findall(self.text))


_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'’./+-]*")

def parse_front_matter(raw: str, where: str = "") -> tuple[dict, str]:
    """Split the '---' YAML front matter from the body: ({key: str | list}, body)."""
    lines = raw.splitlines()
    if not lines or lines[0].strip() != "---":
        raise GlossaryError(f"{where}: the file must start with a '---' front matter line")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise GlossaryError(f"{where}: the front matter has no closing '---' line") from None
    try:
        meta = yaml.safe_load("\n".join(lines[1:end])) or {}
    except yaml.YAMLError as exc:
        raise GlossaryError(f"{where}: the front matter is not valid YAML: {exc}") from None
    if not isinstance(meta, dict):
        raise GlossaryError(f"{where}: the front matter must be 'key: value' lines, got {meta!r}")
    return meta, "\n".join(lines[end + 1:]).strip() + "\n"

def _as_tuple(meta: dict, key: str) -> tuple:
    value = meta.get(key, [])
    return tuple(value) if isinstance(value, list) else ((value,) if value else ())


def _plain(body: str) -> str:
    """Links replaced by their words, Markdown marks dropped: the words a reader sees."""
    text = _LINK.sub(lambda m: m.group(2) or m.group(1).replace("-", " "), body)
    text = re.sub(r"[*_`#>|]", " ", text)
    return text


def parse_entry(path: Path) -> Entry:
    raw = path.read_text(encoding="utf-8")
    meta, body = parse_front_matter(raw, str(path))
    filled, sources, missing = render_numbers(body)
    links = []
    for m in _LINK.finditer(body):
        if m.group(1) not in links:
            links.append(m.group(1))
    title = meta.get("title") or path.stem
    aliases = _as_tuple(meta, "aliases")
    text = _plain(filled)
    search = " \n".join([path.stem.replace("-", " "), title, " ".join(aliases), text]).lower()
    return Entry(slug=path.stem, title=title, aliases=aliases, section=meta.get("section", ""),
                 related=_as_tuple(meta, "related"), labs=_as_tuple(meta, "labs"), body=body, text=text,
                 sources=tuple(sources), missing=tuple(missing), links=tuple(links), path=str(path),
                 _search=search)


@dataclass(frozen=True)
class Glossary:
    entries: dict  # slug -> Entry, sorted by title
    backlinks: dict  # slug -> tuple of slugs whose bodies link to it

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, slug: str) -> bool:
        return slug in self.entries

    def get(self, slug: str) -> Optional[Entry]:
        return self.entries.get(slug)

    def in_section(self, section: str) -> list[Entry]:
        return [e for e in self.entries.values() if e.section == section]

    def sections(self) -> list[tuple[Section, list[Entry]]]:
        """Each known section with its entries (an empty section is a bug a test catches)."""
        return [(s, self.in_section(s.slug)) for s in SECTIONS]

    def dangling(self) -> list[tuple[str, str, str]]:
        """(entry, kind, target) for every link, related term, lab or section that resolves to nothing."""
        bad = []
        for e in self.entries.values():
            bad += [(e.slug, "link", t) for t in e.links if t not in self.entries]
            bad += [(e.slug, "related", t) for t in e.related if t not in self.entries or t == e.slug]
            bad += [(e.slug, "lab", t) for t in e.labs if t not in LABS]
            bad += [(e.slug, "placeholder", t) for t in e.missing]
            if e.section not in SECTION_BY_SLUG:
                bad.append((e.slug, "section", e.section))
        return bad

    def related(self, slug: str) -> list[Entry]:
        e = self.entries.get(slug)
        return [self.entries[r] for r in e.related if r in self.entries] if e else []

    def mentioned_in(self, slug: str) -> list[Entry]:
        return [self.entries[s] for s in self.backlinks.get(slug, ())]

    def search(self, query: str, section: Optional[str] = None) -> list[Entry]:
        """Entries matching every word of the query (title, aliases, slug, text), best first."""
        pool = [e for e in self.entries.values() if section in (None, "", e.section)]
        words = [w for w in re.split(r"\s+", query.lower().strip()) if w]
        if not words:
            return pool
        q = " ".join(words)
        scored = []
        for e in pool:
            title, slug_words = e.title.lower(), e.slug.replace("-", " ")
            aliases = [a.lower() for a in e.aliases]
            if not all(w in e._search for w in words):
                continue
            score = 0.0
            if q in (title, slug_words, e.slug) or q in aliases:
                score += 1000
            elif title.startswith(q) or any(a.startswith(q) for a in aliases):
                score += 500
            elif q in title or any(q in a for a in aliases):
                score += 200
            for w in words:
                if w in title or w in slug_words:
                    score += 50
                elif any(w in a for a in aliases):
                    score += 30
                score += min(e._search.count(w), 10)
            scored.append((-score, e.title.lower(), e))
        return [e for *_, e in sorted(scored, key=lambda t: (t[0], t[1]))]

    def render(self, slug: str, url: str = PAGE_URL) -> str:
        """The entry's Markdown for display: numbers filled, [[links]] as links to `url?term=<slug>`."""
        e = self.entries[slug]
        filled, _, _ = render_numbers(e.body)
        return link_markdown(filled, url, known=self.entries)


def link_markdown(text: str, url: str = PAGE_URL, known: Optional[dict] = None) -> str:
    """[[warp]] -> [warp](glossary?term=warp); [[warp|warps]] -> [warps](glossary?term=warp).

    A link to an unknown slug stays plain text with a visible mark (tests fail on it first)."""
    def sub(m: re.Match) -> str:
        slug, words = m.group(1), m.group(2) or m.group(1).replace("-", " ")
        if known is not None and slug not in known:
            return f"{words} (missing entry: {slug})"
        return f"[{words}]({url}?term={slug})"

    return _LINK.sub(sub, text)


def term_link(slug: str, text: Optional[str] = None, url: str = PAGE_URL) -> str:
    """A Markdown link to one entry, for lab pages: term_link("warp") -> "[warp](glossary?term=warp)"."""
    return f"[{text or slug.replace('-', ' ')}]({url}?term={slug})"


_CACHE: dict = {}


def load(directory: Optional[Path] = None) -> Glossary:
    """Every entry under content/glossary/, re-read when a file changes (a teacher's edit shows at once)."""
    directory = Path(directory or GLOSSARY_DIR)
    files = sorted(directory.glob("*.md"))
    signature = tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in files)
    cached = _CACHE.get(directory)
    if cached and cached[0] == signature:
        return cached[1]
    entries = sorted((parse_entry(p) for p in files), key=lambda e: e.title.lower())
    by_slug = {e.slug: e for e in entries}
    back: dict = {}
    for e in entries:
        for target in e.links:
            if target != e.slug:
                back.setdefault(target, []).append(e.slug)
    backlinks = {k: tuple(sorted(v, key=lambda s: by_slug[s].title.lower())) for k, v in back.items()}
    glossary = Glossary(by_slug, backlinks)
    _CACHE[directory] = (signature, glossary)
    return glossary


def lab_pages(entry: Entry, pages_dir: Path = PAGES_DIR) -> list[tuple[str, str, Path]]:
    """(lab slug, lab title, page path) for each lab of the entry whose page exists."""
    out = []
    for lab in entry.labs:
        page = pages_dir / f"{lab}.py"
        if lab in LABS and page.exists():
            out.append((lab, LABS[lab], page))
    return out

