"""
Launch overhead: the fixed price of asking the GPU to do anything
=================================================================

What you will learn:
- every kernel launched from Python costs a few microseconds of CPU work (the interpreter, PyTorch's
  dispatcher, the CUDA driver) before the GPU sees it; for a tiny tensor that fixed price is larger
  than the work itself, and a chain of K tiny ops costs about K times it;
- launches are queued: the CPU runs ahead of the GPU, so back-to-back launches cost the enqueue time,
  not a round trip; a `.item()` or a synchronize in the loop makes every op wait for the GPU and back;
- a CUDA graph records the chain once and replays it with one launch, leaving only the GPU's own
  per-kernel cost; fusing the chain into one kernel removes even that;
- Horace He's three regimes: for a given op, small tensors are overhead-bound, large ones memory- or
  compute-bound, and the boundaries are where the launch cost equals the bytes or FLOPs term.

The model's launch figures are measured on this machine by probes at the start of every run (and
kept with the recording), never assumed: per-launch cost of a PyTorch op and of a Triton kernel,
graph replay, the GPU's per-kernel cost inside a graph, and a launch + `.item()` round trip. The CPU-side
figures drift on a shared host, so every point is also timed in turns with the one figure it depends on,
and its prediction uses that figure (kept in the row as `probe_us`; `repredict` re-predicts offline).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

from labs.engine import timing
from labs.engine.timing import per_call_us  # the launch lab's timer (scripts reach it as launch.per_call_us)
from labs.engine.gpu import MiB, Target, free_memory_bytes
from labs.engine.lab import Headline, Lab
from labs.engine.params import ParamError, param

# The chain: K ops on a small fp32 tensor, alternately y = y * A and y = y + B. With A = -1, B = 0.5
# the values stay bounded for any K and (inputs on a 1/256 grid) every step is exact in fp32.
A, B = -1.0, 0.5
VARIANTS = ("eager", "graph", "fused", "eager+item")
OPS = ("add", "matmul")


# ---------------------------------------------------------------------------------------------
# The chain, four ways
# ---------------------------------------------------------------------------------------------
def chain_eager(x: torch.Tensor, y: torch.Tensor, k: int, sync_each: bool = False,
                first: torch.Tensor | None = None) -> torch.Tensor:
    """K PyTorch ops, each one kernel launch; with sync_each, a .item() after every op (a round trip).

    `first` is a view of y's first element for the .item() calls. The timed calls pass one made beforehand, as the
    round-trip probe does: making the view inside every call adds a few microseconds of Python that no probe has
    (it put the chain with .item() at K = 1 a fifth to a third above its round-trip figure on both GPUs)."""
    torch.mul(x, A, out=y)  # op 1 reads x, so every call starts afresh
    if sync_each:
        first = y[:1] if first is None else first
        first.item()
    for i in range(1, k):
        if i % 2:
            y.add_(B)
        else:
            y.mul_(A)
        if sync_each:
            first.item()  # copy one value to the CPU: waits until the GPU has finished this op
    return y


@triton.jit
def fused_chain_kernel(x_ptr, y_ptr, n, pairs, odd, a, b, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y = tl.load(x_ptr + offs, mask=mask)  # one read
    for _ in range(pairs):  # all K ops in registers
        y = y * a
        y = y + b
    if odd:
        y = y * a
    tl.store(y_ptr + offs, y, mask=mask)  # one write


FUSED_BLOCK = 1024


def chain_fused(x: torch.Tensor, y: torch.Tensor, k: int) -> torch.Tensor:
    """The same K ops as one Triton kernel: one launch, one read and one write per element."""
    grid = (triton.cdiv(x.numel(), FUSED_BLOCK),)
    fused_chain_kernel[grid](x, y, x.numel(), k // 2, k % 2, A, B, BLOCK=FUSED_BLOCK, num_warps=4)
    return y


def chain_reference(x: torch.Tensor, k: int) -> torch.Tensor:
    y = x.double() * A
    for i in range(1, k):
        y = y + B if i % 2 else y * A
    return y


def grid_input(n: int, device=None) -> torch.Tensor:
    """Fresh normal values on a 1/256 grid (exact through the chain)."""
    return torch.round(timing.random_tensor((n,), "fp32", device) * 256) / 256


# ---------------------------------------------------------------------------------------------
# Timing launch-bound work: timing.per_call_us (calls back to back, the CPU's share included) and
# CUDA graphs (timing.time_ms flushes the L2 with a large memset before each call; the CPU enqueues
# the next launches while that runs, which hides exactly the cost this lab is about)
# ---------------------------------------------------------------------------------------------
def capture(fn) -> torch.cuda.CUDAGraph:
    """Record fn's kernels into a CUDA graph (warm-up on a side stream, as capture requires)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph


