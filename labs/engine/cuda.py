"""Building CUDA C++ kernels at run time (torch.utils.cpp_extension.load_inline), with clear failures.

Labs that need thread-level control (warp divergence, shared-memory tiling, bank conflicts) keep
their CUDA sources beside their kernels (`labs/<lab>/<name>.cu`) and build them with `build()`. The first
build takes ~30 s and is cached by torch on disk; later builds in the process are instant.
A missing GPU, compiler or a failed build becomes a ParamError whose message the page can show.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

from labs.engine.params import ParamError

def source(path) -> str:
    """The text of a CUDA source file (a path, normally `Path(__file__).with_name("x.cu")` in a lab)."""
    return Path(path).read_text()


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
def build(name: str, cuda_file, cpp_decls: str, functions: tuple):
    """Compile the CUDA source at `cuda_file` into an extension exposing `functions`; cached per process."""
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
        raise ParamError(f"Building the CUDA kernels in {Path(cuda_file).name} failed: {str(exc).strip()[-600:]}") from None
