"""A submission's verdict: checked against float64, timed, placed beside our kernel, the library and the model.

    submit(exercise, code) -> dict     (JSON-ready; the page, the CLI and recordings all use it)

The learner's code runs only in the sandboxed worker (labs.workbench.sandbox). This process makes the
check inputs, computes the float64 references and compares; on a GPU it also times the lab's own kernel
and the vendor library at the same point (once per process: they do not change between submissions).
The worker's run and those timings happen inside `runner.gpu_session`, so no two timings ever overlap.

Where Nsight Compute (ncu) is installed and the driver lets the sandbox's user read the GPU's counters, a
correct kernel is launched once more in the same sandbox folder, as the same user, with ncu wrapping the
worker: the DRAM bytes it read and wrote are shown beside the bytes the model counts, and their ratio
goes into the sentence that names the gap. Where counters cannot be read, the verdict says why.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Callable, Optional

import torch

from labs.engine import timing
from labs.engine import runner
from labs.engine import gpu as gpu_mod
from labs.engine.lab import noop_progress
from labs.workbench import sandbox
from labs.workbench.exercises import Exercise, Point, rate

UNITS = {"tbps": "TB/s", "tflops": "TFLOP/s"}
NEAR_MODEL = 0.85  # at or above this fraction of the model's rate the verdict says "at the model"
AS_FAST_AS_OURS = 0.9  # at or above this fraction of our kernel's rate the gap is not blamed on the code
_REFERENCE_TIMINGS: dict = {}  # (exercise, point, gpu key) -> {"ours": ..., "library": ...}
BYTES_FAR_OFF = 1.25  # measured / model DRAM bytes at or above this: the extra bytes are the gap's cause


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
    tol = timing.TOLERANCE[dtype]
    if not isinstance(out, torch.Tensor):
        return {"passed": False, "message": "the function returned no tensor", "shape": list(ref.shape)}
    if tuple(out.shape) != tuple(ref.shape):
        return {"passed": False, "message": f"output shape {tuple(out.shape)}, expected {tuple(ref.shape)}",
                "shape": list(ref.shape)}
    out64, ref64 = out.detach().double(), ref.detach().double()
    rel = timing.rel_error(out64, ref64)
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
    """One check case in plain sentences: "The 1003 case is wrong: ... at index 1000: got 0, expected 1.5." """
    shape = case.get("case") or "x".join(map(str, case.get("shape", []))) or "?"
    if case.get("passed"):
        return f"{shape}: correct, relative error {case['rel_error']:.2g}, largest absolute error {case['max_abs_error']:.2g}."
    if "first_wrong_index" not in case:
        return f"The {shape} case is wrong: {case.get('message', 'no output')}."
    index = ", ".join(map(str, case["first_wrong_index"]))  # [1000] -> 1000, [1, 2] -> 1, 2: never (1000,)
    return (f"The {shape} case is wrong: its relative error {case['rel_error']:.3g} is above the tolerance "
            f"{case['tolerance']:g}. The first wrong element is at index {index}: got {case['got']:.6g}, expected "
            f"{case['expected']:.6g}. {case['wrong_elements']} of {case['elements']} elements are wrong.")


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
                ms = timing.time_ms(fn)
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


def counted_clause(dram_ratio: Optional[float]) -> str:
    """' The GPU's counters: 1.02x the bytes the model counts.' (empty without counters)."""
    return "" if dram_ratio is None else f" The GPU's counters: {dram_ratio:.2f}x the DRAM bytes the model counts."


