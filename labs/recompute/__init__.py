"""
Recomputation: spend arithmetic to save memory traffic
=====================================================

What you will learn:
- what a backward pass reads: the activations the forward pass stored, from device memory;
- recomputation: store less in the forward pass and recompute it in the backward pass, from the
  input, in registers. When the kernels are memory-bound the arithmetic is free and the pass is
  faster: memory accesses, not FLOPs, set the time;
- that this is the same trick as activation checkpointing, there used to save memory, here for speed.

The experiment: out = sigmoid(sigmoid(sigmoid(x))), forward and backward, three ways:
- autograd: three eager sigmoids; autograd saves each one's output for its backward (6 kernels,
  15 accesses of an element-sized tensor per element);
- stored: one fused forward kernel that writes s1, s2 and out, one fused backward kernel that reads
  dout, s1 and s2 and writes dx (the lecture's count: 1 + 3 + 3 + 1 = 8 accesses);
- recomputed: the forward kernel writes only out; the backward kernel reads dout and x and
  recomputes s1, s2 and out on the fly (1 + 1 + 2 + 1 = 5 accesses).
Model: time = accesses x bytes per element x elements / bandwidth + kernels x launch cost, so
recomputing should be 8/5 = 1.6x faster than storing. At small sizes a step's Python outlasts its kernels:
the run reads the CPU's clock at each launch of the timed steps, and the model feeds the kernels to the GPU
at those times (step_ms).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from labs.engine import timing
from labs.fusion import LAUNCH_US
from labs.engine.gpu import MiB, Target, free_memory_bytes
from labs.engine.lab import Headline, Lab
from labs.engine.params import ParamError, param

BLOCK, NUM_WARPS = 2048, 8


# ---------------------------------------------------------------------------------------------
# 1. The kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def _load(ptr, offs, mask, F64: tl.constexpr):
    """Load and widen: arithmetic in fp32 (fp64 when the tensors are fp64, as in the tests)."""
    v = tl.load(ptr + offs, mask=mask)
    if F64:
        v = v.to(tl.float64)
    else:
        v = v.to(tl.float32)
    return v


@triton.jit
def sigmoid3_forward_kernel(x_ptr, out_ptr, s1_ptr, s2_ptr, n, STORE: tl.constexpr, BLOCK: tl.constexpr,
                            F64: tl.constexpr):
    """out = sigmoid(sigmoid(sigmoid(x))); with STORE, also write s1 and s2 for the backward pass."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = _load(x_ptr, offs, mask, F64)  # read 1
    s1 = tl.sigmoid(x)
    s2 = tl.sigmoid(s1)
    out = tl.sigmoid(s2)
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=mask)  # write 1
    if STORE:  # the activations the backward pass will need: 2 more writes
        tl.store(s1_ptr + offs, s1.to(s1_ptr.dtype.element_ty), mask=mask)
        tl.store(s2_ptr + offs, s2.to(s2_ptr.dtype.element_ty), mask=mask)


