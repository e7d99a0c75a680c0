"""One GPU call that tells whether the Gluon FlashAttention-3 forward (labs/attention/gluon_fa3.py) works, and how
fast it is beside cuDNN.

    OUT=/some/dir python3 scripts/gluon_fa3_check.py      (under 200 s on an H100; each part in its own process)
    ONLY=1,5 python3 scripts/gluon_fa3_check.py          (the default and the fifth variant only; TOTAL_S: the budget)

First a child process times torch SDPA's cuDNN and FlashAttention backends at every timed shape and hands the
times to the variants through a JSON file. Then, for each variant of the kernel (the lab's default first, then
the others in VARIANTS), a child process: compiles (the full traceback if it fails), checks
against float64 on odd shapes (lengths 1000 and 333, Lq != Lk, causal and not, d 64 and 128, three programs so
each walks several query blocks), then times seq 2048 and 8192 at batch x heads 16 x 16 (d 128) and 32 x 16
(d 64), causal and not (triton's do_bench, median), and prints TFLOP/s (causal counts half the FLOPs) and the
ratio to cuDNN. A child that hangs (an mbarrier never completing) is killed after CHILD_TIMEOUT_S and said so;
the last is cut at TOTAL_S (none starts with less than MIN_CHILD_S left). With $OUT set, each variant's PTX is
written there.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CHILD_TIMEOUT_S, MIN_CHILD_S = 60, 15
TOTAL_S = int(os.environ.get("TOTAL_S", 195))  # a 3-consumer variant compiles 4 kernels of ~200 wgmma
SEQS = (2048, 8192)
BATCH_HEADS = {128: (16, 16), 64: (32, 16)}
# (batch, heads, Lq, Lk): lengths not multiples of any tile; Lq > Lk leaves causal rows that see no key
ODD_SHAPES = ((1, 2, 1000, 1000), (2, 1, 333, 333), (1, 2, 333, 1000), (1, 1, 1000, 333))
CHECK_PROGRAMS = 3  # few programs: each walks several (head, query block) tiles, crossing tile boundaries
LIBRARIES = ("sdpa-cudnn", "sdpa-flash")
# name -> {head dim: FA3Config keyword arguments}; the first is the lab's default (gluon_fa3.DEFAULT_CONFIGS).
# Each compiles for sm_90a with Triton 3.6 under 227 KiB of shared memory and without spills, except where said
THREE = dict(consumers=3, consumer_regs=160)  # three consumer warpgroups: 192 queries a tile, 160 registers each
D128 = dict(block_n=128, stages=2, o_tma=True)
D64 = dict(THREE, block_n=128, stages=3, o_tma=True)
TWO64 = dict(block_n=128, stages=3, o_tma=True)  # d 64 with two consumers, the default before
VARIANTS = {
    "default: Q double-buffered, O through TMA (d128 128x128 s2, d64 192x128 s3)": {128: D128, 64: D64},
    "192 rows, P in registers (d128 192x64 s3, d64 192x64 s4 O through TMA)": {
        128: dict(THREE, block_n=64, stages=3), 64: dict(THREE, block_n=64, stages=4, o_tma=True)},
    "P through shared memory (d128 128x128 s2; d64 192x128 s3 O through TMA: a few spills outside the key loop)": {
        128: dict(D128, p_smem=True, o_tma=False), 64: dict(THREE, block_n=128, stages=3, p_smem=True, o_tma=True)},
    "no ping-pong (d128 s2, d64 s3)": {128: dict(D128, pingpong=False), 64: dict(TWO64, pingpong=False)},
    "O from registers, as before 2026-11-27 (d128 s2, d64 two consumers s3)": {128: dict(D128, o_tma=False),
                                                                              64: dict(TWO64, o_tma=False)},
    "Q single-buffered, as in the draft (d128 s2, d64 s3)": {128: dict(D128, q_buffers=1), 64: dict(D64, q_buffers=1)},
    "two consumers at d64 (128x128 s3, the default before 2026-11-27); d128 as the default": {128: D128, 64: TWO64},
}
PTX_MARKERS = ("wgmma.mma_async", "wgmma.wait_group", "mbarrier.try_wait", "mbarrier.arrive", "setmaxnreg",
               "cp.async.bulk.tensor", "ex2.approx", "bar.sync")


def say(*parts) -> None:
    print(*parts, flush=True)


def flops(batch: int, heads: int, seq: int, d: int, causal: bool) -> float:
    """Two GEMMs of 2 * seq * seq * d each per head; the causal mask keeps half of them."""
    return 4.0 * batch * heads * seq * seq * d * (0.5 if causal else 1.0)


def timed_shapes():
    for d, (batch, heads) in BATCH_HEADS.items():
        for seq in SEQS:
            for causal in (False, True):
                yield d, batch, heads, seq, causal


def point_key(d, seq, causal) -> str:
    return f"d{d} n{seq} {'causal' if causal else 'full'}"


def bench_ms(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=10, rep=60, return_mode="median")


def qkv(batch, heads, lq, lk, d):
    import torch

    g = torch.Generator(device="cuda").manual_seed(lq * 7 + lk + d)
    q = torch.randn(batch, heads, lq, d, device="cuda", generator=g).to(torch.bfloat16)
    k = torch.randn(batch, heads, lk, d, device="cuda", generator=g).to(torch.bfloat16)
    v = torch.randn(batch, heads, lk, d, device="cuda", generator=g).to(torch.bfloat16)
    return q, k, v


def run_libraries(path: str) -> None:
    """In a child: time cuDNN and FlashAttention (SDPA backends) at every timed shape; write {key: {lib: ms}}."""
    import torch

    from labs.attention.naive import sdpa

    if not torch.cuda.is_available():
        say("  cannot run here: this machine has no CUDA GPU")
        return

    times = {}
    for d, batch, heads, seq, causal in timed_shapes():
        q, k, v = qkv(batch, heads, seq, seq, d)
        row = {}
        for lib in LIBRARIES:
            try:
                sdpa(q, k, v, causal, lib)
                row[lib] = bench_ms(lambda: sdpa(q, k, v, causal, lib))  # noqa: B023 - called at once
            except Exception as exc:  # noqa: BLE001 - a backend that refuses a shape: say so, time the rest
                say(f"  {lib} at {point_key(d, seq, causal)}: {type(exc).__name__}: {exc}"[:300])
        times[point_key(d, seq, causal)] = row
        fl = flops(batch, heads, seq, d, causal)
        say(f"  {point_key(d, seq, causal):>20}: " + "   ".join(f"{lib} {fl / ms / 1e9:6.1f} TFLOP/s"
                                                               for lib, ms in row.items()))
    Path(path).write_text(json.dumps(times))


def ptx_counts(ptx: str) -> str:
    return ", ".join(f"{m} {len(re.findall(re.escape(m), ptx))}" for m in PTX_MARKERS)


def check_odd_shapes(config_for) -> bool:
    """Every odd shape, causal and not, d 64 and 128, against float64; False at the first failure."""
    import torch

    from labs.attention.gluon_fa3 import gluon_attention
    from labs.attention.naive import reference
    from labs.engine import timing

    for d in BATCH_HEADS:
        for batch, heads, lq, lk in ODD_SHAPES:
            for causal in (False, True):
                what = f"d {d}, {batch}x{heads}, Lq {lq}, Lk {lk}, {'causal' if causal else 'full'}"
                q, k, v = qkv(batch, heads, lq, lk, d)
                out = torch.full_like(q, float("nan"))  # a row the kernel forgets stays NaN and fails
                started = time.monotonic()
                try:
                    gluon_attention(q, k, v, causal, config_for(d), out=out, programs=CHECK_PROGRAMS)
                    torch.cuda.synchronize()
                except Exception:  # noqa: BLE001 - the whole text, so the next try can be fixed
                    say(f"  COMPILE/LAUNCH FAILED at {what}:\n{traceback.format_exc()}")
                    return False
                ref = reference(q, k, v, causal)[0]
                worst = (out.double() - ref).abs().max().item()
                try:
                    err = timing.check_close(out, ref, "bf16", what)
                    if not worst < 0.05:
                        raise timing.KernelMismatch(f"{what}: largest error {worst:.3g} (want < 0.05)")
                except timing.KernelMismatch as exc:
                    say(f"  WRONG: {exc}")
                    return False
                say(f"  correct at {what}: rel error {err:.2e}, max {worst:.2e} ({time.monotonic() - started:.1f} s)")
    return True


def run_variant(name: str, library_path: str) -> None:
    """In a child: compile, check, time one variant. Prints as it goes."""
    import torch

    from labs.attention.gluon_fa3 import FA3Config, gluon_attention
    from labs.hopper.gluon_support import attention_unavailable_reason, device_capability

    reason = attention_unavailable_reason(device_capability(torch.device("cuda")))
    if reason:
        say(f"  cannot run here: {reason}")
        return

    def config_for(d):
        return FA3Config(**VARIANTS[name][d])

    if not check_odd_shapes(config_for):
        return
    libs = json.loads(Path(library_path).read_text()) if Path(library_path).exists() else {}
    slug = re.sub(r"[^a-z0-9]+", "-", name.split(":")[0].lower()).strip("-")
    rates = {}  # point -> TFLOP/s, for the summary
    for d, batch, heads, seq, causal in timed_shapes():
        q, k, v = qkv(batch, heads, seq, seq, d)
        out = torch.empty_like(q)
        _, kernel = gluon_attention(q, k, v, causal, config_for(d), out=out, return_kernel=True)
        if seq == SEQS[0]:
            say(f"  d {d} {'causal' if causal else 'full'} {config_for(d).label}: registers "
                f"{getattr(kernel, 'n_regs', '?')}, spills {getattr(kernel, 'n_spills', '?')}, "
                f"shared {kernel.metadata.shared} B")
            say(f"    PTX: {ptx_counts(kernel.asm['ptx'])}")
            if os.environ.get("OUT"):
                Path(os.environ["OUT"], f"fa3_{slug}_d{d}_{'causal' if causal else 'full'}.ptx").write_text(
                    kernel.asm["ptx"])
        ms = bench_ms(lambda: gluon_attention(q, k, v, causal, config_for(d), out=out))  # noqa: B023
        fl = flops(batch, heads, seq, d, causal)
        lib_ms = libs.get(point_key(d, seq, causal), {})
        rate = {lib: fl / lib_ms[lib] / 1e9 if lib in lib_ms else float("nan") for lib in LIBRARIES}
        ratio = f"{lib_ms['sdpa-cudnn'] / ms:.3f}" if "sdpa-cudnn" in lib_ms else "?"
        say(f"  {point_key(d, seq, causal):>20}: {fl / ms / 1e9:6.1f} TFLOP/s   x cuDNN {ratio}   "
            f"cuDNN {rate['sdpa-cudnn']:6.1f}   flash {rate['sdpa-flash']:6.1f}")
        rates[point_key(d, seq, causal)] = fl / ms / 1e9
        Path(library_path).with_name(f"variant-{list(VARIANTS).index(name)}.json").write_text(json.dumps(rates))


def summary(library_path: str) -> None:
    """One line a timed point: cuDNN's TFLOP/s, then each variant's and its ratio to cuDNN (numbered as run)."""
    libs = json.loads(Path(library_path).read_text()) if Path(library_path).exists() else {}
    found = {i: json.loads(f.read_text()) for i in range(len(VARIANTS))
             if (f := Path(library_path).with_name(f"variant-{i}.json")).exists()}
    say("== summary: TFLOP/s (x cuDNN) of variants " + ", ".join(str(i + 1) for i in found))
    for d, batch, heads, seq, causal in timed_shapes():
        key = point_key(d, seq, causal)
        cudnn = flops(batch, heads, seq, d, causal) / libs[key]["sdpa-cudnn"] / 1e9 if "sdpa-cudnn" in libs.get(
            key, {}) else float("nan")
        cells = [f"{i + 1}: {r[key]:5.0f} ({r[key] / cudnn:.2f})" for i, r in found.items() if key in r]
        say(f"  {key:>18}  cuDNN {cudnn:5.0f}   " + "   ".join(cells))


def chosen_variants() -> list:
    """The variants to run: all, or those numbered (from 1, as the summary numbers them) in $ONLY, e.g. ONLY=1,5."""
    only = os.environ.get("ONLY", "")
    picked = {int(i) - 1 for i in only.split(",") if i.strip().isdigit()}
    return [name for i, name in enumerate(VARIANTS) if not picked or i in picked]


def child(args: list, budget_end: float) -> None:
    """Run this script with `args` in a child process, killed after CHILD_TIMEOUT_S or at the call's budget."""
    timeout = min(CHILD_TIMEOUT_S, budget_end - time.monotonic())
    if timeout < MIN_CHILD_S:
        say("  skipped: too little of the call's budget is left")
        return
    try:
        subprocess.run([sys.executable, __file__, *args], timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        say(f"  KILLED after {timeout:.0f} s: a hang (an mbarrier never completed?), a slow compile or the budget")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--libraries":
        run_libraries(sys.argv[2])
        return
    if len(sys.argv) > 3 and sys.argv[1] == "--variant":
        run_variant(sys.argv[2], sys.argv[3])
        return
    started = time.monotonic()
    budget_end = started + TOTAL_S
    import torch
    import triton

    say(f"torch {torch.__version__}, triton {triton.__version__}, "
        f"GPU {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}")
    from labs.hopper.gluon_support import attention_gluon_missing

    say(f"Gluon features for attention: {attention_gluon_missing() or 'all present'}")
    with tempfile.TemporaryDirectory() as tmp:
        library_path = str(Path(tmp, "libraries.json"))
        say("== libraries (torch SDPA backends)")
        child(["--libraries", library_path], budget_end)
        for name in chosen_variants():
            say(f"== {name}")
            child(["--variant", name, library_path], budget_end)
        summary(library_path)
    say(f"total {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