def gap_sentence(ex: Exercise, measured_ms: float, work: dict, ours: Optional[float], target,
                 dram_ratio: Optional[float] = None) -> str:
    """One or two sentences that name the gap between this kernel and the model (and our kernel).
    `dram_ratio`: DRAM bytes measured by the GPU's counters over the bytes the model counts, if measured."""
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
                    f"{unit} ({target.ceilings.copy_tbps:.2f} TB/s copy).{vs_ours}{counted_clause(dram_ratio)}")
        if dram_ratio is None:
            return (f"Takes {times:.1f}x the model's time, as if it moved {times:.1f}x the {work['bytes'] / 1e6:.0f} MB "
                    f"the model counts: {achieved:.2f} {unit} against {predicted:.2f}.{vs_ours} {reason}")
        if dram_ratio >= BYTES_FAR_OFF:
            return (f"Moves {dram_ratio:.1f}x the bytes the model counts (measured by the GPU's counters) and takes "
                    f"{times:.1f}x its time: {achieved:.2f} {unit} against {predicted:.2f}.{vs_ours} {reason}")
        return (f"Takes {times:.1f}x the model's time, yet moves only {dram_ratio:.2f}x the bytes it counts (measured "
                f"by the GPU's counters): the time goes elsewhere than DRAM traffic. {achieved:.2f} {unit} against "
                f"{predicted:.2f}.{vs_ours} {reason}")
    share = achieved / predicted
    if share >= NEAR_MODEL:
        return (f"At the model: {achieved:.0f} {unit}, {100 * share:.0f}% of its {predicted:.0f} {unit}.{vs_ours}"
                f"{counted_clause(dram_ratio)}")
    if dram_ratio is not None and dram_ratio >= BYTES_FAR_OFF:
        return (f"Reaches {100 * share:.0f}% of the model's {predicted:.0f} {unit} ({achieved:.0f} {unit}) and moves "
                f"{dram_ratio:.1f}x the bytes the model counts (measured by the GPU's counters).{vs_ours} {reason}")
    return (f"Reaches {100 * share:.0f}% of the model's {predicted:.0f} {unit} ({achieved:.0f} {unit}).{vs_ours}"
            f"{counted_clause(dram_ratio)} {reason}")


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
# Measured DRAM bytes: one more launch of the learner's kernel under Nsight Compute, in the sandbox
# ---------------------------------------------------------------------------------------------
COUNTER_LOG = "counters.csv"  # ncu's CSV, written in the run's folder
NO_NCU = ("Nsight Compute (ncu) was not found on this server: measured DRAM bytes need it (it ships with the "
          "CUDA toolkit; ROOFLINE_NCU can name the binary).")
_COUNTERS_REFUSED: dict = {}  # {"reason": ...} once the driver refused counters: it will again, so do not retry


def counters_unavailable(gpu: bool) -> str:
    """'' when the learner's kernel can be counted here, else why not (starts no process)."""
    from labs.engine import counters

    if os.environ.get("ROOFLINE_WORKBENCH_COUNTERS") == "0":
        return "Measured DRAM bytes are turned off on this server (ROOFLINE_WORKBENCH_COUNTERS=0)."
    if not gpu:
        return "Measured DRAM bytes need a GPU and Nsight Compute (ncu)."
    if counters.ncu_path() is None:
        return NO_NCU
    return _COUNTERS_REFUSED.get("reason", "")


def count_limits(limits: sandbox.Limits) -> sandbox.Limits:
    """ncu runs inside the fence beside the worker: more files and threads, and time for its replays."""
    return dataclasses.replace(limits, open_files=max(limits.open_files, 4096),
                               processes=max(limits.processes, 4096), wall_s=max(limits.wall_s, 180))


def counted_points(run: sandbox.WorkerRun, labels: list[str]) -> dict:
    """{point label: counted quantities (dram_bytes, dram_read_bytes, ...)} from a counted run's ncu CSV.
    Raises CountersUnavailable with ncu's own reason when it gave no counters."""
    from labs.engine import counters

    log = run.files.get(COUNTER_LOG, "")
    kernels = counters.parse_csv(log)
    problem = counters.ncu_failure(run.returncode or 0, run.stderr_tail + "\n" + log)
    if run.status != "ok":  # the counted launches did not all run: their counters would mislead
        stopped = (run.message or "the worker stopped").strip().splitlines()
        raise counters.CountersUnavailable(" ".join(filter(None, [problem, f"The counted run stopped: {stopped[0]}",
                                                                  stopped[-1] if len(stopped) > 1 else ""])))
    if not kernels:
        raise counters.CountersUnavailable(problem or "Nsight Compute returned no counters.")
    per_point = counters.split_points(kernels, labels)
    return {label: counters.counted_quantities(counters.totals(ks), len(ks)) for label, ks in per_point.items()}


def count_dram(code: str, entry: str, points: list[dict], limits: sandbox.Limits, gpu: bool,
               reuse: Optional[sandbox.WorkerRun] = None) -> dict:
    """Launch `entry` once per point under ncu, inside the sandbox (in `reuse`'s folder, as its user, when
    given), and return counted_points(). The caller holds the GPU lock (runner.gpu_session)."""
    from labs.engine import counters

    ncu = counters.ncu_path()
    if ncu is None:
        raise counters.CountersUnavailable(NO_NCU)
    metrics = counters.metric_names(("dram",))

    def under_ncu(work) -> list:
        return counters.ncu_command(ncu, metrics, str(work / COUNTER_LOG), [], counters.NVTX_RANGE)

    job = {"entry": entry, "gpu": gpu, "mode": "count", "points": points}
    run = sandbox.run_worker(code, job, {}, count_limits(limits), gpu, reuse=reuse, wrapper=under_ncu,
                             collect=(COUNTER_LOG,))
    return counted_points(run, [p["label"] for p in points])