@triton.jit
def sigmoid3_backward_kernel(dout_ptr, x_ptr, s1_ptr, s2_ptr, dx_ptr, n, RECOMPUTE: tl.constexpr,
                             BLOCK: tl.constexpr, F64: tl.constexpr):
    """dx = dout * out' * s2' * s1', where sigmoid'(.) = s (1 - s) of that sigmoid's output s."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = _load(dout_ptr, offs, mask, F64)  # read: the gradient arriving from above
    if RECOMPUTE:  # read x and redo the forward in registers: 1 read instead of 2
        s1 = tl.sigmoid(_load(x_ptr, offs, mask, F64))
        s2 = tl.sigmoid(s1)
    else:  # read the stored activations: 2 reads
        s1 = _load(s1_ptr, offs, mask, F64)
        s2 = _load(s2_ptr, offs, mask, F64)
    out = tl.sigmoid(s2)  # cheaper to recompute from s2 than to store and read back
    g = g * out * (1 - out)
    g = g * s2 * (1 - s2)
    g = g * s1 * (1 - s1)
    tl.store(dx_ptr + offs, g.to(dx_ptr.dtype.element_ty), mask=mask)  # write: dx


def _launch_args(x: torch.Tensor) -> dict:
    return {"BLOCK": BLOCK, "F64": x.dtype == torch.float64, "num_warps": NUM_WARPS}


def sigmoid3_forward(x: torch.Tensor, store: bool, out: Optional[torch.Tensor] = None,
                     s1: Optional[torch.Tensor] = None, s2: Optional[torch.Tensor] = None) -> tuple:
    """(out, s1, s2); s1 and s2 are None unless `store`."""
    out = torch.empty_like(x) if out is None else out
    if store:
        s1 = torch.empty_like(x) if s1 is None else s1
        s2 = torch.empty_like(x) if s2 is None else s2
    grid = (triton.cdiv(x.numel(), BLOCK),)
    sigmoid3_forward_kernel[grid](x, out, s1 if store else out, s2 if store else out, x.numel(), STORE=store,
                                  **_launch_args(x))
    return out, (s1 if store else None), (s2 if store else None)


def sigmoid3_backward(dout: torch.Tensor, x: Optional[torch.Tensor] = None, s1: Optional[torch.Tensor] = None,
                      s2: Optional[torch.Tensor] = None, dx: Optional[torch.Tensor] = None) -> torch.Tensor:
    """dx from x (recomputing) or from the stored s1 and s2."""
    recompute = x is not None
    dx = torch.empty_like(dout) if dx is None else dx
    grid = (triton.cdiv(dout.numel(), BLOCK),)
    sigmoid3_backward_kernel[grid](dout, x if recompute else dout, s1 if not recompute else dout,
                                   s2 if not recompute else dout, dx, dout.numel(), RECOMPUTE=recompute,
                                   **_launch_args(dout))
    return dx


class StackedSigmoids(torch.autograd.Function):
    """sigmoid(sigmoid(sigmoid(x))) with Triton kernels; `recompute` picks what the backward reads. `mark`, if
    given, is called right after each kernel launch (the timer reads the CPU's clock there)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, recompute: bool, mark=None) -> torch.Tensor:
        x = x.contiguous()
        out, s1, s2 = sigmoid3_forward(x, store=not recompute)
        if mark is not None:
            mark()
        ctx.recompute, ctx.mark = recompute, mark
        # Saving the input costs nothing (it exists anyway); saving s1 and s2 is the activation memory.
        ctx.save_for_backward(*((x,) if recompute else (s1, s2)))
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        saved = ctx.saved_tensors
        dout = dout.contiguous()
        if ctx.recompute:
            dx = sigmoid3_backward(dout, x=saved[0])
        else:
            dx = sigmoid3_backward(dout, s1=saved[0], s2=saved[1])
        if ctx.mark is not None:
            ctx.mark()
        return dx, None, None


# ---------------------------------------------------------------------------------------------
# 2. The three versions, and the float64 reference
# ---------------------------------------------------------------------------------------------
def sigmoid3_autograd(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(torch.sigmoid(torch.sigmoid(x)))


VARIANTS = {  # name -> forward function (x, mark=None); mark() is called after each of our kernel launches
    "stored": lambda x, mark=None: StackedSigmoids.apply(x, False, mark),
    "recomputed": lambda x, mark=None: StackedSigmoids.apply(x, True, mark),
    "autograd": lambda x, mark=None: sigmoid3_autograd(x),  # PyTorch launches these: no clock to read inside
}


def forward_backward(forward, x: torch.Tensor, dout: torch.Tensor, mark=None) -> tuple:
    """(out, dx) for one training step's worth of this function (x must require grad). With `mark`, the CPU's
    clock is read after each of our kernel launches and at the end of the forward pass."""
    if mark is None:
        out = forward(x)
    else:
        out = forward(x, mark)
        mark()
    (dx,) = torch.autograd.grad(out, x, dout)  # returns dx without accumulating into x.grad
    return out, dx


def reference(x: torch.Tensor, dout: torch.Tensor) -> tuple:
    """(out, dx) by autograd in float64."""
    x64 = x.detach().to(torch.float64).requires_grad_(True)
    return tuple(t.detach() for t in forward_backward(sigmoid3_autograd, x64, dout.to(torch.float64)))


# ---------------------------------------------------------------------------------------------
# 3. The model
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Params:
    dtypes: tuple = param(("fp32", "bf16"), "storage dtype of x, the activations and the gradients "
                          "(arithmetic in fp32)", choices=("fp32", "bf16", "fp16"))
    sizes_mib: tuple = param((16, 64, 256, 1024), "size of x (each activation and gradient is as large)",
                             unit="MiB", min=1, max=8192, log=True)


# Each version's kernels as (accesses of an element-sized tensor, sigmoids computed), and the
# activations it keeps for the backward pass beyond x and out (in element-sized tensors).
KERNELS = {
    "stored": [(1 + 3, 3), (3 + 1, 1)],  # forward: read x, write s1 s2 out; backward: read dout s1 s2, write dx
    "recomputed": [(1 + 1, 3), (2 + 1, 3)],  # forward: read x, write out; backward: read dout x, write dx
    "autograd": [(1 + 1, 1)] * 3 + [(2 + 1, 0)] * 3,  # 3 sigmoids; 3 sigmoid_backward (read grad and s)
}
SAVED = {"stored": 2, "recomputed": 0, "autograd": 2}
SFU_OPS_PER_SIGMOID = 2  # 1 / (1 + exp(-x)): one exponential and one reciprocal on the special function units


def sfu_ops_per_s(target: Target) -> float:
    """Special-function-unit results per second. Every SM has 16 SFU lanes against 128 FP32 lanes
    (64 on compute capability 7.x and 8.0), so the SFU rate follows from the measured FMA rate."""
    fp32_lanes = 64 if target.compute_capability.startswith("7.") or target.compute_capability == "8.0" else 128
    return target.ceilings.fma_tflops * 1e12 / 2 * 16 / fp32_lanes


def kernel_ms(accesses: int, sigmoids: int, nbytes: int, dtype: str, target: Target) -> tuple:
    """(ms, limit) of one elementwise kernel: the slower of its bytes and its exp/reciprocal work."""
    memory = accesses * nbytes / (target.ceilings.copy_tbps * 1e12) * 1e3
    n = nbytes // timing.element_bytes(dtype)
    sfu = sigmoids * SFU_OPS_PER_SIGMOID * n / sfu_ops_per_s(target) * 1e3
    return max(memory, sfu) + LAUNCH_US * 1e-3, ("memory" if memory >= sfu else "special functions")


def timer_host_floor_ms(host_ms: float, target: Target) -> float:
    """The shortest time the timer can report for a call whose CPU side takes host_ms: all of it.

    The timer clears the L2 with a 256 MB write before each call. If the CPU starts preparing the call while that
    write runs, the events see only part of the CPU's time, and how much they miss depends on how long the write
    takes on this GPU (0.09 ms on an H100, 0.06 ms on an H200): the 2026-11-23 recordings of this lab had CPU-bound
    steps 0.03-0.06 ms under their CPU time on the H100 and 0-0.02 ms under it on the H200. This lab's timer
    therefore waits for the write to finish before it starts the clock (time_step), so the floor is the CPU's whole
    time on every GPU. scripts/models_gpu.py (section terms) tests the overlap.
    """
    return host_ms


FLUSH_BYTES = 256 * 2**20  # what triton's do_bench (timing.time_ms) writes to empty the L2 before each call


def time_with_host_ms(fn, warmup_ms: float = 25, rep_ms: float = 100, max_reps: int = 2000,
                      wait_for_flush: bool = False) -> tuple[float, float]:
    """(GPU ms, CPU ms) of one call of `fn`: the medians, over the same calls, of the time between CUDA events
    around each call and of the CPU's time inside it.

    The calls are timed as timing.time_ms (triton's do_bench) times them: a 256 MiB write empties the L2 before
    each, events on either side. Measuring the CPU's time in the very same calls, rather than in a separate loop,
    matters where the CPU is the floor: on a shared host the CPU's speed drifts by a third between two loops a
    second apart (scripts/naive_models_gpu.py, section host), so a floor measured apart from the timed calls
    cannot be trusted to 15 %.

    Without `wait_for_flush` (do_bench's way, the attention lab's timer) the CPU prepares each call while the write
    runs, and its clock runs between the two events' recording. With it, the CPU waits for the write before it
    starts the call (see time_step).
    """
    timed = time_step(lambda mark: fn(), warmup_ms, rep_ms, max_reps, wait_for_flush)
    return timed["gpu_ms"], timed["host_ms"]


def time_step(step, warmup_ms: float = 25, rep_ms: float = 100, max_reps: int = 2000,
              wait_for_flush: bool = True) -> dict:
    """The GPU's and the CPU's time of one call of `step(mark)`, medians over the same calls:
    {"gpu_ms": between the CUDA events around each call, "host_ms": the CPU's time, "marks_ms": [the CPU's time
    from the start of its window to each mark() the step made, in order]}.

    With `wait_for_flush`, the CPU waits for the L2-clearing write to finish before each call, so the GPU is idle
    when the clock starts and the CPU gets no head start on any GPU. The GPU then sees all of the CPU's lead-in,
    and the CPU's clock must cover everything the events can: it runs from before the start event is recorded to
    after the end event is recorded. (Read between the two records, it missed the records themselves and the
    Python around them, and CPU-bound steps came out 11-13 % above it on both an H100 and an H200.)
    Without the wait (see time_with_host_ms) the clock runs between the two records, as it always has there.
    """
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    idle = lambda: None  # noqa: E731 - mark() outside the timed calls
    step(idle)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        flush.zero_()
        step(idle)
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / estimate))):
        step(idle)
    n = max(5, min(max_reps, int(rep_ms / estimate)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    host, marks = [], []
    for i in range(n):
        stamps = []
        flush.zero_()
        if wait_for_flush:
            torch.cuda.synchronize()  # the GPU is idle when the clock starts: no head start for the CPU
            t0 = time.perf_counter()  # before the start event: the CPU's window covers the events'
            starts[i].record()
        else:
            starts[i].record()
            t0 = time.perf_counter()
        step(lambda: stamps.append(time.perf_counter()))
        if not wait_for_flush:
            host.append(time.perf_counter() - t0)
        ends[i].record()
        if wait_for_flush:
            host.append(time.perf_counter() - t0)
        marks.append([t - t0 for t in stamps])
    torch.cuda.synchronize()
    gpu_ms = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))
    per_mark = [statistics.median(m[j] for m in marks) * 1e3 for j in range(min(len(m) for m in marks))]
    return {"gpu_ms": float(gpu_ms), "host_ms": statistics.median(host) * 1e3, "marks_ms": per_mark}


