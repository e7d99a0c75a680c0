"""Building CUDA C++ kernels at run time (torch.utils.cpp_extension.load_inline), with clear failures.

Labs that need thread-level control (warp divergence, shared-memory tiling, bank conflicts) keep
their CUDA sources in this folder (`labs/cuda/<name>.cu`) and build them with `build()`. The first
build takes ~30 s and is cached by torch on disk; later builds in the process are instant.
A missing GPU, compiler or a failed build becomes a ParamError whose message the page can show.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

from labs.params import ParamError

CUDA_DIR = Path(__file__).resolve().parent


def source(name: str) -> str:
    """The text of labs/cuda/<name>."""
    return (CUDA_DIR / name).read_text()


def why_unavailable() -> str:
    """Why CUDA C++ cannot be built here ('' when it can)."""
    import torch

    if not torch.cuda.is_available():
        return "CUDA C++ kernels need a CUDA GPU; none was found."
    from torch.utils.cpp_extension import CUDA_HOME

    if not (CUDA_HOME and (Path(CUDA_HOME) / "bin" / "nvcc").exists()) and not shutil.which("nvcc"):
        return "CUDA C++ kernels need the CUDA compiler (nvcc), which is not installed on this machine."
    if not shutil.which("c++") and not shutil.which("g++"):
        return "CUDA C++ kernels need a C++ compiler (g++), which is not installed on this machine."
    return ""


@functools.lru_cache(maxsize=None)
def build(name: str, cuda_file: str, cpp_decls: str, functions: tuple):
    """Compile labs/cuda/<cuda_file> into an extension exposing `functions`; cached per process."""
    reason = why_unavailable()
    if reason:
        raise ParamError(reason)
    import torch
    from torch.utils.cpp_extension import load_inline

    major, minor = torch.cuda.get_device_capability()
    try:
        return load_inline(name=name, cpp_sources=[cpp_decls], cuda_sources=[source(cuda_file)],
                           functions=list(functions), extra_cuda_cflags=["-O3", f"-arch=sm_{major}{minor}"],
                           verbose=False)
    except Exception as exc:  # compiler errors arrive as RuntimeError with the build log
        raise ParamError(f"Building the CUDA kernels in {cuda_file} failed: {str(exc).strip()[-600:]}") from None
