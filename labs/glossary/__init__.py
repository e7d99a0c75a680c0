"""The glossary: one Markdown file per term, cross-linked, each number traced to its source.

Entries live in content/glossary/<slug>.md. Each starts with a small front matter block (no YAML
library: the parser below reads `key: value` and `key: [a, b, c]` lines):

    ---
    title: Warp
    aliases: [warps, SIMT group]
    section: programming-model
    related: [thread, warp-scheduler, warp-divergence]
    labs: [divergence]
    ---
    Body in Markdown. [[thread]] or [[thread-block|a block]] links another entry;
    {{H100 SXM.sm_count}} quotes a number from the datasheet table in labs/gpu.py.

Numbers are never typed into an entry when a table in the code already holds them. Five kinds of
placeholder, each rendered with the source it came from:
- `{{<datasheet row>.<field>}}`: labs.engine.gpu.DATASHEET ("H100 SXM", "H200", "A100 80GB", ...), plus a few
  derived fields (`ridge_fp32`, `ridge_bf16`, `bf16_over_fp32`, `clock_ghz`, ...);
- `{{<architecture>.<field>}}`: per-SM facts of an architecture (ARCH below: "Hopper", "Ampere",
  "Ada Lovelace"), chosen for a datasheet row by its compute capability;
- `{{<fact>}}`: other vendor figures (interconnects, memory granularity), FACTS below;
- `{{latency.<level>}}`: approximate load-to-use latencies in cycles from published microbenchmarks;
- `{{recorded:<gpu key>.<field>}}`: a calibration this app recorded on a real GPU
  (content/recorded/<gpu key>/ceilings.json), e.g. `{{recorded:nvidia-h200.copy_tbps}}`.

The module also gives the page everything it needs without streamlit or plotly: search, sections,
backlinks, links to the labs, and the data behind the two diagrams (the thread hierarchy mapped onto
the hardware, and the memory hierarchy with sizes, latencies and bandwidths). The tests use it to check
numbers quoted in entries and lessons against the tables and the recordings, the coverage of another
glossary's titles, and Home's reading routes ("What to read next").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Optional

from labs.engine.gpu import DATASHEET, RECORDED_DIR, Datasheet, datasheet_for

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


# --------------------------------------------------------------------------------------------
# Facts that are not in the datasheet table
# --------------------------------------------------------------------------------------------
_HOPPER_SRC = ("NVIDIA H100 Tensor Core GPU Architecture whitepaper and the CUDA C++ Programming Guide "
               "(compute capability 9.0)")
_AMPERE_SRC = ("NVIDIA A100 Tensor Core GPU Architecture whitepaper and the CUDA C++ Programming Guide "
               "(compute capability 8.0)")
_ADA_SRC = ("NVIDIA Ada GPU Architecture whitepaper and the CUDA C++ Programming Guide "
            "(compute capability 8.9)")


@dataclass(frozen=True)
class ArchFacts:
    """Per-SM figures of one architecture (the same for every product built on it)."""

    name: str
    sub_partitions_per_sm: int  # processing blocks, each with its own warp scheduler
    fp32_lanes_per_sm: int  # "CUDA cores" doing FP32 FMA
    tensor_cores_per_sm: int
    sfus_per_sm: int
    ld_st_units_per_sm: int
    registers_per_sm: int  # 32-bit registers
    max_registers_per_thread: int
    l1_shared_per_sm_kb: int  # one SRAM, split between L1 and shared memory
    max_shared_per_sm_kb: int
    max_shared_per_block_kb: int
    max_threads_per_sm: int
    max_warps_per_sm: int
    max_blocks_per_sm: int
    max_threads_per_block: int
    warp_size: int
    full_chip: str  # die name
    full_chip_gpcs: int
    full_chip_tpcs: int
    full_chip_sms: int
    sms_per_tpc: int
    max_cluster_blocks: int  # thread block cluster size guaranteed portable (0: no clusters)
    source: str

    @property
    def register_file_kb(self) -> int:
        return self.registers_per_sm * 4 // 1024

    @property
    def warps_per_sub_partition(self) -> int:
        return self.max_warps_per_sm // self.sub_partitions_per_sm

    @property
    def lanes_per_sub_partition(self) -> int:
        return self.fp32_lanes_per_sm // self.sub_partitions_per_sm


ARCH: dict[str, ArchFacts] = {
    "Hopper": ArchFacts("Hopper", 4, 128, 4, 16, 32, 65536, 255, 256, 228, 227, 2048, 64, 32, 1024, 32,
                        "GH100", 8, 72, 144, 2, 8, _HOPPER_SRC),
    "Ampere": ArchFacts("Ampere", 4, 64, 4, 16, 32, 65536, 255, 192, 164, 163, 2048, 64, 32, 1024, 32,
                        "GA100", 8, 64, 128, 2, 0, _AMPERE_SRC),
    "Ada Lovelace": ArchFacts("Ada Lovelace", 4, 128, 4, 16, 16, 65536, 255, 128, 100, 99, 1536, 48, 24, 1024, 32,
                              "AD102", 12, 72, 144, 2, 0, _ADA_SRC),
}


@dataclass(frozen=True)
class Fact:
    value: float
    unit: str
    source: str


_TMEM_SRC = "NVIDIA PTX ISA, Tensor Memory and the tcgen05 instructions (sm_100a, Blackwell)"
_PCIE_SRC = "PCI-SIG PCI Express base specifications (x16 link, after encoding)"
_NVLINK_SRC = "NVIDIA H100, H200 and A100 datasheets (NVLink bandwidth per GPU, both directions together)"
FACTS: dict[str, Fact] = {
    "nvlink4_gbps": Fact(900, "GB/s", _NVLINK_SRC),  # H100 SXM and H200 SXM
    "nvlink4_links": Fact(18, "links", "NVIDIA Hopper architecture whitepaper"),
    "nvlink3_gbps": Fact(600, "GB/s", _NVLINK_SRC),  # A100 SXM
    "nvlink3_links": Fact(12, "links", "NVIDIA A100 architecture whitepaper"),
    "pcie5_x16_gbps": Fact(64, "GB/s per direction", _PCIE_SRC),
    "pcie4_x16_gbps": Fact(32, "GB/s per direction", _PCIE_SRC),
    "infiniband_ndr_gbitps": Fact(400, "Gbit/s per port",
                                  "NVIDIA ConnectX-7 / Quantum-2 NDR InfiniBand product briefs"),
    "nvlink_switch_max_gpus": Fact(256, "GPUs", "NVIDIA NVLink Switch System (DGX H100 SuperPOD) documentation"),
    "dgx_h100_gpus": Fact(8, "GPUs", "NVIDIA DGX H100 system datasheet"),
    "dgx_h100_nvswitches": Fact(4, "NVSwitch chips", "NVIDIA DGX H100 system datasheet"),
    "sector_bytes": Fact(32, "bytes", "CUDA C++ Best Practices Guide (global memory accesses)"),
    "cache_line_bytes": Fact(128, "bytes", "CUDA C++ Best Practices Guide (global memory accesses)"),
    "smem_banks": Fact(32, "banks", "CUDA C++ Programming Guide (shared memory, compute capability 5.x and later)"),
    "smem_bank_bytes": Fact(4, "bytes", "CUDA C++ Programming Guide (shared memory, compute capability 5.x and later)"),
    # Blackwell's tensor memory (sm_100): 128 lanes x 512 columns of 32-bit cells per SM
    "tmem_lanes": Fact(128, "lanes", _TMEM_SRC),
    "tmem_columns": Fact(512, "columns of 32 bits", _TMEM_SRC),
    "tmem_alloc_columns": Fact(32, "columns (smallest allocation)", _TMEM_SRC),
    "tmem_per_sm_kb": Fact(256, "KB per SM (128 x 512 x 4 bytes)", _TMEM_SRC),
}


# --------------------------------------------------------------------------------------------
# Placeholders: {{...}} -> (text, source)
# --------------------------------------------------------------------------------------------
_PLACEHOLDER = re.compile(r"\{\{\s*([^{}]+?)\s*\}\}")
_LINK = re.compile(r"\[\[([a-z0-9-]+)(?:\|([^\]]+))?\]\]")
_DATASHEET = {row.name: row for row in DATASHEET}
# Per-SM facts are keyed by compute capability, not family name: A100 (8.0) and A10G (8.6) are both
# "Ampere" but their SMs differ (64 against 128 FP32 lanes), and 8.6 has no facts here.
_ARCH_OF = {"9.0": "Hopper", "8.0": "Ampere", "8.9": "Ada Lovelace"}


def _fmt(x) -> str:
    """Numbers as a person writes them: 132, 3.35, 989.4, 1.555 (no trailing zeros)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    if float(x).is_integer():
        return f"{int(x):,d}" if abs(x) >= 10000 else f"{int(x):d}"
    return f"{x:g}"


