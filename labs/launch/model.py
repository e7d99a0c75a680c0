"""
The launch lab's model: the chain and the regimes from the launch figures the probes measured (this run's, this
machine's cache, or the recorded run of this GPU kind; assumed until one exists) and the GPU's ceilings.

Pure arithmetic; nothing here needs a GPU or launches a kernel.
"""

from __future__ import annotations

import json
from pathlib import Path

from labs.engine import timing
from labs.engine.gpu import KERNEL_LAUNCH_US, MiB, Target, cache_dir
from labs.engine.params import ParamError, from_dict

NAME = "launch"
VARIANTS = ("eager", "graph", "fused", "eager+item")
OPS = ("add", "matmul")


# ---------------------------------------------------------------------------------------------
# The launch figures: what the probes measure, and where the model finds them
# ---------------------------------------------------------------------------------------------
PROBES = {  # name -> what it measures
    "eager_add": "one PyTorch op (in-place add or multiply on the chain's tensor), launched back to back",
    "eager_matmul": "one PyTorch bf16 matmul (16 x 16), launched back to back",
    "eager_triton": "one launch of the fused Triton kernel (K = 1, on the chain's tensor), back to back",
    "graph_replay": "one replay of a CUDA graph holding a single tiny kernel, back to back",
    "graph_kernel": "one more of the chain's ops inside a replayed CUDA graph (slope of 16 vs 256 kernels)",
    "graph_fixed": "the GPU-side cost of one graph replay itself (intercept of 16 vs 256 kernels)",
    "round_trip": "one op on the chain's tensor followed by .item() of its first value (a round trip)",
    "eager_stream_fixed": "the GPU's own cost of an eager add that streams 64 MiB, beyond its bytes at the copy rate",
}

# Used only until this GPU has been measured (here or in a committed recording); flagged as assumed.
# (A streaming kernel's own fixed cost is the engine's one launch cost, KERNEL_LAUNCH_US.)
ASSUMED = {"eager_add": 5.0, "eager_matmul": 10.0, "eager_triton": 15.0, "graph_replay": 4.0,
           "graph_kernel": 1.5, "graph_fixed": 1.5, "round_trip": 20.0, "eager_stream_fixed": KERNEL_LAUNCH_US}
_PROBED: dict = {}  # gpu key -> probe figures measured in this process


def _probe_path(gpu_key: str) -> Path:
    return cache_dir("launch") / f"{gpu_key}.json"


# The CPU-side figures drift on a shared host (30-50 % within one run, on an H100 host): every point is
# timed in turns with the one figure it depends on (paired_us), its row keeps that figure (`probe_us`) and
# its prediction uses it; the group's median is kept as a probe row marked `@group` (for the slope rows).
GROUP_PROBES = {"chain-eager": "eager_add", "chain-graph": "graph_replay", "chain-fused": "eager_triton",
                "chain-eager+item": "round_trip", "regimes-add": "eager_add", "regimes-matmul": "eager_matmul"}


def group_costs(costs: dict, group: str) -> dict:
    """The launch figures for one group of points: its own re-measured figure where there is one."""
    name = GROUP_PROBES.get(group)
    own = costs.get(f"{name}@{group}") if name else None
    return {**costs, name: own} if own is not None else costs


def point_costs(costs: dict, group: str, probe_us) -> dict:
    """The launch figures for one point: the figure timed in turns with it, where the run has one."""
    name = GROUP_PROBES.get(group)
    c = group_costs(costs, group)
    return {**c, name: probe_us} if name and probe_us is not None else c


def launch_costs(target: Target) -> dict:
    """The launch figures (us) the model uses for this GPU, and where they come from ('source')."""
    if target.key in _PROBED:
        return {**_PROBED[target.key], "source": "measured in this run"}
    path = _probe_path(target.key)
    if path.exists():
        try:
            data = json.loads(path.read_text())
            if set(PROBES) <= set(data["us"]):
                return {**{k: float(v) for k, v in data["us"].items()},
                        "source": f"measured on this machine ({data.get('gpu', target.name)}, {data.get('date', '')})"}
        except (OSError, ValueError, KeyError, TypeError):
            pass
    from labs.engine.results import list_recorded  # the committed runs of this lab hold their probes

    for rec in list_recorded("launch"):
        if rec.meta.get("gpu", {}).get("key") != target.key:
            continue
        found = {r["variant"]: r["measured_us"] for r in rec.rows
                 if r.get("experiment") == "probe" and isinstance(r.get("measured_us"), (int, float))}
        if found:  # a recording older than a probe lacks it: that one figure stays assumed
            missing = [k for k in PROBES if k not in found]
            note = f"; assumed: {', '.join(missing)}" if missing else ""
            return {**ASSUMED, **{k: float(v) for k, v in found.items() if k.split("@")[0] in PROBES},
                    "source": f"recorded ({rec.label}){note}"}
    return {**ASSUMED, "source": "assumed: not measured on this GPU yet (run the lab to measure it)"}


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------
def memory_us(nbytes: float, target: Target) -> float:
    return nbytes / (target.ceilings.copy_tbps * 1e12) * 1e6


