"""scripts/repredict.py: recorded runs re-predicted offline with the models in this checkout."""
import json

import pytest

from labs import fusion, get_lab, transfers
from labs.results import RECORDED_DIR
from scripts import repredict

H100 = RECORDED_DIR / "nvidia-h100-80gb-hbm3"


def _recording(lab: str) -> dict:
    path = H100 / f"{lab}.json"
    if not path.exists():
        pytest.skip(f"no H100 recording of {lab}")
    return json.loads(path.read_text())


def test_shares_by_hand():
    within, far, missing = repredict.shares([0.0, -15.0, 15.1, 60.0, -51.0, None])
    assert within == pytest.approx(2 / 5) and far == 2 and missing == 1


def test_recorded_target_is_the_gpu_and_ceilings_of_the_run():
    rec = _recording("fusion")
    target = repredict.recorded_target(rec["meta"])
    assert target.sm_count == rec["meta"]["gpu"]["sm_count"] and not target.live
    assert target.ceilings.copy_tbps == rec["meta"]["ceilings"]["copy_tbps"]


def test_fusion_rows_get_the_current_model():
    rec = _recording("fusion")
    rows = repredict.repredicted_rows(get_lab("fusion"), rec)
    target = repredict.recorded_target(rec["meta"])
    row = next(r for r in rows if r["variant"] == "torch_softmax" and r["n_cols"] == 65536)
    r, c = fusion.softmax_shape(fusion.Params(softmax_mib=row["size_mib"]), 65536)
    predicted = fusion.model_ms(4 * r * c * 4, 1, target)  # three reads and a write of a 256 KiB row
    assert row["after_pct"] == pytest.approx(100 * (row["measured_ms"] - predicted) / predicted)


def test_transfers_use_the_runs_own_memcpy_rate():
    rec = _recording("transfers")
    note = next(m for m in rec["messages"] if "GB/s" in m)
    rate = float(transfers.HOST_RATE_NOTE.search(note).group(1))
    target = repredict.recorded_target(rec["meta"])
    model = transfers.repredict(rec, target)
    pageable = [r for r in model if r.get("memory") == "pageable" and r["experiment"] == "copies"]
    expected = min(transfers.link_for(target)["pcie_gbps"], rate)  # the slower stage: link or staging memcpy
    assert rate != transfers.ASSUMED_HOST_COPY_GBPS
    assert pageable and all(r["model_bandwidth_gbps"] == pytest.approx(expected) for r in pageable)
