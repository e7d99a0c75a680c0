"""
Lower precision: fewer bytes per number is more numbers per second
==================================================================

What you will learn:
- a memory-bound kernel's time is its bytes over the bandwidth, so halving the bytes per element
  (fp32 -> bf16 or fp16) halves the time, and fp8 halves it again;
- tensor cores turn lower precision into more matmul FLOP/s as well (the calibration's rates);
- mixed precision: 16-bit inputs are fine, but the running sum of a long dot product must be kept
  in fp32, or rounding errors pile up with every addition.

Three experiments:
1. elementwise: ReLU over the same N elements stored in fp32, bf16, fp16 and fp8 (e4m3); the model
   is time = bytes / copy bandwidth, with 1 FLOP per element, so bytes per FLOP = 2 x element size;
2. matmul by dtype: the rates the calibration measured with cuBLAS (no kernel run here);
3. accumulation: M dot products of length K of bf16 vectors, summed one term at a time in an fp32
   or a bf16 accumulator, compared with float64. Model: every addition rounds the running sum to
   the accumulator's precision, a random walk whose error grows like sqrt(K).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from labs.engine import timing
from labs.engine.gpu import MATMUL_DTYPES, Target, free_memory_bytes
from labs.engine.lab import Headline, Lab
from labs.engine.params import ParamError, param

ELEMENTWISE_DTYPES = ("fp32", "bf16", "fp16", "fp8")
ACCUMULATORS = ("fp32", "bf16", "fp16")


# ---------------------------------------------------------------------------------------------
# Kernel 1: ReLU in the storage dtype
# ---------------------------------------------------------------------------------------------
@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)  # the element's bytes are what costs; math is fp32
    y = tl.maximum(x, 0.0)  # 1 FLOP per element
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


BLOCK_BYTES, RELU_WARPS = 16384, 8  # 64 bytes per thread for every dtype: four 16-byte loads of fp32, one of fp8


def relu(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    out = torch.empty_like(x) if out is None else out
    block = BLOCK_BYTES // x.element_size()
    relu_kernel[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), BLOCK=block, num_warps=RELU_WARPS)
    return out


# ---------------------------------------------------------------------------------------------
# Kernel 2: dot products accumulated term by term in a chosen precision
# ---------------------------------------------------------------------------------------------
@triton.jit
def round_to_bf16(x):
    """fp32 -> the nearest bf16 value (ties to even), kept in fp32: add half an ulp of bf16, drop 16 bits.

    Done with integer ops so the GPU and Triton's CPU interpreter round identically."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def dot_accumulate_kernel(a_ptr, b_ptr, out_ptr, m, k, ACC: tl.constexpr, BLOCK_M: tl.constexpr):
    """out[i] = sum_j a[i, j] * b[j], the running sum rounded to ACC (0 fp32, 1 bf16, 2 fp16) after every addition."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask = rows < m
    acc = tl.zeros([BLOCK_M], dtype=tl.float32)
    for j in range(k):
        a = tl.load(a_ptr + rows.to(tl.int64) * k + j, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + j).to(tl.float32)
        # the product of two bf16 numbers is exact in fp32; the rounding happens when it joins the sum
        acc = acc + a * b
        if ACC == 1:
            acc = round_to_bf16(acc)
        elif ACC == 2:
            acc = acc.to(tl.float16).to(tl.float32)
    tl.store(out_ptr + rows, acc, mask=mask)


ACC_CODE = {"fp32": 0, "bf16": 1, "fp16": 2}
DOT_BLOCK_M = 128


def dot_accumulate(a: torch.Tensor, b: torch.Tensor, acc: str, out: torch.Tensor | None = None) -> torch.Tensor:
    """a: (m, k) bf16, b: (k,) bf16 -> (m,) fp32 holding the accumulator's final value."""
    m, k = a.shape
    out = torch.empty(m, device=a.device, dtype=torch.float32) if out is None else out
    dot_accumulate_kernel[(triton.cdiv(m, DOT_BLOCK_M),)](a, b, out, m, k, ACC=ACC_CODE[acc], BLOCK_M=DOT_BLOCK_M,
                                                          num_warps=4)
    return out


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
# The model
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Params:
    dtypes: tuple = param(ELEMENTWISE_DTYPES, "storage dtypes of the ReLU", choices=ELEMENTWISE_DTYPES)
    elements_m: int = param(256, "elements of the ReLU (the same count in every dtype)", unit="million",
                            min=1, max=4096)
    accumulators: tuple = param(("fp32", "bf16"), "accumulator precisions of the dot products",
                                choices=ACCUMULATORS)
    dot_lengths: tuple = param((256, 1024, 4096, 16384), "terms per dot product (K)", unit="terms", min=1,
                               max=65536)
    dot_count: int = param(4096, "dot products per length (M), for a steady error estimate", min=16, max=65536)