def _fmt_measured(x: float) -> str:
    """A measured rate to three significant figures (686, 64.7, 4.24)."""
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def arch_for(sheet: Datasheet) -> Optional[ArchFacts]:
    return ARCH.get(_ARCH_OF.get(sheet.compute_capability, ""))


def boost_clock_ghz(sheet: Datasheet) -> Optional[float]:
    """The clock implied by the FP32 rate: TFLOP/s = SMs x FP32 lanes x 2 FLOP x GHz / 1000."""
    arch = arch_for(sheet)
    if arch is None:
        return None
    return sheet.fp32_tflops * 1e3 / (sheet.sm_count * arch.fp32_lanes_per_sm * 2)


def _derived(sheet: Datasheet) -> dict:
    d = {
        "ridge_fp32": round(sheet.fp32_tflops / sheet.bandwidth_tbps),
        "ridge_bf16": round(sheet.bf16_tflops / sheet.bandwidth_tbps) if sheet.bf16_tflops else None,
        "ridge_fp8": round(sheet.fp8_tflops / sheet.bandwidth_tbps) if sheet.fp8_tflops else None,
        "bf16_over_fp32": round(sheet.bf16_tflops / sheet.fp32_tflops) if sheet.bf16_tflops else None,
        "fp8_over_bf16": round(sheet.fp8_tflops / sheet.bf16_tflops) if sheet.fp8_tflops and sheet.bf16_tflops
        else None,
        "bf16_sparse_tflops": round(2 * sheet.bf16_tflops, 1) if sheet.bf16_tflops else None,
        "memory_read_ms": round(sheet.memory_gb / (sheet.bandwidth_tbps * 1e3) * 1e3, 1),
    }
    clock = boost_clock_ghz(sheet)
    if clock:
        d["clock_ghz"] = round(clock, 2)
        arch = arch_for(sheet)
        d["fp32_lanes"] = sheet.sm_count * arch.fp32_lanes_per_sm
        d["tensor_cores"] = sheet.sm_count * arch.tensor_cores_per_sm
        d["max_resident_threads"] = sheet.sm_count * arch.max_threads_per_sm
        d["max_resident_warps"] = sheet.sm_count * arch.max_warps_per_sm
    return d


