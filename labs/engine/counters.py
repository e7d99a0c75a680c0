"""
Hardware counters beside the model: what the GPU itself says it moved
=====================================================================

Every lab predicts bytes, sectors, FLOPs. Nsight Compute (`ncu`, shipped with the CUDA toolkit) reads
the GPU's hardware counters for each kernel, so the model's bytes can be put beside the counted bytes.

How one count works:
1. the parent (the app or the CLI) takes the runner's GPU lock and starts a child process under
   `ncu --csv --clock-control none --metrics ...`;
2. the child (`python -m labs.engine.counters child LAB PARAMS POINTS`) builds each point's inputs, runs the
   point's kernels once to compile them, then runs them again between two tiny marker kernels
   inside an NVTX range, so ncu profiles only those and the parser knows which kernels belong to
   which point;
3. the parent parses ncu's CSV, sums each point's counters and puts them beside the lab's model.

Where `ncu` is missing or the driver does not let this user read counters (ERR_NVGPUCTRPERM), a
`CountersUnavailable` says so plainly; the rest of the app carries on without counters.

The file reads: the metric sets -> ncu's command line and its CSV -> the per-lab adapters (which
points to count, how to run one, what the lab's model says about it) -> the child -> `count()` and the
recordings (content/recorded/<gpu>/counters/<lab>.json). `profile_command` / `profile_python` count any
program's kernels, for pages that want measured DRAM bytes of a learner's own kernel.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch
import triton
import triton.language as tl

from labs.engine import registry
from labs.engine.params import ParamError

# ---------------------------------------------------------------------------------------------
# The counters we read, grouped in sets (each lab asks for the sets it compares)
# ---------------------------------------------------------------------------------------------
METRIC_SETS = {
    # bytes between the L2 and the HBM (what a byte model predicts) and the kernel's duration
    "dram": ("dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum"),
    # global loads and stores as the L1 sees them: 32-byte sectors and warp-wide requests
    "sectors": ("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
                "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum", "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"),
    # the L2: sectors asked for by the SMs and how many hit
    "l2": ("lts__t_sectors_srcunit_tex_op_read.sum", "lts__t_sector_op_read_hit_rate.pct", "lts__t_sector_hit_rate.pct"),
    # shared memory: wavefronts (one per bank pass) and bank conflicts, loads and stores
    "shared": ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum", "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
               "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
               "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
               "smsp__inst_executed_op_shared_ld.sum", "smsp__inst_executed_op_shared_st.sum"),
    # FP32 arithmetic, counted per thread: an FMA is 2 FLOPs, an add or a multiply 1
    "flops": ("smsp__sass_thread_inst_executed_op_ffma_pred_on.sum", "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum",
              "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum"),
    # how busy the pipes were: tensor cores and the FP32 FMA pipe, % of their peak while the SMs were active; and
    # the SM clock they ran at (a share of cycles becomes a rate only at a clock, and the clock falls under load)
    "pipes": ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
              "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active", "sm__cycles_elapsed.avg.per_second"),
    # occupancy and registers
    "occupancy": ("sm__warps_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread",
                  "launch__occupancy_limit_registers"),
    # divergence: threads active per warp instruction, and how often a branch's threads agreed
    "branch": ("smsp__thread_inst_executed_per_inst_executed.ratio",
               "smsp__sass_average_branch_targets_threads_uniform.pct",
               "smsp__sass_branch_targets_threads_divergent.sum", "smsp__sass_branch_targets.sum"),
}

NCU_CANDIDATES = ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu")
MARK_BEGIN, MARK_END = "roofline_count_begin", "roofline_count_end"  # marker kernels' names
NVTX_RANGE = "roofline_count"  # ncu profiles only the kernels inside this NVTX range
NCU_TIMEOUT_S = float(os.environ.get("ROOFLINE_NCU_TIMEOUT_S", "240"))
ROOT = Path(__file__).resolve().parents[2]  # the repository

PERMISSION_HELP = ("The driver does not let this user read the GPU's performance counters (ERR_NVGPUCTRPERM). "
                   "Run as root, or ask the machine's administrator to load the NVIDIA driver with "
                   "NVreg_RestrictProfilingToAdminUsers=0. Everything else in the app works without counters.")


class CountersUnavailable(Exception):
    """Counters cannot be read here (no ncu, no permission, no GPU, ncu failed): the message says why."""


# ---------------------------------------------------------------------------------------------
# Finding ncu and building its command line
# ---------------------------------------------------------------------------------------------
def ncu_path() -> Optional[str]:
    """The ncu binary: $ROOFLINE_NCU, then the PATH, then the usual install places (None if absent)."""
    configured = os.environ.get("ROOFLINE_NCU")
    if configured:
        return configured if os.path.isfile(configured) and os.access(configured, os.X_OK) else None
    found = shutil.which("ncu")
    if found:
        return found
    return next((p for p in NCU_CANDIDATES if os.path.isfile(p) and os.access(p, os.X_OK)), None)


def why_unavailable() -> str:
    """'' when counting can be tried here, else the reason in words (cheap: starts no process)."""
    from labs.engine import gpu

    info = gpu.detect()
    if not info.available:
        return f"Counting needs a GPU: {info.reason}"
    if ncu_path() is None:
        return ("Nsight Compute (ncu) was not found: it ships with the CUDA toolkit (/usr/local/cuda/bin/ncu). "
                "Install the toolkit or set ROOFLINE_NCU to the ncu binary.")
    return ""


def metric_names(sets) -> list[str]:
    """The metrics of the named sets, in order, without repeats."""
    unknown = [s for s in sets if s not in METRIC_SETS]
    if unknown:
        raise ParamError(f"unknown metric set(s) {', '.join(unknown)}; choose from {', '.join(METRIC_SETS)}.")
    return list(dict.fromkeys(m for s in sets for m in METRIC_SETS[s]))


def ncu_command(ncu: str, metrics: list[str], log_file: str, argv: list[str], nvtx_range: Optional[str]) -> list[str]:
    """ncu leaves the clocks alone (the lab's timings run at the same clocks), writes CSV to log_file."""
    cmd = [ncu, "--csv", "--print-units", "base", "--clock-control", "none", "--metrics", ",".join(metrics),
           "--log-file", log_file, "--target-processes", "all"]
    if nvtx_range:
        cmd += ["--nvtx", "--nvtx-include", f"{nvtx_range}/"]
    return cmd + argv


# ---------------------------------------------------------------------------------------------
# Parsing ncu's CSV
# ---------------------------------------------------------------------------------------------
UNIT_SCALE = {"": 1, "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
              "KB": 1e3, "MB": 1e6, "GB": 1e9, "sector": 1, "Ksector": 1e3, "Msector": 1e6, "Gsector": 1e9,
              "nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9, "ns": 1, "us": 1e3, "ms": 1e6,
              "inst": 1, "Kinst": 1e3, "Minst": 1e6, "Ginst": 1e9, "%": 1, "register/thread": 1,
              "cycle": 1, "Kcycle": 1e3, "Mcycle": 1e6, "block": 1, "warp": 1, "request": 1, "Krequest": 1e3,
              "Mrequest": 1e6, "Grequest": 1e9,
              # frequencies in hertz
              "cycle/second": 1, "cycle/msecond": 1e3, "cycle/usecond": 1e6, "cycle/nsecond": 1e9,
              "hz": 1, "Khz": 1e3, "Mhz": 1e6, "Ghz": 1e9, "Hz": 1, "KHz": 1e3, "MHz": 1e6, "GHz": 1e9}


@dataclass
class Kernel:
    """One profiled kernel launch: its name and the metrics read for it (bytes, ns, counts, %)."""

    index: int  # ncu's launch ID, in launch order
    name: str
    metrics: dict = field(default_factory=dict)


def parse_value(text: str, unit: str = ""):
    """A metric's value in base units: '1,234.5' -> 1234.5; 'n/a' -> None; Kbyte etc. scaled."""
    text = (text or "").strip().replace(",", "")
    if text in ("", "n/a", "N/A"):
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value * UNIT_SCALE.get(unit.strip(), 1)


def _csv_body(text: str) -> str:
    """ncu's log mixes '==PROF==' and '==WARNING==' lines with the CSV: keep the CSV, from its header on."""
    lines = [line for line in text.splitlines() if not line.startswith("==")]
    for i, line in enumerate(lines):
        if line.startswith('"ID"'):
            return "\n".join(lines[i:])
    return ""


def parse_csv(text: str) -> list[Kernel]:
    """Kernels in launch order from ncu's default ('details') CSV: one line per kernel and metric."""
    kernels: dict = {}
    for row in csv.DictReader(io.StringIO(_csv_body(text))):
        try:
            index = int(row["ID"])
        except (KeyError, TypeError, ValueError):
            continue
        kernel = kernels.setdefault(index, Kernel(index, row.get("Kernel Name", "")))
        name = row.get("Metric Name")
        if name:
            kernel.metrics[name] = parse_value(row.get("Metric Value", ""), row.get("Metric Unit", ""))
    return [kernels[i] for i in sorted(kernels)]


def split_points(kernels: list[Kernel], labels: list[str]) -> dict:
    """{label: [kernels]}: the kernels between the i-th begin marker and the next end marker are point i's."""
    points, current, i = {}, None, 0
    for k in kernels:
        if MARK_BEGIN in k.name:
            current = []
        elif MARK_END in k.name:
            if current and i < len(labels):  # an empty pair is a warm-up of the markers, not a point
                points[labels[i]] = current
                i += 1
            current = None
        elif current is not None:
            current.append(k)
    return points


def totals(kernels: list[Kernel]) -> dict:
    """One point's counters: sums add up over its kernels; rates (%, ratios) and per-launch figures are
    averaged over the kernels, weighted by each kernel's duration (the time it held the GPU)."""
    out: dict = {}
    weights = [k.metrics.get("gpu__time_duration.sum") or 1.0 for k in kernels]
    for name in dict.fromkeys(m for k in kernels for m in k.metrics):
        pairs = [(k.metrics.get(name), w) for k, w in zip(kernels, weights) if k.metrics.get(name) is not None]
        if not pairs:
            out[name] = None
        elif name.endswith(".sum") and not name.startswith("launch__"):
            out[name] = sum(v for v, _ in pairs)
        else:
            out[name] = sum(v * w for v, w in pairs) / sum(w for _, w in pairs)
    return out


# ---------------------------------------------------------------------------------------------
# What went wrong, in words
# ---------------------------------------------------------------------------------------------
def ncu_failure(returncode: int, output: str) -> Optional[str]:
    """None if ncu's output looks like a profile, else a plain reason."""
    if "ERR_NVGPUCTRPERM" in output:
        return PERMISSION_HELP
    errors = [line for line in output.splitlines() if line.startswith("==ERROR==")]
    if errors:
        return "Nsight Compute failed: " + " ".join(e.replace("==ERROR==", "").strip() for e in errors[:3])
    if "No kernels were profiled" in output:
        return "Nsight Compute profiled no kernels (the point's kernels did not run inside the counted range)."
    if returncode != 0:
        tail = " | ".join(output.strip().splitlines()[-3:])
        return f"The counted run exited with status {returncode}: {tail}"
    return None


# ---------------------------------------------------------------------------------------------
# Running a command under ncu (public: other pages can count a learner's own program)
# ---------------------------------------------------------------------------------------------
def profile_command(argv: list[str], sets=("dram",), metrics: Optional[list[str]] = None,
                    nvtx_range: Optional[str] = None, timeout_s: float = NCU_TIMEOUT_S,
                    env: Optional[dict] = None, keep_log: Optional[str] = None) -> tuple:
    """Run `argv` under ncu and return (kernels, the command's own output).

    `sets` name groups of METRIC_SETS (or pass `metrics` by name). Raises CountersUnavailable with a
    plain reason when ncu is missing, counters are not permitted or the run fails. The caller holds the
    GPU lock (runner.gpu_session) while this runs: ncu replays each kernel several times.
    """
    ncu = ncu_path()
    if ncu is None:
        raise CountersUnavailable(why_unavailable() or "Nsight Compute (ncu) was not found.")
    names = metrics or metric_names(sets)
    with tempfile.TemporaryDirectory(prefix="roofline-ncu-") as tmp:
        log_file = os.path.join(tmp, "counters.csv")
        cmd = ncu_command(ncu, names, log_file, argv, nvtx_range)
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
                                  env={**os.environ, **(env or {})})
        except subprocess.TimeoutExpired:
            raise CountersUnavailable(f"The counted run took longer than {timeout_s:.0f} s and was stopped. "
                                      "Count fewer or smaller points.") from None
        except OSError as exc:
            raise CountersUnavailable(f"Nsight Compute could not be started: {exc}") from None
        log = Path(log_file).read_text() if os.path.exists(log_file) else ""
    if keep_log:  # the raw CSV, for test data and debugging
        Path(keep_log).write_text(log)
    output = done.stdout + "\n" + done.stderr
    problem = ncu_failure(done.returncode, output + "\n" + log)
    kernels = parse_csv(log)
    if problem and not kernels:
        raise CountersUnavailable(problem)
    if not kernels:
        raise CountersUnavailable("Nsight Compute returned no counters. " + " | ".join(output.strip().splitlines()[-3:]))
    return kernels, done.stdout


