"""The glossary: every entry well-formed and linked, every lab term covered, every number quoted beside
a GPU's name held against the datasheet table, the diagrams' data, search speed, and the page."""

import re
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from labs import all_labs, glossary
from labs.gpu import datasheet_by_name

ROOT = Path(__file__).resolve().parent.parent
PAGE = str(ROOT / "pages" / "glossary.py")
G = glossary.load()


# ------------------------------------------------------------------------------------------------
# Content
# ------------------------------------------------------------------------------------------------
def test_at_least_90_entries_and_no_empty_section():
    assert len(G) >= 90
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
}


@pytest.mark.parametrize("name", sorted(VENDOR))
def test_datasheet_table_matches_vendor_figures(name):
    sheet = datasheet_by_name(name)
    for field, value in VENDOR[name].items():
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
    assert text.startswith("132 SMs, 4.8 TB/s, 40 MB, 295 FLOP/byte, 2048, 900, ")
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
                                          ("kv cache", "kv-cache"), ("GEMM", "matmul")])
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
    assert by["l2-cache"]["total_bytes"] == 50e6
    assert by["registers"]["unit_bytes"] == 256 * 1024 and by["shared-memory"]["unit_bytes"] == 256 * 1024
    # shared memory: 132 SMs x 128 bytes per clock x 1.98 GHz (the clock implied by 67 TFLOP/s FP32)
    assert by["shared-memory"]["bandwidth_tbps"] == pytest.approx(132 * 128 * 1.98e9 / 1e12, rel=0.01)
    assert by["pcie"]["bandwidth_tbps"] == 0.064
    lat = [lv["latency_cycles"] for lv in levels]
    bw = [lv["bandwidth_tbps"] for lv in levels]
    assert lat == sorted(lat) and bw == sorted(bw, reverse=True), "faster levels must come first"
    for lv in levels:
        assert lv["slug"] in G and lv["sources"]
    assert glossary.memory_hierarchy("A100 80GB")[3]["bandwidth_tbps"] == 2.039
    assert glossary.human_bytes(34_603_008) == "34.6 MB" and glossary.human_bytes(80e9) == "80 GB"
    assert glossary.human_bytes(256 * 1024) == "256 KB" and glossary.human_bytes(50e6) == "50 MB"


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
