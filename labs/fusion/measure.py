"""Measuring kernel fusion: refuse what does not fit, check every version against float64 (output poisoned
first, odd sizes), then time it and read what it launched with torch.profiler."""

from __future__ import annotations

import math
from typing import Callable

import torch

from labs.engine import timing
from labs.engine.gpu import MiB, Target, free_memory_bytes
from labs.engine.params import ParamError
from labs.fusion.kernels import (A, B, affine_chain, chain_eager, online_softmax, sin2_cos2, sincos_eager,
                                 softmax_config, softmax_decomposed)
from labs.fusion.model import (F32, SINCOS, SOFTMAX, SOFTMAX_PROBE_COLS, SOFTMAX_PROBE_MIB, _row, model_ms,
                               softmax_shape, torch_softmax_moves, with_host_floor, with_softmax_probes)
from labs.fusion.profiling import back_to_back_ms, launched_kernels, summarize_kernels


# ---------------------------------------------------------------------------------------------
# References (float64)
# ---------------------------------------------------------------------------------------------
def reference_sincos(x: torch.Tensor, b: float = 1.0) -> torch.Tensor:
    x64 = x.to(torch.float64)
    return torch.sin(x64) ** 2 + b * torch.cos(x64) ** 2


def reference_chain(x: torch.Tensor, ops: int) -> torch.Tensor:
    """Closed form of `ops` steps of y <- a y + b: a^k y0 + b (1 - a^k) / (1 - a)."""
    a_k = A**ops
    return a_k * x.to(torch.float64) + B * (1 - a_k) / (1 - A)


def reference_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x.to(torch.float64), dim=1)


# ---------------------------------------------------------------------------------------------
# The measurement
# ---------------------------------------------------------------------------------------------
CHECK_ELEMENTS = 1_000_003  # an odd size: the last program is partly masked


def check(params, target: Target) -> None:
    """Refuse what does not fit in free GPU memory (the largest experiment, with 10% to spare)."""
    need = 0
    if "sincos" in params.experiments:
        need = max(need, 6 * max(params.sizes_mib) * MiB)  # x, output and eager's intermediates
    if "chain" in params.experiments:
        need = max(need, 4 * params.chain_mib * MiB)
    if "softmax" in params.experiments:
        need = max(need, 5 * params.softmax_mib * MiB)
    need += 256 * MiB  # the timer's L2-flush buffer
    free = free_memory_bytes() if target.live else target.memory_bytes
    if need > 0.9 * free:
        raise ParamError(f"These sizes need {need / 1e9:.1f} GB of GPU memory (inputs, outputs and eager "
                         f"PyTorch's intermediates); this GPU has {free / 1e9:.1f} GB free. Choose smaller sizes.")


def try_compile(fn: Callable, *example) -> tuple:
    """(compiled fn, "") or (None, why not), compiled for the shapes of `example`.

    Static shapes (one compile per size) let Inductor assume what Triton kernels like (sizes
    divisible by 16, so wide vector loads). torch.compile needs a working tool chain (a C compiler,
    and Triton on a GPU); when anything fails the lab reports why and goes on.
    """
    try:
        torch._dynamo.reset()  # forget earlier sizes: this call compiles for these shapes afresh
        compiled = torch.compile(fn, fullgraph=True, dynamic=False)
        compiled(*example)  # compilation happens at the first call
        return compiled, ""
    except Exception as exc:  # noqa: BLE001 - any failure in the compiler stack becomes a note
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        return None, f"torch.compile failed here ({type(exc).__name__}: {first})"


def _poisoned_check(run: Callable[[torch.Tensor], object], out: torch.Tensor, ref: torch.Tensor, what: str) -> float:
    out.fill_(float("nan"))  # an element left unwritten fails the check
    run(out)
    return timing.check_close(out, ref, "fp32", what)


def _check_ones(out: torch.Tensor, what: str) -> float:
    """sin^2 + cos^2 = 1 exactly: ||out - 1|| / ||1|| without a float64 copy of a large output."""
    err = (torch.linalg.vector_norm(out - 1.0) / math.sqrt(out.numel())).item()
    if not err <= timing.TOLERANCE["fp32"]:
        raise timing.KernelMismatch(f"{what}: relative error {err:.3g} exceeds the fp32 tolerance")
    return err