def chain_us(variant: str, k: int, n: int, costs: dict, target: Target) -> float:
    """Predicted time of one chain call: launch-bound terms from the probes, the bytes from the ceilings."""
    kernel = costs["graph_kernel"] + memory_us(8 * n, target)  # one tiny op on the GPU: read + write n floats
    if variant == "eager":  # the CPU queues launches; the slower of CPU and GPU sets the pace
        return k * max(costs["eager_add"], kernel)
    if variant == "graph":  # one replay launches all K kernels; the GPU still runs them one by one
        return max(costs["graph_replay"], costs["graph_fixed"] + k * kernel)
    if variant == "fused":  # one launch, one read and one write, K FLOPs per element in registers
        flops_us = k * n / (target.ceilings.fma_tflops * 1e12) * 1e6
        return max(costs["eager_triton"], kernel + flops_us)
    if variant == "eager+item":  # every op waits for the GPU and back
        return k * (costs["round_trip"] + memory_us(8 * n, target))
    raise ParamError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")


def slope_us(times: dict) -> float:
    """What one more op costs, read off a sweep: the least-squares slope of time (us) against K ({K: us}). The
    measured and the predicted slope are both read this way, each off its own points."""
    ks, ts = list(times), list(times.values())
    mk, mt = sum(ks) / len(ks), sum(ts) / len(ts)
    var = sum((k - mk) ** 2 for k in ks)
    return sum((k - mk) * (t - mt) for k, t in zip(ks, ts)) / var if var else float("nan")


def matmul_dtype(target: Target) -> str:
    rates = target.ceilings.matmul_tflops
    return "bf16" if rates.get("bf16") else "fp16"


def regime_sizes(params, op: str) -> list:
    if op == "add":  # elements: 1, 2, 4, ... up to add_max_mib of fp32
        top = params.add_max_mib * MiB // 4
        return [2**i for i in range(40) if 2**i <= top]
    return [2**i for i in range(4, 15) if 2**i <= params.matmul_max_n]  # matmul: n = 16, 32, ...


def op_work(op: str, size: int, target: Target) -> tuple:
    """(bytes moved, FLOPs, peak TFLOP/s) of one call."""
    if op == "add":  # x += 1 in fp32: read 4 bytes, write 4 bytes, 1 FLOP per element
        return 8 * size, size, target.ceilings.fma_tflops / 2  # an add is half an FMA's FLOPs per instruction
    dtype = matmul_dtype(target)
    nbytes = 3 * size * size * timing.element_bytes(dtype)  # read A and B, write C, once each
    return nbytes, 2 * size**3, target.ceilings.matmul_tflops.get(dtype) or target.ceilings.fma_tflops


def regime_terms(op: str, size: int, costs: dict, target: Target) -> dict:
    """The three costs of one eager call, in us: launch overhead, memory traffic, arithmetic."""
    nbytes, flops, peak = op_work(op, size, target)
    overhead = costs["eager_add"] if op == "add" else costs["eager_matmul"]
    return {"overhead": overhead, "memory": memory_us(nbytes, target),
            "compute": flops / (peak * 1e12) * 1e6}


def regime_us(op: str, terms: dict, costs: dict) -> float:
    """The CPU's launch runs ahead of the GPU, whose own time is a fixed per-kernel cost plus the roofline. The
    add streams its bytes from memory, and its fixed cost is a streaming kernel's (the eager_stream_fixed probe);
    the matmul's is the tiny kernel's, the few microseconds of it lost beside its FLOPs."""
    fixed = costs["eager_stream_fixed"] if op == "add" else costs["graph_kernel"]
    return max(terms["overhead"], fixed + max(terms["memory"], terms["compute"]))