def attach_counted(row: dict, counted: Optional[dict], ex: Exercise, target) -> None:
    """Measured DRAM bytes beside the model's in a point's row, and the gap sentence told with their ratio."""
    if not counted or counted.get("dram_bytes") is None or not row.get("bytes"):
        return
    row.update({"counted_dram_bytes": counted["dram_bytes"], "counted_dram_read_bytes": counted["dram_read_bytes"],
                "counted_dram_write_bytes": counted["dram_write_bytes"], "counted_kernels": counted["kernels"],
                "dram_bytes_ratio": counted["dram_bytes"] / row["bytes"]})
    if row.get("measured_ms"):
        work = {k: row[k] for k in ("bytes", "flops", "predicted_ms")}
        row["gap"] = gap_sentence(ex, row["measured_ms"], work, row.get(f"ours_{ex.metric}"), target,
                                  row["dram_bytes_ratio"])


def _no_counters(verdict: dict, reason: str) -> None:
    verdict["counters"] = {"status": "unavailable", "message": reason}
    verdict["notes"].append(f"DRAM bytes not measured: {reason}")


def add_counters(verdict: dict, ex: Exercise, code: str, run: sandbox.WorkerRun, target, limits: sandbox.Limits,
                 on_wait=None, progress: Callable[[float, str], None] = noop_progress) -> None:
    """Count a correct kernel's DRAM bytes (GPU lock held) and put them in the verdict; say why not otherwise."""
    from labs.engine import counters

    reason = counters_unavailable(True)
    if not reason:
        progress(0.9, "counting your kernel's DRAM bytes under Nsight Compute (one more launch, in the sandbox)")
        points = [{"label": p.label, "args": list(p.args)} for p in ex.points]
        try:
            with runner.gpu_session(f"workbench-count:{ex.name}", on_wait):
                counted = count_dram(code, ex.entry, points, limits, True, reuse=run)
        except counters.CountersUnavailable as exc:
            reason = str(exc)
            if counters.PERMISSION_HELP in reason:
                _COUNTERS_REFUSED["reason"] = reason
        except Exception as exc:  # noqa: BLE001 - measured bytes are an extra: they never cost the verdict
            reason = f"the counted run failed ({type(exc).__name__}: {exc})."
    if reason:
        return _no_counters(verdict, reason)
    for row in verdict["points"]:
        attach_counted(row, counted.get(row["point"]), ex, target)
    missing = [r["point"] for r in verdict["points"] if r.get("counted_dram_bytes") is None]
    if len(missing) == len(verdict["points"]):
        return _no_counters(verdict, "Nsight Compute counted no launch of your kernel between the markers.")
    verdict["counters"] = {"status": "measured" if not missing else "partial", "tool": "Nsight Compute (ncu)",
                           "message": "DRAM bytes read + written, measured by the GPU's counters (Nsight Compute) "
                                      "on one more launch of your kernel in the same sandbox."
                                      + (f" No counters came back for {', '.join(missing)}." if missing else "")}


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
    """Without a GPU: the datasheet GPU to model; by default the labs' selector's first choice, the first
    datasheet row with committed recordings (the H100 SXM), so the workbench and the labs model one GPU."""
    names = [row.name for row in gpu_mod.DATASHEET]
    if name not in names:
        recorded = {gpu_mod.datasheet_for(k.replace("-", " ")) for k in gpu_mod.recorded_gpu_keys()}
        name = next((row.name for row in gpu_mod.DATASHEET if row in recorded), "H100 SXM")
    return gpu_mod.datasheet_target(gpu_mod.datasheet_by_name(name))


