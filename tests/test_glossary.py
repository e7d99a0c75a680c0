"""The glossary: every entry well-formed and linked, every lab term covered, every number quoted beside
a GPU's name held against the datasheet table, the diagrams' data, search speed, and the page."""

import re
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from labs import all_labs, glossary
from labs.engine.gpu import datasheet_by_name

ROOT = Path(__file__).resolve().parent.parent
PAGE = str(ROOT / "pages" / "glossary.py")
G = glossary.load()


# ------------------------------------------------------------------------------------------------
# Content
# ------------------------------------------------------------------------------------------------
# Issue 20 brought the glossary to 121 entries; others add theirs on top, so the count is a floor, and
# the entries that issue added are named so that none can disappear unnoticed.
ENTRY_FLOOR = 121
ISSUE_20_ENTRIES = {
    "cuda-device-architecture", "sm-architecture", "core", "tensor-memory", "cuda-programming-model",
    "thread-hierarchy", "launch-configuration", "cuda-tile", "cuda-cpp", "gpu-driver", "cuda-binary-utilities",
    "performance-bottleneck", "arithmetic-bandwidth", "warp-execution-state", "sm-utilization",
    "pipe-utilization", "issue-efficiency", "scoreboard-stall",
}


def test_entry_count_and_no_empty_section():
    assert len(G) >= ENTRY_FLOOR, f"{len(G)} entries, fewer than {ENTRY_FLOOR}"
    assert ISSUE_20_ENTRIES <= set(G.entries), f"missing: {ISSUE_20_ENTRIES - set(G.entries)}"
    empty = [s.slug for s, entries in G.sections() if not entries]
    assert not empty, f"sections without entries: {empty}"


def test_every_link_related_term_lab_and_placeholder_resolves():
    assert G.dangling() == []


def test_every_entry_is_80_to_400_words():
    bad = {e.slug: e.words for e in G.entries.values() if not 80 <= e.words <= 400}
    assert not bad, f"entries outside 80-400 words: {bad}"


def test_front_matter_is_complete():
    for e in G.entries.values():
        assert e.title and e.section, e.slug
        assert e.related, f"{e.slug} names no related terms"
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", e.slug), f"file name {e.slug!r} is not a kebab-case slug"


def test_every_lab_term_has_an_entry_that_points_back_to_the_lab():
    labs = all_labs()
    assert labs, "no labs found"
    for lab in labs:
        assert lab.terms, f"lab {lab.name} names no glossary terms"
        missing = [t for t in lab.terms if t not in G]
        assert not missing, f"lab {lab.name} uses terms with no entry: {missing}"
        no_back = [t for t in lab.terms if lab.name not in G.get(t).labs]
        assert not no_back, f"entries {no_back} do not list lab {lab.name!r} under labs:"


def test_every_lab_is_known_to_the_glossary_with_its_title():
    for lab in all_labs():
        assert glossary.LABS.get(lab.name) == lab.title, f"glossary.LABS lacks {lab.name!r}: {lab.title!r}"


def test_every_entry_is_linked_from_somewhere():
    orphans = [s for s in G.entries if not G.backlinks.get(s)]
    assert not orphans, f"no entry links to {orphans}"


def test_backlinks_are_exactly_the_links_in_the_bodies():
    expected = {}
    for e in G.entries.values():
        for target in set(re.findall(r"\[\[([a-z0-9-]+)", e.body)) - {e.slug}:
            expected.setdefault(target, set()).add(e.slug)
    assert {k: set(v) for k, v in G.backlinks.items()} == expected
    assert "thread" in {e.slug for e in G.mentioned_in("warp")}  # thread.md links [[warp]]