def _recorded(key: str) -> Optional[dict]:
    path = RECORDED_DIR / key / "ceilings.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def resolve(name: str) -> Optional[tuple[str, str]]:
    """A placeholder's (text, source), or None if it names nothing known."""
    if name.startswith("recorded:"):
        key, _, path = name[len("recorded:"):].partition(".")
        data = _recorded(key)
        if data is None or not path:
            return None
        value = data
        for part in path.split("."):
            if not isinstance(value, dict) or part not in value:
                return None
            value = value[part]
        if not isinstance(value, (int, float)):
            return None
        versions = data.get("versions", {})
        source = (f"recorded run of this app: calibration on an {data.get('gpu', key)}, "
                  f"{str(data.get('date', ''))[:10]}, torch {versions.get('torch', '?')}")
        return _fmt_measured(value), source
    head, dot, attr = name.rpartition(".")
    if dot and head in _DATASHEET:
        sheet = _DATASHEET[head]
        names = {f.name for f in fields(Datasheet)}
        if attr in names:
            value = getattr(sheet, attr)
        else:
            value = _derived(sheet).get(attr)
        if value is None:
            return None
        return _fmt(value), f"{sheet.name}: {sheet.source}" + (" (derived)" if attr not in names else "")
    if dot and head in ARCH:
        arch = ARCH[head]
        value = getattr(arch, attr, None)
        if value is None or attr == "source":
            return None
        return _fmt(value), f"{arch.name}: {arch.source}"
    if name in FACTS:
        fact = FACTS[name]
        return _fmt(fact.value), fact.source
    if name.startswith("latency.") and name[len("latency."):] in LATENCY_CYCLES:  # {{latency.hbm}}: cycles
        return _fmt(LATENCY_CYCLES[name[len("latency."):]]), LATENCY_SOURCE
    return None


