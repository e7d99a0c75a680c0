"""Measuring the roofline: refuse what does not fit, check the kernel against float64, then time it."""

from __future__ import annotations

import torch

from labs.engine import timing
from labs.engine.gpu import MiB, Target, free_memory_bytes
from labs.engine.params import ParamError
from labs.roofline.kernels import A, B, fma_chain
from labs.roofline.model import bytes_per_element, elements, intensity

CHECK_ELEMENTS = 1_000_003  # an odd size: the last program is partly masked


def reference(x: torch.Tensor, flops_per_element: int) -> torch.Tensor:
    """The chain in float64, in closed form: after an optional y = a*x, F FMAs give
    y_F = a^F y_0 + b (1 - a^F) / (1 - a)."""
    fmas, extra_mul = divmod(flops_per_element, 2)
    y0 = x.to(torch.float64) * (A if extra_mul else 1.0)
    a_f = A**fmas
    return a_f * y0 + B * (1 - a_f) / (1 - A)


def check(params, target: Target) -> None:
    """Refuse buffers that do not fit in free GPU memory (input + output, with 10% to spare)."""
    need = 2 * params.size_mib * MiB
    free = free_memory_bytes() if target.live else target.memory_bytes
    if need > 0.9 * free:
        raise ParamError(f"size_mib = {params.size_mib} needs {need / 1e9:.1f} GB (input and output); "
                         f"this GPU has {free / 1e9:.1f} GB free. Choose size_mib <= {int(0.9 * free / 2 / MiB)}.")


def _check(probe, dtype: str, flops: int) -> float:
    out = torch.full_like(probe, float("nan"))  # poison: an element left unwritten fails the check
    fma_chain(probe, flops, out)
    return timing.check_close(out, reference(probe, flops), dtype, f"FMA chain ({dtype}, F={flops})")


def measure(params, target: Target, progress):
    """For each (dtype, F): check on an odd-sized probe against float64, then time on the full buffer."""
    total = len(params.dtypes) * len(params.flops_per_element)
    done = 0
    for dtype in params.dtypes:
        n = elements(params, dtype)
        x = timing.random_tensor((n,), dtype)
        y = torch.empty_like(x)
        probe = timing.random_tensor((CHECK_ELEMENTS,), dtype)
        for flops in params.flops_per_element:
            progress(done / total, f"{dtype}, {flops} FLOP/element: checking against float64")
            err = timing.once_per_run(("roofline: check", dtype, flops), lambda: _check(probe, dtype, flops))
            progress(done / total, f"{dtype}, {flops} FLOP/element: timing")
            ms = timing.time_ms(lambda: fma_chain(x, flops, y))
            i = intensity(dtype, flops)
            done += 1
            yield {"dtype": dtype, "flops_per_element": flops, "intensity_flop_per_byte": i,
                   "measured_ms": ms, "measured_tflops": timing.tflops(n * flops, ms),
                   "measured_tbps": timing.tbps(n * bytes_per_element(dtype), ms), "check_rel_error": err}
        del x, y
    progress(1.0, "done")
