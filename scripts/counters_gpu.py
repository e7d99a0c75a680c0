"""Device-side checks for labs/counters.py (issue 16).

    python3 scripts/counters_gpu.py capture OUT_DIR   ncu version, metric names, one raw CSV per metric set,
                                                      the NVTX filter, a non-root permission check
    python3 scripts/counters_gpu.py permission OUT_DIR   the same ncu call as an unprivileged user
    python3 scripts/counters_gpu.py count [LAB ...] [--record]   count every covered lab's default points
                                                      (python -m labs count LAB) and print counted/modelled

Prints a compact table at the end of each mode.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from labs.engine import counters  # noqa: E402

ROOFLINE_PARAMS = '{"dtypes": ["fp32"], "flops_per_element": [1, 64], "size_mib": 64}'
ROOFLINE_POINTS = '[{"dtype": "fp32", "flops_per_element": 1}, {"dtype": "fp32", "flops_per_element": 64}]'


def base_name(metric: str) -> str:
    """dram__bytes_read.sum -> dram__bytes_read (query-metrics lists base names)."""
    return metric.split(".")[0]


def capture(out_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ncu = counters.ncu_path()
    print("ncu:", ncu)
    version = subprocess.run([ncu, "--version"], capture_output=True, text=True)
    print(version.stdout.strip().splitlines()[-1])
    query = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=120)
    (out / "query_metrics.txt").write_text(query.stdout + query.stderr)
    known = {line.split()[0] for line in query.stdout.splitlines() if line.strip() and "__" in line.split()[0]}
    wanted = sorted({m for s in counters.METRIC_SETS.values() for m in s})
    missing = [m for m in wanted if base_name(m) not in known]
    print(f"metrics wanted {len(wanted)}, base names not listed by --query-metrics: {missing}")
    child = [sys.executable, "-m", "labs.engine.counters", "child", "roofline", ROOFLINE_PARAMS, ROOFLINE_POINTS]
    env = {"PYTHONPATH": str(counters.ROOT)}
    table = []
    for name in counters.METRIC_SETS:
        started = time.monotonic()
        try:
            kernels, _ = counters.profile_command(child, (name,), nvtx_range=counters.NVTX_RANGE, env=env,
                                                  keep_log=str(out / f"ncu_{name}.csv"))
            points = counters.split_points(kernels, ["F=1", "F=64"])
            got = {label: counters.totals(ks) for label, ks in points.items()}
            status = f"{len(kernels)} kernels, points {list(points)}"
            sample = {k: v for k, v in got.get("F=1", {}).items()}
        except counters.CountersUnavailable as exc:
            status, sample = f"unavailable: {exc}", {}
        table.append((name, time.monotonic() - started, status, sample))
    # the NVTX filter: the same run without it profiles every kernel (warm-up and set-up too)
    try:
        kernels, _ = counters.profile_command(child, ("dram",), nvtx_range=None, env=env,
                                              keep_log=str(out / "ncu_dram_unfiltered.csv"))
        print(f"without the NVTX filter: {len(kernels)} kernels: {[k.name[:40] for k in kernels]}")
    except counters.CountersUnavailable as exc:
        print("without the NVTX filter:", exc)
    # permission check: the same metric as an unprivileged user
    probe = "import torch; x = torch.randn(1 << 20, device='cuda'); y = x * 2; torch.cuda.synchronize()"
    nonroot = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", ncu, "--csv",
                              "--clock-control", "none", "--metrics", "dram__bytes_read.sum", sys.executable, "-c", probe],
                             capture_output=True, text=True, timeout=120, cwd="/tmp")
    (out / "ncu_nonroot.txt").write_text(nonroot.stdout + "\n--- stderr ---\n" + nonroot.stderr)
    print(f"non-root: exit {nonroot.returncode}; ERR_NVGPUCTRPERM in output: "
          f"{'ERR_NVGPUCTRPERM' in nonroot.stdout + nonroot.stderr}; tail: {(nonroot.stdout + nonroot.stderr)[-300:]!r}")
    # one whole count through the public entry point (roofline at 256 MiB)
    from labs import get_lab
    from labs.engine import params as params_mod
    started = time.monotonic()
    try:
        lab = get_lab("roofline")
        result = counters.count("roofline", params_mod.from_strings(lab.Params, {"size_mib": "256"}))
        print(f"count(roofline, 256 MiB) in {time.monotonic() - started:.0f} s; messages {result.messages}")
        for r in result.rows:
            print(f"  {counters.point_label({k: r[k] for k in lab.key}):40s} {r['quantity']:22s} "
                  f"model {r['modelled']}  counted {r['counted']}  ratio {r['ratio']}")
    except Exception as exc:  # report and go on: this is a probe
        print(f"count(roofline) failed: {type(exc).__name__}: {exc}")
    print("\nset        seconds  result")
    for name, seconds, status, sample in table:
        print(f"{name:10s} {seconds:7.1f}  {status}")
        for metric, value in sample.items():
            print(f"           {metric:70s} {value}")


def permission(out_dir: str) -> None:
    """The same ncu call as an unprivileged user (uid 65534) with a HOME it can write: does the driver let it
    read counters (ERR_NVGPUCTRPERM if not)?"""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    probe = "import torch; x = torch.randn(1 << 20, device='cuda'); y = x * 2; torch.cuda.synchronize()"
    env = {**os.environ, "HOME": "/tmp/nobody-home"}
    os.makedirs(env["HOME"], exist_ok=True)
    os.chmod(env["HOME"], 0o777)
    done = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", counters.ncu_path(),
                           "--csv", "--clock-control", "none", "--metrics", "dram__bytes_read.sum", sys.executable, "-c",
                           probe], capture_output=True, text=True, timeout=120, cwd="/tmp", env=env)
    text = done.stdout + "\n--- stderr ---\n" + done.stderr
    (out / "ncu_nonroot.txt").write_text(text)
    print(f"non-root: exit {done.returncode}; ERR_NVGPUCTRPERM: {'ERR_NVGPUCTRPERM' in text}; "
          f"kernels parsed: {len(counters.parse_csv(done.stdout))}; tail {text[-300:]!r}")


def count(labs: list[str], record: bool) -> int:
    failed = 0
    for lab in labs:
        cmd = [sys.executable, "-m", "labs", "count", lab] + (["--record"] if record else [])
        started = time.monotonic()
        done = subprocess.run(cmd, cwd=counters.ROOT, capture_output=True, text=True)
        print(f"\n=== {lab}: exit {done.returncode} in {time.monotonic() - started:.0f} s")
        print(done.stdout[-6000:])
        print(done.stderr[-2500:])
        failed += done.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "capture":
        capture(sys.argv[2])
    elif len(sys.argv) >= 3 and sys.argv[1] == "permission":
        permission(sys.argv[2])
    elif len(sys.argv) >= 2 and sys.argv[1] == "count":
        names = [a for a in sys.argv[2:] if not a.startswith("--")] or list(counters.ADAPTERS)
        sys.exit(count(names, "--record" in sys.argv))
    else:
        print(__doc__)
        sys.exit(2)
