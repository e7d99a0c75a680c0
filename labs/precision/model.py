"""Lower precision's napkin math: a memory-bound kernel's time is its bytes over the copy bandwidth, and a
running sum's error is a random walk of roundings that grows like sqrt(K).

Pure arithmetic on the parameters and the GPU's facts (labs.engine.gpu.Target): it never touches the GPU
and launches no kernel.
"""

from __future__ import annotations

import math

from labs.engine import timing
from labs.engine.gpu import MATMUL_DTYPES, Target

ELEMENTWISE_DTYPES = ("fp32", "bf16", "fp16", "fp8")
ACCUMULATORS = ("fp32", "bf16", "fp16")
DEFAULT_ELEMENTS_M = 256  # the ReLU's default size (Params.elements_m), quoted by the lesson

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


def predict(params, target: Target) -> list[dict]:
    """ReLU rows: bytes / copy bandwidth. Accumulation rows: the random-walk rounding error."""
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
    """The {{placeholders}} of content/labs/precision.md for this GPU."""
    bw = target.ceilings.copy_tbps
    rates = target.ceilings.matmul_tflops
    n = DEFAULT_ELEMENTS_M * 10**6
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
