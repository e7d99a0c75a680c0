"""
The matmul ladder's CUDA C++ kernels: naive, shared-memory tiled, warp-tiled
============================================================================

The kernels themselves are in matmul.cu beside this file (built with torch's load_inline, FP32 arithmetic on the
CUDA cores for every input dtype); this module builds them once and launches them. The Triton rung and cuBLAS come
from the matmul lab (labs/matmul/kernels.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

from labs.engine import cuda
from labs.matmul.ladder_model import WARP

CUDA_DIR = Path(__file__).resolve().parent


def extension():
    """The compiled CUDA kernels (built once per machine, then cached by torch)."""
    return cuda.build("roofline_matmul_ladder", CUDA_DIR / "matmul.cu",
                      "void matmul_naive(torch::Tensor a, torch::Tensor b, torch::Tensor c);\n"
                      "void matmul_tiled(torch::Tensor a, torch::Tensor b, torch::Tensor c, int64_t tile);\n"
                      "void matmul_warptile(torch::Tensor a, torch::Tensor b, torch::Tensor c, int64_t min_blocks);\n",
                      ("matmul_naive", "matmul_tiled", "matmul_warptile"))


def cuda_matmul(kernel: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
                min_blocks: int = 0) -> torch.Tensor:
    """Run 'naive', 'tiledT' or 'warptiled' on row-major a, b into out."""
    ext = extension()
    if kernel == "naive":
        ext.matmul_naive(a, b, out)
    elif kernel == "warptiled":
        ext.matmul_warptile(a, b, out, min_blocks or WARP.min_blocks)
    else:
        ext.matmul_tiled(a, b, out, int(kernel[len("tiled"):]))
    return out


