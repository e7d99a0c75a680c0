"""What each GPU's process runs for the collectives lab (started by torchrun from labs/collectives/measure.py).

One process per GPU, joined in one torch.distributed group (NCCL on GPUs, gloo on CPUs). Every rank runs
the same sequence of calls (a collective waits until every rank has called it), checks each operation
against a float64 reference on odd sizes, then times it. Rank 0 reports to the launcher on stdout, one
line per event: `ROW {json}` for a measured row, `PROGRESS <fraction> <message>` for progress.

The timer is not bench.time_ms: do_bench picks its repetition count from each process's own estimate,
and ranks that disagree on the count would wait forever in a collective the others never call. Here the
count follows from the message size alone, so every rank makes the same calls; each rank takes the median
of a few batches of back-to-back calls (one stalled batch does not move it), and the time reported is the
slowest rank's (a collective is done when its last rank is).

Besides the collectives, three probes measure the model's ceilings in the same run: the copy engines
between GPUs (the link alone), NCCL's own point-to-point exchange (the link driven by NCCL's kernels, as a
collective drives it), and each collective's smallest message replayed from a CUDA graph (the GPUs' own
latency, without the host's cost of issuing the call).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F

warnings.filterwarnings("ignore", category=FutureWarning)  # torch renames the *_tensor collectives

WARMUP_CALLS = 3
TIMED_BYTES = 4 * 2**30  # a size's repetition count: about this many bytes in all, 5 to 100 calls
BATCHES = 5  # the time of a call is the median over this many batches of back-to-back calls
GRAPH_CALLS = 20  # calls captured in one CUDA graph for the GPU-side latency
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
TOL = {"bf16": 2e-2, "fp32": 1e-5}
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=3)  # a rank stuck in a collective ends the run, with an error


# ---------------------------------------------------------------------------------------------
# Plumbing: who am I, what did the launcher ask for, how to report
# ---------------------------------------------------------------------------------------------
def setup() -> tuple[int, int, torch.device]:
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device, timeout=COLLECTIVE_TIMEOUT)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=COLLECTIVE_TIMEOUT)
    return dist.get_rank(), dist.get_world_size(), device


# the batches behind the last timing (each the slowest rank's), sent with the next row: the engine's timing rule
# keeps them as the row's repeats and spread (labs.engine.timing.record_samples, on the launcher's side)
_LAST_SAMPLES: list = []


def report(kind: str, payload) -> None:
    if kind == "ROW" and _LAST_SAMPLES:
        payload = {**payload, "samples_ms": list(_LAST_SAMPLES)}
        _LAST_SAMPLES.clear()  # a row reports the timing just before it, never an older one
    if dist.get_rank() == 0:
        text = json.dumps(payload) if kind == "ROW" else payload
        print(f"{kind} {text}", flush=True)


def progress(fraction: float, message: str) -> None:
    report("PROGRESS", f"{fraction:.4f} {message}")


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def calls_for(nbytes: int) -> int:
    return max(5, min(100, TIMED_BYTES // max(nbytes, 1)))


def batch_ms(fn, calls: int, device) -> float:
    """Mean time of one call over `calls` back-to-back calls, in ms (CUDA events on a GPU)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / calls
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - started) * 1e3 / calls


def timed_ms(fn, calls: int, device, batches: int = BATCHES) -> float:
    """Time of one call: the median over `batches` batches of `calls` back-to-back calls after a warm-up, each
    batch the slowest rank's, in ms. Every rank makes the same number of calls."""
    [(ms, samples)] = timed_in_turns([(fn, calls)], device, batches)
    _LAST_SAMPLES[:] = samples
    return ms


