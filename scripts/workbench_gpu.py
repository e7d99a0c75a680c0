"""Device-side check of the kernel workbench (one call): the sandbox on the GPU machine, our solutions
through the workbench against the labs' own kernels, the sandbox's cost, and the uncoalesced starter.

    export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ROOFLINE_CACHE=/tmp/rc
    python3 scripts/workbench_gpu.py [--record] [--out DIR] [--exercises add,matmul]

Prints a compact table; --record saves content/recorded/<gpu>/workbench-<exercise>.json for every
correct solution (and copies them to --out).
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

from labs import bench, gpu  # noqa: E402
from labs.results import save_recording  # noqa: E402
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
    return bench.time_ms(lambda: fn(*args))


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
        ours = bench.time_ms(fn)
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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--out", default="")
    parser.add_argument("--exercises", default=",".join(e.name for e in EXERCISES))
    parser.add_argument("--skip-probes", action="store_true")
    parser.add_argument("--sweep", default="", help="comma-separated: matmul,attention (knob sweeps first)")
    args = parser.parse_args()
    info = gpu.detect()
    if not info.available:
        print(f"needs a GPU: {info.reason}")
        return 2
    target = gpu.live_target()
    print(f"GPU {info.name}; ceilings: {target.describe_ceilings()}")
    for name in filter(None, args.sweep.split(",")):
        sweep(name)
    if not args.skip_probes:
        probe_sandbox()
    out = Path(args.out) if args.out else None
    verdicts, table = {}, []
    for name in args.exercises.split(","):
        ex = get_exercise(name)
        started = time.monotonic()
        v = wb.submit(ex, ex.solution())
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
        v = wb.submit(get_exercise("transpose"), get_exercise("transpose").starter())
        table.append("starter " + wb.summary_line(v))
        table += [f"{'':10s} gap: {r.get('gap')}" for r in v.get("points", [])]
    print("\n".join(table))
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "workbench_verdicts.json").write_text(json.dumps(verdicts, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
