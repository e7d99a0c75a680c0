"""Device-side check of the workbench's judge (issue 31), every submission through the CLI:

    export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ROOFLINE_CACHE=/tmp/rc ROOFLINE_BWRAP=/path/to/bwrap
    python3 scripts/workbench_gpu.py [--out DIR] [--budget-s 270] [--only solutions|adversarial] [--record]
                                     [--old DIR]     (DIR: a checkout of the workbench before the jail, timed alike)
                                     [--parallel STEMS] [--order STEMS]

Runs `python -m labs workbench run EXERCISE FILE --json` for our solutions (content/workbench/*_solution.py)
and for the adversarial submissions (tests/data/adversarial/*.py: patched timer and harness, cached, lazy,
side stream, inputs modified, work hidden on the CPU, an endless kernel), each in a fresh CLI process, and
prints one line per verdict: status, how it was measured, trusted and self-timed ms, the rate against our
kernel, why not credible, and the wall time to the verdict. Saves every verdict to DIR (and, with --record,
the solutions' recordings). Stops starting new submissions past --budget-s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
ADVERSARIAL = ROOT / "tests" / "data" / "adversarial"
SOLUTIONS = ("add", "sincos", "softmax", "transpose", "matmul", "attention")


def gpu_processes() -> str:
    """Compute processes still on the GPU and its memory in use (nvidia-smi), after a kill."""
    try:
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip()
        used = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip()
        return f"GPU processes: [{apps.replace(chr(10), '; ') or 'none'}], memory used {used}"
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi: {exc}"


def submit(exercise: str, path: Path, record: bool, cwd: Path = ROOT, extra_env: dict | None = None) -> tuple:
    argv = [sys.executable, "-m", "labs", "workbench", "run", exercise, str(path), "--json"] + (["--record"] if record else [])
    env = {**os.environ, **(extra_env or {}), "PYTHONPATH": str(cwd)}
    started = time.monotonic()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - started
    try:
        verdict = json.loads(done.stdout)
    except ValueError:
        verdict = {"status": "no JSON", "message": (done.stdout[-600:] + done.stderr[-1500:])}
    return verdict, wall, done.stderr


def line(kind: str, name: str, v: dict, wall: float) -> str:
    m = v.get("metric", "tbps")
    parts = []
    for r in v.get("points", []) or [{}]:
        you, ours = r.get(f"measured_{m}"), r.get(f"ours_{m}")
        ratio = f"{you / ours:.3f}x ours" if you and ours else "-"
        parts.append(f"[{r.get('point', '')}: {r.get('measured_by') or '-'} {fmt(r.get('trusted_ms'))} ms, "
                     f"self {fmt(r.get('self_ms'))} ms, floor {fmt(r.get('floor_ms'))} ms, {fmt(you)} {v.get('unit', '')} "
                     f"{ratio}; kernels/call {fmt(r.get('kernels_per_call'))}]")
    why = " ".join(v.get("message", "").split())[:300]
    return f"{kind:11s} {name:22s} {v.get('status', '?'):12s} {wall:6.1f} s  {' '.join(parts)}\n{'':12s}{why}"


def fmt(x) -> str:
    return f"{x:.4g}" if isinstance(x, (int, float)) else "-"


def record_one(out: Path, summary: list, kind: str, exercise: str, path: Path, v: dict, wall: float,
               stderr: str) -> None:
    label = f"{kind.rstrip('*')}-{path.stem}"
    (out / "verdicts" / f"{label}.json").write_text(json.dumps({"wall_s": wall, "verdict": v}, indent=1, default=str))
    text = line(kind, path.stem, v, wall)
    if v.get("status") in ("no JSON", "crashed", "error") or "endless" in path.stem:
        text += "\n" + "\n".join("            | " + s for s in stderr.strip().splitlines()[-8:])
        text += "\n            " + gpu_processes()
    text += "".join("\n            " + s for s in stderr.splitlines() if s.startswith("recorded") or "--record" in s)
    print(text, flush=True)
    summary.append({"kind": kind, "file": path.name, "exercise": exercise, "status": v.get("status"),
                    "wall_s": round(wall, 1), "measured_by": v.get("measured_by"), "jail": v.get("jail"),
                    "message": v.get("message"), "freed_s": v.get("freed_s"), "seconds": v.get("seconds"),
                    "points": [{k: r.get(k) for k in ("point", "measured_by", "trusted_ms", "self_ms", "floor_ms",
                                                      f"measured_{v.get('metric')}", f"ours_{v.get('metric')}",
                                                      f"library_{v.get('metric')}", "credible", "not_credible",
                                                      "kernels_per_call", "dram_bytes_ratio", "launch", "gap")}
                               for r in v.get("points", [])]})
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/final/workbench")
    parser.add_argument("--budget-s", type=float, default=270)
    parser.add_argument("--only", default="")
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--old", default="", help="an older checkout to time the same solutions with (baseline)")
    parser.add_argument("--exercises", default=",".join(SOLUTIONS))
    parser.add_argument("--counters", action="store_true", help="(scripts/final_h100.sh) = --only adversarial")
    parser.add_argument("--skip-probes", action="store_true", help="(scripts/final_h100.sh) = --only solutions")
    parser.add_argument("--adversarial", default="")
    parser.add_argument("--order", default="", help="comma-separated file stems: run these first, in this order")
    parser.add_argument("--parallel", default="",
                        help="comma-separated file stems run at the same time before the rest: only submissions "
                             "whose outcome cannot depend on timing (wrong outputs, no kernel at all)")
    args = parser.parse_args()
    args.only = "adversarial" if args.counters else "solutions" if args.skip_probes else args.only
    out = Path(args.out)
    (out / "verdicts").mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    from labs.workbench import jail

    print(f"jail: {jail.status()}", flush=True)
    # what the app does at start: the trusted judge's jail variant found once, so the verdicts below are warm
    t0 = time.monotonic()
    prepared = subprocess.run([sys.executable, "-m", "labs", "workbench", "prepare"], cwd=ROOT, capture_output=True,
                              text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    print(f"prepare (app start): {(prepared.stdout + prepared.stderr[-800:]).strip()} [{time.monotonic() - t0:.1f} s]",
          flush=True)
    items = []
    names = [n for n in args.exercises.split(",") if n]
    if args.only != "adversarial":
        items += [("solution", n, ROOT / "content" / "workbench" / f"{n}_solution.py") for n in names[:1]]
    if args.only != "solutions":
        files = sorted(ADVERSARIAL.glob("*.py"))
        if args.adversarial:
            files = [f for f in files if f.stem in args.adversarial.split(",")]
        items += [("adversarial", f.stem.split("_")[0], f) for f in files]
    if args.only != "adversarial":
        items += [("solution", n, ROOT / "content" / "workbench" / f"{n}_solution.py") for n in names[1:]]
    if args.old:
        items += [("old", n, Path(args.old).resolve() / "content" / "workbench" / f"{n}_solution.py") for n in names[:2]]
        items += [("solution", names[0], ROOT / "content" / "workbench" / f"{names[0]}_solution.py")]  # again, warm
    if args.order:
        rank = {stem: i for i, stem in enumerate(args.order.split(","))}
        items.sort(key=lambda item: rank.get(item[2].stem, len(rank)))
    summary = []
    together = [it for it in items if it[2].stem in args.parallel.split(",")]
    if together:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(together)) as pool:
            results = list(pool.map(lambda it: submit(it[1], it[2], False), together))
        for (kind, exercise, path), (v, wall, stderr) in zip(together, results):
            record_one(out, summary, kind + "*", exercise, path, v, wall, stderr)
        items = [it for it in items if it not in together]
    for kind, exercise, path in items:
        if time.monotonic() - started > args.budget_s:
            print(f"budget spent: {kind} {path.name} not run", flush=True)
            continue
        cwd = Path(args.old).resolve() if kind == "old" else ROOT
        v, wall, stderr = submit(exercise, path, args.record and kind == "solution", cwd)
        record_one(out, summary, kind, exercise, path, v, wall, stderr)
    if args.record:
        for rec in (ROOT / "content" / "recorded").glob("*/workbench-*.json"):
            if rec.stat().st_mtime > time.time() - (time.monotonic() - started) - 5:
                (out / "recorded").mkdir(exist_ok=True)
                shutil.copy(rec, out / "recorded" / f"{rec.parent.name}__{rec.name}")
    print(f"done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