def render_numbers(text: str) -> tuple[str, list[str], list[str]]:
    """Fill every {{placeholder}}: (text, sources used, unresolved names). Unresolved ones stay visible."""
    sources, missing = [], []

    def sub(m: re.Match) -> str:
        found = resolve(m.group(1))
        if found is None:
            missing.append(m.group(1))
            return m.group(0)
        if found[1] not in sources:
            sources.append(found[1])
        return found[0]

    return _PLACEHOLDER.sub(sub, text), sources, missing


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
    """Split '---' front matter from the body: ({key: str | list}, body)."""
    lines = raw.splitlines()
    if not lines or lines[0].strip() != "---":
        raise GlossaryError(f"{where}: the file must start with a '---' front matter line")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise GlossaryError(f"{where}: the front matter has no closing '---' line") from None
    meta: dict = {}
    for n, line in enumerate(lines[1:end], start=2):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, colon, value = line.partition(":")
        if not colon or not key.strip().isidentifier():
            raise GlossaryError(f"{where}:{n}: expected 'key: value', got {line!r}")
        value = value.strip()
        if value.startswith("["):
            if not value.endswith("]"):
                raise GlossaryError(f"{where}:{n}: a list must close on the same line: {line!r}")
            items = [_unquote(v) for v in value[1:-1].split(",")]
            meta[key.strip()] = [v for v in items if v]
        else:
            meta[key.strip()] = _unquote(value)
    return meta, "\n".join(lines[end + 1:]).strip() + "\n"


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


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


# --------------------------------------------------------------------------------------------
# Numbers quoted next to a GPU's name, checked against the tables (used by the tests)
# --------------------------------------------------------------------------------------------
_GPU_NAMES = {  # how entries name a GPU -> datasheet rows the numbers may come from
    r"\bH100 PCIe\b": ("H100 PCIe",),
    r"\bH100\b(?! PCIe)": ("H100 SXM",),
    r"\bH200\b": ("H200",),
    r"\bA100\b": ("A100 40GB", "A100 80GB"),
    r"\bL4\b": ("L4",),
    r"\bL40S\b": ("L40S",),
    r"\bT4\b": ("T4",),
    r"\bA10G\b": ("A10G",),
    r"\bRTX 4090\b": ("RTX 4090",),
    r"\bB200\b": ("B200",),
}


def _discover_recordings() -> dict:
    """Datasheet row name -> recording folder, for every GPU with a committed calibration."""
    found = {}
    for path in sorted(RECORDED_DIR.glob("*/ceilings.json")):
        sheet = datasheet_for(str((_recorded(path.parent.name) or {}).get("gpu", "")))
        if sheet:
            found.setdefault(sheet.name, path.parent.name)
    return found