# ------------------------------------------------------------------------------------------------
# Numbers: the datasheet table, and the entries against it
# ------------------------------------------------------------------------------------------------
# Vendor figures, typed from the datasheets (dense tensor rates = half the "with sparsity" figures):
# the datasheet table in labs/gpu.py must agree with them, and the entries must agree with the table.
VENDOR = {
    "H100 SXM": dict(sm_count=132, l2_mb=50, memory_gb=80, bandwidth_tbps=3.35, fp32_tflops=67,
                     tf32_tflops=494.7, bf16_tflops=989.4, fp16_tflops=989.4, fp8_tflops=1978.9),
    "H200": dict(sm_count=132, memory_gb=141, bandwidth_tbps=4.8, fp32_tflops=67, bf16_tflops=989.4,
                 fp8_tflops=1978.9),
    "A100 80GB": dict(sm_count=108, l2_mb=40, memory_gb=80, bandwidth_tbps=2.039, fp32_tflops=19.5,
                      tf32_tflops=156, bf16_tflops=312, fp8_tflops=None),
    "A100 40GB": dict(sm_count=108, l2_mb=40, memory_gb=40, bandwidth_tbps=1.555, bf16_tflops=312),
    "H100 PCIe": dict(sm_count=114, l2_mb=50, memory_gb=80, bandwidth_tbps=2.0, fp32_tflops=51, tf32_tflops=378,
                      bf16_tflops=756, fp8_tflops=1513),
    "L4": dict(memory_gb=24, bandwidth_tbps=0.3, fp32_tflops=30.3, tf32_tflops=60, bf16_tflops=121,
               fp8_tflops=242.5),
    # HGX B200 page (memory, bandwidth, FP32 = 600 / 8) and the Blackwell technical brief (dense tensor rates)
    "B200": dict(memory_gb=180, bandwidth_tbps=8.0, fp32_tflops=75, tf32_tflops=1100, bf16_tflops=2250,
                 fp8_tflops=4500),
}


@pytest.mark.parametrize("name", sorted(VENDOR))
def test_datasheet_table_matches_vendor_figures(name):
    sheet = datasheet_by_name(name)
    for field, value in VENDOR[name].items():
        if field == "l2_mb":  # the vendor's "MB" of L2 are MiB (what the device reports); the table holds 10^6 bytes
            assert sheet.l2_mb == pytest.approx(value * 2**20 / 1e6, abs=0.05), f"{name}.{field}"
            continue
        assert getattr(sheet, field) == value, f"{name}.{field}"


@pytest.mark.parametrize("name", ["H100 SXM", "H200", "A100 80GB"])
def test_entries_quote_the_key_figures_through_placeholders(name):
    bodies = "\n".join(e.body for e in G.entries.values())
    for field in ("sm_count", "l2_mb", "memory_gb", "bandwidth_tbps", "bf16_tflops"):
        assert "{{" + f"{name}.{field}" + "}}" in bodies, f"no entry quotes {name}.{field}"


def test_placeholders_render_the_table_values():
    text, sources, missing = glossary.render_numbers(
        "{{H100 SXM.sm_count}} SMs, {{H200.bandwidth_tbps}} TB/s, {{A100 80GB.l2_mb}} MB, "
        "{{H100 SXM.ridge_bf16}} FLOP/byte, {{Hopper.max_threads_per_sm}}, {{nvlink4_gbps}}, {{nope.x}}")
    assert text.startswith("132 SMs, 4.8 TB/s, 41.9 MB, 295 FLOP/byte, 2048, 900, ")
    assert missing == ["nope.x"] and "{{nope.x}}" in text
    assert any("H100 Tensor Core GPU datasheet" in s for s in sources)


def test_recorded_placeholder_reads_the_recording():
    import json

    rec = json.loads((ROOT / "content" / "recorded" / "nvidia-h200" / "ceilings.json").read_text())
    text, sources, missing = glossary.render_numbers("{{recorded:nvidia-h200.copy_tbps}}")
    assert not missing and abs(float(text) - rec["copy_tbps"]) < 0.01
    assert "recorded run of this app" in sources[0]


def test_numbers_beside_gpu_names_match_the_datasheet():
    assert glossary.drifted_numbers(G) == []


def test_the_drift_check_catches_a_wrong_number():
    sentence = "An H100 SXM has 3.9 TB/s of bandwidth and 144 SMs. The H200 has 141 GB."
    found = {(v, u) for _, _, v, u in glossary.quoted_gpu_numbers(sentence)}
    assert found == {(3.9, "TB/s"), (144.0, "SMs"), (141.0, "GB")}
    assert 3.9 not in glossary.allowed_values(["H100 SXM"], "TB/s")
    assert 144 not in glossary.allowed_values(["H100 SXM"], "SMs")
    assert 141 in glossary.allowed_values(["H200"], "GB")
    assert glossary.quoted_gpu_numbers("The GH100 die has 144 SMs.") == []  # GH100 is not H100


