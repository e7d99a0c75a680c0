"""Our kernels against the libraries, from the rows of one run: the scorecard's ratios and the page's table.

Pure functions of result rows (no torch): a ratio is the library's time over ours in the same run (1.0 = as fast).
"""

from __future__ import annotations

GLUON = "gluon-fa3"  # model.GLUON_IMPL (this module is below model.py: it cannot import it)
CUDNN = "sdpa-cudnn"

# Issue 15's bars for our Triton FlashAttention: at least this share of each library's speed, from this sequence
# length (or at exactly it), at every head dim, mask and mode the lab runs
LIBRARY_TARGETS = {CUDNN: (0.95, lambda n: n >= 2048), "sdpa-flash": (0.9, lambda n: n == 1024)}
LIBRARY_NAMES = {CUDNN: "cuDNN (SDPA)", "sdpa-flash": "FlashAttention (SDPA)"}
# Issue 33's bars for the Gluon FlashAttention-3 against cuDNN, from N = 2048: the forward by head dim, forward and
# backward (the training call) at either
GLUON_TARGETS = {128: 0.95, 64: 1.0}
GLUON_TRAIN_TARGET = 0.9
GLUON_MIN_N = 2048
KERNEL_NAMES = {"ours": "ours (Triton)", GLUON: "ours (Gluon FA3)"}
# the Gluon rung's own library label, so the scorecard keeps its cases apart from the Triton kernel's
GLUON_LIBRARY_NAME = "cuDNN (SDPA), against the Gluon rung"


def _times(rows: list) -> dict:
    """{(mode, causal, dtype, d, N, impl): measured ms} of every timed row."""
    return {(r["mode"], bool(r["causal"]), r["dtype"], r["head_dim"], r["seq_len"], r["impl"]): r["measured_ms"]
            for r in rows if isinstance(r, dict) and r.get("measured_ms") and r.get("impl") in
            ("ours", GLUON, *LIBRARY_TARGETS)}


def _case(mode, causal, dtype, d, n) -> str:
    return f"{mode} {'causal' if causal else 'full'} {dtype} d = {d} N = {n}"


def library_ratios(rows: list) -> list[dict]:
    """Our kernels against SDPA's cuDNN and flash backends in the same run, one row per (mode, mask, head dim,
    N, library) where both were timed: the library's time over ours, with the target where an issue sets one
    (labs/engine/repredict.py gathers these for the scorecard). The Gluon rung is held to cuDNN alone."""
    times = _times(rows)
    out = []
    for (mode, causal, dtype, d, n, impl), library in sorted(times.items()):
        if impl not in LIBRARY_TARGETS:
            continue
        ours = times.get((mode, causal, dtype, d, n, "ours"))
        if ours:
            bar, applies = LIBRARY_TARGETS[impl]
            out.append({"case": _case(mode, causal, dtype, d, n), "ours": KERNEL_NAMES["ours"],
                        "library": LIBRARY_NAMES[impl], "speed_ratio": library / ours,
                        "target": bar if applies(n) else None})
        gluon = times.get((mode, causal, dtype, d, n, GLUON))
        if gluon and impl == CUDNN:
            out.append({"case": _case(mode, causal, dtype, d, n), "ours": KERNEL_NAMES[GLUON],
                        "library": GLUON_LIBRARY_NAME, "speed_ratio": library / gluon,
                        "target": gluon_target(mode, d) if n >= GLUON_MIN_N else None})
    return out


def gluon_target(mode: str, d: int):
    """Issue 33's bar for the Gluon rung against cuDNN at this pass and head dim (from GLUON_MIN_N on)."""
    return GLUON_TARGETS.get(d) if mode == "fwd" else GLUON_TRAIN_TARGET


def rung_table(rows: list, mode: str, causal: bool, dtype: str, head_dim: int) -> list[dict]:
    """One row per N of a run: the TFLOP/s of our Triton kernel, the Gluon rung and cuDNN, and each kernel's speed
    against cuDNN (cuDNN's time over the kernel's: 1.0 = as fast). Empty where the run timed neither against cuDNN."""
    rates = {}
    for r in rows:
        if isinstance(r, dict) and r.get("measured_tflops") and r.get("mode") == mode and \
                bool(r.get("causal")) == causal and r.get("dtype") == dtype and r.get("head_dim") == head_dim:
            rates[(r["seq_len"], r["impl"])] = r["measured_tflops"]
    out = []
    for n in sorted({n for n, impl in rates if impl == CUDNN}):
        cudnn = rates[(n, CUDNN)]
        row = {"N": n, "cuDNN (TFLOP/s)": round(cudnn)}
        for impl in ("ours", GLUON):
            if (n, impl) in rates:  # time ratio = rate ratio: the same FLOPs in both
                row[f"{KERNEL_NAMES[impl]} (TFLOP/s)"] = round(rates[(n, impl)])
                row[f"{KERNEL_NAMES[impl]} / cuDNN (x)"] = round(rates[(n, impl)] / cudnn, 2)
        if len(row) > 2:
            out.append(row)
    return out
