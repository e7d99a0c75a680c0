"""Measuring lower precision: refuse what cannot run, check each kernel (ReLU exactly, the accumulation
kernel against the same rounding done step by step in torch), then time the ReLU and measure the sums'
errors against float64."""

from __future__ import annotations

import torch

from labs.engine import timing
from labs.engine.gpu import Target, free_memory_bytes
from labs.engine.params import ParamError
from labs.precision.kernels import dot_accumulate, relu
from labs.precision.model import accumulation_error, element_bytes, supported

CHECK_ELEMENTS = 1_000_003
CHECK_DOT = (257, 300)  # (m, k): a partial last block of rows


# ---------------------------------------------------------------------------------------------
# References (float64)
# ---------------------------------------------------------------------------------------------
def relu_reference(x: torch.Tensor) -> torch.Tensor:
    return torch.clamp(x.to(torch.float64), min=0.0)


def dot_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.to(torch.float64) @ b.to(torch.float64)


def dot_emulated(a: torch.Tensor, b: torch.Tensor, acc: str) -> torch.Tensor:
    """The same running sum in torch, rounding after every addition (a second opinion for tests)."""
    dtype = timing.torch_dtype(acc)
    s = torch.zeros(a.shape[0], dtype=dtype, device=a.device)
    for j in range(a.shape[1]):
        s = (s.float() + a[:, j].float() * b[j].float()).to(dtype)
    return s.float()


# ---------------------------------------------------------------------------------------------
# The measurement
# ---------------------------------------------------------------------------------------------
def check(params, target: Target) -> None:
    # an unsupported dtype among others is skipped with a note (measure_relu), so the defaults run on every GPU
    if not any(supported(d, target) for d in params.dtypes):
        raise ParamError(f"fp8 (e4m3) needs compute capability 8.9 or newer (and a torch with float8); this GPU "
                         f"is {target.compute_capability}. Choose another dtype.")
    need = 2 * params.elements_m * 10**6 * max(element_bytes(d) for d in params.dtypes)
    need = max(need, params.dot_count * max(params.dot_lengths) * 2)
    free = free_memory_bytes() if target.live else target.memory_bytes
    if need > 0.9 * free:
        raise ParamError(f"elements_m = {params.elements_m} needs {need / 1e9:.1f} GB (input and output in the "
                         f"widest dtype); this GPU has {free / 1e9:.1f} GB free. Lower elements_m.")


def measure_relu(params, target: Target, progress, total: int):
    n = params.elements_m * 10**6
    done = 0
    for dtype in params.dtypes:
        if not supported(dtype, target):
            yield (f"ReLU in {dtype} skipped: it needs compute capability 8.9 or newer (and a torch with float8); "
                   f"this GPU is {target.compute_capability}.")
            continue
        progress(done / total, f"ReLU {dtype}: checking against float64")
        probe = timing.random_tensor((CHECK_ELEMENTS,), dtype)
        out = torch.full_like(probe, float("nan"))  # poison: an element left unwritten fails the check
        relu(probe, out)
        err = timing.check_close(out, relu_reference(probe), dtype, f"ReLU ({dtype})", tol=0.0)
        progress(done / total, f"ReLU {dtype}: timing {params.elements_m}M elements")
        x = timing.random_tensor((n,), dtype)
        y = torch.empty_like(x)
        ms = timing.time_ms(lambda: relu(x, y))
        nbytes = 2 * n * element_bytes(dtype)
        done += 1
        yield {"experiment": "relu", "dtype": dtype, "k": None, "measured_ms": ms,
               "measured_tbps": timing.tbps(nbytes, ms), "measured_gflops": n / (ms * 1e-3) / 1e9,
               "check_rel_error": err}
        del x, y


def measure_accumulation(params, progress, start: int, total: int):
    gen = torch.Generator(device=timing.default_device()).manual_seed(0)
    done = start
    # the kernel itself, checked against the same rounding done step by step in torch
    a = timing.random_tensor(CHECK_DOT, "bf16", generator=gen)
    b = timing.random_tensor((CHECK_DOT[1],), "bf16", generator=gen)
    for acc in params.accumulators:
        out = torch.full((CHECK_DOT[0],), float("nan"), device=a.device)
        dot_accumulate(a, b, acc, out)
        timing.check_close(out, dot_emulated(a, b, acc), "fp32", f"{acc} accumulation (vs step-by-step torch)",
                          tol=1e-6)
    for k in params.dot_lengths:
        a = timing.random_tensor((params.dot_count, k), "bf16", generator=gen)
        b = timing.random_tensor((k,), "bf16", generator=gen)
        ref = dot_reference(a, b)
        for acc in params.accumulators:
            progress(done / total, f"{params.dot_count} dot products of {k} bf16 terms, {acc} accumulator")
            out = dot_accumulate(a, b, acc)
            done += 1
            yield {"experiment": "accumulation", "dtype": acc, "k": k, "measured_rel_error": timing.rel_error(out, ref)}


def measure(params, target: Target, progress):
    total = len(params.dtypes) + len(params.accumulators) * len(params.dot_lengths)
    yield from measure_relu(params, target, progress, total)
    torch.cuda.empty_cache()
    yield from measure_accumulation(params, progress, len(params.dtypes), total)
    progress(1.0, "done")


def accumulation_example(k: int, accumulators: tuple = ("fp32", "bf16"), m: int = 256, seed: int = 0) -> list[dict]:
    """The accumulation experiment on the CPU, in torch (no GPU, no Triton): rows like measure()'s."""
    gen = torch.Generator().manual_seed(seed)
    a = timing.random_tensor((m, k), "bf16", "cpu", gen)
    b = timing.random_tensor((k,), "bf16", "cpu", gen)
    ref = dot_reference(a, b)
    return [{"experiment": "accumulation", "dtype": acc, "k": k, "dot_count": m,
             "measured_rel_error": timing.rel_error(dot_emulated(a, b, acc), ref),
             "predicted_rel_error": accumulation_error(k, acc)} for acc in accumulators]