# How many of each version's KERNELS its forward pass launches (the rest are the backward pass's).
FORWARD_KERNELS = {"stored": 1, "recomputed": 1, "autograd": 3}


def launch_times_ms(variant: str, marks_ms: list) -> tuple:
    """(the CPU's clock at each kernel launch, at the end of the forward pass, at the end of the backward pass),
    from the marks of one timed step (time_step; in order of the calls to mark()).

    Our Triton versions read the clock right after each launch: [forward launch, forward end, backward launch,
    backward end]. Autograd's six kernels are launched inside PyTorch, where no clock can be read ([forward end,
    backward end]): each pass's launches are spread evenly over its CPU time, each at the end of its share.
    """
    if variant != "autograd":
        launch_forward, forward_end, launch_backward, backward_end = marks_ms
        return [launch_forward, launch_backward], forward_end, backward_end
    forward_end, backward_end = marks_ms
    k_forward = FORWARD_KERNELS[variant]
    k_backward = len(KERNELS[variant]) - k_forward
    launches = [forward_end * (j + 1) / k_forward for j in range(k_forward)]
    launches += [forward_end + (backward_end - forward_end) * (j + 1) / k_backward for j in range(k_backward)]
    return launches, forward_end, backward_end


def step_ms(kernels_ms: list, launches_ms: list, host_ms: float) -> float:
    """One training step from an idle GPU, with the CPU launching what the GPU runs.

    The CPU's clock starts with the GPU's (time_step) and launches kernel i at launches_ms[i]. The GPU starts a
    kernel once it is launched and the previous one is done. The step ends when both the GPU's last kernel and the
    CPU's last record (host_ms) are done. A step whose Python outlasts its kernels takes host_ms; one whose kernels
    outlast the Python takes the first launch (the CPU's lead-in, which the idle GPU waits for) plus the kernels.
    """
    done = 0.0
    for launch, ms in zip(launches_ms, kernels_ms):
        done = max(done, launch) + ms
    return max(done, host_ms)