def profile_python(script: str, args: list[str] = (), sets=("dram",), metrics: Optional[list[str]] = None,
                   timeout_s: float = NCU_TIMEOUT_S) -> list[dict]:
    """Count the kernels of a Python script (a learner's own kernel, say): one dict per kernel launch with
    its name and metrics, DRAM bytes by default. Needs the GPU lock held by the caller, like profile_command."""
    kernels, _ = profile_command([sys.executable, script, *args], sets, metrics, timeout_s=timeout_s)
    return [{"kernel": k.name, **k.metrics} for k in kernels]


# ---------------------------------------------------------------------------------------------
# Per-lab adapters: which points to count, how to run one point, what the model says about it
# ---------------------------------------------------------------------------------------------
# quantity -> (label, unit); rows compare modelled and counted values of these
QUANTITIES = {
    "dram_bytes": ("DRAM bytes (read + written)", "bytes"),
    "dram_read_bytes": ("DRAM bytes read", "bytes"),
    "dram_write_bytes": ("DRAM bytes written", "bytes"),
    "fp32_flops": ("FP32 FLOPs (2 per FMA)", "FLOP"),
    "load_sectors": ("global-load sectors (32 B)", "sectors"),
    "sectors_per_request": ("sectors per global-load request", "sectors/request"),
    "shared_wavefronts_per_load": ("shared-memory wavefronts per shared load", "wavefronts/instruction"),
    "bank_conflicts": ("shared-memory bank conflicts", "conflicts"),
    "l2_hit_rate_pct": ("L2 hit rate of the SMs' reads", "%"),
    "tensor_pipe_pct": ("tensor-pipe utilisation", "% of peak"),
    "fma_pipe_pct": ("FMA-pipe utilisation", "% of peak"),
    "sm_clock_mhz": ("SM clock while counted", "MHz"),
    "threads_per_warp_instruction": ("active threads per warp instruction", "threads"),
    "branch_uniformity_pct": ("branch efficiency (uniform branches)", "%"),
    "achieved_occupancy_pct": ("achieved occupancy", "% of max warps"),
    "registers_per_thread": ("registers per thread", "registers"),
    "kernels": ("kernels launched", "kernels"),
    "duration_us": ("time under ncu (clocks left alone)", "us"),
}