def recorded_gpu(ex: Exercise) -> Optional[str]:
    """The datasheet name of the GPU whose recording of the exercise's lab stands in for our kernel and the
    library without a GPU: the model then describes that same GPU."""
    from labs.engine.results import list_recorded

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
           limits: Optional[sandbox.Limits] = None, counters: bool = True, model_gpu: Optional[str] = None) -> dict:
    """Check (and on a GPU, time) the learner's code for one exercise. Never raises for the learner's faults.
    counters: also measure a correct kernel's DRAM bytes where Nsight Compute can read the GPU's counters.
    model_gpu: without a GPU, the datasheet GPU to model (the labs' selector; default: model_target's)."""
    code = code.encode("utf-8", "replace").decode("utf-8")  # lone surrogates from a browser cannot be written
    info = gpu_mod.detect()
    gpu = info.available
    target = gpu_mod.live_target() if gpu else model_target(model_gpu)
    verdict = {"exercise": ex.name, "metric": ex.metric, "unit": UNITS[ex.metric], "gpu": info.name if gpu else None,
               "model_gpu": target.name, "sandbox": protections(), "checks": [], "points": [], "notes": []}
    problems = sandbox.static_problems(code) if static_check else []
    if problems:
        return verdict | {"status": "refused", "message": "Not run: " + " ".join(problems)}
    cases = ex.check_cases(gpu)
    job = {"entry": ex.entry, "gpu": gpu,
           "points": [{"label": p.label, "args": list(p.args)} for p in ex.points] if gpu else []}
    limits = limits or limits_for(gpu)
    progress(0.1, "waiting for the GPU lock, then starting the sandbox")
    with runner.gpu_session(f"workbench:{ex.name}", on_wait):
        progress(0.2, "running your code in the sandbox" + (" (check, then timing)" if gpu else " (check)"))
        # on a GPU the run's folder stays for the counted launch (its Triton cache saves the compilation)
        run = sandbox.run_worker(code, job, {"cases": [list(c) for c in cases]}, limits, gpu, keep_dir=gpu)
        if run.status == "ok" and gpu:
            progress(0.8, "timing our kernel and the library at the same size")
            rows = point_rows(ex, target, {t["label"]: t["ms"] for t in run.result.get("timings", [])})
    try:
        return _finish(verdict, ex, code, run, cases, rows if run.status == "ok" and gpu else [], target, info,
                       limits, on_wait, progress, counters)
    finally:
        sandbox.discard(run)


def _finish(verdict: dict, ex: Exercise, code: str, run: sandbox.WorkerRun, cases: list, rows: list, target, info,
            limits: sandbox.Limits, on_wait, progress, counters: bool) -> dict:
    """The verdict from the worker's run: its checks against float64, then (correct, on a GPU) its points."""
    gpu = info.available
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
        verdict["message"] = describe_check(bad)
        # the model (and our kernel) still say what to aim for; a wrong kernel's time is not shown
        verdict["points"] = [{k: val for k, val in r.items() if not k.startswith("measured_")
                              and k not in ("gap", "error_pct")} for r in rows] if gpu else point_rows(ex, target, {})
        return verdict
    verdict["message"] = "Correct on every check case (" + "; ".join(c["case"] for c in verdict["checks"]) + ")."
    if gpu:
        verdict["points"] = rows
        if counters:
            add_counters(verdict, ex, code, run, target, limits, on_wait, progress)
    else:
        verdict["points"] = point_rows(ex, target, {})
        from labs.workbench import interpret  # what the kernel does, counted in the interpreter, and its model time

        interpret.attach(verdict, ex, code, target)
        verdict["notes"].append(f"Timing needs a GPU, and this machine has none. The check ran in Triton's interpreter "
                                f"on small shapes. Beside the model for the {target.name} are our kernel and the "
                                f"library as recorded on a real GPU. {counters_unavailable(False)}")
        verdict["counters"] = {"status": "unavailable", "message": counters_unavailable(False)}
    return verdict


# ---------------------------------------------------------------------------------------------
# Recordings: a verdict as a Result (content/recorded/<gpu>/workbench-<exercise>.json)
# ---------------------------------------------------------------------------------------------
def to_result(v: dict, source: str):
    """The verdict of a live GPU run as a Result: one row per timing point, the gap sentences as messages."""
    from labs.engine.results import Result, run_metadata

    info = gpu_mod.detect()
    meta = run_metadata("live" if v.get("gpu") else "model", info if info.available else None,
                         gpu_mod.live_target() or model_target())
    meta |= {"sandbox": v.get("sandbox", []), "status": v.get("status"), "source_file": source,
             "counters": v.get("counters", {}),
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
        dram = r.get("dram_bytes_ratio")
        lines.append(f"{v['exercise']:10s} {v.get('status', ''):8s} {r.get('point', ''):24s} you {_f(you)} "
                     f"ours {_f(ours)} library {_f(r.get(f'library_{m}'))} model {_f(r.get(f'predicted_{m}'))} "
                     f"{v['unit']:7s} {ratio}" + (f"  DRAM bytes {dram:.2f}x model" if dram else ""))
    return "\n".join(lines)


def _f(x) -> str:
    return f"{x:8.3f}" if isinstance(x, (int, float)) and x == x else "       -"