# Unit roundoff of each accumulator: 2^-(significant bits). The rounding error of a value x is spread
# over +-ulp(x)/2; averaged over where x sits in its binade its standard deviation is ROUNDING_RMS * |x| * u
# with ROUNDING_RMS = sqrt(3 / (8 ln 2)) / sqrt(3) ~ 0.424 (derivation in content/labs/precision.md).
SIGNIFICANT_BITS = {"fp32": 24, "bf16": 8, "fp16": 11}
ROUNDING_RMS = math.sqrt(3 / (8 * math.log(2))) / math.sqrt(3)


def element_bytes(dtype: str) -> int:
    return {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}[dtype]


def supported(dtype: str, target: Target) -> bool:
    """fp8 (e4m3) loads and conversions need compute capability 8.9 (Ada) or newer."""
    if dtype != "fp8":
        return True
    major, minor = (int(p) for p in target.compute_capability.split(".")[:2])
    return (major, minor) >= (8, 9) and "fp8" in timing.DTYPES


def accumulation_error(k: int, acc: str) -> float:
    """Predicted ||sum - exact|| / ||exact|| for K terms with random signs, rounded after each addition.

    The running sum after j terms has rms sqrt(j) sigma; each rounding adds an independent error of
    rms ROUNDING_RMS * u * sqrt(j) sigma. Summed over j = 1..K the error variance is
    (ROUNDING_RMS u sigma)^2 K^2 / 2, and the exact sum's is K sigma^2, so the ratio is
    ROUNDING_RMS * u * sqrt(K / 2).
    """
    u = 2.0 ** -SIGNIFICANT_BITS[acc]
    return ROUNDING_RMS * u * math.sqrt(k / 2)


def predict(params: Params, target: Target) -> list[dict]:
    bw = target.ceilings.copy_tbps
    n = params.elements_m * 10**6
    rows = []
    for dtype in params.dtypes:
        if not supported(dtype, target):
            continue
        nbytes = 2 * n * element_bytes(dtype)  # one read and one write per element
        rows.append({"experiment": "relu", "dtype": dtype, "k": None, "element_bytes": element_bytes(dtype),
                     "bytes_per_flop": 2 * element_bytes(dtype), "bytes": nbytes,
                     "predicted_ms": nbytes / (bw * 1e12) * 1e3, "predicted_tbps": bw})
    for acc in params.accumulators:
        for k in params.dot_lengths:
            rows.append({"experiment": "accumulation", "dtype": acc, "k": k,
                         "predicted_rel_error": accumulation_error(k, acc)})
    return rows


def matmul_rates(target: Target) -> list[dict]:
    """Matmul TFLOP/s by dtype: the calibration (measured with cuBLAS) beside the datasheet."""
    c, sheet = target.ceilings, target.datasheet
    base = c.matmul_tflops.get("fp32")
    rows = []
    for dtype in MATMUL_DTYPES:
        rate = c.matmul_tflops.get(dtype)
        sheet_rate = sheet.matmul_tflops(dtype) if sheet else None
        if rate is None and sheet_rate is None:
            continue
        rows.append({"dtype": dtype, "element_bytes": element_bytes(dtype), "calibrated_tflops": rate,
                     "datasheet_tflops": sheet_rate, "speedup_vs_fp32": rate / base if rate and base else None,
                     "fraction_of_datasheet": rate / sheet_rate if rate and sheet_rate else None,
                     "unit": "tensor cores" if dtype != "fp32" else "CUDA cores (FMA)",
                     "source": c.source})
    return rows


