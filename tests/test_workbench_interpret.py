"""A workbench that teaches without a GPU (issue 34): the learner's kernel counted in Triton's interpreter (bytes,
programs, masked lanes) and the model's time for *their* launch, so the slow starter and our solution differ."""

import json
import subprocess
import sys

import pytest

from labs.engine import gpu
from labs.workbench import get_exercise, interpret
from labs.workbench.interpret_worker import sample_of

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent
H100 = gpu.datasheet_target(gpu.datasheet_by_name("H100 SXM"))


def counted(name: str, kind: str) -> dict:
    ex = get_exercise(name)
    result = interpret.count(ex, ex.path(kind).read_text())
    assert result["status"] == "ok", result
    return {p.label: (result["points"][p.label], interpret.predict_yours(result["points"][p.label], ex, p, H100))
            for p in ex.points}


@pytest.fixture(scope="module")
def runs():
    return {(name, kind): counted(name, kind) for name in ("add", "matmul", "attention")
            for kind in ("starter", "solution")}


def test_sample_is_evenly_spread_and_keeps_both_ends():
    assert sample_of(3, 4) == {0, 1, 2}
    assert sample_of(1001, 4) == {0, 333, 667, 1000}


def test_add_counts_every_byte_and_program(runs):
    counts, model = runs[("add", "starter")]["n=67108864"]
    n = 2**26
    assert counts["bytes"] == pytest.approx(12 * n)  # two loads and a store of 4 bytes per element
    assert counts["programs"] == n // 32 and counts["masked_lanes"] == 0
    assert counts["launches"][0]["num_warps"] == 1 and counts["launches"][0]["constexprs"]["BLOCK"] == 32


@pytest.mark.parametrize("name", ["add", "matmul", "attention"])
def test_starter_is_predicted_slower_than_our_solution(runs, name):
    """Same model, same GPU: only the learner's launch differs. The starter moves more bytes, or keeps too few in
    flight, and its predicted time is longer at every timing point."""
    for label, (starter, slow) in runs[(name, "starter")].items():
        solution, fast = runs[(name, "solution")][label]
        assert starter["bytes"] >= solution["bytes"], label
        assert slow["predicted_ms_yours"] > 1.2 * fast["predicted_ms_yours"], (label, slow, fast)
        # our solution sits near the exercise's own model (the floor it aims at): within the 15 % the project
        # holds its models to. Attention's lab model also hides part of the shorter phase (products or
        # exponentials) under a second warpgroup of the SM, which needs the registers a kernel takes: the count
        # of a learner's launch cannot see them, so its model adds the two phases (0.70 ms against the lab
        # model's 0.63 ms at the full point on an H100 SXM; our solution, judged on an H100: 0.63 ms)
        ex = get_exercise(name)
        point = next(p for p in ex.points if p.label == label)
        assert fast["predicted_ms_yours"] == pytest.approx(ex.work(point, H100)["predicted_ms"], rel=0.15)


def test_tiled_starters_request_more_bytes(runs):
    """32x32 matmul tiles and 16-query attention tiles re-read their operands: several times the solution's bytes."""
    for name in ("matmul", "attention"):
        for label, (starter, _) in runs[(name, "starter")].items():
            assert starter["bytes"] > 4 * runs[(name, "solution")][label][0]["bytes"], (name, label)


def test_causal_starter_visits_every_tile(runs):
    """The starter masks the tiles above the diagonal instead of skipping them: causal costs it as much as full."""
    starter = runs[("attention", "starter")]
    solution = runs[("attention", "solution")]
    full, causal = (next(v for k, v in starter.items() if k.startswith(m)) for m in ("full", "causal"))
    assert causal[0]["dot_flops"] == pytest.approx(full[0]["dot_flops"], rel=0.01)
    full, causal = (next(v for k, v in solution.items() if k.startswith(m)) for m in ("full", "causal"))
    assert causal[0]["dot_flops"] < 0.6 * full[0]["dot_flops"]


def test_cli_json_carries_interpreter_bytes_and_predicted_ms_yours(tmp_path):
    if gpu.detect().available:
        pytest.skip("with a GPU the workbench times the kernel instead")
    out = subprocess.run([sys.executable, "-m", "labs", "workbench", "run", "add",
                          str(ROOT / "content/workbench/add_starter.py"), "--json"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    verdict = json.loads(out.stdout)
    assert verdict["status"] == "correct"
    assert verdict["interpreter_bytes"]["n=67108864"] == pytest.approx(12 * 2**26)
    assert verdict["predicted_ms_yours"]["n=67108864"] > verdict["points"][0]["predicted_ms"]
    row = verdict["points"][0]
    assert "2,097,152 programs of 1 warp" in row["yours"] and "((" not in row["yours"]
    assert verdict["model_gpu"] == "H100 SXM"  # the labs' selector's default
