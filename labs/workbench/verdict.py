"""A submission's verdict: checked against float64, timed, placed beside our kernel, the library and the model.

    submit(exercise, code) -> dict     (JSON-ready; the page, the CLI and recordings all use it)

The learner's code runs only in the sandboxed worker (labs.workbench.sandbox). This process makes the
check inputs, computes the float64 references and compares; on a GPU it also times the lab's own kernel
and the vendor library at the same point (once per process: they do not change between submissions).
The worker's run and those timings happen inside `runner.gpu_session`, so no two timings ever overlap.
"""

from __future__ import annotations

import math
import re
from typing import Callable, Optional

import torch

from labs import bench, runner
from labs import gpu as gpu_mod
from labs.lab import noop_progress
from labs.workbench import sandbox
from labs.workbench.exercises import Exercise, Point, rate

UNITS = {"tbps": "TB/s", "tflops": "TFLOP/s"}
NEAR_MODEL = 0.85  # at or above this fraction of the model's rate the verdict says "at the model"
AS_FAST_AS_OURS = 0.9  # at or above this fraction of our kernel's rate the gap is not blamed on the code
_REFERENCE_TIMINGS: dict = {}  # (exercise, point, gpu key) -> {"ours": ..., "library": ...}


# ---------------------------------------------------------------------------------------------
# Correctness
# ---------------------------------------------------------------------------------------------
def case_label(args) -> str:
    """'1001x517 @ 517x1003', '2x3x1000x64, causal': the check case's input shapes (and flags)."""
    shapes = []
    for a in args:
        if isinstance(a, torch.Tensor):
            shape = "x".join(map(str, a.shape))
            if shape not in shapes:
                shapes.append(shape)
        elif a is True:
            shapes.append("causal")
    return ", ".join(shapes)


def compare(out, ref: torch.Tensor, dtype: str) -> dict:
    """Relative and max error against float64, and the first element that is wrong (or the worst one)."""
    tol = bench.TOLERANCE[dtype]
    if not isinstance(out, torch.Tensor):
        return {"passed": False, "message": "the function returned no tensor", "shape": list(ref.shape)}
    if tuple(out.shape) != tuple(ref.shape):
        return {"passed": False, "message": f"output shape {tuple(out.shape)}, expected {tuple(ref.shape)}",
                "shape": list(ref.shape)}
    out64, ref64 = out.detach().double(), ref.detach().double()
    rel = bench.rel_error(out64, ref64)
    diff = (out64 - ref64).abs()
    finite = torch.isfinite(out64)
    scale = ref64.abs().mean().item() or 1.0
    wrong = ~finite | (diff > 10 * tol * (ref64.abs() + scale))  # far off for this dtype, element by element
    result = {"passed": rel <= tol, "rel_error": rel, "tolerance": tol,
              "max_abs_error": float(diff[finite].max()) if finite.any() else float("inf"),
              "shape": list(ref.shape)}
    if not result["passed"]:
        flat = wrong.flatten().nonzero()
        i = int(flat[0]) if len(flat) else int(torch.nan_to_num(diff, nan=math.inf).flatten().argmax())
        index = [int(v) for v in torch.unravel_index(torch.tensor(i), tuple(ref.shape))]
        result.update({"first_wrong_index": index, "got": float(out64.flatten()[i]),
                       "expected": float(ref64.flatten()[i]),
                       "wrong_elements": int(wrong.sum()), "elements": ref.numel()})
    return result


def describe_check(case: dict) -> str:
    shape = case.get("case") or "x".join(map(str, case.get("shape", []))) or "?"
    if case.get("passed"):
        return f"{shape}: correct (relative error {case['rel_error']:.2g}, max abs error {case['max_abs_error']:.2g})"
    if "first_wrong_index" not in case:
        return f"{shape}: wrong: {case.get('message', '')}"
    return (f"{shape}: wrong: relative error {case['rel_error']:.3g} > {case['tolerance']:g}; first wrong element "
            f"at index {tuple(case['first_wrong_index'])}: got {case['got']:.6g}, expected {case['expected']:.6g} "
            f"({case['wrong_elements']} of {case['elements']} elements wrong)")