# ------------------------------------------------------------------------------------------------
# The parser and the links
# ------------------------------------------------------------------------------------------------
def test_front_matter_parser():
    meta, body = glossary.parse_front_matter(
        "---\ntitle: \"Warp: 32 threads\"\naliases: [warps, 'SIMT group']\nsection: programming-model\n"
        "labs: []\n---\nBody [[thread]].\n")
    assert meta == {"title": "Warp: 32 threads", "aliases": ["warps", "SIMT group"],
                    "section": "programming-model", "labs": []}
    assert body == "Body [[thread]].\n"
    for bad in ("title: x\n", "---\ntitle: x\n", "---\nnot a pair\n---\n", "---\nrelated: [a, b\n---\n"):
        with pytest.raises(glossary.GlossaryError):
            glossary.parse_front_matter(bad, "bad.md")


def test_link_syntax():
    known = {"warp": None, "thread-block": None}
    out = glossary.link_markdown("A [[warp]] of a [[thread-block|block]] and [[nowhere]].", known=known)
    assert out == ("A [warp](glossary?term=warp) of a [block](glossary?term=thread-block) and "
                   "nowhere (missing entry: nowhere).")
    assert glossary.term_link("bank-conflict") == "[bank conflict](glossary?term=bank-conflict)"
    rendered = G.render("warp")
    assert "[[" not in rendered and "{{" not in rendered and "(glossary?term=thread)" in rendered


# ------------------------------------------------------------------------------------------------
# Search
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("query, first", [("warp", "warp"), ("HBM3e", "hbm"), ("smem", "shared-memory"),
                                          ("bank conflict", "bank-conflict"), ("Little", "littles-law"),
                                          ("kv cache", "kv-cache"), ("GEMM", "matmul"), ("nvidia.ko", "gpu-driver"),
                                          ("TMEM", "tensor-memory"), ("active cycle", "sm-utilization"),
                                          ("long scoreboard", "scoreboard-stall"), ("CUDA C++", "cuda-cpp"),
                                          ("cuobjdump", "cuda-binary-utilities"), ("cuTile", "cuda-tile")])
def test_search_ranks_the_entry_first(query, first):
    assert G.search(query)[0].slug == first


def test_search_matches_text_and_filters_by_section():
    assert "flash-attention" in {e.slug for e in G.search("log-sum-exp")}  # a word from the body only
    numerics = G.search("", "numerics")
    assert numerics and all(e.section == "numerics" for e in numerics)
    assert {e.slug for e in G.search("precision", "numerics")} <= {e.slug for e in numerics}
    assert G.search("no such thing anywhere") == []
    assert len(G.search("")) == len(G)


def test_search_is_fast():
    queries = ["warp", "memory bandwidth", "tensor core fp8", "a", "zzz", "the", "bank conflict shared"]
    worst = 0.0
    for q in queries * 10:
        t = time.perf_counter()
        G.search(q)
        worst = max(worst, time.perf_counter() - t)
    assert worst < 0.1, f"slowest search took {worst * 1e3:.1f} ms"


# ------------------------------------------------------------------------------------------------
# Diagram data
# ------------------------------------------------------------------------------------------------
def test_thread_hierarchy_maps_software_onto_hardware():
    data = glossary.thread_hierarchy("H100 SXM")
    assert [lv["software"] for lv in data["levels"]] == ["Grid", "Cluster", "Block (CTA)", "Warp", "Thread"]
    assert [lv["hardware"] for lv in data["levels"]] == ["GPU", "GPC", "SM", "SM sub-partition", "Lane"]
    assert data["counts"] == {"sms": 132, "sub_partitions": 528, "lanes": 16896, "resident_threads": 270336}
    for lv in data["levels"]:
        assert lv["software_slug"] in G and lv["hardware_slug"] in G
    ampere = glossary.thread_hierarchy("A100 80GB")  # no clusters before Hopper
    assert [lv["software"] for lv in ampere["levels"]] == ["Grid", "Block (CTA)", "Warp", "Thread"]