_GPU_RECORDINGS = {"H200": "nvidia-h200", **_discover_recordings()}
# The look-behind keeps digits inside names out: "A100 SMs" quotes no "100 SMs".
_QUOTED = re.compile(r"(?<![\w.])(\d[\d,]*(?:\.\d+)?)\s*(TB/s|TB/sec|TFLOP/s|TFLOPS|TFLOPs|TFLOP|GB|MB|SMs)(?![/\w])")
_UNIT_FIELDS = {"TB/s": ("bandwidth_tbps",), "TFLOP/s": ("fp32_tflops", "tf32_tflops", "fp16_tflops",
                                                         "bf16_tflops", "fp8_tflops"),
                "GB": ("memory_gb",), "MB": ("l2_mb",), "SMs": ("sm_count",)}


def _unit(u: str) -> str:
    return {"TB/sec": "TB/s", "TFLOPS": "TFLOP/s", "TFLOPs": "TFLOP/s", "TFLOP": "TFLOP/s"}.get(u, u)


def quoted_gpu_numbers(text: str) -> list[tuple[str, str, float, str]]:
    """(sentence, GPU rows named, value, unit) for each number with a datasheet unit in a sentence
    that names H100, H200 or A100."""
    out = []
    for sentence in re.split(r"(?<=[.!?])\s+|\n+", text):
        rows = [r for pattern, names in _GPU_NAMES.items() if re.search(pattern, sentence) for r in names]
        if not rows:
            continue
        for m in _QUOTED.finditer(sentence):
            out.append((sentence.strip(), ",".join(rows), float(m.group(1).replace(",", "")), _unit(m.group(2))))
    return out


def allowed_values(rows: list[str], unit: str) -> set:
    """The values a sentence naming these GPU rows may quote in this unit: datasheet and recorded runs."""
    values = set()
    for name in rows:
        sheet = _DATASHEET[name]
        for f in _UNIT_FIELDS.get(unit, ()):
            v = getattr(sheet, f)
            if v is not None:
                values.add(round(float(v), 3))
        rec = _recorded(_GPU_RECORDINGS.get(name, "")) if name in _GPU_RECORDINGS else None
        if rec:
            if unit == "TB/s":
                values.add(round(float(_fmt_measured(rec["copy_tbps"])), 3))
            if unit == "TFLOP/s":
                values.add(round(float(_fmt_measured(rec["fma_tflops"])), 3))
                values.update(round(float(_fmt_measured(v)), 3) for v in rec.get("matmul_tflops", {}).values())
    return values


def drifted_numbers(glossary: Glossary) -> list[str]:
    """Every number quoted beside a GPU's name that its datasheet row (or recorded run) does not hold."""
    bad = []
    for e in glossary.entries.values():
        for sentence, rows, value, unit in quoted_gpu_numbers(e.text):
            if round(value, 3) not in allowed_values(rows.split(","), unit):
                bad.append(f"{e.slug}: {value:g} {unit} beside {rows}: {sentence!r}")
    return bad



# Lessons quote what a lab measured on a real GPU ("about 610 TFLOP/s on an H200"). Such a number must be a
# datasheet figure, a recorded ceiling, or within the rounding of "about" (5 %) of a value in the lab's own
# recording on that GPU (its measured_ and predicted_ columns), so a re-recording that moves it is caught.
LESSON_TOLERANCE = 0.05
_UNIT_SUFFIX = {"TB/s": "_tbps", "TFLOP/s": "_tflops"}


def recorded_lab_values(gpu_key: str, lab: str, unit: str) -> list[float]:
    """The measured_ and predicted_ values in this unit of content/recorded/<gpu_key>/<lab>.json."""
    suffix = _UNIT_SUFFIX.get(unit)
    try:
        data = json.loads((RECORDED_DIR / gpu_key / f"{lab}.json").read_text())
    except (OSError, ValueError):
        return []
    if not suffix or not isinstance(data, dict):
        return []
    return [float(v) for row in data.get("rows", []) for k, v in row.items()
            if k.startswith(("measured_", "predicted_")) and k.endswith(suffix)
            and isinstance(v, (int, float)) and not isinstance(v, bool)]


