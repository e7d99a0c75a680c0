"""Facts that hold up (issue 34): the datasheet table's units, its sources, and the glossary figures a spot check
found off (NVLink against HBM, PCIe after its line code, the A10G's own rates, the warpgroup's sub-partitions)."""

import re

import pytest

from labs.engine.gpu import DATASHEET, datasheet_by_name
from labs.engine.links import LINKS
from labs.glossary.facts import FACTS
from labs.transfers import model as transfers_model
from ui import text

# L2 as each device reports it (cudaDeviceProp.l2CacheSize), in MiB: vendors print these as "MB"
L2_MIB_REPORTED = {"H100 SXM": 50, "H100 PCIe": 50, "H200": 60, "A100 40GB": 40, "A100 80GB": 40, "L4": 48,
                   "L40S": 96, "T4": 4, "A10G": 6, "RTX 4090": 72, "B200": 126}


def test_every_row_is_covered_by_the_units_check():
    assert {row.name for row in DATASHEET} == set(L2_MIB_REPORTED)


@pytest.mark.parametrize("name", sorted(L2_MIB_REPORTED))
def test_l2_is_in_1e6_bytes_on_every_row(name):
    """One unit for the column: a row holding the MiB count (48 for the L4's 50.3 MB) would be 5 % small."""
    assert datasheet_by_name(name).l2_mb == pytest.approx(L2_MIB_REPORTED[name] * 2**20 / 1e6, abs=0.05)


@pytest.mark.parametrize("row", DATASHEET, ids=lambda r: r.name)
def test_every_row_names_its_source(row):
    assert re.search(r"datasheet|whitepaper|specifications|documentation|technical brief", row.source), row.source
    assert row.name in LINKS and LINKS[row.name].source


def test_a10g_row_holds_the_a10g_rates_not_the_a10s():
    """80 SMs with the A10's 31.2 TFLOP/s (72 SMs) did not add up: FP32 = SMs x 128 lanes x 2 x boost clock."""
    a10g = datasheet_by_name("A10G")
    assert a10g.sm_count == 80
    assert a10g.fp32_tflops == pytest.approx(a10g.sm_count * 128 * 2 * a10g.boost_clock_mhz * 1e6 / 1e12, rel=0.01)
    assert "A10" in a10g.note and "72 SMs" in a10g.note


def test_pcie_figures_are_after_the_line_code():
    """64 GB/s is PCIe 5.0 x16 before 128b/130b; after it, one direction carries 63 GB/s."""
    assert FACTS["pcie5_x16_gbps"].value == pytest.approx(transfers_model.pcie_gbps(5, 16), abs=0.1)
    assert FACTS["pcie4_x16_gbps"].value == pytest.approx(transfers_model.pcie_gbps(4, 16), abs=0.1)
    for name, link in LINKS.items():
        for quoted in re.findall(r"PCIe Gen\d (\d+) GB/s[^,;)]*", link.source):
            assert "before" in link.source, f"{name}: {link.source}"


def _entry(slug: str) -> str:
    return text.read(f"glossary/{slug}.md")


def test_nvlink_share_of_hbm_is_one_direction_against_local_bandwidth():
    body = _entry("nvlink")
    assert "quarter" not in body
    share = re.search(r"450 GB/s, is about (\d+) %", body)
    assert share, "the entry must say what one direction is worth against HBM"
    h100 = datasheet_by_name("H100 SXM")
    assert int(share.group(1)) == round(100 * LINKS["H100 SXM"].nvlink_per_direction_gbps / (h100.bandwidth_tbps * 1e3))


def test_warpgroup_entry_claims_nothing_unsourced():
    body = _entry("warpgroup")
    assert "Each of the four warps runs on a different sub-partition" not in body
    assert "does not document" in body and "PTX ISA" in body