def with_host_floor(row: dict, gpu_ms: float, host_ms: float, nbytes_moved: float, target: Target) -> dict:
    """The model once the CPU's time per call is known (measured in the run): the larger of the GPU's time
    and the part of the CPU's time the timer sees."""
    floor_ms = timer_host_floor_ms(host_ms, target)
    ms = max(gpu_ms, floor_ms)
    return {**row, "host_ms": host_ms, "gpu_model_ms": gpu_ms, "predicted_ms": ms,
            "predicted_tbps": nbytes_moved / (ms * 1e-3) / 1e12, "limited_by": "CPU" if floor_ms > gpu_ms else "GPU"}


def with_step_model(row: dict, variant: str, nbytes: int, dtype: str, host_ms: float, marks_ms: list,
                    target: Target) -> dict:
    """The model once the step's CPU times are known (measured in the run by time_step): the GPU's kernels,
    each from the roofline, fed by the CPU's launches (step_ms)."""
    kernels = [kernel_ms(a, s, nbytes, dtype, target)[0] for a, s in KERNELS[variant]]
    launches, forward_end, backward_end = launch_times_ms(variant, marks_ms)
    ms = step_ms(kernels, launches, host_ms)
    accesses = sum(a for a, _ in KERNELS[variant])
    ours = variant != "autograd"  # our Triton kernels' launches were read; autograd's are spread
    return {**row, "host_ms": host_ms, "host_forward_ms": forward_end, "host_backward_ms": backward_end,
            "host_forward_launch_ms": launches[0] if ours else None,
            "host_backward_launch_ms": launches[1] if ours else None, "gpu_model_ms": sum(kernels),
            "predicted_ms": ms, "predicted_tbps": accesses * nbytes / (ms * 1e-3) / 1e12,
            "limited_by": "CPU" if host_ms > sum(kernels) else "GPU"}


