"""
Can this machine run the Gluon step? Feature checks, never version checks
=========================================================================

The warp-specialized step (labs/hopper/gluon_ws.py) is written in Gluon, Triton's lower-level language. It needs
a Triton that ships `triton.experimental.gluon` with the Hopper pieces the kernel calls, a `warp_specialize` that
takes (functions_and_args, worker_num_warps, worker_num_regs) as Triton 3.6's does, and a Hopper GPU (wgmma exists
on compute capability 9.x only). Each is checked by looking for it, so a newer Triton that keeps the API passes and
an older one that lacks it is named in the note. Where something is missing the lab leaves the step out of runs
and says why (labs/hopper/measure.py, pages/hopper.py).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Optional

# module -> the names the kernel uses from it ("new|old": either will do; Triton 3.6 has the old TMA names)
REQUIRED = {
    "triton.experimental.gluon": ("jit", "constexpr_function"),
    "triton.experimental.gluon.language": ("warp_specialize", "allocate_shared_memory", "NVMMASharedLayout",
                                           "NVMMADistributedLayout", "zeros", "static_range", "cdiv", "constexpr"),
    "triton.experimental.gluon.language.nvidia.hopper": ("warpgroup_mma", "warpgroup_mma_wait",
                                                         "fence_async_shared", "mbarrier", "tma"),
    "triton.experimental.gluon.language.nvidia.hopper.tma": ("async_load|async_copy_global_to_shared",
                                                             "async_store|async_copy_shared_to_global", "store_wait"),
    "triton.experimental.gluon.language.nvidia.hopper.mbarrier": ("MBarrierLayout", "init", "expect", "arrive",
                                                                  "wait", "invalidate"),
    "triton.experimental.gluon.nvidia.hopper": ("TensorDescriptor", ),
}
# what the attention lab's FlashAttention-3 kernel (labs/attention/gluon_fa3.py) uses beyond the matmul's
ATTENTION_REQUIRED = {
    "triton.experimental.gluon.language": ("DotOperandLayout", "SliceLayout", "convert_layout", "expand_dims",
                                           "arange", "full", "where", "maximum", "minimum", "exp2", "max", "sum",
                                           "load", "store", "inline_asm_elementwise"),
}
WARP_SPECIALIZE_ARGS = ("functions_and_args", "worker_num_warps", "worker_num_regs")


def _absent(required: dict) -> Optional[str]:
    """None if every module of `required` imports and has its names, else what is missing (one sentence)."""
    for module_name, names in required.items():
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # noqa: BLE001 - ImportError, or a Triton that fails half-way: either way absent
            return f"this Triton has no {module_name} ({type(exc).__name__})"
        absent = [n for n in names if not any(hasattr(module, alt) for alt in n.split("|"))]
        if absent:
            return f"this Triton's {module_name} lacks {', '.join(absent)}"
    return None


@functools.lru_cache(maxsize=1)
def gluon_missing() -> Optional[str]:
    """None if this Triton has every Gluon feature the matmul kernel uses, else what is missing (one sentence)."""
    missing = _absent(REQUIRED)
    if missing:
        return missing
    from triton.experimental.gluon import language as gl

    try:
        params = tuple(inspect.signature(gl.warp_specialize).parameters)
    except (TypeError, ValueError):
        params = ()
    if params[:3] != WARP_SPECIALIZE_ARGS:
        return (f"this Triton's gluon.warp_specialize takes ({', '.join(params[:4])}, ...), not "
                f"({', '.join(WARP_SPECIALIZE_ARGS)}) as the kernel calls it")
    return None


def hopper_missing(compute_capability: Optional[str]) -> Optional[str]:
    """None on a Hopper GPU (compute capability 9.x: wgmma, setmaxnreg), else why not."""
    if not compute_capability:
        return "this machine has no CUDA GPU"
    if not compute_capability.startswith("9."):
        return f"the GPU is compute capability {compute_capability}; wgmma and setmaxnreg exist on Hopper (9.x) only"
    return None


def device_capability(device) -> Optional[str]:
    """'9.0' for a CUDA device, None for the CPU (or where torch sees no CUDA)."""
    import torch

    if getattr(device, "type", str(device)).split(":")[0] != "cuda" or not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return f"{major}.{minor}"


def unavailable_reason(compute_capability: Optional[str]) -> Optional[str]:
    """None where the Gluon step can run (a Hopper GPU and a Triton with Gluon), else why not: the note the lab
    shows where it leaves the step out."""
    return hopper_missing(compute_capability) or gluon_missing()


@functools.lru_cache(maxsize=1)
def attention_gluon_missing() -> Optional[str]:
    """gluon_missing(), and the attention kernel's further names (layouts for P in registers, the softmax's ops)."""
    return gluon_missing() or _absent(ATTENTION_REQUIRED)


def attention_unavailable_reason(compute_capability: Optional[str]) -> Optional[str]:
    """None where the Gluon FlashAttention-3 kernel can run, else why not (the note where it is left out)."""
    return hopper_missing(compute_capability) or attention_gluon_missing()


class GluonUnavailable(RuntimeError):
    """The Gluon step was asked for where it cannot run (the message says why)."""
