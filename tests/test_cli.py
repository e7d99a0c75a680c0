"""The command line: list, run (model only without a GPU), bad input exits with status 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from labs.engine import gpu
from labs.engine.results import Result

ROOT = Path(__file__).resolve().parent.parent


def cli(*args):
    return subprocess.run([sys.executable, "-m", "labs", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_list_names_every_lab_and_its_parameters():
    out = cli("list")
    assert out.returncode == 0
    assert "roofline" in out.stdout and "size_mib=1024" in out.stdout


@pytest.mark.skipif(gpu.detect().available, reason="checks the model-only path")
def test_run_without_gpu_writes_the_model(tmp_path):
    path = tmp_path / "r.csv"
    out = cli("run", "roofline", "dtypes=bf16", "flops_per_element=1,64", "--out", str(path), "--model-gpu", "L4")
    assert out.returncode == 0, out.stderr
    assert "No CUDA GPU" in out.stderr
    result = Result.from_csv(path.read_text())
    assert result.kind == "model" and result.meta["gpu"]["name"] == "L4"
    assert [r["flops_per_element"] for r in result.rows] == [1, 64]


def test_run_json_to_stdout():
    out = cli("run", "roofline", "dtypes=fp32", "flops_per_element=2", "size_mib=64")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["lab"] == "roofline"


@pytest.mark.parametrize("args, says", [
    (("run", "roofline", "bogus=1"), "unknown parameter 'bogus'"),
    (("run", "roofline", "size_mib=-5"), "out of range"),
    (("run", "roofline", "dtypes=int4"), "choose from"),
    (("run", "roofline", "size_mib"), "expected key=value"),
    (("run", "nolab"), "unknown lab"),
])
def test_bad_input_exits_2_and_says_what_is_allowed(args, says):
    out = cli(*args)
    assert out.returncode == 2
    assert says in out.stderr


@pytest.mark.skipif(gpu.detect().available, reason="checks the no-GPU path")
def test_record_and_calibrate_need_a_gpu():
    assert cli("run", "roofline", "--record").returncode == 2
    out = cli("calibrate")
    assert out.returncode == 2 and "No CUDA GPU" in out.stderr