def _measured(ms: float, nbytes: float, nbytes_useful: float, kernels: list) -> dict:
    """The timed rates, and what torch.profiler saw in one call at the same size."""
    return {"measured_ms": ms, "measured_tbps": timing.tbps(nbytes, ms),
            "measured_effective_tbps": timing.tbps(nbytes_useful, ms), "measured_kernels": len(kernels),
            "profiled_kernel_ms": sum(us for _, us in kernels) / 1e3, "kernel_names": summarize_kernels(kernels)}


def _points(params) -> int:
    total = 0
    if "sincos" in params.experiments:
        total += len(params.sizes_mib) * (len(SINCOS) - (0 if params.compile else 1))
    if "chain" in params.experiments:
        total += 2 * len(params.chain_ops)
    if "softmax" in params.experiments:
        total += len(SOFTMAX) * len(params.softmax_cols)
    return total


def measure(params, target: Target, progress):
    total, done = _points(params), [0]

    def step(message: str) -> None:
        progress(min(done[0] / total, 1.0), message)

    if "sincos" in params.experiments:
        yield from _measure_sincos(params, target, step, done)
    if "chain" in params.experiments:
        yield from _measure_chain(params, step, done)
    if "softmax" in params.experiments:
        yield from _measure_softmax(params, target, step, done)
    progress(1.0, "done")


def _time_and_profile(run: Callable[[], object]) -> tuple:
    """(median ms, [(kernel, us)] of one profiled call)."""
    return timing.time_ms(run), launched_kernels(run)


def _measure_sincos(params, target: Target, step, done):
    probe = timing.random_tensor((CHECK_ELEMENTS,), "fp32")
    ref, out = reference_sincos(probe), torch.empty_like(probe)
    step("sin^2 + cos^2: checking the kernels against float64 (b = 1, and b = -1 which gives -cos 2x)")
    _poisoned_check(lambda o: sin2_cos2(probe, 1.0, o), out, ref, "fused sin^2 + cos^2")
    _poisoned_check(lambda o: sin2_cos2(probe, -1.0, o), out, reference_sincos(probe, -1.0), "fused sin^2 - cos^2")
    timing.check_close(sincos_eager(probe), ref, "fp32", "eager sin^2 + cos^2")
    note = ""
    if params.compile:
        step("sin^2 + cos^2: compiling with torch.compile (the first compile takes a few seconds)")
        compiled, note = try_compile(sincos_eager, probe)
        if compiled is not None:
            timing.check_close(compiled(probe), ref, "fp32", "torch.compile sin^2 + cos^2")
    del probe, ref, out
    for size in params.sizes_mib:
        n = size * MiB // F32
        x = timing.random_tensor((n,), "fp32")
        runs = {"eager": lambda: sincos_eager(x), "triton": lambda: sin2_cos2(x),
                "copy": lambda: torch.empty_like(x).copy_(x)}
        if params.compile and not note:
            step(f"sin^2 + cos^2, {size} MiB: compiling with torch.compile for this size")
            compiled, note = try_compile(sincos_eager, x)
            if compiled is not None:
                _check_ones(compiled(x), f"torch.compile sin^2 + cos^2 ({size} MiB)")
                runs["compiled"] = lambda: compiled(x)
        for variant, (kernels, moves) in SINCOS.items():
            if variant == "compiled" and not params.compile:
                continue
            step(f"sin^2 + cos^2, {size} MiB: timing {variant}, then one call under torch.profiler")
            done[0] += 1
            if variant not in runs:
                yield _row("sincos", variant, size, measured_ms=None, note=note)
                continue
            # calls back to back, as in a loop: the CPU's share shows on small tensors, and the CPU's time per
            # call is read in the same calls (see back_to_back_ms)
            ms, host_ms = back_to_back_ms(runs[variant])
            profiled = launched_kernels(runs[variant])
            row = _row("sincos", variant, size, **_measured(ms, moves * n * F32, 2 * n * F32, profiled))
            yield with_host_floor(row, 2 * n * F32, moves * n * F32, kernels,
                                  model_ms(moves * n * F32, kernels, target), host_ms, target)
        del x, runs