# ---------------------------------------------------------------------------------------------
# Performance: our kernel, the library, the model, and the gap
# ---------------------------------------------------------------------------------------------
def reference_figures(ex: Exercise, point: Point, target) -> dict:
    """Our kernel's and the library's achieved rate at this point: timed here on a GPU (once per process),
    else the committed lab recordings. Values: (rate, where it comes from)."""
    if target is None or not target.live:
        return ex.recorded(point)
    key = (ex.name, point.label, target.key)
    if key not in _REFERENCE_TIMINGS:
        figures = {}
        for who, build in (("ours", ex.ours), ("library", ex.library)):
            try:
                fn, nbytes, flops = build(point)
                ms = bench.time_ms(fn)
                figures[who] = (rate(ex.metric, nbytes, flops, ms), f"{target.name}, measured now ({ex.lab} lab)")
                del fn
            except Exception as exc:  # noqa: BLE001 - a missing compiler must not cost the learner the verdict
                recorded = ex.recorded(point).get(who)
                figures[who] = recorded or (None, f"could not run: {exc}")
        _REFERENCE_TIMINGS[key] = figures
    return _REFERENCE_TIMINGS[key]


def slow_reason(ex: Exercise) -> str:
    """The lesson's 'When it is slow' section: why a kernel of this exercise usually misses the model."""
    match = re.search(r"^## When it is slow\s*\n(.*?)(?=^## |\Z)", ex.lesson(), re.S | re.M)
    return " ".join(match.group(1).split()) if match else ""


def gap_sentence(ex: Exercise, measured_ms: float, work: dict, ours: Optional[float], target) -> str:
    """One or two sentences that name the gap between this kernel and the model (and our kernel)."""
    unit = UNITS[ex.metric]
    achieved = rate(ex.metric, work["bytes"], work["flops"], measured_ms)
    predicted = rate(ex.metric, work["bytes"], work["flops"], work["predicted_ms"])
    vs_ours = f" That is {achieved / ours:.2f}x our kernel." if ours else ""
    reason = slow_reason(ex)
    if ours and achieved >= AS_FAST_AS_OURS * ours:  # the gap is the lab kernel's too: not this code's fault
        reason = (f"Our kernel misses the model by as much: the {ex.lab} lab explains that gap "
                  f"(ceilings {target.ceilings.source}).")
    if ex.metric == "tbps":
        times = measured_ms / work["predicted_ms"]
        if times <= 1 / NEAR_MODEL:
            return (f"At the byte floor: {achieved:.2f} {unit}, {100 / times:.0f}% of the model's {predicted:.2f} "
                    f"{unit} ({target.ceilings.copy_tbps:.2f} TB/s copy).{vs_ours}")
        return (f"Takes {times:.1f}x the model's time, as if it moved {times:.1f}x the {work['bytes'] / 1e6:.0f} MB "
                f"the model counts: {achieved:.2f} {unit} against {predicted:.2f}.{vs_ours} {reason}")
    share = achieved / predicted
    if share >= NEAR_MODEL:
        return f"At the model: {achieved:.0f} {unit}, {100 * share:.0f}% of its {predicted:.0f} {unit}.{vs_ours}"
    return (f"Reaches {100 * share:.0f}% of the model's {predicted:.0f} {unit} ({achieved:.0f} {unit}).{vs_ours} "
            f"{reason}")