def predict_ms(variant: str, nbytes: int, target: Target, dtype: str = "fp32") -> float:
    return sum(kernel_ms(a, s, nbytes, dtype, target)[0] for a, s in KERNELS[variant])


def predict(params: Params, target: Target) -> list[dict]:
    rows = []
    for dtype in params.dtypes:
        for size in params.sizes_mib:
            nbytes = size * MiB
            stored_ms = predict_ms("stored", nbytes, target, dtype)
            for variant, kernels in KERNELS.items():
                ms = predict_ms(variant, nbytes, target, dtype)
                accesses = sum(a for a, _ in kernels)
                limits = {kernel_ms(a, s, nbytes, dtype, target)[1] for a, s in kernels}
                rows.append({"dtype": dtype, "size_mib": size, "variant": variant, "predicted_kernels": len(kernels),
                             "accesses": accesses, "bytes_moved": accesses * nbytes, "sigmoids": sum(s for _, s in kernels),
                             "bound": " and ".join(sorted(limits)), "predicted_ms": ms,
                             "predicted_speedup": stored_ms / ms, "predicted_activation_bytes": SAVED[variant] * nbytes,
                             "predicted_tbps": accesses * nbytes / (ms * 1e-3) / 1e12})
    return rows


# ---------------------------------------------------------------------------------------------
# 4. The measurement
# ---------------------------------------------------------------------------------------------
CHECK_ELEMENTS = 1_000_003  # odd: the last program is partly masked


