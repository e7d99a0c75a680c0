"""
The launch lab's measurement: probes of the launch figures first, then every point of the chain and the regimes,
checked against float64 and timed in turns with the one figure its prediction depends on.

Launch-bound work is timed with timing.per_call_us (calls back to back, the CPU's share included) and CUDA graphs:
timing.time_ms flushes the L2 with a large memset before each call, and the CPU enqueues the next launches while
that runs, which hides exactly the cost this lab is about.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from labs.engine import timing
from labs.engine.gpu import MiB, Target, free_memory_bytes
from labs.engine.params import ParamError
from labs.engine.timing import per_call_us
from labs.launch.kernels import A, B, capture, chain_eager, chain_fused, chain_reference, grid_input
from labs.launch.model import (GROUP_PROBES, PROBES, _PROBED, _probe_path, chain_us, launch_costs, matmul_dtype,
                               memory_us, op_work, point_costs, regime_sizes, regime_terms, regime_us, slope_us)

PROBE_OPS = 256  # ops per timed call in the probes (amortises the Python loop around them)


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
    point never saw set the figure alone (16 alternating rounds on an H200, measured once and dropped: the
    fastest of 8 consecutive rounds missed the fused chain at K = 256 by 24-30 % in 8 of 9 windows, the fastest of
    3 such rounds missed the chain with .item() by 21-23 %; the medians of 8 agreed within 6 % in every window of
    every point).
    """
    points, probes = [], []
    per_round = budget_ms / PAIR_ROUNDS
    with timing.collecting():  # the rounds' own timings stay here: the row records its median (own_time)
        for _ in range(PAIR_ROUNDS):
            probes.append(per_call_us(probe, budget_ms=per_round, batches=3, warmup_ms=PAIR_WARMUP_MS) / probe_ops)
            points.append(per_call_us(point, budget_ms=per_round, batches=3, warmup_ms=PAIR_WARMUP_MS))
    return statistics.median(points), statistics.median(probes)


def own_time(*us: float) -> None:
    """The row about to be yielded reports these figures (us): they are its timings (timing.record_own). Left to the
    timers, a row's spread was the widest of its probe's and its point's 16 short rounds, and the probes' rows all
    fell on the first probe: on an H200, 73 of 89 rows flagged unsteady while their medians met the model within 6 %."""
    timing.record_own(*(figure * 1e-3 for figure in us))


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


def check(params, target: Target) -> None:
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


def _measure_chain(params, target: Target, step):
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
            own_time(us, probe_us)
            yield {"experiment": "chain", "variant": variant, "k": k, "size": n, "measured_us": us,
                   "measured_per_op_us": us / k, "check_rel_error": err, "probe": name, "probe_us": probe_us,
                   "predicted_us": predicted, "predicted_per_op_us": predicted / k}
        probe_row = group_probe_row(group, figures, target)
        if probe_row:
            own_time(probe_row["measured_us"])  # the group's figure, over the passes like any other
            yield probe_row
        del probe
    for variant, points in measured.items():  # what one more op costs: least-squares slope over K
        if len(points) >= 2 and variant != "fused":
            # the model's slope off the points' own predictions (each made with its paired figure), as measured
            slope = slope_us({k: us for k, (us, _) in points.items()})
            own_time(slope)
            yield {"experiment": "fit", "variant": variant, "k": None, "size": n,
                   "measured_us": slope,
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


def _measure_regimes(params, target: Target, step):
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
            with timing.collecting():  # recorded with the row's other figures (own_time)
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
            own_time(eager_us, probe_us, gpu_us)
            yield {"experiment": "regimes", "variant": op, "k": None, "size": size, "measured_us": eager_us,
                   "probe": name, "probe_us": probe_us, "predicted_us": regime_us(op, terms, c),
                   "predicted_overhead_us": terms["overhead"],
                   "measured_gpu_us": gpu_us, "measured_tbps": nbytes / (eager_us * 1e-6) / 1e12,
                   "measured_tflops": flops / (eager_us * 1e-6) / 1e12, "measured_regime": regime,
                   "measured_overhead_share": max(0.0, 1 - gpu_us / eager_us), "check_rel_error": err}
            del sets, first
        probe_row = group_probe_row(group, figures, target)
        if probe_row:
            own_time(probe_row["measured_us"])  # the group's figure, over the passes like any other
            yield probe_row
        del probe
        torch.cuda.empty_cache()


def measure(params, target: Target, progress):
    points = 6  # probes
    if "chain" in params.experiments:
        points += len(params.variants) * len(params.ks)
    if "regimes" in params.experiments:
        points += sum(len(regime_sizes(params, op)) for op in params.ops)
    done = [0]

    def step(message: str) -> None:
        progress(min(done[0] / points, 1.0), message)
        done[0] += 1

    with timing.collecting():  # each probe's row records its own figure below
        figures = run_probes(step, target, params.elements)
    remember_probes(target.key, figures, target.name)
    for name, us in figures.items():
        own_time(us)
        yield {"experiment": "probe", "variant": name, "k": None, "size": None, "measured_us": us,
               "what": PROBES[name]}
    if "chain" in params.experiments:
        yield from _measure_chain(params, target, step)
    if "regimes" in params.experiments:
        yield from _measure_regimes(params, target, step)
    remember_probes(target.key, _PROBED[target.key], target.name)  # with the groups' re-measured figures
    progress(1.0, "done")