def test_memory_hierarchy_h100_numbers():
    levels = glossary.memory_hierarchy("H100 SXM")
    by = {lv["slug"]: lv for lv in levels}
    assert by["hbm"]["total_bytes"] == 80e9 and by["hbm"]["bandwidth_tbps"] == 3.35
    assert by["l2-cache"]["total_bytes"] == 52.4e6  # 50 MiB, what the device reports
    assert by["registers"]["unit_bytes"] == 256 * 1024 and by["shared-memory"]["unit_bytes"] == 256 * 1024
    # shared memory: 132 SMs x 128 bytes per clock x 1.98 GHz (the clock implied by 67 TFLOP/s FP32)
    assert by["shared-memory"]["bandwidth_tbps"] == pytest.approx(132 * 128 * 1.98e9 / 1e12, rel=0.01)
    assert by["pcie"]["bandwidth_tbps"] == 0.063  # after the 128b/130b line code
    lat = [lv["latency_cycles"] for lv in levels]
    bw = [lv["bandwidth_tbps"] for lv in levels]
    assert lat == sorted(lat) and bw == sorted(bw, reverse=True), "faster levels must come first"
    for lv in levels:
        assert lv["slug"] in G and lv["sources"]
    assert glossary.memory_hierarchy("A100 80GB")[3]["bandwidth_tbps"] == 2.039
    assert glossary.human_bytes(34_603_008) == "34.6 MB" and glossary.human_bytes(80e9) == "80 GB"
    assert glossary.human_bytes(256 * 1024) == "256 KB" and glossary.human_bytes(50e6) == "50 MB"


@pytest.mark.parametrize("gpu", ["H100 PCIe", "L4"])
def test_diagrams_draw_other_gpus_with_their_own_figures(gpu):
    sheet = datasheet_by_name(gpu)
    threads = glossary.thread_hierarchy(gpu)
    assert threads["counts"]["sms"] == sheet.sm_count
    levels = glossary.memory_hierarchy(gpu)
    assert levels[3]["bandwidth_tbps"] == sheet.bandwidth_tbps and levels[2]["total_bytes"] == sheet.l2_mb * 1e6
    assert levels[3]["level"].startswith("HBM" if sheet.memory_type.startswith("HBM") else "DRAM")
    bw = [lv["bandwidth_tbps"] for lv in levels]
    assert bw == sorted(bw, reverse=True)


def test_diagrams_attach_to_entries_that_exist():
    for name, slugs in glossary.DIAGRAMS.items():
        assert all(s in G for s in slugs), name
    assert glossary.diagram_for("memory-hierarchy") == "memory" and glossary.diagram_for("warp") == "threads"
    assert glossary.diagram_for("fp8") is None


# ------------------------------------------------------------------------------------------------
# The page
# ------------------------------------------------------------------------------------------------
def _run(query_term=None):
    at = AppTest.from_file(PAGE, default_timeout=30)
    if query_term:
        at.query_params["term"] = query_term
    at.run()
    assert not at.exception, at.exception
    return at


def _open_keys(at):
    return [b.key for b in at.button if b.key and b.key.startswith("open_")]


def test_page_overview_lists_everything_and_draws_both_diagrams():
    at = _run()
    assert at.title[0].value == "Glossary"
    assert len(_open_keys(at)) == len(G)
    assert [s.value for s in at.subheader] == ["Sections", "Diagrams"]
    assert len(at.get("plotly_chart")) == 2
    t = time.perf_counter()
    at.run()
    assert time.perf_counter() - t < 1.0, "the page should render in under a second"


def test_page_search_and_section_filter():
    at = _run()
    at.text_input(key="glossary_query").input("bank conflict").run()
    assert _open_keys(at)[0] == "open_bank-conflict"
    at.text_input(key="glossary_query").input("").run()
    at.selectbox(key="glossary_section").select("Numerics").run()
    assert sorted(_open_keys(at)) == sorted(f"open_{e.slug}" for e in G.in_section("numerics"))


def test_page_deep_link_backlinks_and_navigation():
    at = _run("warp")
    assert at.header[0].value == "Warp"
    assert "(glossary?term=thread)" in at.markdown[0].value
    backs = sorted(b.key for b in at.button if b.key.startswith("back_"))
    assert backs == sorted(f"back_{s}" for s in G.backlinks["warp"])
    assert any(b.key == "rel_warp-scheduler" for b in at.button)
    assert "Mentioned in" in [s.value for s in at.subheader]
    at.button(key="back_thread").click().run()
    assert at.query_params["term"] == ["thread"] or at.query_params["term"] == "thread"
    assert at.header[0].value == "Thread"
    at.button(key="open_hbm").click().run()
    assert at.header[0].value.startswith("HBM")
    assert len(at.get("plotly_chart")) == 1  # hbm shows the memory-hierarchy diagram


