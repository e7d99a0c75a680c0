"""Device-side check of the kernel workbench (one call): the sandbox on the GPU machine, our solutions
through the workbench against the labs' own kernels, the sandbox's cost, and the uncoalesced starter.

    export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ROOFLINE_CACHE=/tmp/rc
    python3 scripts/workbench_gpu.py [--record] [--out DIR] [--exercises add,matmul] [--no-counters]
    python3 scripts/workbench_gpu.py --counters      (only the hardware-counter section, < 90 s)

Prints a compact table; --record saves content/recorded/<gpu>/workbench-<exercise>.json for every
correct solution (and copies them to --out). Verdicts include measured DRAM bytes where Nsight Compute
can read the counters (--no-counters leaves them out). --counters: the uncoalesced transpose starter's
whole verdict with its measured bytes and gap sentence, then each of our solutions counted in the
sandbox under ncu (one launch per timing point): measured DRAM bytes against the model's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from labs.engine import timing
from labs.engine import counters
from labs.engine import gpu
from labs.engine import runner  # noqa: E402
from labs.engine.results import save_recording  # noqa: E402
from labs.workbench import EXERCISES, get_exercise, sandbox  # noqa: E402
from labs.workbench import verdict as wb  # noqa: E402
from labs.workbench.exercises import cuda_args  # noqa: E402

PROBES = {  # escapes a learner might try; run with the static check off so the OS limits are what answers
    "network": "import socket\ndef add(x, y):\n    socket.create_connection(('1.1.1.1', 80), timeout=3)\n",
    "repository": f"def add(x, y):\n    open({str(ROOT / 'labs' / 'runner.py')!r}).read()\n",
    "user": "import os\ndef add(x, y):\n    raise RuntimeError(f'uid {os.getuid()} gid {os.getgid()}')\n",
    "100 GB on the GPU": "import torch\ndef add(x, y):\n    return torch.empty(25 * 2**30, device='cuda')\n",
}


def probe_sandbox() -> None:
    print("sandbox:", sandbox.capabilities())
    ex = get_exercise("add")
    for name, code in PROBES.items():
        v = wb.submit(ex, code, static_check=False)
        print(f"  probe {name:18s} -> {v['status']:7s} {' '.join(v.get('message', '').split())[-170:]}")


def solution_module(ex):
    spec = importlib.util.spec_from_file_location(f"solution_{ex.name}", ex.path("solution"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def in_process_ms(ex, point, module=None) -> float:
    """Our solution timed in this process, outside the sandbox: what the sandbox might cost."""
    fn = getattr(module or solution_module(ex), ex.entry)
    args = cuda_args(point)
    fn(*args)
    return timing.time_ms(lambda: fn(*args))


SWEEPS = {  # module-level knobs of our solutions, tried in this process (no sandbox) against the lab's kernel
    "matmul": [dict(USE_TMA=t, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, WARPS=w, STAGES=s)
               for t, bm, bn, bk, w, s in ((True, 128, 256, 64, 8, 3), (True, 128, 256, 64, 8, 4),
                                           (True, 128, 128, 64, 4, 4), (True, 128, 128, 64, 8, 4),
                                           (False, 128, 256, 64, 8, 3), (False, 128, 256, 64, 8, 4))],
    "attention": [dict(BLOCK_M=bm, BLOCK_N=bn, WARPS=w, STAGES=s)
                  for bm, bn, w, s in ((64, 128, 4, 2), (64, 128, 4, 3), (128, 64, 4, 3), (128, 64, 8, 3),
                                       (128, 128, 8, 2), (64, 64, 4, 3), (128, 128, 8, 3))],
}


def sweep(name: str) -> None:
    ex = get_exercise(name)
    module = solution_module(ex)
    for point in ex.points:
        fn, nbytes, flops = ex.ours(point)
        ours = timing.time_ms(fn)
        del fn
        for knobs in SWEEPS[name]:
            for key, value in knobs.items():
                setattr(module, key, value)
            try:
                ms = in_process_ms(ex, point, module)
                print(f"  sweep {name} {point.label:22s} {knobs} {flops / ms / 1e9:7.1f} TFLOP/s "
                      f"{ours / ms:5.2f}x ours", flush=True)
            except Exception as exc:  # noqa: BLE001 - a config that does not compile is a result too
                print(f"  sweep {name} {point.label:22s} {knobs} failed: {str(exc)[:120]}", flush=True)


COUNTERS_BUDGET_S = 70  # the section must finish in < 90 s: no new count starts past this (one takes ~10 s)


def count_line(name: str, kind: str, ex, label: str, counted: dict, seconds: float) -> str:
    target = gpu.live_target()
    point = next(p for p in ex.points if p.label == label)
    model = ex.work(point, target)["bytes"]
    got = counted.get(label, {})
    dram = got.get("dram_bytes")
    ratio = f"{dram / model:6.2f}x" if dram and model else "     -"
    mb = (lambda x: f"{x / 1e6:9.1f}" if x is not None else "        -")
    return (f"  {name:10s} {kind:8s} {label:22s} model {mb(model)} MB  measured {mb(dram)} MB "
            f"(read {mb(got.get('dram_read_bytes'))}, written {mb(got.get('dram_write_bytes'))})  {ratio} "
            f"kernels {got.get('kernels', '-')}  {seconds:4.1f} s")


def diagnose(limits) -> None:
    """The sandboxed count failed: is it ncu itself, or the namespaces? Count our add solution once with the
    namespaces and the separate user off (ROOFLINE_SANDBOX_PLAIN=1; prlimit only), and say which works."""
    import os

    ex = get_exercise("add")
    points = [{"label": p.label, "args": list(p.args)} for p in ex.points]
    os.environ["ROOFLINE_SANDBOX_PLAIN"] = "1"
    sandbox.capabilities.cache_clear()
    try:
        with runner.gpu_session("workbench-count:diagnose"):
            counted = wb.count_dram(ex.solution(), ex.entry, points, limits, True)
        print("  diagnose: without namespaces the count works: " + count_line("add", "plain", ex, points[0]["label"],
                                                                                counted, 0).strip())
    except counters.CountersUnavailable as exc:
        print(f"  diagnose: without namespaces the count fails too: {exc}")
    finally:
        del os.environ["ROOFLINE_SANDBOX_PLAIN"]
        sandbox.capabilities.cache_clear()
    wb._COUNTERS_REFUSED.clear()  # the solutions below try again inside the full sandbox


def counters_section() -> None:
    """The transpose starter's verdict with measured bytes, then our solutions counted one by one."""
    started = time.monotonic()
    print(f"ncu: {counters.ncu_path()}; counters: {wb.counters_unavailable(True) or 'to be tried'}", flush=True)
    starter = get_exercise("transpose")
    v = wb.submit(starter, starter.starter())
    print(f"  transpose starter verdict: {v['status']} in {time.monotonic() - started:.1f} s; "
          f"counters {v.get('counters', {}).get('status')}: {v.get('counters', {}).get('message', '')[:160]}")
    for row in v.get("points", []):
        print(f"  {row['point']}: model {row['bytes'] / 1e6:.1f} MB, measured "
              f"{(row.get('counted_dram_bytes') or 0) / 1e6:.1f} MB, ratio {row.get('dram_bytes_ratio')}\n"
              f"  gap: {row.get('gap')}", flush=True)
    limits = wb.limits_for(True)
    if v.get("counters", {}).get("status") != "measured":
        diagnose(limits)
    for name in ("add", "sincos", "softmax", "transpose", "matmul", "attention"):
        if time.monotonic() - started > COUNTERS_BUDGET_S:
            print(f"  {name}: not counted (the section's {COUNTERS_BUDGET_S} s are spent)")
            continue
        ex = get_exercise(name)
        points = [{"label": p.label, "args": list(p.args)} for p in ex.points]
        began = time.monotonic()
        try:
            with runner.gpu_session(f"workbench-count:{name}"):
                counted = wb.count_dram(ex.solution(), ex.entry, points, limits, True)
        except counters.CountersUnavailable as exc:
            print(f"  {name:10s} solution: no counters: {exc}", flush=True)
            continue
        for p in points:
            print(count_line(name, "solution", ex, p["label"], counted, time.monotonic() - began), flush=True)
    print(f"counters section: {time.monotonic() - started:.1f} s")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--out", default="")
    parser.add_argument("--exercises", default=",".join(e.name for e in EXERCISES))
    parser.add_argument("--skip-probes", action="store_true")
    parser.add_argument("--sweep", default="", help="comma-separated: matmul,attention (knob sweeps first)")
    parser.add_argument("--counters", action="store_true", help="only the hardware-counter section (< 90 s)")
    parser.add_argument("--no-counters", action="store_true", help="verdicts without measured DRAM bytes")
    args = parser.parse_args()
    info = gpu.detect()
    if not info.available:
        print(f"needs a GPU: {info.reason}")
        return 2
    target = gpu.live_target()
    print(f"GPU {info.name}; ceilings: {target.describe_ceilings()}")
    if args.counters:
        counters_section()
        return 0
    for name in filter(None, args.sweep.split(",")):
        sweep(name)
    if not args.skip_probes:
        probe_sandbox()
    out = Path(args.out) if args.out else None
    verdicts, table = {}, []
    for name in args.exercises.split(","):
        ex = get_exercise(name)
        started = time.monotonic()
        v = wb.submit(ex, ex.solution(), counters=not args.no_counters)
        verdicts[name] = v
        print(f"  {name}: {v['status']} in {time.monotonic() - started:.1f} s (worker {v.get('seconds')} s): "
              f"{' '.join(v.get('message', '').split())[:200]}", flush=True)
        table.append(wb.summary_line(v))
        for row in v.get("points", []):
            if row.get("measured_ms"):
                point = next(p for p in ex.points if p.label == row["point"])
                plain = in_process_ms(ex, point)
                table.append(f"{'':10s} sandbox {row['measured_ms']:.4f} ms vs in-process {plain:.4f} ms "
                             f"({row['measured_ms'] / plain:.3f}x); gap: {row.get('gap', '')[:150]}")
        if args.record and v.get("status") == "correct":
            path = save_recording(wb.to_result(v, ex.path("solution").name))
            table.append(f"{'':10s} recorded {path.relative_to(ROOT)}")
            if out:
                out.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, out / path.name)
    if "transpose" in args.exercises:
        v = wb.submit(get_exercise("transpose"), get_exercise("transpose").starter(), counters=not args.no_counters)
        table.append("starter " + wb.summary_line(v))
        table += [f"{'':10s} gap: {r.get('gap')}" for r in v.get("points", [])]
    print("\n".join(table))
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "workbench_verdicts.json").write_text(json.dumps(verdicts, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
