"""Checks the tests run over the words: numbers quoted beside a GPU's name (in entries and lessons) that trace
to no table or recording, and which entry covers a term named elsewhere (another glossary's titles)."""

from __future__ import annotations

import json
import re
from typing import Optional

from labs.engine.gpu import RECORDED_DIR, datasheet_for
from labs.glossary.entries import Glossary, _plain
from labs.glossary.facts import _DATASHEET, _fmt_measured, _recorded

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
        if unit == "MB":  # the vendor's "MB" of L2 are MiB: the table's 4.2 MB (10^6 bytes) is the T4's "4 MB"
            values.add(float(round(sheet.l2_mb * 1e6 / 2**20)))
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