def untraced_lesson_numbers(text: str, lab: Optional[str] = None) -> list[str]:
    """Numbers quoted beside a GPU's name in a lesson that trace neither to the tables nor to a recording."""
    bad = []
    for sentence, rows, value, unit in quoted_gpu_numbers(_plain(text)):
        names = rows.split(",")
        if round(value, 3) in allowed_values(names, unit):
            continue
        recorded = [v for n in names if n in _GPU_RECORDINGS and lab
                    for v in recorded_lab_values(_GPU_RECORDINGS[n], lab, unit)]
        if any(abs(v - value) <= LESSON_TOLERANCE * value for v in recorded):
            continue
        bad.append(f"{value:g} {unit} beside {rows}: {sentence!r}")
    return bad

# --------------------------------------------------------------------------------------------
# Diagram data (drawn by the page with plotly)
# --------------------------------------------------------------------------------------------
def thread_hierarchy(gpu: str = "H100 SXM") -> dict:
    """The CUDA thread hierarchy beside the hardware each level runs on, with this GPU's counts."""
    sheet = _DATASHEET[gpu]
    a = arch_for(sheet)
    if a is None:
        raise KeyError(f"no architecture facts for {gpu} ({sheet.arch}); known: {', '.join(ARCH)}")
    levels = [
        {"software": "Grid", "software_slug": "grid", "hardware": "GPU", "hardware_slug": "sm",
         "software_detail": "every block of one kernel launch",
         "hardware_detail": f"{sheet.sm_count} SMs, {_fmt(sheet.l2_mb)} MB L2, {_fmt(sheet.memory_gb)} GB "
                            f"{sheet.memory_type}",
         "rule": "blocks go to whichever SM has room, in no promised order"},
    ]
    if a.max_cluster_blocks:
        levels.append(
            {"software": "Cluster", "software_slug": "thread-block-cluster", "hardware": "GPC",
             "hardware_slug": "gpc",
             "software_detail": f"up to {a.max_cluster_blocks} blocks scheduled together (optional)",
             "hardware_detail": f"a group of SMs ({a.full_chip} has {a.full_chip_gpcs} GPCs)",
             "rule": "a cluster's blocks run at the same time on SMs of one GPC and can read each "
                     "other's shared memory"})
    levels += [
        {"software": "Block (CTA)", "software_slug": "thread-block", "hardware": "SM", "hardware_slug": "sm",
         "software_detail": f"up to {a.max_threads_per_block} threads sharing shared memory",
         "hardware_detail": f"{a.fp32_lanes_per_sm} FP32 lanes, {a.tensor_cores_per_sm} tensor cores, "
                            f"{a.l1_shared_per_sm_kb} KB L1/shared, {a.register_file_kb} KB registers",
         "rule": f"a block stays on one SM; up to {a.max_blocks_per_sm} blocks and "
                 f"{a.max_threads_per_sm} threads live on an SM at once"},
        {"software": "Warp", "software_slug": "warp", "hardware": "SM sub-partition",
         "hardware_slug": "warp-scheduler",
         "software_detail": f"{a.warp_size} consecutive threads of a block",
         "hardware_detail": f"1 of {a.sub_partitions_per_sm} per SM: a warp scheduler, "
                            f"{a.lanes_per_sub_partition} FP32 lanes, 1 tensor core, "
                            f"{a.register_file_kb // a.sub_partitions_per_sm} KB registers",
         "rule": f"a warp stays on one sub-partition; up to {a.warps_per_sub_partition} warps share it "
                 "and its scheduler issues one of them per clock"},
        {"software": "Thread", "software_slug": "thread", "hardware": "Lane", "hardware_slug": "cuda-core",
         "software_detail": f"its own registers (up to {a.max_registers_per_thread}) and program counter",
         "hardware_detail": "one slot of a 32-wide SIMT instruction (an FP32 unit, a CUDA core)",
         "rule": "thread i of a warp always runs in lane i"},
    ]
    return {"gpu": sheet.name, "arch": a.name, "levels": levels,
            "counts": {"sms": sheet.sm_count, "sub_partitions": sheet.sm_count * a.sub_partitions_per_sm,
                       "lanes": sheet.sm_count * a.fp32_lanes_per_sm,
                       "resident_threads": sheet.sm_count * a.max_threads_per_sm},
            "sources": [sheet.source, a.source]}