def check(params: Params, target: Target) -> None:
    """x, dout, out, s1, s2 and dx at the largest size, plus the timer's 256 MiB flush buffer."""
    need = 6 * max(params.sizes_mib) * MiB + 256 * MiB
    free = free_memory_bytes() if target.live else target.memory_bytes
    if need > 0.9 * free:
        largest = int((0.9 * free - 256 * MiB) / 6 / MiB)
        raise ParamError(f"sizes_mib up to {max(params.sizes_mib)} needs {need / 1e9:.1f} GB (x, dout, out, two "
                         f"activations, dx); this GPU has {free / 1e9:.1f} GB free. Choose sizes <= {largest} MiB.")


def check_kernels(dtype: str, device: Optional[str] = None, n: int = CHECK_ELEMENTS) -> float:
    """Every kernel (outputs poisoned with NaN) and every version end to end against float64 autograd.
    Returns the largest relative error."""
    x = timing.random_tensor((n,), dtype, device)
    dout = timing.random_tensor((n,), dtype, device)
    ref_out, ref_dx = reference(x, dout)
    errors = []
    nan = lambda: torch.full_like(x, float("nan"))  # noqa: E731 - a poisoned output
    for store in (True, False):
        out, s1, s2 = sigmoid3_forward(x, store, nan(), nan(), nan())
        errors.append(timing.check_close(out, ref_out, dtype, f"forward kernel ({dtype}, store={store})"))
        if store:
            x64 = x.to(torch.float64)
            errors.append(timing.check_close(s1, torch.sigmoid(x64), dtype, f"stored s1 ({dtype})"))
            errors.append(timing.check_close(s2, torch.sigmoid(torch.sigmoid(x64)), dtype, f"stored s2 ({dtype})"))
            dx = sigmoid3_backward(dout, s1=s1, s2=s2, dx=nan())
        else:
            dx = sigmoid3_backward(dout, x=x, dx=nan())
        errors.append(timing.check_close(dx, ref_dx, dtype, f"backward kernel ({dtype}, recompute={not store})"))
    for variant, forward in VARIANTS.items():
        out, dx = forward_backward(forward, x.detach().clone().requires_grad_(True), dout)
        errors.append(timing.check_close(out, ref_out, dtype, f"{variant}: forward ({dtype})"))
        errors.append(timing.check_close(dx, ref_dx, dtype, f"{variant}: gradient ({dtype})"))
    return max(errors)


def activation_bytes(forward, x: torch.Tensor) -> int:
    """Peak memory of the forward pass beyond what was allocated before it and the output itself:
    what the forward keeps for the backward (torch.cuda.max_memory_allocated)."""
    timing.sync()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = forward(x)
    timing.sync()
    peak = torch.cuda.max_memory_allocated()
    held = peak - before - out.numel() * out.element_size()
    del out
    return int(held)


def measure(params: Params, target: Target, progress):
    total = len(params.dtypes) * len(params.sizes_mib) * len(VARIANTS)
    done = 0
    for dtype in params.dtypes:
        progress(done / total, f"{dtype}: checking every kernel and gradient against float64 autograd")
        err = check_kernels(dtype)
        for size in params.sizes_mib:
            n = size * MiB // timing.element_bytes(dtype)
            x = timing.random_tensor((n,), dtype).requires_grad_(True)
            dout = timing.random_tensor((n,), dtype)
            stored_ms = None
            for variant, forward in VARIANTS.items():  # "stored" first: the others' speed-up is against it
                progress(done / total, f"{dtype}, {size} MiB: {variant}: activation memory and timing")
                held = activation_bytes(forward, x)

                def step(mark, forward=forward):  # one training step, the CPU's clock read at its launches
                    forward_backward(forward, x, dout, mark)
                    mark()

                timed = time_step(step)  # GPU and CPU times measured in the same calls
                ms = timed["gpu_ms"]
                stored_ms = ms if variant == "stored" else stored_ms
                done += 1
                accesses = sum(a for a, _ in KERNELS[variant])
                row = {"dtype": dtype, "size_mib": size, "variant": variant, "measured_ms": ms,
                       "measured_speedup": stored_ms / ms, "measured_activation_bytes": held,
                       "measured_tbps": timing.tbps(accesses * size * MiB, ms), "check_rel_error": err}
                yield with_step_model(row, variant, size * MiB, dtype, timed["host_ms"], timed["marks_ms"], target)
            del x, dout
    progress(1.0, "done")