def test_page_unknown_term_warns_and_still_lists():
    at = _run("no-such-term")
    assert "no-such-term" in at.warning[0].value
    assert len(_open_keys(at)) == len(G)


def test_page_try_it_live_links_to_existing_lab_pages():
    entry = next(e for e in G.entries.values() if glossary.lab_pages(e))  # e.g. roofline
    lab, title, page = glossary.lab_pages(entry)[0]
    assert page.exists()
    at = _run(entry.slug)  # standalone: a plain link to the lab's URL
    assert "Try it live" in [s.value for s in at.subheader]
    assert any(f"]({lab})" in m.value for m in at.markdown)
    nav = AppTest.from_string(  # under st.navigation, as in app.py: a real page link
        "import streamlit as st\n"
        f"st.navigation([st.Page({PAGE!r}, url_path='glossary', default=True), "
        f"st.Page({str(page)!r}, url_path={lab!r})]).run()\n", default_timeout=30)
    nav.query_params["term"] = entry.slug
    nav.run()
    assert not nav.exception, nav.exception
    assert (lab, title) in [(p.proto.page, p.proto.label) for p in nav.get("page_link")]



# ------------------------------------------------------------------------------------------------
# Coverage of the best-known static GPU glossary
# ------------------------------------------------------------------------------------------------
# The entry titles of Modal's GPU Glossary (modal.com/gpu-glossary, 2026), each with its abbreviation where
# it has one: used to measure coverage only, no text taken from it. Before issue 20 the glossary covered 53
# of these 81 (53 of the 79 counted in the issue, which predate "Kernel Launch Configuration" and "cuTile
# BASIC").
REFERENCE_TERMS = (
    # device hardware
    ("CUDA (Device Architecture)",), ("Streaming Multiprocessor", "SM"), ("Core",),
    ("Special Function Unit", "SFU"), ("Load/Store Unit", "LSU"), ("Warp Scheduler",), ("CUDA Core",),
    ("Tensor Core",), ("Tensor Memory Accelerator", "TMA"), ("Streaming Multiprocessor Architecture",),
    ("Texture Processing Cluster", "TPC"), ("Graphics/GPU Processing Cluster", "GPC"), ("Register File",),
    ("L1 Data Cache",), ("Tensor Memory",), ("GPU RAM",),
    # device software
    ("CUDA (Programming Model)",), ("Streaming ASSembler", "SASS"), ("Parallel Thread eXecution", "PTX"),
    ("Compute Capability",), ("Thread",), ("Warp",), ("Cooperative Thread Array",), ("Kernel",),
    ("Thread Block",), ("Thread Block Grid",), ("Thread Hierarchy",), ("Memory Hierarchy",), ("Registers",),
    ("Shared Memory",), ("Global Memory",), ("Warpgroup",), ("CUDA Tile programming model",),
    ("Kernel Launch Configuration",),
    # host software
    ("CUDA (Software Platform)",), ("CUDA C++ (programming language)",), ("NVIDIA GPU Drivers",),
    ("nvidia.ko",), ("CUDA Driver API",), ("libcuda.so",), ("NVIDIA Management Library", "NVML"),
    ("libnvml.so",), ("nvidia-smi",), ("CUDA Runtime API",), ("libcudart.so",),
    ("NVIDIA CUDA Compiler Driver", "nvcc"), ("NVIDIA Runtime Compiler", "NVRTC"),
    ("NVIDIA CUDA Profiling Tools Interface", "CUPTI"), ("NVIDIA Nsight Systems",), ("CUDA Binary Utilities",),
    ("cuBLAS",), ("cuDNN",), ("CUDA Graph",), ("CUTLASS",), ("CuTe",), ("CuTe DSL",), ("cuTile BASIC",),
    ("NVIDIA Nsight Compute",),
    # performance
    ("Performance Bottleneck",), ("Roofline Model",), ("Compute-bound",), ("Memory-bound",),
    ("Arithmetic Intensity",), ("Overhead",), ("Little's Law",), ("Memory Bandwidth",),
    ("Arithmetic Bandwidth",), ("Latency Hiding",), ("Warp Execution State",), ("Active Cycle",),
    ("Occupancy",), ("Pipe Utilization",), ("Peak Rate",), ("Issue Efficiency",),
    ("Streaming Multiprocessor Utilization",), ("Warp Divergence",), ("Branch Efficiency",),
    ("Bank Conflict",), ("Register Pressure",), ("Scoreboard Stall",), ("Memory Coalescing",),
)