# Approximate load-to-use latencies on Hopper, from published microbenchmarks (rounded): they
# vary with clock, load and access pattern, and are here to show orders of magnitude.
LATENCY_SOURCE = ("approximate: microbenchmarks of Hopper (Luo et al., 'Benchmarking and Dissecting the Nvidia "
                "Hopper GPU Architecture', 2024), rounded")
LATENCY_CYCLES = {"registers": 1, "shared": 30, "l1": 40, "l2": 260, "hbm": 480, "pcie": 2000,
                   "fma": 4}  # a dependent FP32 FMA
L2_OVER_HBM = 2.5  # L2 serves roughly 2-3x the HBM bandwidth (microbenchmarks); an estimate


def memory_hierarchy(gpu: str = "H100 SXM") -> list[dict]:
    """Levels of the memory hierarchy, fastest first: size (per unit and whole GPU), latency, bandwidth.

    Bandwidths are whole-GPU aggregates. Registers and shared memory are computed from per-SM widths at
    the clock implied by the FP32 rate; L2 is an estimate; HBM is the datasheet figure."""
    sheet = _DATASHEET[gpu]
    a = arch_for(sheet)
    if a is None:
        raise KeyError(f"no architecture facts for {gpu} ({sheet.arch}); known: {', '.join(ARCH)}")
    ghz = boost_clock_ghz(sheet)
    sms = sheet.sm_count
    kb = 1024
    return [
        {"level": "Registers", "slug": "registers", "scope": "per thread (file per SM)",
         "unit_bytes": a.register_file_kb * kb, "total_bytes": sms * a.register_file_kb * kb,
         "latency_cycles": LATENCY_CYCLES["registers"],
         "bandwidth_tbps": sms * a.fp32_lanes_per_sm * 3 * 4 * ghz / 1e3,
         "note": "operands of one FMA per lane per clock; latency is part of the instruction",
         "sources": [a.source, "bandwidth: computed (3 operands x 4 bytes per lane per clock)"]},
        {"level": "L1 / shared memory", "slug": "shared-memory", "scope": "per SM (per block)",
         "unit_bytes": a.l1_shared_per_sm_kb * kb, "total_bytes": sms * a.l1_shared_per_sm_kb * kb,
         "latency_cycles": LATENCY_CYCLES["shared"],
         "bandwidth_tbps": sms * FACTS["smem_banks"].value * FACTS["smem_bank_bytes"].value * ghz / 1e3,
         "note": f"up to {a.max_shared_per_sm_kb} KB of it as shared memory; an L1 hit takes about "
                 f"{LATENCY_CYCLES['l1']} cycles",
         "sources": [a.source, "bandwidth: computed (32 banks x 4 bytes per SM per clock)", LATENCY_SOURCE]},
        {"level": "L2 cache", "slug": "l2-cache", "scope": "whole GPU",
         "unit_bytes": sheet.l2_mb * 1e6, "total_bytes": sheet.l2_mb * 1e6,
         "latency_cycles": LATENCY_CYCLES["l2"],
         "bandwidth_tbps": L2_OVER_HBM * sheet.bandwidth_tbps,
         "note": "bandwidth is an estimate (about 2-3x HBM in microbenchmarks)",
         "sources": [sheet.source, LATENCY_SOURCE]},
        {"level": f"{'HBM' if sheet.memory_type.startswith('HBM') else 'DRAM'} ({sheet.memory_type})", "slug": "hbm",
         "scope": "whole GPU (global memory)",
         "unit_bytes": sheet.memory_gb * 1e9, "total_bytes": sheet.memory_gb * 1e9,
         "latency_cycles": LATENCY_CYCLES["hbm"], "bandwidth_tbps": sheet.bandwidth_tbps,
         "note": "the datasheet bandwidth; a copy kernel reaches roughly 85-90 % of it",
         "sources": [sheet.source, LATENCY_SOURCE]},
        {"level": "Host memory over PCIe", "slug": "pcie", "scope": "the CPU's RAM",
         "unit_bytes": None, "total_bytes": None,
         "latency_cycles": LATENCY_CYCLES["pcie"],
         "bandwidth_tbps": FACTS["pcie5_x16_gbps"].value / 1e3 if a.name == "Hopper"
         else FACTS["pcie4_x16_gbps"].value / 1e3,
         "note": "one direction of a x16 link; latency of order a microsecond",
         "sources": [_PCIE_SRC]},
    ]