def recorded_marks(row: dict) -> Optional[list]:
    """A recorded row's CPU times in the order time_step's marks come (see launch_times_ms), or None where the
    recording predates them."""
    names = ["host_forward_ms", "host_backward_ms"]
    if row.get("variant") != "autograd":
        names = ["host_forward_launch_ms", "host_forward_ms", "host_backward_launch_ms", "host_backward_ms"]
    marks = [row.get(name) for name in names]
    return marks if all(isinstance(m, (int, float)) for m in marks) else None


def repredict(recording: dict, target: Target) -> list[dict]:
    """The model of a recorded run with the CPU time per step that run measured at each point."""
    from labs.engine.params import from_dict

    params = from_dict(Params, recording["params"])
    measured = {(r["dtype"], r["size_mib"], r["variant"]): r for r in recording["rows"]
                if r.get("host_ms") is not None}
    rows = []
    for row in predict(params, target):
        key = (row["dtype"], row["size_mib"], row["variant"])
        got = measured.get(key)
        nbytes, accesses = row["size_mib"] * MiB, sum(a for a, _ in KERNELS[row["variant"]])
        marks = recorded_marks(got) if got is not None else None
        if marks is not None:
            row = with_step_model(row, row["variant"], nbytes, row["dtype"], got["host_ms"], marks, target)
        elif got is not None:  # recorded before the launches' CPU times were: the CPU floor alone
            row = with_host_floor(row, predict_ms(row["variant"], nbytes, target, row["dtype"]), got["host_ms"],
                                  accesses * nbytes, target)
        rows.append(row)
    return rows


def lesson_numbers(target: Target) -> dict:
    nbytes = 1024 * MiB
    ms = {v: predict_ms(v, nbytes, target) for v in KERNELS}
    bf16 = {v: predict_ms(v, nbytes, target, "bf16") for v in KERNELS}
    return {
        "gpu": target.name,
        "bandwidth_tbps": f"{target.ceilings.copy_tbps:.2f}",
        "ceilings_source": target.describe_ceilings(),
        "stored_1gib_ms": f"{ms['stored']:.2f}",
        "recomputed_1gib_ms": f"{ms['recomputed']:.2f}",
        "autograd_1gib_ms": f"{ms['autograd']:.2f}",
        "speedup": f"{ms['stored'] / ms['recomputed']:.2f}",
        "autograd_speedup": f"{ms['autograd'] / ms['recomputed']:.2f}",
        "bf16_speedup": f"{bf16['stored'] / bf16['recomputed']:.2f}",
        "sfu_tops": f"{sfu_ops_per_s(target) / 1e12:.1f}",
        "fma_tflops": f"{target.ceilings.fma_tflops:.1f}",
    }


LAB = Lab(
    name="recompute",
    title="Recomputation",
    summary="Three stacked sigmoids, forward and backward: a backward pass that recomputes the activations "
            "from x instead of reading them back moves 5/8 of the bytes and runs 1.6x faster.",
    terms=("recomputation", "activation-checkpointing", "kernel-fusion", "memory-bound", "hbm",
           "memory-bandwidth", "training-memory", "triton", "kernel", "arithmetic-intensity", "registers", "sfu"),
    Params=Params,
    predict=predict,
    measure=measure,
    key=("dtype", "size_mib", "variant"),
    metric="ms",
    order=55,
    check=check,
    lesson_numbers=lesson_numbers,
    headline=Headline("How many times faster is forward + backward (fp32, 1 GiB) when the backward pass "
                      "recomputes the sigmoids instead of reading stored activations?", "x",
                      {"dtype": "fp32", "size_mib": 1024, "variant": "recomputed"}, "speedup"),
)