def test_every_term_of_the_reference_glossary_has_an_entry_that_explains_it():
    assert len(REFERENCE_TERMS) == 81 and len(set(REFERENCE_TERMS)) == 81
    index = glossary.names_index(G)
    uncovered, unexplained = [], []
    for names in REFERENCE_TERMS:
        slug = glossary.covering_entry(G, names, index)
        if slug is None:
            uncovered.append(names[0])
            continue
        entry = G.get(slug)  # covered by a title or an alias, and the entry's own words name the term
        words = glossary.name_key(entry.title + " " + entry.text)
        if not any(glossary.name_key(n) in words for n in names):
            unexplained.append((names[0], slug))
    assert not uncovered, f"{len(uncovered)} of {len(REFERENCE_TERMS)} terms have no entry: {uncovered}"
    assert not unexplained, f"entries that carry a term as an alias but never mention it: {unexplained}"


def test_name_keys_and_covering_entry():
    assert glossary.name_key("NVIDIA Nsight Systems") == glossary.name_key("nsight systems")
    assert glossary.name_key("Load/Store Unit") == "load store unit"
    assert glossary.name_key("CUDA (Device Architecture)") == "cuda device architecture"
    assert glossary.covering_entry(G, ("Streaming Multiprocessor", "SM")) == "sm"
    assert glossary.covering_entry(G, ("libcudart.so",)) == "cuda-runtime-api"  # an alias
    assert glossary.covering_entry(G, ("CUDA C++",)) == "cuda-cpp"  # a title wins over another entry's alias
    assert glossary.covering_entry(G, ("Hyperdimensional Flux Capacitor",)) is None


# ------------------------------------------------------------------------------------------------
# Per-SM facts, the tables against the recorded device, and numbers in lessons
# ------------------------------------------------------------------------------------------------
def test_architecture_facts_are_keyed_by_compute_capability():
    assert glossary.arch_for(datasheet_by_name("L4")).name == "Ada Lovelace"
    assert glossary.arch_for(datasheet_by_name("A100 80GB")).name == "Ampere"
    assert glossary.arch_for(datasheet_by_name("A10G")) is None  # 8.6: an "Ampere" with a different SM
    # the L4's FP32 rate implies its 2.04 GHz boost clock only with Ada's 128 lanes per SM
    assert glossary.boost_clock_ghz(datasheet_by_name("L4")) == pytest.approx(2.04, abs=0.01)
    assert glossary.thread_hierarchy("L4")["counts"]["resident_threads"] == 58 * 1536


def test_tables_agree_with_every_recorded_device():
    import json

    checked = 0
    for path in sorted((ROOT / "content" / "recorded").glob("*/roofline.json")):
        device = json.loads(path.read_text())["meta"]["gpu"]
        sheet = datasheet_by_name(glossary.datasheet_for(device["name"]).name)
        arch = glossary.arch_for(sheet)
        assert device["sm_count"] == sheet.sm_count, path
        assert device["l2_bytes"] / 1e6 == pytest.approx(sheet.l2_mb, abs=0.05), path
        assert device["compute_capability"] == sheet.compute_capability, path
        assert device["shared_memory_per_sm_bytes"] == arch.max_shared_per_sm_kb * 1024, path
        assert device["registers_per_sm"] == arch.registers_per_sm, path
        assert device["max_threads_per_sm"] == arch.max_threads_per_sm, path
        checked += 1
    assert checked >= 1


LESSONS = sorted((ROOT / "content" / "labs").glob("*.md"))


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_numbers_beside_gpu_names_in_lessons_trace_to_the_tables_or_a_recording(lesson):
    assert glossary.untraced_lesson_numbers(lesson.read_text(), lesson.stem) == []


