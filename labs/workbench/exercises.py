"""The six exercises: what the learner writes, how it is checked, and what it is compared with.

Each exercise is tied to a lab and reuses that lab's reference, model and kernel:
    add        vector add at the byte floor           roofline lab (fma_chain)      torch.add
    sincos     fused sin^2 + cos^2                    fusion lab (sin2_cos2)        eager torch (5 kernels)
    softmax    row softmax (online softmax)           fusion lab (online_softmax)   torch.softmax
    matmul     tiled matmul, BLOCK_M/N/K and GROUP_M  matmul lab (triton_matmul)    cuBLAS
    attention  FlashAttention forward (causal or not) attention lab (ours)          SDPA (cuDNN)
    transpose  a transposing copy (coalescing)        coalescing lab (tiled+padded) torch .t().contiguous()

The learner's file defines one function (`entry`) that takes the exercise's inputs and returns the output.
Check cases are small and odd-sized (never multiples of a tile); timing points are large and run on a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from labs.engine.gpu import ROOT, Target

CONTENT = ROOT / "content" / "workbench"


def tensor(*shape: int, dtype: str = "float32") -> dict:
    """A random input of a timing point: made fresh inside the worker (and for our kernels, here)."""
    return {"shape": list(shape), "dtype": dtype}


@dataclass(frozen=True)
class Point:
    """One timing point: the arguments (tensor specs or plain values) and the sizes the model needs."""

    label: str
    args: tuple
    size: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Exercise:
    name: str  # slug: ?exercise=..., CLI name, file names under content/workbench/
    title: str
    lab: str  # the lab whose model and kernel this exercise reuses
    entry: str  # the function the learner's file defines
    signature: str  # how it is called, for the page
    dtype: str  # the tolerance against float64 (labs.engine.timing.TOLERANCE)
    metric: str  # "tbps" (memory-bound) or "tflops" (compute-bound)
    terms: tuple  # glossary slugs
    check_cases: Callable[[bool], list]  # gpu? -> list of argument tuples (CPU tensors, fresh random)
    reference: Callable[..., torch.Tensor]  # float64
    points: tuple  # timing points (GPU)
    work: Callable[[Point, Target], dict]  # the model: bytes, flops, predicted_ms for this point
    ours: Callable[[Point], tuple]  # (zero-argument call of the lab's kernel, bytes, flops) on the GPU
    library: Callable[[Point], tuple]  # (zero-argument call of the vendor op, bytes, flops)
    recorded: Callable[[Point], dict]  # {"ours"|"library": (value, label)} from committed lab recordings
    library_name: str = ""

    def path(self, kind: str) -> Path:
        """content/workbench/<name>.md (lesson), <name>_starter.py, <name>_solution.py."""
        return CONTENT / (f"{self.name}.md" if kind == "lesson" else f"{self.name}_{kind}.py")

    def starter(self) -> str:
        return self.path("starter").read_text()

    def solution(self) -> str:
        return self.path("solution").read_text()

    def lesson(self) -> str:
        return self.path("lesson").read_text()


# ---------------------------------------------------------------------------------------------
# Helpers shared by the exercises
# ---------------------------------------------------------------------------------------------
def fresh(*shape: int, dtype=torch.float32) -> torch.Tensor:
    """Fresh standard-normal CPU data (a new seed every call: a kernel cannot learn the inputs)."""
    return torch.randn(shape, dtype=torch.float32).to(dtype)


def cuda_args(point: Point) -> list:
    return [torch.randn(a["shape"], device="cuda", dtype=torch.float32).to(getattr(torch, a["dtype"]))
            if isinstance(a, dict) else a for a in point.args]


def memory_model(nbytes: float, flops: float, target: Target) -> dict:
    """The byte floor: one kernel moving `nbytes` at the measured copy bandwidth (fusion lab's model)."""
    from labs import fusion

    return {"bytes": nbytes, "flops": flops, "predicted_ms": fusion.model_ms(nbytes, 1, target),
            "model": "bytes / copy bandwidth + one launch (fusion lab)"}


def recorded_row(lab: str, match: dict, column: str, note: str = "") -> Optional[tuple]:
    """(value, label) of the newest committed recording of `lab` with a row matching `match`; `note` says
    where the recorded run differs from the exercise (e.g. its dtype)."""
    from labs.engine.results import list_recorded

    for result in list_recorded(lab):
        for row in result.rows:
            if all(row.get(k) == v for k, v in match.items()) and row.get(column) is not None:
                gpu = result.meta.get("gpu", {}).get("name", "?")
                return row[column], f"{gpu}, recorded {str(result.meta.get('date', ''))[:10]} ({lab} lab{note})"
    return None


def _recorded(ours: Optional[tuple], library: Optional[tuple]) -> dict:
    return {k: v for k, v in (("ours", ours), ("library", library)) if v is not None}


# ---------------------------------------------------------------------------------------------
# 1. Vector add
# ---------------------------------------------------------------------------------------------
ADD_N = 2**26  # 64 Mi elements: 768 MiB moved, far beyond any L2


def _add_ours(point: Point) -> tuple:
    from labs import roofline

    x, = cuda_args(Point("", (tensor(point.size["n"]),)))
    out = torch.empty_like(x)
    return (lambda: roofline.fma_chain(x, 1, out)), 8 * x.numel(), x.numel()


def _add_library(point: Point) -> tuple:
    x, y = cuda_args(point)
    out = torch.empty_like(x)
    return (lambda: torch.add(x, y, out=out)), 12 * x.numel(), x.numel()


ADD = Exercise(
    name="add", title="1. Vector add at the byte floor", lab="roofline", entry="add", signature="add(x, y) -> x + y",
    dtype="fp32", metric="tbps", terms=("memory-bound", "memory-bandwidth", "coalescing", "thread-block"),
    check_cases=lambda gpu: [(fresh(n), fresh(n)) for n in ((1_000_003, 17) if gpu else (1003, 4099))],
    reference=lambda x, y: x.double() + y.double(),
    points=(Point(f"n={ADD_N}", (tensor(ADD_N), tensor(ADD_N)), {"n": ADD_N}),),
    work=lambda p, t: memory_model(12 * p.size["n"], p.size["n"], t),
    ours=_add_ours, library=_add_library, library_name="torch.add",
    recorded=lambda p: _recorded(recorded_row("roofline", {"dtype": "fp32", "flops_per_element": 1}, "measured_tbps"),
                                 recorded_row("fusion", {"experiment": "sincos", "variant": "copy", "size_mib": 256},
                                              "measured_tbps")),
)


# ---------------------------------------------------------------------------------------------
# 2. Fused sin^2 + cos^2
# ---------------------------------------------------------------------------------------------
SINCOS_N = 2**26  # 256 MiB of fp32 in, 256 MiB out (the fusion lab's 256 MiB point)


def _sincos_ours(point: Point) -> tuple:
    from labs import fusion

    x, = cuda_args(point)
    out = torch.empty_like(x)
    return (lambda: fusion.sin2_cos2(x, out=out)), 8 * x.numel(), 0


def _sincos_library(point: Point) -> tuple:
    from labs import fusion

    x, = cuda_args(point)
    return (lambda: fusion.sincos_eager(x)), 8 * x.numel(), 0  # useful bytes: what the model counts


SINCOS = Exercise(
    name="sincos", title="2. A fused elementwise chain: sin² + cos²", lab="fusion", entry="sin2_cos2",
    signature="sin2_cos2(x) -> sin(x)**2 + cos(x)**2", dtype="fp32", metric="tbps",
    terms=("kernel-fusion", "memory-bound", "launch-overhead", "sfu"),
    check_cases=lambda gpu: [(fresh(n),) for n in ((1_000_003,) if gpu else (1003,))],
    reference=lambda x: torch.sin(x.double()) ** 2 + torch.cos(x.double()) ** 2,
    points=(Point(f"n={SINCOS_N}", (tensor(SINCOS_N),), {"n": SINCOS_N}),),
    work=lambda p, t: memory_model(8 * p.size["n"], 0, t),
    ours=_sincos_ours, library=_sincos_library, library_name="eager torch (5 kernels)",
    recorded=lambda p: _recorded(recorded_row("fusion", {"experiment": "sincos", "variant": "triton", "size_mib": 256},
                                              "measured_tbps"),
                                 recorded_row("fusion", {"experiment": "sincos", "variant": "eager", "size_mib": 256},
                                              "measured_tbps")),
)


# ---------------------------------------------------------------------------------------------
# 3. Row softmax
# ---------------------------------------------------------------------------------------------
SOFTMAX_SHAPE = (16384, 4096)  # 256 MiB of fp32: the fusion lab's 4096-column point


def _softmax_ours(point: Point) -> tuple:
    from labs import fusion

    x, = cuda_args(point)
    out = torch.empty_like(x)
    return (lambda: fusion.online_softmax(x, out)), 8 * x.numel(), 0


def _softmax_library(point: Point) -> tuple:
    x, = cuda_args(point)
    return (lambda: torch.softmax(x, dim=1)), 8 * x.numel(), 0


SOFTMAX = Exercise(
    name="softmax", title="3. Row softmax in one pass (online softmax)", lab="fusion", entry="softmax",
    signature="softmax(x) -> softmax of each row of a 2-D x", dtype="fp32", metric="tbps",
    terms=("softmax", "online-softmax", "kernel-fusion", "memory-bound"),
    check_cases=lambda gpu: [(fresh(r, c),) for r, c in (((37, 1000), (5, 4099)) if gpu else ((7, 33), (3, 1000)))],
    reference=lambda x: torch.softmax(x.double(), dim=1),
    points=(Point(f"{SOFTMAX_SHAPE[0]}x{SOFTMAX_SHAPE[1]}", (tensor(*SOFTMAX_SHAPE),),
                  {"rows": SOFTMAX_SHAPE[0], "cols": SOFTMAX_SHAPE[1]}),),
    work=lambda p, t: memory_model(8 * p.size["rows"] * p.size["cols"], 0, t),
    ours=_softmax_ours, library=_softmax_library, library_name="torch.softmax",
    recorded=lambda p: _recorded(
        recorded_row("fusion", {"experiment": "softmax", "variant": "triton_online", "n_cols": 4096}, "measured_tbps"),
        recorded_row("fusion", {"experiment": "softmax", "variant": "torch_softmax", "n_cols": 4096}, "measured_tbps")),
)


# ---------------------------------------------------------------------------------------------
# 4. Tiled matmul (fp16 in, fp16 out, fp32 accumulation)
# ---------------------------------------------------------------------------------------------
MATMUL_N = 4096
BF16 = ", a bf16 run: the same tensor-core rate as fp16 on these GPUs"


def _matmul_work(point: Point, target: Target) -> dict:
    from labs import matmul

    n = point.size["n"]
    row = matmul.predict_point(n, "fp16", matmul.DEFAULT_CONFIGS["fp16"], target)
    roof = matmul.roofline_tflops(n, "fp16", target)
    flops = 2.0 * n**3
    ms = row.get("predicted_ms") or (flops / (roof * 1e12) * 1e3 if roof else None)
    return {"bytes": 6.0 * n * n, "flops": flops, "predicted_ms": ms,
            "model": f"the matmul lab's tile and wave model for its {matmul.DEFAULT_CONFIGS['fp16'].label} tiles "
                     f"(roofline alone: {roof or 0:.0f} TFLOP/s)"}


def _matmul_ours(point: Point) -> tuple:
    from labs import matmul

    a, b = cuda_args(point)
    out = torch.empty((a.shape[0], b.shape[1]), device="cuda", dtype=torch.float16)
    n = point.size["n"]
    return (lambda: matmul.triton_matmul(a, b, "fp16", out)), 6.0 * n * n, 2.0 * n**3


def _matmul_library(point: Point) -> tuple:
    from labs import matmul

    a, b = cuda_args(point)
    out = torch.empty((a.shape[0], b.shape[1]), device="cuda", dtype=torch.float16)
    n = point.size["n"]
    return (lambda: matmul.cublas_matmul(a, b, "fp16", out)), 6.0 * n * n, 2.0 * n**3


MATMUL = Exercise(
    name="matmul", title="4. A tiled matmul: BLOCK_M, BLOCK_N, BLOCK_K and GROUP_M", lab="matmul", entry="matmul",
    signature="matmul(a, b) -> a @ b  (fp16 in and out, fp32 accumulation)", dtype="fp16", metric="tflops",
    terms=("matmul", "tiling", "tensor-core", "tile-quantization", "wave-quantization", "l2-cache"),
    check_cases=lambda gpu: [(fresh(m, k, dtype=torch.float16), fresh(k, n, dtype=torch.float16))
                             for m, k, n in (((1001, 517, 1003), (256, 256, 256)) if gpu else ((33, 29, 47), (64, 64, 64)))],
    reference=lambda a, b: a.double() @ b.double(),
    points=(Point(f"{MATMUL_N}x{MATMUL_N}x{MATMUL_N}", (tensor(MATMUL_N, MATMUL_N, dtype="float16"),
                                                        tensor(MATMUL_N, MATMUL_N, dtype="float16")), {"n": MATMUL_N}),),
    work=_matmul_work, ours=_matmul_ours, library=_matmul_library, library_name="cuBLAS (torch.matmul)",
    recorded=lambda p: _recorded(recorded_row("matmul", {"kernel": "triton", "n": p.size["n"]}, "measured_tflops", BF16),
                                 recorded_row("matmul", {"kernel": "cublas", "n": p.size["n"]}, "measured_tflops", BF16)),
)


# ---------------------------------------------------------------------------------------------
# 5. FlashAttention forward (fp16, (batch, heads, length, head_dim))
# ---------------------------------------------------------------------------------------------
ATTN = dict(b=4, h=16, n=4096, d=64)


def _attention_shape(point: Point):
    from labs import attention

    s = point.size
    return attention.Shape(s["b"], s["h"], s["n"], s["n"], s["d"], s["causal"], "fp16")


def _attention_work(point: Point, target: Target) -> dict:
    from labs import attention

    shape = _attention_shape(point)
    model = attention.flash_model(shape, "fwd", target)
    flops = attention.attention_flops("fwd", shape.b, shape.h, shape.lq, shape.lk, shape.d, shape.causal)
    return {"bytes": model["predicted_hbm_bytes"], "flops": flops, "predicted_ms": model["predicted_ms"],
            "model": "the attention lab's model: tensor-core time + exponentials, or HBM bytes if longer"}


def _attention_call(point: Point, fn) -> tuple:
    q, k, v, causal = cuda_args(point)
    work = _attention_work(point, _any_target())
    return (lambda: fn(q, k, v, causal)), work["bytes"], work["flops"]


def _any_target() -> Target:
    from labs.engine import gpu

    return gpu.live_target() or gpu.datasheet_target(gpu.datasheet_by_name("H100 SXM"))


def _sdpa(q, k, v, causal):
    """The library: SDPA with its cuDNN backend (the fastest in the attention lab), else torch's own choice."""
    from labs import attention

    try:
        return attention.sdpa(q, k, v, causal, "sdpa-cudnn")
    except RuntimeError:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _attention_points() -> tuple:
    b, h, n, d = ATTN["b"], ATTN["h"], ATTN["n"], ATTN["d"]
    return tuple(Point(f"{'causal' if causal else 'full'} {b}x{h}x{n}x{d}",
                       tuple(tensor(b, h, n, d, dtype="float16") for _ in range(3)) + (causal,),
                       {**ATTN, "causal": causal}) for causal in (False, True))


def _attention_reference(q, k, v, causal):
    from labs import attention

    return attention.reference(q, k, v, causal)[0]


ATTENTION = Exercise(
    name="attention", title="5. FlashAttention forward (causal and not)", lab="attention", entry="attention",
    signature="attention(q, k, v, causal) -> softmax(q k^T / sqrt(d) [+ causal mask]) v;  q, k, v: (B, H, L, D) fp16",
    dtype="fp16", metric="tflops", terms=("flash-attention", "online-softmax", "attention", "tensor-core", "tiling"),
    check_cases=lambda gpu: [tuple(fresh(*shape, dtype=torch.float16) for _ in range(3)) + (causal,)
                             for shape in ((2, 3, 1000, 64) if gpu else (1, 2, 37, 16),) for causal in (False, True)],
    reference=_attention_reference, points=_attention_points(), work=_attention_work,
    ours=lambda p: _attention_call(p, lambda q, k, v, c: _flash(q, k, v, c)),
    library=lambda p: _attention_call(p, _sdpa), library_name="SDPA (cuDNN)",
    recorded=lambda p: _recorded(
        recorded_row("attention", {"impl": "ours", "mode": "fwd", "causal": p.size["causal"], "head_dim": 64,
                                   "seq_len": p.size["n"]}, "measured_tflops", BF16),
        recorded_row("attention", {"impl": "sdpa-cudnn", "mode": "fwd", "causal": p.size["causal"], "head_dim": 64,
                                   "seq_len": p.size["n"]}, "measured_tflops", BF16)),
)


def _flash(q, k, v, causal):
    from labs import attention

    return attention.flash_attention_forward(q, k, v, causal)[0]


# ---------------------------------------------------------------------------------------------
# 6. Transpose (a copy whose reads and writes cannot both follow memory order)
# ---------------------------------------------------------------------------------------------
TRANSPOSE_N = 8192  # 256 MiB of fp32 read, 256 MiB written


def _transpose_call(point: Point, variant: str) -> tuple:
    from labs import coalescing

    x, = cuda_args(point)
    out = torch.empty((x.shape[1], x.shape[0]), device="cuda", dtype=x.dtype)
    return (lambda: coalescing.transpose(x, variant, out)), 8 * x.numel(), 0


TRANSPOSE = Exercise(
    name="transpose", title="6. A transposing copy (coalescing)", lab="coalescing", entry="transpose",
    signature="transpose(x) -> x.T as a new contiguous tensor (x: 2-D fp32)", dtype="fp32", metric="tbps",
    terms=("coalescing", "memory-sector", "shared-memory", "transpose", "bank-conflict"),
    check_cases=lambda gpu: [(fresh(r, c),) for r, c in (((1001, 1003), (3, 4099)) if gpu else ((37, 45), (5, 130)))],
    reference=lambda x: x.double().t(),
    points=(Point(f"{TRANSPOSE_N}x{TRANSPOSE_N}", (tensor(TRANSPOSE_N, TRANSPOSE_N),), {"n": TRANSPOSE_N}),),
    work=lambda p, t: memory_model(8 * p.size["n"] ** 2, 0, t),
    ours=lambda p: _transpose_call(p, "tiled+padded"), library=lambda p: _transpose_call(p, "torch"),
    library_name="torch x.t().contiguous()",
    recorded=lambda p: _recorded(recorded_row("coalescing", {"experiment": "transpose", "variant": "tiled+padded"},
                                              "measured_tbps"),
                                 recorded_row("coalescing", {"experiment": "transpose", "variant": "torch"},
                                              "measured_tbps")),
)

EXERCISES = (ADD, SINCOS, SOFTMAX, MATMUL, ATTENTION, TRANSPOSE)


def get_exercise(name: str) -> Exercise:
    from labs.engine.params import ParamError

    for ex in EXERCISES:
        if ex.name == name:
            return ex
    raise ParamError(f"unknown exercise {name!r}; the exercises are: {', '.join(e.name for e in EXERCISES)}.")


def rate(metric: str, nbytes: float, flops: float, ms: float) -> float:
    """Achieved TB/s or TFLOP/s."""
    if not ms or not math.isfinite(ms):
        return float("nan")
    return (nbytes if metric == "tbps" else flops) / (ms * 1e-3) / 1e12