def _measure_chain(params, step, done):
    probe = timing.random_tensor((CHECK_ELEMENTS,), "fp32")
    out = torch.empty_like(probe)
    n = params.chain_mib * MiB // F32
    x = timing.random_tensor((n,), "fp32")
    y = torch.empty_like(x)
    for ops in params.chain_ops:
        step(f"chain of {ops}: checking both versions against float64")
        ref = reference_chain(probe, ops)
        _poisoned_check(lambda o: affine_chain(probe, ops, o), out, ref, f"fused chain of {ops}")
        timing.check_close(chain_eager(probe, ops), ref, "fp32", f"eager chain of {ops}")
        for variant, run in (("eager", lambda: chain_eager(x, ops)), ("triton", lambda: affine_chain(x, ops, y))):
            step(f"chain of {ops}: timing {variant}, then one call under torch.profiler")
            ms, profiled = _time_and_profile(run)
            done[0] += 1
            moved = 2 * n * F32 * (ops if variant == "eager" else 1)
            yield _row("chain", variant, params.chain_mib, ops, **_measured(ms, moved, 2 * n * F32, profiled),
                       measured_tflops=timing.tflops(2.0 * n * ops, ms))
    del x, y


def probe_softmax_rates(size_mib: int) -> dict:
    """The rates (TB/s, bytes the kernel must move over its time) of the two kinds of kernels eager softmax
    runs besides exp, timed as the softmax points are, on a probe tensor of its own: a row max (reads the
    tensor once) and a subtraction of a per-row value (reads it, writes the result)."""
    rows, cols = max(1, size_mib * MiB // (F32 * SOFTMAX_PROBE_COLS)), SOFTMAX_PROBE_COLS
    x = timing.random_tensor((rows, cols), "fp32")
    m = x.amax(dim=1, keepdim=True)
    few = x[:5].to(torch.float64)  # the check on a few rows: a float64 copy of the whole probe is not needed
    timing.check_close((x - m)[:5], few - few.amax(dim=1, keepdim=True), "fp32", "probe: row max, broadcast subtract")
    nbytes = x.numel() * F32
    reduce_ms = timing.time_ms(lambda: x.amax(dim=1, keepdim=True))
    broadcast_ms = timing.time_ms(lambda: x - m)
    del x, m
    return {"reduce_probe_tbps": timing.tbps(nbytes, reduce_ms), "broadcast_probe_tbps": timing.tbps(2 * nbytes, broadcast_ms)}


def _measure_softmax(params, target: Target, step, done):
    runs = {"eager_decomposed": softmax_decomposed, "torch_softmax": lambda t: torch.softmax(t, dim=1),
            "triton_online": online_softmax}
    step("softmax: probing the row-reduction and broadcast-elementwise rates of eager PyTorch's kernels")
    probes = probe_softmax_rates(min(params.softmax_mib, SOFTMAX_PROBE_MIB))
    for n_cols in params.softmax_cols:
        rows, cols = softmax_shape(params, n_cols)
        # Check on an odd number of rows, and on one column fewer when that runs the same kernel
        # configuration (so the column mask is exercised too).
        check_cols = n_cols - 1 if n_cols > 2 and softmax_config(n_cols - 1) == softmax_config(n_cols) else n_cols
        probe = timing.random_tensor((5, check_cols), "fp32")
        ref, out = reference_softmax(probe), torch.empty_like(probe)
        step(f"softmax, {n_cols} columns: checking against float64")
        _poisoned_check(lambda o: online_softmax(probe, o), out, ref, f"online softmax ({check_cols} columns)")
        timing.check_close(softmax_decomposed(probe), ref, "fp32", "eager decomposed softmax")
        timing.check_close(torch.softmax(probe, dim=1), ref, "fp32", "torch.softmax")
        x = timing.random_tensor((rows, cols), "fp32")
        for variant, (kernels, moves) in SOFTMAX.items():
            moves = torch_softmax_moves(cols) if variant == "torch_softmax" else moves
            step(f"softmax, {n_cols} columns x {rows} rows: timing {variant}, then one call under torch.profiler")
            ms, profiled = _time_and_profile(lambda: runs[variant](x))
            done[0] += 1
            row = _row("softmax", variant, params.softmax_mib, n_cols=n_cols,
                       **_measured(ms, moves * x.numel() * F32, 2 * x.numel() * F32, profiled),
                       fraction_of_copy=timing.tbps(2 * x.numel() * F32, ms) / target.ceilings.copy_tbps)
            yield with_softmax_probes(row, x.numel() * F32, probes, target) if variant == "eager_decomposed" else row
        del x