def point_rows(ex: Exercise, target, timings: dict) -> list[dict]:
    """One row per timing point: model, measurement (when timed), our kernel, the library, the gap."""
    rows = []
    for point in ex.points:
        work = ex.work(point, target)
        figures = reference_figures(ex, point, target)
        ours, ours_from = figures.get("ours", (None, "no recording"))
        library, library_from = figures.get("library", (None, "no recording"))
        row = {"point": point.label, "bytes": work["bytes"], "flops": work["flops"],
               "intensity_flop_per_byte": work["flops"] / work["bytes"] if work["bytes"] else None,
               "predicted_ms": work["predicted_ms"],
               f"predicted_{ex.metric}": rate(ex.metric, work["bytes"], work["flops"], work["predicted_ms"]),
               "model": work["model"], f"ours_{ex.metric}": ours, "ours_source": ours_from,
               f"library_{ex.metric}": library, "library_source": library_from, "library": ex.library_name}
        ms = timings.get(point.label)
        if ms is not None:
            row.update({"measured_ms": ms, f"measured_{ex.metric}": rate(ex.metric, work["bytes"], work["flops"], ms),
                        "gap": gap_sentence(ex, ms, work, ours, target)})
            row["error_pct"] = 100 * (row[f"measured_{ex.metric}"] / row[f"predicted_{ex.metric}"] - 1)
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# A submission
# ---------------------------------------------------------------------------------------------
def limits_for(gpu: bool) -> sandbox.Limits:
    if not gpu:
        return sandbox.Limits(wall_s=120, cpu_s=120)
    total = torch.cuda.mem_get_info()[1]
    fraction = max(0.05, min(0.9, 0.85 * gpu_mod.free_memory_bytes() / total))
    return sandbox.Limits(wall_s=240, cpu_s=240, memory_bytes=16 * 2**30, gpu_memory_fraction=fraction)


def model_target(name: Optional[str] = None):
    """Without a GPU: the datasheet GPU to model, by default the first one with committed recordings
    (so the model, our kernel and the library describe the same GPU)."""
    names = [row.name for row in gpu_mod.DATASHEET]
    if name not in names:
        name = None
    if name is None:
        keys = gpu_mod.recorded_gpu_keys()
        sheet = gpu_mod.datasheet_for(keys[0].replace("-", " ")) if keys else None
        name = sheet.name if sheet else "H100 SXM"
    return gpu_mod.datasheet_target(gpu_mod.datasheet_by_name(name))


def recorded_gpu(ex: Exercise) -> Optional[str]:
    """The datasheet name of the GPU whose recording of the exercise's lab stands in for our kernel and the
    library without a GPU: the model then describes that same GPU."""
    from labs.results import list_recorded

    for result in list_recorded(ex.lab):
        sheet = gpu_mod.datasheet_for(result.meta.get("gpu", {}).get("name", ""))
        if sheet:
            return sheet.name
    return None


def verdict_target(v: dict):
    """The GPU a verdict's model describes: the attached one for a live run, else the named datasheet GPU."""
    return (gpu_mod.live_target() if v.get("gpu") else None) or model_target(v.get("model_gpu"))


def protections() -> list[str]:
    return [name for name, active, _ in sandbox.capabilities().lines() if active]