def timed_in_turns(loops: list, device, batches: int = BATCHES) -> list:
    """[(median ms of one call, the batches' times)] for several (fn, calls) loops timed in turns: one batch of
    each loop, then one of each again, `batches` times; each batch the slowest rank's.

    The host's cost of issuing a call drifts within seconds on a shared machine, and a small message's loop
    is that cost: timed one size after the other, the smallest message (which sets the model's host term)
    and the next sizes could catch different moments. In turns they sample the same ones."""
    for fn, _ in loops:
        for _ in range(WARMUP_CALLS):
            fn()
    sync(device)
    dist.barrier()
    times = torch.tensor([[batch_ms(fn, calls, device) for fn, calls in loops] for _ in range(batches)],
                         dtype=torch.float64, device=device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # each batch: the slowest rank's (the others wait for it)
    per_loop = times.T.tolist()
    return [(sorted(samples)[batches // 2], samples) for samples in per_loop]


def host_issue_ms(fn, calls: int, device, batches: int = BATCHES) -> float:
    """The CPU's time to issue one call, in ms: `calls` calls timed on the host clock without waiting for the
    GPUs (the wait comes after the clock stops), the median of `batches`, the slowest rank's. A loop of calls
    can go no faster than this, whatever the GPUs do."""
    times = []
    for _ in range(batches):
        sync(device)
        dist.barrier()
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - started) * 1e3 / calls)
        sync(device)
    slowest = torch.tensor(sorted(times)[batches // 2], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return float(slowest)


def rank_data(rank: int, numel: int, dtype, device, salt: int = 0) -> torch.Tensor:
    """Rank r's input: fresh normal numbers from a seed every rank knows, so any rank can rebuild any other's."""
    g = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randn(numel, generator=g, dtype=torch.float64).to(dtype).to(device)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.double().cpu(), ref.double().cpu()
    if not torch.isfinite(out64).all():
        return float("inf")
    return float((out64 - ref64).norm() / ref64.norm().clamp_min(1e-300))


def require(err: float, tol: float, what: str) -> float:
    if not err <= tol:
        raise AssertionError(f"{what}: relative error {err:.3g} exceeds {tol:g}")
    return err


# ---------------------------------------------------------------------------------------------
# The collectives: buffers of S bytes in all, the nccl-tests conventions
# ---------------------------------------------------------------------------------------------
def collective(op: str, full: torch.Tensor, part: torch.Tensor):
    """One call of `op`. `full` holds S bytes (all-reduce buffer, all-gather output, reduce-scatter input,
    broadcast buffer); `part` holds S / n (all-gather input, reduce-scatter output)."""
    if op == "all_reduce":
        return lambda: dist.all_reduce(full)
    if op == "all_gather":
        return lambda: dist.all_gather_into_tensor(full, part)
    if op == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(part, full)
    if op == "broadcast":
        return lambda: dist.broadcast(full, src=0)
    raise ValueError(f"unknown collective {op!r}")


def check_collective(op: str, dtype: str, rank: int, n: int, device) -> float:
    """Run `op` once on an odd size with NaN-poisoned outputs and compare with a float64 reference."""
    per_rank = 1001  # odd, so no power-of-two chunking hides an off-by-one
    torch_dtype = DTYPES[dtype]
    inputs = [rank_data(r, per_rank * n, torch_dtype, device, salt=7) for r in range(n)]
    total = sum(x.double() for x in inputs)
    if op == "all_reduce":
        out = inputs[rank].clone()
        dist.all_reduce(out)
        ref = total
    elif op == "all_gather":
        out = torch.full((per_rank * n,), float("nan"), dtype=torch_dtype, device=device)
        dist.all_gather_into_tensor(out, inputs[rank][:per_rank].contiguous())
        ref = torch.cat([x[:per_rank].double() for x in inputs])
    elif op == "reduce_scatter":
        out = torch.full((per_rank,), float("nan"), dtype=torch_dtype, device=device)
        dist.reduce_scatter_tensor(out, inputs[rank])
        ref = total[rank * per_rank:(rank + 1) * per_rank]
    else:
        out = inputs[rank].clone() if rank == 0 else torch.full_like(inputs[rank], float("nan"))
        dist.broadcast(out, src=0)
        ref = inputs[0].double()
    return require(rel_error(out, ref), TOL[dtype], f"{op} ({dtype}, {n} ranks)")


def graph_ms(fn, device) -> float:
    """Time of one call replayed from a CUDA graph of GRAPH_CALLS calls: the GPUs' own time, with no host
    cost per call (NCCL's kernels can be captured like any other). The slowest rank's, in ms."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, on a side stream as capture requires
        for _ in range(WARMUP_CALLS):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    sync(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    ms = timed_ms(graph.replay, 5, device) / GRAPH_CALLS
    _LAST_SAMPLES[:] = [t / GRAPH_CALLS for t in _LAST_SAMPLES]
    del graph
    return ms


def measure_collectives(ops, sizes, dtype: str, rank: int, n: int, device, done: int, total: int) -> int:
    """Per collective: checked on an odd size, then every message size timed in turns (timed_in_turns), then
    the smallest message replayed from a CUDA graph (the GPUs' own latency)."""
    elem = DTYPES[dtype].itemsize
    for op in ops:
        err = check_collective(op, dtype, rank, n, device)
        message_bytes, loops = [], []  # each loop's call holds its own buffers
        for size in sorted(sizes):
            numel = max(n, size // elem // n * n)  # a whole number of elements per rank
            full = torch.randn(numel, device=device).to(DTYPES[dtype])
            part = full[rank * (numel // n):(rank + 1) * (numel // n)].clone()
            message_bytes.append(numel * elem)
            loops.append((collective(op, full, part), calls_for(numel * elem)))
        del full, part
        progress(done / total, f"{op}: {len(loops)} message sizes, timed in turns")
        for nbytes, (ms, samples) in zip(message_bytes, timed_in_turns(loops, device)):
            _LAST_SAMPLES[:] = samples
            report("ROW", {"experiment": "collective", "op": op, "size_bytes": nbytes, "gpus": n,
                           "step": "-", "tokens": 0, "measured_ms": ms, "check_rel_error": err})
            done += 1
        if device.type == "cuda":  # the smallest message, replayed from a graph
            report_graph_latency(op, loops[0][0], message_bytes[0], err, n, device, done, total)
        del loops
    return done


def report_graph_latency(op: str, fn, nbytes: int, err: float, n: int, device, done: int, total: int) -> None:
    try:
        gpu_ms = graph_ms(fn, device)
    except RuntimeError as exc:  # no capture here: the model then assumes the GPU latency
        progress(done / total, f"{op}: no CUDA graph capture ({exc}); GPU latency not measured")
        return
    report("ROW", {"experiment": "collective_gpu", "op": op, "size_bytes": nbytes, "gpus": n, "step": "-",
                   "tokens": 0, "measured_ms": gpu_ms, "check_rel_error": err})


# ---------------------------------------------------------------------------------------------
# Peer copies: the link itself, without a collective library
# ---------------------------------------------------------------------------------------------
def measure_peer_copy(nbytes: int, rank: int, n: int, device) -> None:
    """Copy engines moving a buffer to the next GPU: rank 0 alone (one direction), then every rank at once
    (with two GPUs: both directions of the same link together)."""
    if device.type != "cuda" or n < 2 or torch.cuda.device_count() < n:
        return
    peer = torch.device("cuda", (device.index + 1) % n)
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.full((nbytes // 4,), float("nan"), device=peer)
    dst.copy_(src)
    torch.cuda.synchronize(peer)
    err = require(rel_error(dst, src), 0.0, "peer copy")
    for pattern, active in (("one direction", rank == 0), ("all at once", True)):
        def copy():
            if active:
                dst.copy_(src, non_blocking=True)

        def copy_and_wait():
            copy()
            torch.cuda.synchronize(peer)  # the copy runs on the peer's stream: wait for it too

        ms = timed_ms(copy_and_wait, 4, device)
        report("ROW", {"experiment": "peer_copy", "op": pattern, "size_bytes": nbytes, "gpus": n, "step": "-",
                       "tokens": 0, "measured_ms": ms, "measured_gbps": nbytes / (ms * 1e-3) / 1e9,
                       "check_rel_error": err})


def measure_exchange(nbytes: int, rank: int, n: int, device) -> None:
    """NCCL's own point-to-point path: every rank sends `nbytes` to the next rank and receives as much from the
    previous one, at once (with two GPUs, both directions of the link). NCCL's kernels move these bytes with
    the SMs, through the same buffers as a collective: each rank reads and writes every byte it sends, and
    again every byte it receives."""
    if device.type != "cuda" or n < 2:
        return
    numel = nbytes // 4
    nxt, prev = (rank + 1) % n, (rank - 1) % n
    pattern = (torch.arange(numel, device=device) % 1021).float()  # exact in fp32, distinct per rank below
    send = pattern + 4096.0 * (rank + 1)
    recv = torch.full_like(send, float("nan"))

    def exchange():
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prev)])
        for work in works:
            work.wait()

    exchange()
    sync(device)
    err = require(float((recv - (pattern + 4096.0 * (prev + 1))).abs().max()), 0.0, "NCCL send/recv exchange")
    ms = timed_ms(exchange, 4, device)
    report("ROW", {"experiment": "nccl_p2p", "op": "exchange", "size_bytes": nbytes, "gpus": n, "step": "-",
                   "tokens": 0, "measured_ms": ms, "measured_gbps": nbytes / (ms * 1e-3) / 1e9,
                   "check_rel_error": err})
    del send, recv, pattern


# ---------------------------------------------------------------------------------------------
# One layer's MLP, data-parallel and tensor-parallel
# ---------------------------------------------------------------------------------------------
def mlp(x: torch.Tensor, w_gu: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """Llama's gated MLP: silu(x Wg) * (x Wu), then Wdown. w_gu holds Wg and Wu side by side."""
    gate, up = (x @ w_gu).chunk(2, dim=-1)  # (T, ff) each
    return (F.silu(gate) * up) @ w_down  # (T, d)


def gated_weight(d: int, ff: int, dtype, device, cols=None) -> torch.Tensor:
    """[Wg | Wu] (d x 2ff), or only the columns `cols` of each of Wg and Wu (a tensor-parallel shard)."""
    g = torch.Generator().manual_seed(11)
    full = torch.randn(d, 2 * ff, generator=g, dtype=torch.float64) / d**0.5
    if cols is not None:
        full = torch.cat([full[:, :ff][:, cols], full[:, ff:][:, cols]], dim=1)
    return full.to(dtype).to(device)


def down_weight(d: int, ff: int, dtype, device, rows=None) -> torch.Tensor:
    g = torch.Generator().manual_seed(12)
    full = torch.randn(ff, d, generator=g, dtype=torch.float64) / ff**0.5
    return (full if rows is None else full[rows]).to(dtype).to(device)


class AllReduceForward(torch.autograd.Function):
    """Megatron's g: sum the partial outputs across ranks going forward; pass the gradient through."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class AllReduceBackward(torch.autograd.Function):
    """Megatron's f: pass the input through going forward; sum the input's gradient across ranks backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


def tp_mlp(x, w_gu, w_down, communicate: bool = True):
    """The MLP with Wg, Wu split by columns and Wdown by rows: one all-reduce forward, one backward."""
    if communicate:
        x = AllReduceBackward.apply(x)
    y = mlp(x, w_gu, w_down)  # a partial sum of the output
    return AllReduceForward.apply(y) if communicate else y


def reference_mlp(d, ff, device):
    w_gu = gated_weight(d, ff, torch.float64, device).requires_grad_()
    w_down = down_weight(d, ff, torch.float64, device).requires_grad_()
    return w_gu, w_down


def check_tp(dtype, rank: int, n: int, device, d=24, ff=40, tokens=37) -> float:
    """Tensor-parallel output and input gradient on an odd shape against the unsplit MLP in float64."""
    cols = torch.arange(rank * ff // n, (rank + 1) * ff // n)
    x = rank_data(0, tokens * d, DTYPES[dtype], device, salt=3).view(tokens, d).requires_grad_()
    dy = rank_data(0, tokens * d, DTYPES[dtype], device, salt=4).view(tokens, d)
    w_gu = gated_weight(d, ff, DTYPES[dtype], device, cols)
    w_down = down_weight(d, ff, DTYPES[dtype], device, cols)
    y = tp_mlp(x, w_gu, w_down)
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    w_gu64, w_down64 = reference_mlp(d, ff, device)
    y64 = mlp(x64, w_gu64, w_down64)
    y64.backward(dy.double())
    err = max(rel_error(y, y64), rel_error(x.grad, x64.grad))
    return require(err, TOL[dtype], f"tensor-parallel MLP ({n} ranks)")


def check_dp(dtype, rank: int, n: int, device, d=24, ff=40, tokens=37) -> float:
    """Data-parallel gradients (each rank its own batch, then summed) against float64 over all batches."""
    w_gu = gated_weight(d, ff, DTYPES[dtype], device).requires_grad_()
    w_down = down_weight(d, ff, DTYPES[dtype], device).requires_grad_()
    x = rank_data(rank, tokens * d, DTYPES[dtype], device, salt=5).view(tokens, d)
    dy = rank_data(rank, tokens * d, DTYPES[dtype], device, salt=6).view(tokens, d)
    mlp(x, w_gu, w_down).backward(dy)
    for w in (w_gu, w_down):
        dist.all_reduce(w.grad)
    w_gu64, w_down64 = reference_mlp(d, ff, device)
    for r in range(n):
        x64 = rank_data(r, tokens * d, DTYPES[dtype], device, salt=5).view(tokens, d).double()
        dy64 = rank_data(r, tokens * d, DTYPES[dtype], device, salt=6).view(tokens, d).double()
        mlp(x64, w_gu64, w_down64).backward(dy64)
    err = max(rel_error(w_gu.grad, w_gu64.grad), rel_error(w_down.grad, w_down64.grad))
    return require(err, TOL[dtype], f"data-parallel gradients ({n} ranks)")


def dp_steps(x, dy, weights, device):
    """The four ways to time a data-parallel step: compute only, gradients' all-reduce only, one after the
    other, and overlapped (each gradient's all-reduce starts as soon as backward has produced it, as DDP does)."""
    def backward_only():
        for w in weights:
            w.grad = None
        mlp(x, *weights).backward(dy)

    def allreduce_only():
        for w in weights:
            dist.all_reduce(w.grad)

    def serial():
        backward_only()
        allreduce_only()

    pending = []

    def launch(w):
        pending.append(dist.all_reduce(w.grad, async_op=True))

    def overlapped():
        for w in weights:
            w.grad = None
        hooks = [w.register_post_accumulate_grad_hook(launch) for w in weights]
        mlp(x, *weights).backward(dy)
        for h in hooks:
            h.remove()
        for work in pending:
            work.wait()
        pending.clear()

    backward_only()  # allreduce_only needs gradients to exist
    return {"compute": backward_only, "communication": allreduce_only, "serial": serial, "overlapped": overlapped}


def tp_steps(x, dy, weights):
    def step(communicate):
        def run():
            x.grad = None
            for w in weights:
                w.grad = None
            tp_mlp(x, *weights, communicate=communicate).backward(dy)
        return run

    y = torch.empty_like(x)
    gx = torch.empty_like(x)

    def communication():
        dist.all_reduce(y)
        dist.all_reduce(gx)

    return {"compute": step(False), "communication": communication, "serial": step(True)}


def measure_layers(spec: dict, rank: int, n: int, device, done: int, total: int) -> int:
    d, ff, dtype = spec["d_model"], spec["d_ff"], spec["dtype"]
    dt = DTYPES[dtype]
    for kind in spec["layer_steps"]:
        err = check_dp(dtype, rank, n, device) if kind == "dp" else check_tp(dtype, rank, n, device)
        if kind == "tp" and ff % n:
            raise ValueError(f"d_ff = {ff} does not split over {n} GPUs")
        for tokens in spec["layer_tokens"]:
            if kind == "dp":
                weights = [gated_weight(d, ff, dt, device).requires_grad_(), down_weight(d, ff, dt, device).requires_grad_()]
                seed = rank
            else:
                cols = torch.arange(rank * ff // n, (rank + 1) * ff // n)
                weights = [gated_weight(d, ff, dt, device, cols).requires_grad_(),
                           down_weight(d, ff, dt, device, cols).requires_grad_()]
                seed = 0  # tensor parallelism: every rank sees the same tokens
            x = rank_data(seed, tokens * d, dt, device, salt=8).view(tokens, d).requires_grad_()
            dy = rank_data(seed, tokens * d, dt, device, salt=9).view(tokens, d)
            steps = dp_steps(x, dy, weights, device) if kind == "dp" else tp_steps(x, dy, weights)
            for step, fn in steps.items():
                progress(done / total, f"{kind} layer step, {tokens} tokens per GPU: {step}")
                ms = timed_ms(fn, 4, device)
                host = host_issue_ms(fn, 4, device)  # leaves _LAST_SAMPLES, the step's own batches, as they are
                report("ROW", {"experiment": kind, "op": "-", "size_bytes": 0, "gpus": n, "step": step,
                               "tokens": tokens, "measured_ms": ms, "host_ms": host, "check_rel_error": err})
                done += 1
            del weights, x, dy, steps
    return done


def main() -> int:
    spec = json.loads(sys.argv[1])
    rank, n, device = setup()
    try:
        total = len(spec["ops"]) * len(spec["sizes_bytes"]) + len(spec["layer_steps"]) * len(spec["layer_tokens"]) * 4
        done = measure_collectives(spec["ops"], spec["sizes_bytes"], spec["dtype"], rank, n, device, 0, max(total, 1))
        if spec.get("peer_copy_bytes"):
            progress(done / max(total, 1), "the link alone: copy engines, then NCCL's send/recv exchange")
            measure_peer_copy(spec["peer_copy_bytes"], rank, n, device)
            measure_exchange(spec["peer_copy_bytes"], rank, n, device)
        measure_layers(spec, rank, n, device, done, max(total, 1))
        progress(1.0, "done")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