def counted_quantities(t: dict, n_kernels: int) -> dict:
    """The quantities a learner compares, computed from one point's summed counters (None where not read)."""
    def get(name):
        return t.get(name)

    def ratio(a, b):
        return a / b if a is not None and b else None

    read, write = get("dram__bytes_read.sum"), get("dram__bytes_write.sum")
    ffma, fadd, fmul = (get(f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum") for op in ("ffma", "fadd", "fmul"))
    conflicts = [get(f"l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{op}.sum") for op in ("ld", "st")]
    duration, clock = get("gpu__time_duration.sum"), get("sm__cycles_elapsed.avg.per_second")
    return {
        "dram_bytes": read + write if read is not None and write is not None else None,
        "dram_read_bytes": read, "dram_write_bytes": write,
        "fp32_flops": 2 * ffma + (fadd or 0) + (fmul or 0) if ffma is not None else None,
        "load_sectors": get("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"),
        "sectors_per_request": ratio(get("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"),
                                     get("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum")),
        "shared_wavefronts_per_load": ratio(get("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"),
                                            get("smsp__inst_executed_op_shared_ld.sum")),
        "bank_conflicts": sum(conflicts) if None not in conflicts else None,
        "l2_hit_rate_pct": get("lts__t_sector_op_read_hit_rate.pct"),
        "tensor_pipe_pct": get("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"),
        "fma_pipe_pct": get("sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"),
        "sm_clock_mhz": clock / 1e6 if clock is not None else None,
        "threads_per_warp_instruction": get("smsp__thread_inst_executed_per_inst_executed.ratio"),
        "branch_uniformity_pct": get("smsp__sass_average_branch_targets_threads_uniform.pct"),
        "achieved_occupancy_pct": get("sm__warps_active.avg.pct_of_peak_sustained_active"),
        "registers_per_thread": get("launch__registers_per_thread"),
        "kernels": n_kernels,
        "duration_us": duration / 1e3 if duration is not None else None,
    }


def tensor_pipe_share(tflops: Optional[float], target, dtype: str) -> Optional[float]:
    """A model's tensor-pipe utilisation (%): its TFLOP/s of tensor work over the datasheet's dense peak, which
    assumes the peak's clock (None without a rate or a datasheet row). The labs' adapters compare it with
    sm__pipe_tensor_cycles_active, a share of the cycles at the clock the SMs ran."""
    peak = target.datasheet.matmul_tflops(dtype) if target.datasheet else None
    return 100.0 * tflops / peak if tflops and peak else None


@dataclass(frozen=True)
class Adapter:
    """How to count one lab. `points(params)` gives the row keys counted by default; `prepare(params, point)`
    (in the child, on the GPU) builds the point's inputs and returns a function that launches its kernels;
    `model(params, point, predicted_row, target)` gives the model's value of each compared quantity."""

    sets: tuple
    points: Callable
    prepare: Callable
    model: Callable
    shown: tuple  # quantities compared in the table and chart, in order
    note: str = ""  # what a learner should know when reading the ratio (from content/counters.md otherwise)




def counted_labs() -> list:
    """Names of the labs that hand the engine a counter spec (their LAB.counters)."""
    return [lab.name for lab in registry.all_labs() if lab.counters is not None]


def adapter_for(lab_name: str) -> Adapter:
    """The lab's counter spec: the engine asks the lab; it imports none."""
    spec = registry.get_lab(lab_name).counters
    if spec is None:
        raise ParamError(f"no counter spec for lab {lab_name!r}; counted labs: {', '.join(counted_labs())}.")
    return spec


def has_counters(lab_name: str) -> bool:
    try:
        return adapter_for(lab_name) is not None
    except ParamError:
        return False


def point_label(point: dict) -> str:
    """'dtype=fp32 flops_per_element=64': how a point is named in the child's output and the tables."""
    return " ".join(f"{k}={v}" for k, v in point.items())


# ---------------------------------------------------------------------------------------------
# The child: runs the points' kernels between markers, inside the NVTX range ncu profiles
# ---------------------------------------------------------------------------------------------
@triton.jit
def roofline_count_begin(flag_ptr):
    tl.store(flag_ptr, 1.0)  # does nothing useful: its name in ncu's list opens a point


@triton.jit
def roofline_count_end(flag_ptr):
    tl.store(flag_ptr, 2.0)  # its name closes the point


def child_main(lab_name: str, params_json: str, points_json: str) -> int:
    """Run each point's kernels once to compile them (not profiled), then once between the markers."""
    from labs.engine import params as params_mod

    lab, adapter = registry.get_lab(lab_name), adapter_for(lab_name)
    params = params_mod.from_dict(lab.Params, json.loads(params_json))
    flag = torch.zeros(1, device="cuda")  # the markers compile at their first launch (no kernel runs then)
    for point in json.loads(points_json):
        launch = adapter.prepare(params, point)
        launch()  # compile, autotune, allocator warm-up: outside the counted range
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(NVTX_RANGE)
        roofline_count_begin[(1,)](flag)
        launch()
        roofline_count_end[(1,)](flag)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        print(f"counted {point_label(point)}", flush=True)
        del launch
        torch.cuda.empty_cache()
    return 0


# ---------------------------------------------------------------------------------------------
# Counting a lab's points (the app and the CLI)
# ---------------------------------------------------------------------------------------------
def _key_columns(points: list[dict]) -> list[str]:
    return list(dict.fromkeys(k for p in points for k in p))


def _match(row: dict, point: dict) -> bool:
    return all(row.get(k) == v for k, v in point.items())


COMPARISON_COLUMNS = ("quantity", "what", "unit", "modelled", "counted", "ratio")


def compare_rows(points: list[dict], counted: dict, modelled: dict, shown: tuple) -> list[dict]:
    """Long rows, one per point and quantity: modelled, counted, ratio counted / modelled."""
    rows = []
    for point in points:
        label = point_label(point)
        for q in shown:
            m, c = modelled.get(label, {}).get(q), counted.get(label, {}).get(q)
            name, unit = QUANTITIES[q]
            rows.append({**point, "quantity": q, "what": name, "unit": unit, "modelled": m, "counted": c,
                         "ratio": c / m if c is not None and m else None})
    return rows


def model_values(lab, adapter: Adapter, params, points: list[dict], target) -> dict:
    """{point label: {quantity: modelled value}} from the lab's own predict rows and the adapter."""
    predicted = lab.predict(params, target)
    out = {}
    for point in points:
        row = next((r for r in predicted if _match(r, point)), {})
        out[point_label(point)] = adapter.model(params, point, row, target)
    return out


def count(lab_name: str, params=None, points: Optional[list] = None, progress=lambda f, m: None,
          on_wait=None):
    """Count one lab's points under ncu (the GPU lock held throughout) and put them beside the model.

    Returns a Result whose rows compare modelled and counted quantities. Raises ParamError for bad
    input and CountersUnavailable when counters cannot be read here.
    """
    from labs.engine import gpu
    from labs.engine import runner
    from labs.engine import params as params_mod
    from labs.engine.results import Result, run_metadata

    lab, adapter = registry.get_lab(lab_name), adapter_for(lab_name)
    params = params_mod.validate(params if params is not None else lab.default_params())
    reason = why_unavailable()
    if reason:
        raise CountersUnavailable(reason)
    target = gpu.live_target()
    if lab.check:
        lab.check(params, target)
    points = list(points or adapter.points(params))
    argv = [sys.executable, "-m", "labs.engine.counters", "child", lab_name, json.dumps(params_mod.to_dict(params)),
            json.dumps(points)]
    started = time.monotonic()
    with runner.gpu_session(f"count {lab_name}", on_wait):
        progress(0.1, f"counting {len(points)} point(s) of {lab.title} under Nsight Compute")
        kernels, _ = profile_command(argv, adapter.sets, nvtx_range=NVTX_RANGE,
                                     env={"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    progress(0.9, "reading the counters")
    per_point = split_points(kernels, [point_label(p) for p in points])
    counted = {label: counted_quantities(totals(ks), len(ks)) for label, ks in per_point.items()}
    modelled = model_values(lab, adapter, params, points, target)
    rows = compare_rows(points, counted, modelled, adapter.shown)
    meta = run_metadata("live", gpu.detect(), target) | {
        "duration_s": round(time.monotonic() - started, 2), "counters": True, "metric_sets": list(adapter.sets),
        "kernels": [{"point": label, "kernel": k.name, **{m: v for m, v in k.metrics.items()}}
                    for label, ks in per_point.items() for k in ks]}
    messages = [f"No counters came back for {point_label(p)}." for p in points if point_label(p) not in per_point]
    if adapter.note:
        messages.append(adapter.note)
    progress(1.0, "done")
    return Result(lab_name, params_mod.to_dict(params), rows, meta, messages, not any(m.startswith("No counters")
                                                                                      for m in messages))


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and abs(value) >= 1e5:
        return f"{value:.4g}"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def format_table(rows: list[dict]) -> str:
    """The comparison as text for the CLI: point, quantity, modelled, counted, counted / modelled."""
    lines = [f"{'point':44s} {'quantity':30s} {'modelled':>11s} {'counted':>11s} {'ratio':>6s}"]
    for r in rows:
        point = point_label({k: v for k, v in r.items() if k not in COMPARISON_COLUMNS})
        lines.append(f"{point[:44]:44s} {r['quantity'][:30]:30s} {_fmt(r['modelled']):>11s} {_fmt(r['counted']):>11s} "
                     f"{_fmt(r['ratio']):>6s}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Recorded counter runs: content/recorded/<gpu>/counters/<lab>.json
# ---------------------------------------------------------------------------------------------
def recording_path(gpu_key: str, lab_name: str) -> Path:
    from labs.engine.gpu import RECORDED_DIR

    return RECORDED_DIR / gpu_key / "counters" / f"{lab_name}.json"


def save_recording(result) -> Path:
    """Commit a live count as a recorded one (written by the CLI on the GPU, never by hand)."""
    from labs.engine.results import Result

    key = result.meta.get("gpu", {}).get("key")
    if result.kind != "live" or not key:
        raise ParamError("Only live counts on a GPU can be recorded.")
    recorded = Result.from_dict(json.loads(result.to_json()))
    recorded.meta["kind"] = "recorded"
    path = recording_path(key, result.lab)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(recorded.to_json())
    return path


def list_recordings(lab_name: str) -> list:
    """Every committed counter recording of a lab, newest first (the engine's lister, one folder down)."""
    from labs.engine.results import list_recorded

    return list_recorded(f"counters/{lab_name}")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "child":
        sys.exit(child_main(*sys.argv[2:]))
    print("usage: python -m labs.engine.counters child LAB PARAMS_JSON POINTS_JSON (started by count())", file=sys.stderr)
    sys.exit(2)