def test_the_lesson_trace_catches_an_untraced_number():
    untraced = "On an H200 the padded tile ran at 7.5 TB/s."  # nothing within 5 % of it in the recording
    traced = "On an H200 cuBLAS ran bf16 at about 610 TFLOP/s at N = 2048."  # the matmul recording holds 614
    assert glossary.untraced_lesson_numbers(untraced, "coalescing") != []
    assert glossary.untraced_lesson_numbers(traced, "matmul") == []
    assert glossary.untraced_lesson_numbers(traced, "coalescing") != []  # another lab's run is no trace
    assert glossary.untraced_lesson_numbers("An H100 has 52.4 MB of L2 and 132 SMs.") == []
    assert glossary.untraced_lesson_numbers("An L4 has 300 GB of memory.") != []


@pytest.mark.parametrize("page", LESSONS + [ROOT / "content" / "home.md"], ids=lambda p: p.stem)
def test_every_glossary_link_in_lessons_and_home_has_an_entry(page):
    missing = sorted({s for s in re.findall(r"\[\[([a-z0-9-]+)", page.read_text()) if s not in G})
    assert not missing, f"{page.name} links terms with no entry: {missing}"


def test_home_quotes_no_untraced_numbers():
    assert glossary.untraced_lesson_numbers((ROOT / "content" / "home.md").read_text()) == []


# ------------------------------------------------------------------------------------------------
# Home's "What to read next": one ordered route per kind of user
# ------------------------------------------------------------------------------------------------
def _routes():
    from ui import text

    section = text.split_sections((ROOT / "content" / "home.md").read_text())["What to read next"]
    return glossary.reading_routes(section)


def test_home_has_an_ordered_route_for_each_kind_of_user():
    intro, routes = _routes()
    assert intro
    assert [title for title, _ in routes] == ["In a course", "Self-paced", "Instructor"]
    for title, steps in routes:
        assert len(steps) >= 5, title
        pages = [p for step in steps for p in glossary.step_targets(step)[0]]
        slugs = [s for step in steps for s in glossary.step_targets(step)[1]]
        assert "roofline" in pages and pages.index("roofline") <= 2, f"{title}: the route starts elsewhere"
        assert len(set(pages)) >= 4 and len(set(slugs)) >= 8, title


def test_every_link_of_the_routes_resolves():
    labs = {lab.name for lab in all_labs()}
    for title, steps in _routes()[1]:
        for step in steps:  # a lab whose page is still being built is allowed: Home hides its step
            pages, slugs = glossary.step_targets(step)
            for page in pages:
                assert page in labs or (ROOT / "pages" / f"{page}.py").exists(), (title, page)
            missing = [s for s in slugs if s not in G]
            assert not missing, f"{title}: no entry for {missing}"


def test_home_shows_only_steps_whose_pages_exist(tmp_path):
    (tmp_path / "roofline.py").write_text("")
    steps = ["[Roofline](roofline?predict=1) and [[roofline]]", "[Later](not_built_yet) lab", "[[warp]] only"]
    assert glossary.ready_steps(steps, tmp_path) == [steps[0], steps[2]]
    for _, steps in _routes()[1]:
        for step in glossary.ready_steps(steps):
            assert all((ROOT / "pages" / f"{p}.py").exists() for p in glossary.step_targets(step)[0])


def test_the_self_paced_route_reaches_every_lab_page():
    pages = {p for step in _routes()[1][1][1] for p in glossary.step_targets(step)[0]}
    lab_pages = {lab.name for lab in all_labs() if (ROOT / "pages" / f"{lab.name}.py").exists()}
    assert lab_pages <= pages, f"the self-paced route skips {sorted(lab_pages - pages)}"


def test_home_page_shows_each_route_in_its_own_tab():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)  # Home links lab pages: needs app.py
    at.run()
    at.switch_page("pages/home.py")
    at.run()
    assert not at.exception, at.exception
    assert "What to read next" in [h.value for h in at.header]
    assert [t.label for t in at.tabs] == ["In a course", "Self-paced", "Instructor"]
    self_paced = at.tabs[1].markdown[0].value
    assert self_paced.startswith("1. ") and "](roofline)" in self_paced
    assert "(glossary?term=thread-hierarchy)" in self_paced and "[[" not in self_paced