def submit(ex: Exercise, code: str, progress: Callable[[float, str], None] = noop_progress,
           on_wait: Optional[Callable[[int], None]] = None, static_check: bool = True,
           limits: Optional[sandbox.Limits] = None) -> dict:
    """Check (and on a GPU, time) the learner's code for one exercise. Never raises for the learner's faults."""
    code = code.encode("utf-8", "replace").decode("utf-8")  # lone surrogates from a browser cannot be written
    info = gpu_mod.detect()
    gpu = info.available
    target = gpu_mod.live_target() if gpu else model_target(recorded_gpu(ex))
    verdict = {"exercise": ex.name, "metric": ex.metric, "unit": UNITS[ex.metric], "gpu": info.name if gpu else None,
               "model_gpu": target.name, "sandbox": protections(), "checks": [], "points": [], "notes": []}
    problems = sandbox.static_problems(code) if static_check else []
    if problems:
        return verdict | {"status": "refused", "message": "Not run: " + " ".join(problems)}
    cases = ex.check_cases(gpu)
    job = {"entry": ex.entry, "gpu": gpu,
           "points": [{"label": p.label, "args": list(p.args)} for p in ex.points] if gpu else []}
    progress(0.1, "waiting for the GPU lock, then starting the sandbox")
    with runner.gpu_session(f"workbench:{ex.name}", on_wait):
        progress(0.2, "running your code in the sandbox" + (" (check, then timing)" if gpu else " (check)"))
        run = sandbox.run_worker(code, job, {"cases": [list(c) for c in cases]}, limits or limits_for(gpu), gpu)
        if run.status == "ok" and gpu:
            progress(0.8, "timing our kernel and the library at the same size")
            rows = point_rows(ex, target, {t["label"]: t["ms"] for t in run.result.get("timings", [])})
    verdict["seconds"] = round(run.seconds, 2)
    if run.status != "ok":
        message = run.message or "The worker stopped."
        if run.status == "crashed" and run.stderr_tail.strip():
            message += " Last lines it printed:\n" + "\n".join(run.stderr_tail.strip().splitlines()[-6:])
        return verdict | {"status": run.status if run.status != "ok" else "error", "message": message}
    outputs = run.outputs.get("outputs", [])
    for args, out in zip(cases, outputs):
        verdict["checks"].append({"case": case_label(args)} | compare(out, ex.reference(*args), ex.dtype))
    correct = len(verdict["checks"]) == len(cases) and all(c["passed"] for c in verdict["checks"])
    verdict["status"] = "correct" if correct else "wrong"
    verdict["device"] = run.result.get("device", "")
    if not correct:
        bad = next((c for c in verdict["checks"] if not c["passed"]), {"message": "missing outputs"})
        verdict["message"] = "Wrong: " + describe_check(bad)
        # the model (and our kernel) still say what to aim for; a wrong kernel's time is not shown
        verdict["points"] = [{k: val for k, val in r.items() if not k.startswith("measured_")
                              and k not in ("gap", "error_pct")} for r in rows] if gpu else point_rows(ex, target, {})
        return verdict
    verdict["message"] = "Correct on every check case (" + "; ".join(c["case"] for c in verdict["checks"]) + ")."
    if gpu:
        verdict["points"] = rows
    else:
        verdict["points"] = point_rows(ex, target, {})
        verdict["notes"].append(f"Timing needs a GPU ({info.reason}); the check ran in Triton's interpreter on small "
                                f"shapes. Beside the model for the {target.name}: our kernel and the library as "
                                "recorded on a real GPU.")
    return verdict


# ---------------------------------------------------------------------------------------------
# Recordings: a verdict as a Result (content/recorded/<gpu>/workbench-<exercise>.json)
# ---------------------------------------------------------------------------------------------
def to_result(v: dict, source: str):
    """The verdict of a live GPU run as a Result: one row per timing point, the gap sentences as messages."""
    from labs.results import Result, run_metadata

    info = gpu_mod.detect()
    meta = run_metadata("live" if v.get("gpu") else "model", info if info.available else None,
                         gpu_mod.live_target() or model_target())
    meta |= {"sandbox": v.get("sandbox", []), "status": v.get("status"), "source_file": source,
             "checks": [{k: c.get(k) for k in ("case", "passed", "rel_error", "max_abs_error")} for c in v["checks"]]}
    rows = [{k: val for k, val in r.items() if k not in ("gap", "model")} for r in v.get("points", [])]
    messages = [v.get("message", "")] + [f"{r['point']}: {r['gap']}" for r in v.get("points", []) if r.get("gap")]
    return Result(f"workbench-{v['exercise']}", {"exercise": v["exercise"], "file": source}, rows, meta, messages,
                  v.get("status") == "correct")


def summary_line(v: dict) -> str:
    """One line per timing point for the CLI and the GPU script."""
    lines = []
    m = v["metric"]
    for r in v.get("points", []) or [{}]:
        you, ours = r.get(f"measured_{m}"), r.get(f"ours_{m}")
        ratio = f"{you / ours:5.2f}x ours" if you and ours else "    -    "
        lines.append(f"{v['exercise']:10s} {v.get('status', ''):8s} {r.get('point', ''):24s} you {_f(you)} "
                     f"ours {_f(ours)} library {_f(r.get(f'library_{m}'))} model {_f(r.get(f'predicted_{m}'))} "
                     f"{v['unit']:7s} {ratio}")
    return "\n".join(lines)


def _f(x) -> str:
    return f"{x:8.3f}" if isinstance(x, (int, float)) and x == x else "       -"