def model_rows(params, target: Target, costs: dict) -> list[dict]:
    """predict() for given launch figures (pure: tests pass their own)."""
    rows = []
    n = params.elements
    if "chain" in params.experiments:
        for variant in params.variants:
            c = group_costs(costs, f"chain-{variant}")
            times = {k: chain_us(variant, k, n, c, target) for k in params.ks}
            for k, us in times.items():
                rows.append({"experiment": "chain", "variant": variant, "k": k, "size": n, "predicted_us": us,
                             "predicted_per_op_us": us / k})
            if variant != "fused" and len(times) >= 2:  # the fused chain has no per-op launch to fit
                rows.append({"experiment": "fit", "variant": variant, "k": None, "size": n,
                             "predicted_us": slope_us(times)})
    if "regimes" in params.experiments:
        for op in params.ops:
            c = group_costs(costs, f"regimes-{op}")
            for size in regime_sizes(params, op):
                terms = regime_terms(op, size, c, target)
                nbytes, flops, _ = op_work(op, size, target)
                rows.append({"experiment": "regimes", "variant": op, "k": None, "size": size, "bytes_moved": nbytes,
                             "flops": flops, "predicted_us": regime_us(op, terms, c),
                             "predicted_regime": max(terms, key=terms.get),
                             **{f"predicted_{name}_us": v for name, v in terms.items()}})
    return rows


def predict(params, target: Target) -> list[dict]:
    costs = launch_costs(target)
    rows = model_rows(params, target, costs)
    for row in rows:
        row["launch_figures"] = costs["source"]
    return rows


def recorded_costs(recording: dict) -> dict:
    """The launch figures a recorded run measured (its probe rows, the groups' `@` figures included)."""
    found = {r["variant"]: float(r["measured_us"]) for r in recording["rows"]
             if r.get("experiment") == "probe" and isinstance(r.get("measured_us"), (int, float))}
    return {**ASSUMED, **found}


def repredict(recording: dict, target: Target) -> list[dict]:
    """The model of a recorded run from the figures it measured (scripts/repredict.py): the run's probes, and
    for every point that was timed in turns with its own figure (`probe_us`), that figure."""
    from labs.engine.registry import get_lab  # the lab's Params (labs/launch/__init__.py)

    Params = get_lab(NAME).Params
    known = {f for f in Params.__dataclass_fields__}
    params = from_dict(Params, {k: v for k, v in recording["params"].items() if k in known})
    costs = recorded_costs(recording)
    rows = model_rows(params, target, costs)
    own = {(r.get("experiment"), r.get("variant"), r.get("k"), r.get("size")): r.get("probe_us")
           for r in recording["rows"] if r.get("probe_us") is not None}
    for row in rows:
        probe_us = own.get((row["experiment"], row["variant"], row["k"], row["size"]))
        if probe_us is None:
            continue
        group = f"{row['experiment']}-{row['variant']}"
        c = point_costs(costs, group, probe_us)
        if row["experiment"] == "chain":
            row["predicted_us"] = chain_us(row["variant"], row["k"], row["size"], c, target)
        else:
            row["predicted_us"] = regime_us(row["variant"], regime_terms(row["variant"], row["size"], c, target), c)
    for fit in (r for r in rows if r["experiment"] == "fit"):  # the slope of the points as now predicted
        fit["predicted_us"] = slope_us({r["k"]: r["predicted_us"] for r in rows
                                        if r["experiment"] == "chain" and r["variant"] == fit["variant"]})
    return rows


def lesson_numbers(target: Target) -> dict:
    costs = launch_costs(target)
    from labs.engine.registry import get_lab  # the lab's Params (labs/launch/__init__.py)

    p = get_lab(NAME).Params()
    n = p.elements
    add_boundary = costs["eager_add"] * 1e-6 * target.ceilings.copy_tbps * 1e12 / 8  # elements where memory = launch
    dtype = matmul_dtype(target)
    peak = target.ceilings.matmul_tflops.get(dtype) or target.ceilings.fma_tflops
    mm_boundary = (costs["eager_matmul"] * 1e-6 * peak * 1e12 / 2) ** (1 / 3)
    return {
        "gpu": target.name,
        "launch_source": costs["source"],
        "eager_us": f"{costs['eager_add']:.1f}",
        "triton_us": f"{costs['eager_triton']:.1f}",
        "matmul_launch_us": f"{costs['eager_matmul']:.1f}",
        "graph_kernel_us": f"{costs['graph_kernel']:.2f}",
        "graph_replay_us": f"{costs['graph_replay']:.1f}",
        "graph_fixed_us": f"{costs['graph_fixed']:.1f}",
        "round_trip_us": f"{costs['round_trip']:.1f}",
        "chain_elements": n,
        "chain_eager_64_us": f"{chain_us('eager', 64, n, costs, target):.0f}",
        "chain_graph_64_us": f"{chain_us('graph', 64, n, costs, target):.0f}",
        "chain_fused_64_us": f"{chain_us('fused', 64, n, costs, target):.0f}",
        "chain_item_64_us": f"{chain_us('eager+item', 64, n, costs, target):.0f}",
        "add_boundary_mib": f"{add_boundary * 4 / MiB:.1f}",
        "matmul_boundary_n": f"{mm_boundary:.0f}",
        "matmul_dtype": dtype,
        "bandwidth_tbps": f"{target.ceilings.copy_tbps:.2f}",
    }