# ---------------------------------------------------------------------------------------------
# Probes: the launch costs the model uses, measured on this machine
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
ASSUMED = {"eager_add": 5.0, "eager_matmul": 10.0, "eager_triton": 15.0, "graph_replay": 4.0,
           "graph_kernel": 1.5, "graph_fixed": 1.5, "round_trip": 20.0, "eager_stream_fixed": 3.0}
PROBE_OPS = 256  # ops per timed call in the probes (amortises the Python loop around them)
_PROBED: dict = {}  # gpu key -> probe figures measured in this process


def _probe_path(gpu_key: str) -> Path:
    base = os.environ.get("ROOFLINE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "roofline")
    return Path(base) / "launch" / f"{gpu_key}.json"


def _repeat(op, times: int):
    def ops():
        for _ in range(times):
            op()
    return ops


def probe_callable(name: str, n: int = 4096) -> tuple:
    """(fn, ops): a call that repeats one CPU-side launch figure `ops` times (eager_add, eager_matmul,
    eager_triton, graph_replay, round_trip); per_call_us(fn) / ops is the figure, in us."""
    if name == "eager_add":  # the same two in-place ops the eager chain alternates, on a tensor of its size
        chain_like = torch.zeros(n, device="cuda")

        def add_then_mul():
            chain_like.add_(B)
            chain_like.mul_(A)

        return _repeat(add_then_mul, PROBE_OPS // 2), PROBE_OPS
    if name == "eager_matmul":
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        m16 = torch.randn(16, 16, device="cuda", dtype=dtype)
        m_out = torch.empty_like(m16)
        return _repeat(lambda: torch.matmul(m16, m16, out=m_out), 64), 64
    if name == "eager_triton":
        x, y = grid_input(n), torch.empty(n, device="cuda")
        return _repeat(lambda: chain_fused(x, y, 1), 64), 64
    if name == "graph_replay":  # a graph of one tiny kernel: the replay call is the CPU's whole part
        t = torch.zeros(1, device="cuda")
        one = capture(lambda: t.add_(1.0))
        return _repeat(one.replay, 16), 16
    if name == "round_trip":
        y = torch.zeros(n, device="cuda")
        first = y[:1]

        def op_and_read():
            y.add_(B)
            first.item()

        return _repeat(op_and_read, 32), 32
    raise ValueError(f"no CPU-side probe named {name!r}")


def probe_launch_us(name: str, n: int = 4096) -> float:
    """One of the CPU-side launch figures, in us, measured now."""
    fn, ops = probe_callable(name, n)
    return per_call_us(fn, budget_ms=40 if name == "round_trip" else 20) / ops


PAIR_ROUNDS = 8  # point and probe timed alternately this many times each; the median round of each
PAIR_WARMUP_MS = 0.5  # calls before each round's timing, after switching between point and probe


def paired_us(point, probe, probe_ops: int, budget_ms: float = 24.0) -> tuple:
    """(us per call of `point`, us per op of `probe`), timed alternately in PAIR_ROUNDS short rounds that share
    `budget_ms` of timing per side; each side's median round.

    The CPU-side launch cost drifts on a shared host, by 30 % and more within seconds, and an H200 host switched
    between a fast and a slow state (15 and 20-22 us for one Triton launch) every few tens of milliseconds. Timed
    in turns, a few milliseconds apart, the point and its probe sample the same mix of states, and the median of
    each lands in the same one. The fastest round of each did not: one probe round that caught a fast spell its
    point never saw set the figure alone (16 alternating rounds on an H200, scripts/models_gpu.py hosttimers: the
    fastest of 8 consecutive rounds missed the fused chain at K = 256 by 24-30 % in 8 of 9 windows, the fastest of
    3 such rounds missed the chain with .item() by 21-23 %; the medians of 8 agreed within 6 % in every window of
    every point).
    """
    points, probes = [], []
    per_round = budget_ms / PAIR_ROUNDS
    for _ in range(PAIR_ROUNDS):
        probes.append(per_call_us(probe, budget_ms=per_round, batches=3, warmup_ms=PAIR_WARMUP_MS) / probe_ops)
        points.append(per_call_us(point, budget_ms=per_round, batches=3, warmup_ms=PAIR_WARMUP_MS))
    return statistics.median(points), statistics.median(probes)


def run_probes(step, target: Target, n: int = 4096) -> dict:
    """Measure every figure in PROBES, in microseconds (n: elements of the chain's tensor)."""
    out = {}
    step("probe: PyTorch launch cost")
    # Measured first in a run, launches came out up to 30 % slower than the same launches a few seconds
    # later (CPU clocks and caches warming up): spin for a while before the first figure.
    warm = torch.zeros(n, device="cuda")
    per_call_us(_repeat(lambda: warm.add_(B), PROBE_OPS), budget_ms=5, warmup_ms=100)
    out["eager_add"] = probe_launch_us("eager_add", n)
    step("probe: bf16 matmul launch cost")
    out["eager_matmul"] = probe_launch_us("eager_matmul", n)
    step("probe: Triton launch cost")
    out["eager_triton"] = probe_launch_us("eager_triton", n)
    step("probe: CUDA graph replay and per-kernel cost")
    out["graph_replay"] = probe_launch_us("graph_replay", n)
    out["graph_kernel"], out["graph_fixed"] = graph_kernel_us(n)
    step("probe: launch + .item() round trip")
    out["round_trip"] = probe_launch_us("round_trip", n)
    step("probe: a streaming kernel's own cost on the GPU")
    out["eager_stream_fixed"] = stream_fixed_us(target)
    return out


def graph_kernel_us(n: int) -> tuple:
    """(us per kernel, us per replay) on the GPU: replays of graphs of 16 and PROBE_OPS kernels, each the chain's
    own op pair (add, then multiply) on a tensor of the chain's size; the slope and intercept of the two."""
    t = torch.zeros(n, device="cuda")

    def pair():
        t.add_(B)
        t.mul_(A)

    few, many = capture(_repeat(pair, 8)), capture(_repeat(pair, PROBE_OPS // 2))
    # alternately, three times each, the median of each: timed once each, the intercept came out 2.1 us in one
    # run and 1.5-1.6 us in two others on one H200, and the 2.1 put the graphs of 1 and 2 kernels 16-21 % off
    rounds = [(per_call_us(few.replay, budget_ms=10), per_call_us(many.replay, budget_ms=10)) for _ in range(3)]
    few_us, many_us = (statistics.median(side) for side in zip(*rounds))
    per_kernel = (many_us - few_us) / (PROBE_OPS - 16)
    return per_kernel, max(0.0, few_us - 16 * per_kernel)


STREAM_MIB = 64  # each of the stream probe's two tensors: larger than any L2 the datasheet lists


def stream_fixed_us(target: Target) -> float:
    """What one eagerly launched kernel that streams from device memory costs the GPU beyond its bytes, in us.

    In-place adds over two alternating 64 MiB tensors, launched back to back: each add takes the GPU 30-50 us, far
    longer than its launch, so the queue stays full and the time per add is the GPU's. Less the bytes at the
    measured copy rate, what remains is the kernel's fixed cost in a stream: starting it, the first loads' trip to
    memory, the last wave's tail, the gap to the next kernel (3.5-4 us on an H200, about 4 us on an H100, against about
    1 us for a tiny kernel inside a graph). The add's model charges it where the GPU, not the launch, sets the time.
    """
    tensors = [torch.zeros(STREAM_MIB * MiB // 4, device="cuda") for _ in range(2)]

    def adds():
        for i in range(16):
            tensors[i % 2].add_(1.0)

    us = per_call_us(adds, budget_ms=20, batches=3) / 16
    del tensors
    return max(0.0, us - memory_us(2 * STREAM_MIB * MiB, target))


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


def group_probe_row(group: str, figures: list, target: Target):
    """Remember the median of a group's paired figures; returns its probe row (or None)."""
    name = GROUP_PROBES.get(group)
    if name is None or not figures:
        return None
    us = statistics.median(figures)
    _PROBED.setdefault(target.key, {})[f"{name}@{group}"] = us
    return {"experiment": "probe", "variant": f"{name}@{group}", "k": None, "size": None, "measured_us": us,
            "what": f"{PROBES[name]}, median of the figures timed in turns with the {group.replace('-', ' ')} points"}


def remember_probes(gpu_key: str, figures: dict, gpu_name: str) -> None:
    _PROBED[gpu_key] = dict(figures)
    path = _probe_path(gpu_key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y-%m-%d", time.gmtime())
        path.write_text(json.dumps({"gpu": gpu_name, "date": stamp, "us": figures}, indent=1) + "\n")
    except OSError:
        pass  # a read-only cache only loses the figures for later sessions


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
@dataclass(frozen=True)
class Params:
    experiments: tuple = param(("chain", "regimes"), "which experiments to run", choices=("chain", "regimes"))
    ks: tuple = param(tuple(2**i for i in range(9)), "chain: number of tiny ops K", unit="ops", min=1, max=4096)
    variants: tuple = param(VARIANTS, "chain: how the K ops are run", choices=VARIANTS)
    elements: int = param(4096, "chain: elements of the small fp32 tensor", unit="elements", min=1,
                          max=1_048_576, log=True)
    ops: tuple = param(OPS, "regimes: which ops to sweep over tensor sizes", choices=OPS)
    add_max_mib: int = param(256, "regimes: largest tensor for the add (sizes x2 from 1 element)", unit="MiB",
                             min=1, max=4096, log=True)
    matmul_max_n: int = param(4096, "regimes: largest bf16 matmul n x n (sizes x2 from 16)", unit="n", min=16,
                              max=16384, log=True)


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


def regime_sizes(params: Params, op: str) -> list:
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


def model_rows(params: Params, target: Target, costs: dict) -> list[dict]:
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


def predict(params: Params, target: Target) -> list[dict]:
    costs = launch_costs(target)
    rows = model_rows(params, target, costs)
    for row in rows:
        row["launch_figures"] = costs["source"]
    return rows


# ---------------------------------------------------------------------------------------------
# The measurement
# ---------------------------------------------------------------------------------------------
def check(params: Params, target: Target) -> None:
    need = 0
    if "regimes" in params.experiments:
        if "add" in params.ops:
            need = max(need, 2 * params.add_max_mib * MiB)
        if "matmul" in params.ops:
            need = max(need, 2 * 3 * params.matmul_max_n**2 * 2 + params.matmul_max_n**2 * 8 * 3)  # + fp64 check
    free = free_memory_bytes() if target.live else target.memory_bytes
    if need > 0.6 * free:
        raise ParamError(f"The largest regime sizes need {need / 1e9:.1f} GB; this GPU has {free / 1e9:.1f} GB free. "
                         "Lower add_max_mib or matmul_max_n.")
    if target.live and "regimes" in params.experiments and "matmul" in params.ops \
            and not target.ceilings.matmul_tflops.get(matmul_dtype(target)):
        raise ParamError("This GPU has no measured bf16 or fp16 matmul rate; calibrate it on the Your GPU page, "
                         "or choose ops = add.")


def _check_chain(variant: str, k: int, n: int) -> float:
    """Run one variant on fresh data (output poisoned first) and compare with float64."""
    size = n if n % 2 else n + 1  # an odd size: the last Triton program is partly masked
    x = grid_input(size)
    y = torch.full_like(x, float("nan"))
    if variant == "fused":
        chain_fused(x, y, k)
    else:
        chain_eager(x, y, k, sync_each=variant == "eager+item")
    return timing.check_close(y, chain_reference(x, k), "fp32", f"chain ({variant}, K={k})")


def _measure_chain(params: Params, target: Target, step):
    n = params.elements
    x, y = grid_input(n), torch.empty(n, device="cuda")
    measured = {v: {} for v in params.variants}
    for variant in params.variants:
        group = f"chain-{variant}"
        name = GROUP_PROBES[group]
        probe, probe_ops = probe_callable(name, n)
        budget = 36.0 if variant == "eager+item" else 24.0  # ms of timing per side, all rounds together
        figures = []
        for k in params.ks:
            step(f"chain, {variant}, K = {k}: checking, then timing")
            graph = None
            if variant == "graph":
                graph = capture(lambda: chain_eager(x, y, k))
                x.copy_(grid_input(n))  # fresh input in the buffer the graph reads
                y.fill_(float("nan"))
                graph.replay()
                err = timing.check_close(y, chain_reference(x, k), "fp32", f"chain (graph, K={k})")
                point = graph.replay
            else:
                err = _check_chain(variant, k, n)
                if variant == "fused":
                    def point():
                        chain_fused(x, y, k)
                else:
                    def point(sync_each=variant == "eager+item", first=y[:1]):
                        chain_eager(x, y, k, sync_each, first)
            us, probe_us = paired_us(point, probe, probe_ops, budget)
            del graph
            figures.append(probe_us)
            predicted = chain_us(variant, k, n, point_costs(launch_costs(target), group, probe_us), target)
            measured[variant][k] = (us, predicted)
            yield {"experiment": "chain", "variant": variant, "k": k, "size": n, "measured_us": us,
                   "measured_per_op_us": us / k, "check_rel_error": err, "probe": name, "probe_us": probe_us,
                   "predicted_us": predicted, "predicted_per_op_us": predicted / k}
        probe_row = group_probe_row(group, figures, target)
        if probe_row:
            yield probe_row
        del probe
    for variant, points in measured.items():  # what one more op costs: least-squares slope over K
        if len(points) >= 2 and variant != "fused":
            # the model's slope off the points' own predictions (each made with its paired figure), as measured
            yield {"experiment": "fit", "variant": variant, "k": None, "size": n,
                   "measured_us": slope_us({k: us for k, (us, _) in points.items()}),
                   "predicted_us": slope_us({k: predicted for k, (_, predicted) in points.items()})}


ROTATE_FROM_BYTES = MiB  # below this the launch dwarfs the kernel, wherever its data sits
GRAPH_CALLS = 16  # calls per timed batch in the regimes (a graph replay of 16 shows the GPU's own time)


def _rotating(op: str, size: int, l2_bytes: int) -> list:
    """Input/output sets to cycle through, enough that back-to-back calls do not find their data in the
    L2 (one set for tiny tensors: extra sets only add CPU work, and the launch dominates there anyway)."""
    dtype = "fp32" if op == "add" else ("bf16" if torch.cuda.is_bf16_supported() else "fp16")
    per_call = 8 * size if op == "add" else 3 * size * size * timing.element_bytes(dtype)
    copies = 1 if per_call < ROTATE_FROM_BYTES else max(1, min(128, -(-2 * max(l2_bytes, 1) // per_call)))
    sets = []
    for _ in range(copies):
        if op == "add":  # in place, like the chain's ops: reads and writes each element once
            sets.append((timing.random_tensor((size,), "fp32"),))
        else:
            a, b = timing.random_tensor((size, size), dtype), timing.random_tensor((size, size), dtype)
            sets.append((a, b, torch.empty_like(a)))
    return sets


def _call(op: str, s: tuple):
    if op == "add":
        s[0].add_(1.0)
    else:
        torch.matmul(s[0], s[1], out=s[2])


def _measure_regimes(params: Params, target: Target, step):
    for op in params.ops:
        group = f"regimes-{op}"
        name = GROUP_PROBES[group]
        probe, probe_ops = probe_callable(name, params.elements)
        figures = []
        for size in regime_sizes(params, op):
            step(f"regimes, {op}, size {size}: checking, then timing")
            sets = _rotating(op, size, target.l2_bytes)
            first = sets[0]
            if op == "add":
                before = first[0].double()
                _call(op, first)
                err = timing.check_close(first[0], before + 1, "fp32", f"add ({size})")
                del before
            else:
                first[2].fill_(float("nan"))
                _call(op, first)
                err = timing.check_close(first[2], first[0].double() @ first[1].double(),
                                        "bf16" if first[0].dtype == torch.bfloat16 else "fp16", f"matmul ({size})")

            calls = [sets[i % len(sets)] for i in range(max(len(sets), GRAPH_CALLS))]

            def eager():
                for s in calls:
                    _call(op, s)

            batch_us, probe_us = paired_us(eager, probe, probe_ops)
            eager_us = batch_us / len(calls)
            figures.append(probe_us)
            graph = capture(eager)  # several calls per replay, so the replay's own cost is spread out
            gpu_us = per_call_us(graph.replay) / len(calls)
            del graph
            nbytes, flops, peak = op_work(op, size, target)
            bw_frac = nbytes / (gpu_us * 1e-6) / (target.ceilings.copy_tbps * 1e12)
            fl_frac = flops / (gpu_us * 1e-6) / (peak * 1e12)
            if eager_us > 2 * gpu_us:  # more than half the eager time disappears without launches
                regime = "overhead"
            else:
                regime = "memory" if bw_frac >= fl_frac else "compute"
            c = point_costs(launch_costs(target), group, probe_us)
            terms = regime_terms(op, size, c, target)
            yield {"experiment": "regimes", "variant": op, "k": None, "size": size, "measured_us": eager_us,
                   "probe": name, "probe_us": probe_us, "predicted_us": regime_us(op, terms, c),
                   "predicted_overhead_us": terms["overhead"],
                   "measured_gpu_us": gpu_us, "measured_tbps": nbytes / (eager_us * 1e-6) / 1e12,
                   "measured_tflops": flops / (eager_us * 1e-6) / 1e12, "measured_regime": regime,
                   "measured_overhead_share": max(0.0, 1 - gpu_us / eager_us), "check_rel_error": err}
            del sets, first
        probe_row = group_probe_row(group, figures, target)
        if probe_row:
            yield probe_row
        del probe
        torch.cuda.empty_cache()


def measure(params: Params, target: Target, progress):
    points = 6  # probes
    if "chain" in params.experiments:
        points += len(params.variants) * len(params.ks)
    if "regimes" in params.experiments:
        points += sum(len(regime_sizes(params, op)) for op in params.ops)
    done = [0]

    def step(message: str) -> None:
        progress(min(done[0] / points, 1.0), message)
        done[0] += 1

    figures = run_probes(step, target, params.elements)
    remember_probes(target.key, figures, target.name)
    for name, us in figures.items():
        yield {"experiment": "probe", "variant": name, "k": None, "size": None, "measured_us": us,
               "what": PROBES[name]}
    if "chain" in params.experiments:
        yield from _measure_chain(params, target, step)
    if "regimes" in params.experiments:
        yield from _measure_regimes(params, target, step)
    remember_probes(target.key, _PROBED[target.key], target.name)  # with the groups' re-measured figures
    progress(1.0, "done")


def recorded_costs(recording: dict) -> dict:
    """The launch figures a recorded run measured (its probe rows, the groups' `@` figures included)."""
    found = {r["variant"]: float(r["measured_us"]) for r in recording["rows"]
             if r.get("experiment") == "probe" and isinstance(r.get("measured_us"), (int, float))}
    return {**ASSUMED, **found}


def repredict(recording: dict, target: Target) -> list[dict]:
    """The model of a recorded run from the figures it measured (scripts/repredict.py): the run's probes, and
    for every point that was timed in turns with its own figure (`probe_us`), that figure."""
    from labs.engine.params import from_dict

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
    p = Params()
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


LAB = Lab(
    name="launch",
    title="Launch overhead",
    summary="Every kernel launch costs microseconds before any work starts: time a chain of tiny ops eager, "
            "as a CUDA graph and fused, and find where each op leaves the overhead-bound regime.",
    terms=("launch-overhead", "overhead-bound", "kernel", "cuda-graph", "kernel-fusion", "memory-bound",
           "compute-bound", "cuda-runtime-api", "triton", "torch-compile", "roofline"),
    Params=Params,
    predict=predict,
    measure=measure,
    key=("experiment", "variant", "k", "size"),
    metric="us",
    order=45,
    check=check,
    lesson_numbers=lesson_numbers,
    headline=Headline("A loop of 64 tiny element-wise PyTorch ops on a 4096-element tensor: how many microseconds "
                      "does it take, launched one after another?", "us",
                      {"experiment": "chain", "variant": "eager", "k": 64}, "us"),
)
