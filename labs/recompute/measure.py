"""
The recompute lab's measurement: every kernel and every version checked against float64 autograd (outputs
poisoned with NaN first), then each version's training step timed with the CPU's clock read at each launch, and its
activation memory read from torch's allocator.
"""

from __future__ import annotations

from typing import Optional

import torch

from labs.engine import timing
from labs.engine.gpu import MiB, Target, free_memory_bytes
from labs.engine.params import ParamError
from labs.engine.timing import FLUSH_WRITE_BYTES as FLUSH_BYTES, time_step, time_with_host_ms  # noqa: F401
from labs.recompute.kernels import VARIANTS, forward_backward, reference, sigmoid3_backward, sigmoid3_forward
from labs.recompute.model import KERNELS, with_step_model



CHECK_ELEMENTS = 1_000_003  # odd: the last program is partly masked


def check(params, target: Target) -> None:
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


def measure(params, target: Target, progress):
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