def human_bytes(n: float) -> str:
    """Bytes as datasheets write them: decimal MB and GB (34.6 MB, 80 GB); on-chip SRAM in KB of 1024."""
    if n < 1e6 and n % 1024 == 0:
        return f"{n / 1024:g} KB"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} bytes"


# Entries that show a diagram under their text.
DIAGRAMS = {
    "threads": ("thread", "warp", "thread-block", "grid", "thread-block-cluster", "sm", "gpc", "tpc",
                "warp-scheduler", "cuda-core", "simt", "kernel", "warpgroup", "thread-hierarchy",
                "cuda-programming-model", "launch-configuration", "core", "cuda-device-architecture"),
    "memory": ("memory-hierarchy", "registers", "register-file", "shared-memory", "l1-cache", "l2-cache", "hbm",
               "global-memory", "local-memory", "memory-bandwidth"),
}


def diagram_for(slug: str) -> Optional[str]:
    """'threads', 'memory' or None: which diagram belongs under this entry."""
    for name, slugs in DIAGRAMS.items():
        if slug in slugs:
            return name
    return None


# --------------------------------------------------------------------------------------------
# Coverage: which entry explains a term named elsewhere (another glossary's titles, a lesson's words)
# --------------------------------------------------------------------------------------------
def name_key(name: str) -> str:
    """A name reduced to compare with others: 'NVIDIA Nsight Systems' and 'Nsight systems' agree,
    'Load/Store Unit' and 'load-store unit' agree, 'CUDA (Device Architecture)' keeps its qualifier."""
    key = name.lower().replace("\u2019", "'")
    key = re.sub(r"^nvidia\s+", "", key)  # the vendor's prefix names nothing new
    key = re.sub(r"[()]", " ", key)
    key = re.sub(r"[-_/]", " ", key)
    return re.sub(r"\s+", " ", key).strip()


def names_index(glossary: Glossary) -> dict:
    """name key -> slug, for every entry's slug, title and aliases (a title wins over an alias)."""
    index: dict = {}
    for e in glossary.entries.values():
        for name in e.aliases:
            index.setdefault(name_key(name), e.slug)
    for e in glossary.entries.values():
        index[name_key(e.slug)] = e.slug
        index[name_key(e.title)] = e.slug
    return index


def covering_entry(glossary: Glossary, names: tuple, index: Optional[dict] = None) -> Optional[str]:
    """The slug of the entry whose slug, title or an alias is one of `names` (a term's title and its
    abbreviation), or None when no entry explains the term."""
    index = names_index(glossary) if index is None else index
    for name in names:
        slug = index.get(name_key(name))
        if slug:
            return slug
    return None


# --------------------------------------------------------------------------------------------
# Reading routes: Home's "What to read next", one ordered route per kind of user
# --------------------------------------------------------------------------------------------
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