# ---------------------------------------------------------------------------------------------
# The measurement
# ---------------------------------------------------------------------------------------------
CHECK_ELEMENTS = 1_000_003
CHECK_DOT = (257, 300)  # (m, k): a partial last block of rows


def check(params: Params, target: Target) -> None:
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


def measure_relu(params: Params, target: Target, progress, total: int):
    n = params.elements_m * 10**6
    done = 0
    for dtype in params.dtypes:
        if not supported(dtype, target):
            yield (f"ReLU in {dtype} skipped: it needs compute capability 8.9 or newer (and a torch with float8); "
                   f"this GPU is {target.compute_capability}.")
            continue
        progress(done / total, f"ReLU {dtype}: checking against float64")
        probe = timing.random_tensor((CHECK_ELEMENTS,), dtype)
        out = torch.full_like(probe, float("nan"))
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


def measure_accumulation(params: Params, progress, start: int, total: int):
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


def measure(params: Params, target: Target, progress):
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


def time_ratios(rows: list[dict], base: str = "fp32") -> list[dict]:
    """Each dtype's ReLU time against the base dtype's, beside the byte ratio the model predicts."""
    relu_rows = {r["dtype"]: r for r in rows if r.get("experiment") == "relu"}
    ref = relu_rows.get(base)
    out = []
    for dtype, r in relu_rows.items():
        if ref is None or dtype == base:
            continue
        measured = ref.get("measured_ms") / r["measured_ms"] if r.get("measured_ms") and ref.get("measured_ms") else None
        bytes_ratio = element_bytes(base) / element_bytes(dtype)
        out.append({"dtype": dtype, "byte_ratio": bytes_ratio, "measured_time_ratio": measured,
                    "error_pct": 100 * (measured - bytes_ratio) / bytes_ratio if measured else None})
    return out


def lesson_numbers(target: Target) -> dict:
    bw = target.ceilings.copy_tbps
    rates = target.ceilings.matmul_tflops
    n = Params().elements_m * 10**6
    return {
        "gpu": target.name,
        "bandwidth_tbps": f"{bw:.2f}",
        "relu_fp32_ms": f"{2 * n * 4 / (bw * 1e12) * 1e3:.3f}",
        "relu_bf16_ms": f"{2 * n * 2 / (bw * 1e12) * 1e3:.3f}",
        "bf16_matmul_tflops": f"{rates['bf16']:.0f}" if rates.get("bf16") else "n/a",
        "fp32_matmul_tflops": f"{rates['fp32']:.0f}" if rates.get("fp32") else "n/a",
        "bf16_speedup": f"{rates['bf16'] / rates['fp32']:.0f}" if rates.get("bf16") and rates.get("fp32") else "n/a",
        "bf16_err_4096": f"{accumulation_error(4096, 'bf16'):.3f}",
        "fp32_err_4096": f"{accumulation_error(4096, 'fp32'):.1e}",
        "ceilings_source": target.describe_ceilings(),
    }


LAB = Lab(
    name="precision",
    title="Lower precision",
    summary="The same ReLU in fp32, bf16, fp16 and fp8: half the bytes, half the time. Matmul rates by dtype, "
            "and why long sums are kept in fp32.",
    terms=("fp32", "bf16", "fp16", "fp8", "mixed-precision", "accumulation", "tensor-core", "memory-bound",
           "memory-bandwidth", "quantization", "tf32"),
    Params=Params,
    predict=predict,
    measure=measure,
    key=("experiment", "dtype", "k"),
    metric="ms",
    order=30,
    check=check,
    lesson_numbers=lesson_numbers,
    headline=Headline("How long will ReLU over 256 million bf16 elements take?", "ms",
                      {"experiment": "relu", "dtype": "bf16"}, "ms"),
)
