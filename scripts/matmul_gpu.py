"""Device-side checks for the matmul lab (issue 15): the stream-K kernel against float64, then our kernel
beside cuBLAS, with the model's error.

Run on a GPU:  python scripts/matmul_gpu.py [check] [variants] [sweep] [floor] [lab] [labsk]
               (default: check variants)
  check     every stream-K variant on odd shapes, odd program counts and both program orders, against float64;
            the counters must come back to zero
  variants  bf16 at the sizes where the plain kernel is under 0.9x cuBLAS (N = 1024 ... 3072): cuBLAS, the lab's
            choice, the plain big tile and each stream-K variant, each checked before it is timed; one table of
            ratios to cuBLAS, with the registers and spills of each compiled variant, and how many partial sums the
            tile owners' shortcut saved
  sweep     bf16 at every N of DEFAULT_SIZES: cuBLAS and the lab's choice, with the model
  floor     the model's probes (the smallest product, and a load's latency) beside cuBLAS's smallest products
  lab       the lab's own default run (python -m labs run matmul), summarised
  labsk     the same with streamk=on
  tailcheck the split-K tail kernel on odd shapes, odd slot counts and forced splits, twice each, against float64;
            the workspace and counters must come back to zero
  hybrid    bf16 at HYBRID_SIZES: the row-tail schedule (big tiles on the full waves' rows, short tiles on the rest)
            with several tail tiles, one after the other or on a second stream, beside plain tiles and cuBLAS
            (HYBRID_SET=pdl: the row tail's variants with and without the early start; HYBRID_SET=final: the lab's
            choice against its nearest alternatives)
  rowcheck  the row tail on odd shapes and few slots (both launches), with and without the early start
  earlycheck the row tail and interior + edge, early start on and off: every element of each part against float64,
            checked in-stream right after each of 3 direct launches and 3 graph replays
  early     bf16 at EARLY_SIZES: cuBLAS, the lab's choice, the previous default (before) and, at the interior + edge
            sizes, the strips launched first and the interior alone: ratio to cuBLAS (ours us / model us).
            EARLY_SET=wait: the early start with every or only the last program waiting, with and without the
            largest shared-memory carveout, and edge tile variants
  splitcheck interior + edge with the strips split along K (the rule, and 2 pieces) and with bands (both strips, the
            right one only, the bottom one computed directly: bothN), early start on: every element of each part
            against float64 after direct launches and graph replays; split workspaces back at zero
  split     bf16 at SPLIT_SIZES: cuBLAS, the lab's choice, split strips (the rule), the bands, the interior alone,
            and at N % 32 != 0 the interior alone on row-padded copies (32- and 128-byte aligned rows; SPLIT_PAD=0: not)
  tail      bf16 at TAIL_SIZES: plain tiles of several shapes, the split-K tail kernel, the Hopper lab's persistent
            kernels, beside cuBLAS (ratios, model, registers and spills)
  pieces    composite tiles (matmul_pieces_kernel: sides made of power-of-two pieces, 192 = 128 + 64): each variant
            on odd shapes against a full float64 product, then bf16 at PIECES_SIZES beside cuBLAS and the lab's choice
            (ratio to cuBLAS [model TFLOP/s]), with registers, spills and shared memory of each compiled variant and a
            summary of its PTX (wgmma shapes, how many take A from registers, the waits); names ending a1/a2 keep row
            pieces of A in registers (labs.matmul.PIECES_A_REGS); PIECES_ONLY, PIECES_SIZES (env): variants, sizes
  align     the pointer path with 16-byte rows promised to Triton (matmul_kernel's ALIGN = 8: N = 2056's rows are
            16-byte but not 32-byte aligned, where the TMA interior ran 0.80x cuBLAS against 1.0x on padded rows):
            odd shapes against float64 first, then bf16 at ALIGN_SIZES the interior (whole tiles) and the whole
            product, TMA against pointer loads in several tiles, beside cuBLAS (ratio, us, registers, spills)
  spread    interior + edge in one launch, each program carrying one 16-wide piece of each strip in its K loop
            (matmul_spread_kernel): checked against a full float64 product, then timed beside cuBLAS, the lab's
            choice (strips in their own launches) and the interior alone at SPREAD_SIZES
  lanes     odd N (rows aligned to one element): the pointer kernel as it is against matmul_lanes_kernel (the row
            strides unspecialized, so each lane loads one element and the warp's lanes line up along the row), in
            a few tiles: checked against float64 on odd shapes first, then bf16 at LANES_SIZES beside cuBLAS, with
            registers, spills and the PTX's global load and shared store instructions
Prints a compact table per section; with $OUT set, writes matmul_gpu.json there. Sections (and sizes) stop being
started once DEADLINE_S (env, seconds since start, default 220) has passed; VARIANT_SIZES (env, comma-separated)
replaces the sizes of `variants`.
"""
import json
import os
import sys
import time

import torch
import triton

from labs import matmul as mm
from labs.engine import timing
from labs.engine import gpu

T0 = time.monotonic()
DEADLINE = float(os.environ.get("DEADLINE_S", "220"))
OUT = os.environ.get("OUT")
results: dict = {"rows": []}
T = mm.TileConfig
BIG = mm.DEFAULT_CONFIGS["bf16"]
SK = T(128, 256, 64, 8, 8, 3, True)
CANDIDATES = {  # name -> (config, SK_EXTRA_WAVE, SK_FIXUP); "lab" = the lab's per-size choice (config_for)
    "lab": (None, True, 1),
    "dp_big": (BIG, True, 1),
    "sk0": (SK, True, 0),  # the first stream-K version: the last to arrive re-reads every part
    "sk1": (SK, True, 1),  # the tile's owner adds the other parts in registers
    "sk1_1": (SK, False, 1),  # the same, sharing out only the partial wave
    "sk1_128": (T(128, 128, 64, 8, 8, 4, True), True, 1),  # smaller tiles, smaller parts
    "dp_64": (T(64, 64, 64, 8, 4, 4), True, 1),  # small tiles, three programs per SM (N <= 1536 only)
}
VARIANT_SIZES = tuple(int(x) for x in os.environ.get("VARIANT_SIZES", "1024,1536,2048,2056,2064,2304,3072").split(","))
TMA = "auto"  # the load path the candidates take ("on" forces TMA, for a dry run in the CPU interpreter)
CHECK_SHAPES = ((517, 528, 560), (1001, 1032, 2056), (2057, 2064, 200), (264, 264, 4104))  # M odd; N, K 16-byte rows
SEEN: set = set()


def cublas_point(n: int):
    """Fresh bf16 operands of size n, cuBLAS checked against float64 on them, and its TFLOP/s."""
    a, b = mm.operands(n, n, n, "bf16")
    out = torch.full((n, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    c = mm.cublas_matmul(a, b, "bf16", out)
    mm.check_sampled(c, a, b, "bf16", f"cublas {n}")
    cub = timing.tflops(2 * n**3, mm.kernel_ms(lambda: mm.cublas_matmul(a, b, "bf16", out)))
    return a, b, out, cub


def elapsed() -> float:
    return time.monotonic() - T0


def save():
    if OUT:
        with open(os.path.join(OUT, "matmul_gpu.json"), "w") as fh:
            json.dump(results, fh, indent=1, default=str)


def record(section, **row):
    row["section"] = section
    results["rows"].append(row)


def fmt(v):
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def run_ours(a, b, out, cfg, extra_wave, fixup=1, programs=None, reversed_order=False):  # stream-K variants
    mm.SK_EXTRA_WAVE, mm.SK_FIXUP = extra_wave, fixup
    try:
        return mm.triton_matmul(a, b, "bf16", out, cfg, TMA, programs=programs, reversed_order=reversed_order)
    finally:
        mm.SK_EXTRA_WAVE, mm.SK_FIXUP = True, 1


def section_check():
    """Each stream-K variant on odd shapes (M odd, N and K 16-byte multiples), odd program counts and both
    program orders, output poisoned with NaN, against a full float64 product; the counters must come back to zero."""
    print(f"{'variant':<9} {'M x N x K':<16} {'progs':>5} {'rev':>3} {'rel err':>9}  ok")
    for name, (cfg, extra, fixup) in CANDIDATES.items():
        if cfg is None or not cfg.streamk:
            continue
        for (m, n, k), progs, rev in [(sh, p, r) for sh in CHECK_SHAPES for p, r in ((None, False), (7, False), (None, True))]:
            a, b = mm.operands(m, n, k, "bf16")
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            try:
                for _ in range(2):  # the second call finds the counters the first left
                    out.fill_(float("nan"))
                    run_ours(a, b, out, cfg, extra, fixup, progs, rev)
                    torch.cuda.synchronize()
                    err = timing.check_close(out, mm.reference(a, b), "bf16", f"{name} {m}x{n}x{k} p{progs}")
                clean = int(mm._SCRATCH[("streamk", str(a.device))][1].abs().sum()) == 0
                ok = "yes" if clean else "COUNTERS LEFT NONZERO"
            except Exception as exc:
                err, ok = float("nan"), f"FAIL {exc}"[:200]
            record("check", config=name, shape=f"{m}x{n}x{k}", programs=progs, reversed=rev, err=err, ok=ok)
            if ok != "yes" or progs is None and not rev:
                print(f"{name:<9} {f'{m}x{n}x{k}':<16} {str(progs):>5} {rev!s:>5} {err:9.2e}  {ok}", flush=True)
    fails = [r for r in results["rows"] if r["section"] == "check" and r["ok"] != "yes"]
    print(f"check: {len(fails)} failures", flush=True)


def partial_segments(n, cfg, extra, slots=None):
    """(pieces of tiles that a program holds only in part, tiles that more than one program shares)."""
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    tiles, k_steps = triton.cdiv(n, bm) * triton.cdiv(n, bn), triton.cdiv(n, bk)
    plan = mm.streamk_plan(tiles, k_steps, slots or torch.cuda.get_device_properties(0).multi_processor_count, extra)
    total, grid = plan["sk_tiles"] * k_steps, plan["grid"]
    pieces = 0
    for p in range(grid):
        start, end = p * total // grid, (p + 1) * total // grid
        for t in range(start // k_steps, -(-end // k_steps)):
            lo, hi = max(start, t * k_steps) - t * k_steps, min(end, t * k_steps + k_steps) - t * k_steps
            pieces += not (lo == 0 and hi == k_steps)
    shared = sum(((t * k_steps + k_steps) * grid - 1) // total > ((t * k_steps + 1) * grid - 1) // total
                 for t in range(plan["sk_tiles"]))
    return pieces, shared


def section_variants():
    """bf16 at VARIANT_SIZES: cuBLAS, then each candidate checked (finite everywhere, sampled rows and columns
    against float64) and timed the same way; one table of ratios to cuBLAS."""
    target = gpu.live_target()
    params = mm.Params()
    names = list(CANDIDATES)
    table = []
    mm.probe_floor_us(target)  # the model's floor and load latency, as the lab's run probes them
    print(f"floor {mm.fixed_us(target):.2f} us, load latency {mm.load_latency_us(target):.2f} us", flush=True)
    print(f"{'N':>5} {'cuBLAS':>7} | " + " ".join(f"{x:>8}" for x in names) + "  (ours / cuBLAS)", flush=True)
    for n in VARIANT_SIZES:
        if elapsed() > DEADLINE:
            print("deadline: variants stopped", flush=True)
            break
        a, b, out, cub = cublas_point(n)
        row = {"n": n, "cublas": cub}
        for name, (cfg, extra, fixup) in CANDIDATES.items():
            cfg = cfg or mm.config_for(params, "bf16", n, target.sm_count, target.compute_capability)
            if name == "lab":
                row["lab_config"] = cfg.label
            if name == "sk1_1" and triton.cdiv(n, 128) * triton.cdiv(n, 256) <= target.sm_count:
                continue  # the same as sk1 when there is no full wave before the partial one
            if name == "dp_64" and n > 1536:
                continue
            try:
                if cfg.streamk:  # a first call sizes the scratch; then poison it, to count the slots written
                    run_ours(a, b, out, cfg, extra, fixup)
                    mm._SCRATCH[("streamk", str(a.device))][0].fill_(float("nan"))
                out.fill_(float("nan"))
                _, _, comp = run_ours(a, b, out, cfg, extra, fixup)
                mm.check_sampled(out, a, b, "bf16", f"{name} {n}")
                if cfg.streamk:  # slots written (the owner's shortcut writes none) against pieces of tiles
                    parts, tile = mm._SCRATCH[("streamk", str(a.device))][0], cfg.block_m * cfg.block_n
                    parts = parts[:parts.numel() // tile * tile].view(-1, tile)
                    written = int((~parts.isnan().all(1)).sum())
                    pieces, shared = partial_segments(n, cfg, extra)
                    row[f"{name}_parts"] = f"{written}/{pieces} ({shared} shared tiles)"
                if name not in SEEN:
                    SEEN.add(name)
                    print(f"   {name} {cfg.label}: {mm._compiled_resources(comp)} spills={getattr(comp, 'n_spills', '?')}",
                          flush=True)
                ms = mm.kernel_ms(lambda: run_ours(a, b, out, cfg, extra, fixup))
                row[name] = timing.tflops(2 * n**3, ms)
                mm.SK_EXTRA_WAVE, mm.SK_FIXUP = extra, fixup  # the model of this variant's schedule and fix-up
                row[f"{name}_pred"] = mm.predict_point(n, "bf16", cfg, target).get("predicted_tflops")
                mm.SK_EXTRA_WAVE, mm.SK_FIXUP = True, 1
            except Exception as exc:
                row[name] = float("nan")
                print(f"   {name} at {n} failed: {exc}"[:300], flush=True)
        record("variants", **row)
        table.append(row)
        print(f"{n:>5} {cub:7.1f} | " + " ".join(f"{row.get(x, float('nan')) / cub:8.2f}" for x in names), flush=True)
        del a, b, out
    save()
    print("\n== ours / cuBLAS (bf16)   [model TFLOP/s in brackets]  parts written / pieces")
    for row in table:
        print(f"N={row['n']:>5} cuBLAS={row['cublas']:6.1f}  " + "  ".join(
            f"{x}={row.get(x, float('nan')) / row['cublas']:.2f}[{row.get(x + '_pred') or float('nan'):.0f}]"
            for x in names) + "  " + " ".join(f"{x}:{row[x + '_parts']}" for x in names if x + "_parts" in row)
            + f"  lab={row.get('lab_config')}", flush=True)


def section_sweep():
    """bf16 at every size: cuBLAS, the lab's choice (config_for), and the candidates (aligned sizes only)."""
    target = gpu.live_target()
    params = mm.Params()
    print("ceilings:", target.describe_ceilings(), flush=True)
    mm.probe_floor_us(target)
    print(f"{'N':>5} {'cuBLAS':>7} {'lab':>7} {'x':>5} {'model':>7} {'err%':>6}  lab config", flush=True)
    for n in mm.DEFAULT_SIZES:
        if elapsed() > DEADLINE:
            print("deadline: sweep stopped", flush=True)
            return
        a, b, out, cub = cublas_point(n)
        cfg = mm.config_for(params, "bf16", n, target.sm_count, target.compute_capability)
        out.fill_(float("nan"))
        _, path, compiled = mm.triton_matmul(a, b, "bf16", out, cfg, "auto")
        mm.check_sampled(out, a, b, "bf16", f"lab {n}")
        lab = timing.tflops(2 * n**3, mm.kernel_ms(lambda: mm.triton_matmul(a, b, "bf16", out, cfg, "auto")))
        pred = mm.predict_point(n, "bf16", cfg, target).get("predicted_tflops") or float("nan")
        row = {"n": n, "cublas": cub, "lab": lab, "ratio": lab / cub, "model": pred,
               "err_pct": 100 * (lab - pred) / pred, "config": cfg.label, "path": path,
               **mm._compiled_resources(compiled)}
        record("sweep", **row)
        print(f"{n:>5} {cub:7.1f} {lab:7.1f} {lab / cub:5.2f} {pred:7.1f} {row['err_pct']:+6.1f}  {cfg.label:<24}",
              flush=True)
        del a, b, out
    save()


def section_tailcheck():
    """The split-K tail kernel on odd shapes (M odd, N and K 16-byte rows), a few slot counts and splits, output
    poisoned with NaN, twice each (the second launch finds what the first left), against a full float64 product."""
    fails = 0
    for cfg in (T(128, 256, 64, 8, 8, 3, split_tail=True), T(128, 128, 64, 8, 4, 4, split_tail=True)):
        runs = ((None, None), (7, None), (5, 3))  # (slots, split): the plan's own, few slots, a forced split
        for (m, n, k), progs, split in [(sh, p, s) for sh in CHECK_SHAPES for p, s in runs]:
            a, b = mm.operands(m, n, k, "bf16")
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            try:
                for _ in range(2):
                    out.fill_(float("nan"))
                    mm.triton_matmul(a, b, "bf16", out, cfg, "auto", programs=progs, split=split)
                    torch.cuda.synchronize()
                    err = timing.check_close(out, mm.reference(a, b), "bf16", f"tail {m}x{n}x{k} p{progs} s{split}")
                ws, counts = mm._SCRATCH[("splittail", str(a.device))]
                ok = "yes" if float(ws.abs().sum()) == 0 and int(counts.abs().sum()) == 0 else "SCRATCH LEFT NONZERO"
            except Exception as exc:
                err, ok = float("nan"), f"FAIL {exc}"[:200]
            fails += ok != "yes"
            record("tailcheck", config=cfg.label, shape=f"{m}x{n}x{k}", programs=progs, split=split, err=err, ok=ok)
            if ok != "yes" or progs is None:
                print(f"tail {cfg.label:<26} {m}x{n}x{k:<6} p={progs} s={split} err={err:.2e} {ok}", flush=True)
    print(f"tailcheck: {fails} failures", flush=True)

HYBRID_SIZES = tuple(int(x) for x in os.environ.get(
    "HYBRID_SIZES", "3072,2304,2056,2064,1536,1024,5120,2560,3584,1280,1792,2048,4096").split(","))


def hybrid_candidates():
    """name -> (config, tail config, how): how = 'serial' (the lab's launcher), 'side-after' / 'side-before' (the
    tail on a second stream, launched after / before the big tiles), None for a plain config."""
    big, big2 = T(128, 256, 64, 8, 8, 3, row_tail=True), T(128, 128, 64, 8, 4, 3, row_tail=True)
    if os.environ.get("HYBRID_SET") == "final":  # the lab's choice against its nearest alternatives
        return {
            "lab": (None, None, None),
            "p64x64s4": (T(64, 64, 64, 8, 4, 4), None, None),
            "p64x64s6": (T(64, 64, 64, 8, 4, 6), None, None),
            "p64x128s4": (T(64, 128, 64, 8, 4, 4), None, None),
            "p64x128s6": (T(64, 128, 64, 8, 4, 6), None, None),
            "rt_nopdl": (big, None, "nopdl"),
            "rt_64x128s5": (big, T(64, 128, 64, 8, 4, 5), "serial"),
        }
    if os.environ.get("HYBRID_SET") == "pdl":  # after the row tail became the lab's choice: its variants
        return {
            "lab": (None, None, None),
            "p128x256": (T(128, 256, 64, 8, 8, 3), None, None),
            "rt_nopdl": (big, T(64, 128, 64, 8, 4, 4), "nopdl"),
            "rt_64x128s4": (big, T(64, 128, 64, 8, 4, 4), "serial"),
            "rt_64x128s5": (big, T(64, 128, 64, 8, 4, 5), "serial"),
            "rt_64x128s6": (big, T(64, 128, 64, 8, 4, 6), "serial"),
            "rt_64x64s4": (big, T(64, 64, 64, 8, 4, 4), "serial"),
            "rt_64x64s6": (big, T(64, 64, 64, 8, 4, 6), "serial"),
        }
    return {
        "lab": (None, None, None),
        "p128x256": (T(128, 256, 64, 8, 8, 3), None, None),
        "p128x128s3": (T(128, 128, 64, 8, 4, 3), None, None),
        "p64x128s3": (T(64, 128, 64, 8, 4, 3), None, None),
        "p64x128s4": (T(64, 128, 64, 8, 4, 4), None, None),
        "rt_64x128s4": (big, T(64, 128, 64, 8, 4, 4), "serial"),
        "rt_64x128s3": (big, T(64, 128, 64, 8, 4, 3), "serial"),
        "rt_64x64": (big, T(64, 64, 64, 8, 4, 4), "serial"),
        "rt_128x128s3": (big, T(128, 128, 64, 8, 4, 3), "serial"),
        "rt_64x256": (big, T(64, 256, 64, 8, 4, 3), "serial"),
        "rt2_64x128s3": (big2, T(64, 128, 64, 8, 4, 3), "serial"),
        "rt2_64x64": (big2, T(64, 64, 64, 8, 4, 4), "serial"),
        "rtA_64x128s4": (big, T(64, 128, 64, 8, 4, 4), "side-after"),
        "rtB_64x128s4": (big, T(64, 128, 64, 8, 4, 4), "side-before"),
    }


SIDE = {}


def on_two_streams(a, b, out, big, tail, before):
    """The row-tail schedule with the tail on a second stream (fork and join, which a CUDA graph keeps)."""
    side = SIDE.setdefault("s", torch.cuda.Stream())
    big = mm.dataclasses.replace(big, row_tail=False)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    slots = sms * max(1, mm.blocks_per_sm(big, "bf16", "tma", "9.0"))
    rows = mm.row_tail_rows(a.shape[0], b.shape[1], big, slots)
    if rows in (0, a.shape[0]):
        return mm.triton_matmul(a, b, "bf16", out, big if rows else tail)
    main = torch.cuda.current_stream()
    side.wait_stream(main)
    if not before:
        res = mm.triton_matmul(a[:rows], b, "bf16", out[:rows], big)
    with torch.cuda.stream(side):
        mm.triton_matmul(a[rows:], b, "bf16", out[rows:], tail)
    if before:
        res = mm.triton_matmul(a[:rows], b, "bf16", out[:rows], big)
    main.wait_stream(side)
    return res


def without_pdl(fn):
    """fn() with the row tail's second launch an ordinary one."""
    return with_early(False, fn)


def with_edge_first(fn):
    """fn() with interior + edge launching the strips before the interior."""
    mm.EDGE_FIRST = True
    try:
        return fn()
    finally:
        mm.EDGE_FIRST = False


def with_early(on, fn, wait=None, carveout=None):
    """fn() with the early start (programmatic dependent launch of the later parts) on or off, and optionally which
    programs wait (mm.EARLY_WAIT) and the shared-memory carveout asked for (mm.SHARED_CARVEOUT)."""
    before = mm.EARLY_START, mm.EARLY_WAIT, mm.SHARED_CARVEOUT
    mm._set_early_start(on)
    mm.EARLY_WAIT = before[1] if wait is None else wait
    mm.SHARED_CARVEOUT = before[2] if carveout is None else carveout
    try:
        return fn()
    finally:
        mm._set_early_start(before[0])
        mm.EARLY_WAIT, mm.SHARED_CARVEOUT = before[1:]


def section_rowcheck():
    """The row-tail schedule on odd shapes (M odd, N and K 16-byte rows) with few slots, so that both launches
    run, with and without programmatic dependent launch, twice each, against a full float64 product."""
    fails = 0
    cfg = T(128, 256, 64, 8, 8, 3, row_tail=True)
    for (m, n, k), progs in (((517, 528, 560), 7), ((1001, 1032, 2056), 9), ((2057, 2064, 200), 132),
                             ((3072, 3072, 3072), None), ((2056, 2056, 2056), None)):
        for pdl in (True, False):
            a, b = mm.operands(m, n, k, "bf16")
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            rows = mm.row_tail_rows(m, n, cfg, progs or 132)
            try:
                for _ in range(2):
                    out.fill_(float("nan"))
                    run = lambda: mm.triton_matmul(a, b, "bf16", out, cfg, "auto", programs=progs)  # noqa: E731
                    run() if pdl else without_pdl(run)
                    torch.cuda.synchronize()
                    err = timing.check_close(out, mm.reference(a, b), "bf16", f"row tail {m}x{n}x{k} p{progs}")
                ok = "yes"
            except Exception as exc:
                err, ok = float("nan"), f"FAIL {exc}"[:200]
            fails += ok != "yes"
            record("rowcheck", shape=f"{m}x{n}x{k}", programs=progs, pdl=pdl, rows=rows, err=err, ok=ok)
            print(f"row tail {m}x{n}x{k} slots={progs} big rows={rows} pdl={pdl} err={err:.2e} {ok}", flush=True)
    print(f"rowcheck: {fails} failures; PDL launched: {mm._PDL_WORKS}", flush=True)


def regions(m, n, cfg, slots):
    """name -> (row slice, column slice) of C that each launch of cfg's schedule writes."""
    big = mm.dataclasses.replace(cfg, row_tail=False, edge=False)
    if cfg.edge:
        r, c = mm.edge_interior(m, n, big)
        return {"interior": (slice(0, r), slice(0, c)), "bottom": (slice(r, m), slice(0, n)),
                "right": (slice(0, r), slice(c, n))}
    if cfg.row_tail:
        r = mm.row_tail_rows(m, n, big, slots)
        return {"main": (slice(0, r), slice(0, n)), "tail": (slice(r, m), slice(0, n))}
    return {"all": (slice(0, m), slice(0, n))}


def early_cases():
    """(name, (M, N, K), config, slots or None, tail config or None) for the early-start checks and timings."""
    big = T(128, 256, 64, 8, 8, 3)
    rt, eg = mm.dataclasses.replace(big, row_tail=True), mm.dataclasses.replace(big, edge=True)
    rt128 = T(128, 128, 64, 8, 4, 4, row_tail=True)
    return [("rt", (517, 528, 560), rt, 7, None), ("rt", (1001, 1032, 2056), rt, 9, None),
            ("rt", (2304,) * 3, rt, None, None), ("rt", (3072,) * 3, rt, None, None), ("rt", (5120,) * 3, rt, None, None),
            ("eg", (2057, 2064, 200), eg, None, None), ("eg", (1031, 1040, 1000), eg, None, None),
            ("eg", (600, 520, 4104), eg, None, None), ("eg", (2056,) * 3, eg, None, None),
            ("eg", (2064,) * 3, eg, None, None), ("rt128", (1536,) * 3, rt128, 132, None),
            ("rt128", (1031, 1040, 1000), rt128, 11, None)]


EARLY_CHECK_MODES = (2, 1, 0)  # early start with only the last program waiting, with every one, and without


def section_earlycheck():
    """The row tail and interior + edge with the early start (programmatic dependent launch, each later kernel
    waiting for the one before it at its end), and without: fresh inputs, C poisoned with NaN before every launch,
    then EVERY element of every part's output compared with a float64 product in the same stream right after the
    launch (no synchronisation in between, so a part still running would be caught), 3 direct launches and 3 replays
    of a captured CUDA graph (how the lab times it) per case."""
    fails = 0
    for name, (m, n, k), cfg, slots, tail in early_cases():
        for early in EARLY_CHECK_MODES:
            a, b = mm.operands(m, n, k, "bf16")
            ref = mm.reference(a, b)
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            launch = lambda: with_early(early > 0, lambda: mm.triton_matmul(  # noqa: E731
                a, b, "bf16", out, cfg, "auto", programs=slots, tail_config=tail), max(1, early), 100)
            worst, ok = {}, "yes"
            try:
                launch()  # compile, outside the graph
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    launch()
                torch.cuda.current_stream().wait_stream(side)
                with torch.cuda.graph(graph):
                    launch()
                for how in ("direct",) * 3 + ("graph",) * 3:
                    out.fill_(float("nan"))
                    launch() if how == "direct" else graph.replay()
                    for part, (rs, cs) in regions(m, n, cfg, slots or 132).items():
                        if rs.stop <= rs.start or cs.stop <= cs.start:
                            continue
                        err = timing.check_close(out[rs, cs], ref[rs, cs], "bf16", f"{name} {part} {m}x{n}x{k} {how}")
                        worst[part] = max(worst.get(part, 0.0), err)
                torch.cuda.synchronize()
            except Exception as exc:
                ok = f"FAIL {exc}"[:200]
            fails += ok != "yes"
            record("earlycheck", case=name, shape=f"{m}x{n}x{k}", early=early, worst=worst, ok=ok)
            print(f"{name:<6} {m}x{n}x{k:<6} early={early} " + " ".join(f"{p}={e:.1e}" for p, e in worst.items())
                  + f"  {ok}", flush=True)
            del a, b, ref, out
    print(f"earlycheck: {fails} failures; PDL launched: {mm._PDL_WORKS}; carveouts set: {set(mm._CARVED.values())}",
          flush=True)


EARLY_SIZES = tuple(int(x) for x in os.environ.get("EARLY_SIZES", "2056,2064,1536,3072,2304,5120").split(","))


def early_variants(n):
    """name -> (config, early start, slots, tail config, wait, carveout) for the timings at size n: the lab's
    choice, then its schedule without the early start, and with it, every program or only the last one waiting,
    with the driver's carveout (-1) or the most shared memory (100)."""
    params, sms = mm.Params(), torch.cuda.get_device_properties(0).multi_processor_count
    big = T(128, 256, 64, 8, 8, 3)
    if n == 1536:
        sched = T(128, 128, 64, 8, 4, 4, row_tail=True)
    elif mm.edge_applies(n, big, "bf16", sms):
        sched = mm.dataclasses.replace(big, edge=True)
    else:
        sched = mm.dataclasses.replace(big, row_tail=True)
    if os.environ.get("EARLY_SET") != "wait":  # the lab's choice, the previous default, and diagnostics of the edge
        before = T(64, 128, 64, 8, 4, 3) if n == 1536 else (mm.dataclasses.replace(big, row_tail=True)
                                                             if sched.edge else sched)
        v = {"lab": (None, None, None, None, None, None), "before": (before, False, None, None, None, None)}
        if sched.edge:
            v["rt_es"] = (mm.dataclasses.replace(big, row_tail=True), True, None, None, 2, None)
            v["edge_first"] = (sched, True, None, "first", 2, None)
            v["interior_only"] = (sched, True, None, "interior", 2, None)
        return v
    v = {"lab": (None, None, None, None, None, None), "plain": (sched, False, None, None, None, None)}
    for w in (1, 2):
        for c in (-1, 100):
            v[f"es_w{w}_c{c}"] = (sched, True, None, None, w, c)
    if sched.edge:
        v["es_w2_c100_k128"] = (sched, True, None, (T(16, 64, 128, 8, 4, 3), T(64, 16, 128, 8, 4, 3)), 2, 100)
        v["es_w2_c100_32"] = (sched, True, None, (T(32, 64, 64, 8, 4, 4), T(64, 32, 64, 8, 4, 4)), 2, 100)
    if n == 1536:
        v["p64x128s3"] = (T(64, 128, 64, 8, 4, 3), False, None, None, None, None)
    return v


def section_early():
    """bf16 at EARLY_SIZES: cuBLAS and each variant (the row tail and interior + edge with and without the early start;
    at 1536, a 128 x 128 row tail), each checked (every element finite, sampled rows and columns against float64)
    before it is timed, all with the same timer (graph replay, L2 flushed); ratios to cuBLAS and the model."""
    target = gpu.live_target()
    params = mm.Params()
    mm.probe_floor_us(target)
    print(f"floor {mm.fixed_us(target):.2f} us, load latency {mm.load_latency_us(target):.2f} us", flush=True)
    timer = lambda f: timing.time_ms(f, 10, 50)  # noqa: E731
    for n in EARLY_SIZES:
        if elapsed() > DEADLINE:
            print("deadline: early stopped", flush=True)
            break
        a, b = mm.operands(n, n, n, "bf16")
        out = torch.full((n, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        mm.check_sampled(mm.cublas_matmul(a, b, "bf16", out), a, b, "bf16", f"cublas {n}")
        cub_ms = timing.graph_time_ms(lambda: mm.cublas_matmul(a, b, "bf16", out), timer=timer)
        row, cells = {"n": n, "cublas_us": cub_ms * 1e3}, []
        for name, (cfg, early, slots, tail, wait, carve) in early_variants(n).items():
            try:
                cfg = cfg or mm.config_for(params, "bf16", n, target.sm_count, target.compute_capability)
                early = mm.EARLY_START if early is None else early
                region = (slice(0, n), slice(0, n))
                if isinstance(tail, tuple):  # edge tiles (bottom, right)
                    fn = lambda: with_early(early, lambda: mm._edge_matmul(  # noqa: E731
                        a, b, "bf16", out, cfg, "auto", tail[0], tail[1]), wait, carve)
                elif tail == "first":  # the strips launched before the interior
                    fn = lambda: with_early(early, lambda: with_edge_first(lambda: mm.triton_matmul(  # noqa: E731
                        a, b, "bf16", out, cfg, "auto")), wait, carve)
                elif tail == "interior":  # the interior's launch alone (a diagnostic: the strips are not computed)
                    r, c = mm.edge_interior(n, n, cfg)
                    region = (slice(0, r), slice(0, c))
                    big_only = mm.dataclasses.replace(cfg, edge=False)
                    fn = lambda: mm.triton_matmul(a[:r], b[:, :c], "bf16", out[:r, :c], big_only, "auto")  # noqa: E731
                else:
                    fn = lambda: with_early(early, lambda: mm.triton_matmul(  # noqa: E731
                        a, b, "bf16", out, cfg, "auto", programs=slots, tail_config=tail), wait, carve)
                out.fill_(float("nan"))
                fn()
                rs, cs = region
                mm.check_sampled(out[rs, cs], a[rs], b[:, cs], "bf16", f"{name} {n}")
                ms = timing.graph_time_ms(fn, timer=timer)
                pred = with_early(early, lambda: mm.predict_point(n, "bf16", cfg, target)).get("predicted_ms")
                row[name] = cub_ms / ms
                row[name + "_us"] = ms * 1e3
                row[name + "_pred_us"] = pred * 1e3 if pred else None
                if name == "lab":
                    row["lab_config"] = cfg.label
                cells.append(f"{name}={cub_ms / ms:.3f}({ms * 1e3:.1f}/{(pred or 0) * 1e3:.1f})")
            except Exception as exc:
                print(f"   {name} at {n} failed: {exc!r}"[:400], flush=True)
        record("early", **row)
        print(f"N={n} cuBLAS={cub_ms * 1e3:.1f}us lab[{row.get('lab_config')}] " + " ".join(cells), flush=True)
        del a, b, out
    print(f"carveouts set: {set(mm._CARVED.values())}", flush=True)
    save()


SPLIT_CHECK = ((2057, 2064, 200), (1031, 1040, 1000), (600, 520, 4104), (2056,) * 3, (2064,) * 3)
SPLIT_SIZES = tuple(int(x) for x in os.environ.get("SPLIT_SIZES", "2056,2064,2048,2304,1536,3072").split(","))


def with_band_trans(trans, fn):
    before = mm.EDGE_BAND_TRANS
    mm.EDGE_BAND_TRANS = trans
    try:
        return fn()
    finally:
        mm.EDGE_BAND_TRANS = before


def section_splitcheck():
    """Interior + edge with split strips (every strip tile cut along K, pieces added in an FP32 workspace, the last
    piece writing the tile), early start on: fresh inputs, C poisoned with NaN before every launch, EVERY element of
    each part against float64 in the same stream right after 2 direct launches and 2 graph replays; the strips'
    workspaces and counters must be back at zero afterwards."""
    fails = 0
    eg = mm.dataclasses.replace(BIG, edge=True)
    for (m, n, k) in SPLIT_CHECK:
        for split in (True, 2, "both", "right", "bothN"):
            a, b = mm.operands(m, n, k, "bf16")
            ref = mm.reference(a, b)
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            if isinstance(split, str):  # the bands (B^T A^T for the rows below, or directly: N)
                launch = lambda split=split: with_band_trans(not split.endswith("N"), lambda: mm._edge_matmul(  # noqa
                    a, b, "bf16", out, eg, "auto", band=split.rstrip("N")))
            else:
                launch = lambda: mm._edge_matmul(a, b, "bf16", out, eg, "auto", split=split)  # noqa: E731
            worst, ok = {}, "yes"
            try:
                launch()
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    launch()
                torch.cuda.current_stream().wait_stream(side)
                with torch.cuda.graph(graph):
                    launch()
                for how in ("direct",) * 2 + ("graph",) * 2:
                    out.fill_(float("nan"))
                    launch() if how == "direct" else graph.replay()
                    for part, (rs, cs) in regions(m, n, eg, 132).items():
                        if rs.stop <= rs.start or cs.stop <= cs.start:
                            continue
                        err = timing.check_close(out[rs, cs], ref[rs, cs], "bf16", f"split {part} {m}x{n}x{k} {how}")
                        worst[part] = max(worst.get(part, 0.0), err)
                torch.cuda.synchronize()
                dirty = [key for key, (ws, cnt) in mm._SCRATCH.items() if key[0].startswith("edge")
                         and (ws.any() or cnt.any())]
                if dirty:
                    raise RuntimeError(f"workspace not clean: {dirty}")
            except Exception as exc:
                ok = f"FAIL {exc}"[:200]
            fails += ok != "yes"
            record("splitcheck", shape=f"{m}x{n}x{k}", split=str(split), worst=worst, ok=ok)
            print(f"split={split} {m}x{n}x{k} " + " ".join(f"{p}={e:.1e}" for p, e in worst.items()) + f"  {ok}",
                  flush=True)
            del a, b, ref, out
    print(f"splitcheck: {fails} failures; PDL launched: {mm._PDL_WORKS}", flush=True)


def section_split():
    """bf16 at SPLIT_SIZES: cuBLAS, the lab's choice, and at the interior + edge sizes the strips split along K (the
    rule, and 2, 4, 8 pieces), the interior alone, and at 2056 the interior alone on operands whose rows are padded
    to 2064 and 2112 elements (same values, 32-byte and 128-byte aligned rows): each checked before it is timed,
    all with the same timer (graph replay, L2 flushed). Ratio to cuBLAS (ours us / model us)."""
    target = gpu.live_target()
    params = mm.Params()
    mm.probe_floor_us(target)
    timer = lambda f: timing.time_ms(f, 10, 50)  # noqa: E731
    eg = mm.dataclasses.replace(BIG, edge=True)
    for n in SPLIT_SIZES:
        if elapsed() > DEADLINE:
            print("deadline: split stopped", flush=True)
            break
        a, b = mm.operands(n, n, n, "bf16")
        out = torch.full((n, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        mm.check_sampled(mm.cublas_matmul(a, b, "bf16", out), a, b, "bf16", f"cublas {n}")
        cub_ms = timing.graph_time_ms(lambda: mm.cublas_matmul(a, b, "bf16", out), timer=timer)
        lab_cfg = mm.config_for(params, "bf16", n, target.sm_count, target.compute_capability)
        v = {"lab": (lambda: mm.triton_matmul(a, b, "bf16", out, lab_cfg, "auto"), None, None)}
        if mm.edge_applies(n, BIG, "bf16", target.sm_count):
            r, c = mm.edge_interior(n, n, BIG)
            v["splitR"] = (lambda: mm._edge_matmul(a, b, "bf16", out, eg, "auto", split=True), None, True)
            for band in ("both", "right", "bothN"):
                v[f"band_{band}"] = (lambda band=band: with_band_trans(not band.endswith("N"), lambda: mm._edge_matmul(
                    a, b, "bf16", out, eg, "auto", band=band.rstrip("N"))), None, band)
            v["interior"] = (lambda: mm.triton_matmul(a[:r], b[:, :c], "bf16", out[:r, :c], BIG, "auto"),
                             (slice(0, r), slice(0, c)), None)
            if n % 32 and os.environ.get("SPLIT_PAD", "1") == "1":
                for pad in (2064, 2112):
                    ap = torch.empty((n, pad), device="cuda", dtype=torch.bfloat16)[:, :n]
                    bp = torch.empty((n, pad), device="cuda", dtype=torch.bfloat16)[:, :n]
                    ap.copy_(a)
                    bp.copy_(b)
                    v[f"interior_pad{pad}"] = (lambda ap=ap, bp=bp: mm.triton_matmul(
                        ap[:r], bp[:, :c], "bf16", out[:r, :c], BIG, "auto"), (slice(0, r), slice(0, c)), None)
        row, cells = {"n": n, "cublas_us": cub_ms * 1e3, "lab_config": lab_cfg.label}, []
        for name, (fn, region, sp) in v.items():
            try:
                out.fill_(float("nan"))
                fn()
                rs, cs = region or (slice(0, n), slice(0, n))
                mm.check_sampled(out[rs, cs], a[rs], b[:, cs], "bf16", f"{name} {n}")
                if region is None and name != "lab":  # every element of the strips too
                    r, c = mm.edge_interior(n, n, BIG)
                    ref_b = a[r:].double() @ b.double()
                    ref_r = a[:r].double() @ b[:, c:].double()
                    timing.check_close(out[r:], ref_b, "bf16", f"{name} {n} bottom")
                    timing.check_close(out[:r, c:], ref_r, "bf16", f"{name} {n} right")
                ms = timing.graph_time_ms(fn, timer=timer)
                pred = None
                if name == "lab" or sp is not None:
                    before = mm.EDGE_SPLIT, mm.EDGE_BAND
                    mm.EDGE_SPLIT = sp is True or (name == "lab" and before[0])
                    mm.EDGE_BAND = sp.rstrip("N") if isinstance(sp, str) else (before[1] if name == "lab" else None)
                    try:
                        pred = mm.predict_point(n, "bf16", lab_cfg if name == "lab" else eg, target).get("predicted_ms")
                    finally:
                        mm.EDGE_SPLIT, mm.EDGE_BAND = before
                row[name] = cub_ms / ms
                row[name + "_us"] = ms * 1e3
                row[name + "_pred_us"] = pred * 1e3 if pred else None
                cells.append(f"{name}={cub_ms / ms:.3f}({ms * 1e3:.1f}/{(pred or 0) * 1e3:.1f})")
            except Exception as exc:
                print(f"   {name} at {n} failed: {exc!r}"[:400], flush=True)
        record("split", **row)
        print(f"N={n} cuBLAS={cub_ms * 1e3:.1f}us lab[{lab_cfg.label}] " + " ".join(cells), flush=True)
        del a, b, out
    save()


def section_hybrid():
    """bf16 at HYBRID_SIZES: cuBLAS, plain tiles and row-tail variants, each checked against float64 before timing."""
    target = gpu.live_target()
    params = mm.Params()
    cands = hybrid_candidates()
    mm.probe_floor_us(target)
    for n in HYBRID_SIZES:
        if elapsed() > DEADLINE:
            print("deadline: hybrid stopped", flush=True)
            break
        a, b, out, cub = cublas_point(n)
        row = {"n": n, "cublas": cub}
        cells = []
        for name, (cfg, tail, how) in cands.items():
            try:
                cfg = cfg or mm.config_for(params, "bf16", n, target.sm_count, target.compute_capability)
                if how in ("side-after", "side-before"):
                    fn = lambda: on_two_streams(a, b, out, cfg, tail, how == "side-before")  # noqa: E731
                elif how == "nopdl":
                    fn = lambda: without_pdl(  # noqa: E731
                        lambda: mm.triton_matmul(a, b, "bf16", out, cfg, "auto", tail_config=tail))
                else:
                    fn = lambda: mm.triton_matmul(a, b, "bf16", out, cfg, "auto", tail_config=tail)  # noqa: E731
                out.fill_(float("nan"))
                fn()
                torch.cuda.synchronize()
                mm.check_sampled(out, a, b, "bf16", f"{name} {n}")
                ms = timing.graph_time_ms(fn, timer=lambda f: timing.time_ms(f, 10, 40))
                row[name] = timing.tflops(2 * n**3, ms)
                if name == "lab":
                    row["lab_config"] = cfg.label
                if how in (None, "serial", "nopdl"):
                    row[name + "_pred"] = mm.predict_point(n, "bf16", cfg, target).get("predicted_tflops")
                cells.append(f"{name}={row[name] / cub:.2f}")
            except Exception as exc:
                print(f"   {name} at {n} failed: {exc!r}"[:400], flush=True)
        record("hybrid", **row)
        best = max((k for k in cands if k in row), key=lambda k: row[k])
        print(f"N={n} cuBLAS={cub:.1f} lab[{row.get('lab_config')}] " + " ".join(cells) + f"  | best {best}",
              flush=True)
        del a, b, out
    save()

TAIL_SIZES = tuple(int(x) for x in os.environ.get(
    "TAIL_SIZES", "3072,2056,2064,1536,2304,1024,2048,2560,4096").split(","))


def tail_candidates():
    """name -> (kind, config, split): 'mm' = this lab's launcher (plain or split-tail), 'hp' = the Hopper lab's
    persistent kernel (labs/hopper.py Switches), 'lab' = the lab's per-size choice."""
    from labs import hopper as hp

    c = {"lab": ("mm", None, None)}
    for bm, bn, w, st in ((128, 256, 8, 3), (256, 128, 8, 3), (128, 128, 8, 4), (128, 128, 4, 4), (128, 128, 4, 3),
                          (64, 128, 4, 3), (64, 256, 4, 3), (64, 128, 4, 4)):
        c[f"p{bm}x{bn}w{w}s{st}"] = ("mm", T(bm, bn, 64, 8, w, st), None)
    for bm, bn, w, st in ((128, 256, 8, 3), (256, 128, 8, 3), (128, 128, 8, 4), (128, 128, 4, 4), (64, 128, 4, 4)):
        c[f"t{bm}x{bn}w{w}s{st}"] = ("mm", T(bm, bn, 64, 8, w, st, split_tail=True), None)
    for sp in (2, 3, 4, 6):
        c[f"t128x256_sp{sp}"] = ("mm", T(128, 256, 64, 8, 8, 3, split_tail=True), sp)
    c["hp_grp_s4"] = ("hp", hp.Switches(True, 4, False, "grouped", False), None)
    c["hp_pers"] = ("hp", hp.Switches(True, 3, True, "hilbert", False), None)
    c["hp_flat"] = ("hp", hp.Switches(True, 3, True, "hilbert", False, flatten=True), None)
    c["hp_256x128"] = ("hp", hp.Switches(True, 3, True, "hilbert", False, block=(256, 128, 64)), None)
    c["hp_128x128f"] = ("hp", hp.Switches(True, 4, True, "grouped", False, block=(128, 128, 64), flatten=True), None)
    return c


def section_tail():
    """bf16 at TAIL_SIZES: cuBLAS; plain tiles of several shapes; the split-K tail kernel (auto split and forced
    splits); the Hopper lab's persistent kernels. Each checked against float64 before it is timed; a table of
    ratios to cuBLAS with the model's prediction for the lab's own kernels, and registers / spills once each."""
    from labs import hopper as hp

    target = gpu.live_target()
    params = mm.Params()
    cands = tail_candidates()
    mm.probe_floor_us(target)
    print(f"floor {mm.fixed_us(target):.2f} us, load latency {mm.load_latency_us(target):.2f} us", flush=True)
    for n in TAIL_SIZES:
        if elapsed() > DEADLINE:
            print("deadline: tail stopped", flush=True)
            break
        a, b, out, cub = cublas_point(n)
        row = {"n": n, "cublas": cub}
        cells = []
        for name, (kind, cfg, split) in cands.items():
            if elapsed() > DEADLINE + 20:
                break
            try:
                if kind == "mm":
                    cfg = cfg or mm.config_for(params, "bf16", n, target.sm_count, target.compute_capability)
                    fn = lambda: mm.triton_matmul(a, b, "bf16", out, cfg, "auto", split=split)  # noqa: E731
                else:
                    fn = hp.prepare(a, b, out, cfg)
                out.fill_(float("nan"))
                res = fn()
                mm.check_sampled(out, a, b, "bf16", f"{name} {n}")
                comp = res[2] if kind == "mm" else res
                if name not in SEEN:
                    SEEN.add(name)
                    lab = cfg.label if kind == "mm" else cfg.config_label
                    print(f"   {name} [{lab}]: {mm._compiled_resources(comp)} spills={getattr(comp, 'n_spills', '?')}",
                          flush=True)
                ms = timing.graph_time_ms(fn, timer=lambda f: timing.time_ms(f, 10, 40))  # kernel_ms, shorter
                row[name] = timing.tflops(2 * n**3, ms)
                if kind == "mm":
                    row[name + "_pred"] = mm.predict_point(n, "bf16", cfg, target).get("predicted_tflops")
                    if name == "lab":
                        row["lab_config"] = cfg.label
                cells.append(f"{name}={row[name] / cub:.2f}")
            except Exception as exc:
                print(f"   {name} at {n} failed: {exc!r}"[:400], flush=True)
        record("tail", **row)
        print(f"N={n} cuBLAS={cub:.1f} lab[{row.get('lab_config')}] " + " ".join(cells), flush=True)
        best = max((k for k in cands if k in row), key=lambda k: row[k])
        print(f"   best {best} {row[best] / cub:.2f}; model for ST: " + " ".join(
            f"{k}:{row[k]:.0f}/{row.get(k + '_pred') or 0:.0f}" for k in cands if k.startswith("t") and k in row),
            flush=True)
        del a, b, out
    save()

PIECES = {  # name -> composite tile (rows pieces x column pieces)
    "192x192": T(192, 192, 64, 8, 8, 3, row_pieces=(128, 64), col_pieces=(128, 64)),
    "192x192s4": T(192, 192, 64, 8, 8, 4, row_pieces=(128, 64), col_pieces=(128, 64)),
    "192x192r3": T(192, 192, 64, 8, 8, 3, row_pieces=(64, 64, 64), col_pieces=(128, 64)),
    "192x128": T(192, 128, 64, 8, 8, 4, row_pieces=(128, 64)),
    "192x256": T(192, 256, 64, 8, 8, 3, row_pieces=(128, 64)),
    "192x192w12": T(192, 192, 64, 8, 12, 3, row_pieces=(128, 64), col_pieces=(128, 64)),
    "192x192k128": T(192, 192, 128, 8, 8, 2, row_pieces=(128, 64), col_pieces=(128, 64)),
    "192x192k32": T(192, 192, 32, 8, 8, 6, row_pieces=(128, 64), col_pieces=(128, 64)),
    "192x192g16": T(192, 192, 64, 16, 8, 3, row_pieces=(128, 64), col_pieces=(128, 64)),
    "big": BIG,  # the plain 128 x 256 tile over all of C, for the same PTX summary
}
# variants with row pieces of A kept in registers (mm.PIECES_A_REGS: 1 the pieces after the first, 2 every piece)
for _name, _regs in (("192x192", 1), ("192x192", 2), ("192x192r3", 1), ("192x192r3", 2), ("192x256", 1),
                     ("192x128", 1)):
    PIECES[f"{_name}a{_regs}"] = PIECES[_name]
A_REGS_OF = {name: int(name[-1]) for name in PIECES if name[-2:] in ("a1", "a2")}


def with_a_regs(name, fn):
    """fn() with the composite kernel's A_REGS that the variant `name` asks for (0 unless it ends in a1 or a2)."""
    mm.PIECES_A_REGS = A_REGS_OF.get(name, 0)
    try:
        return fn()
    finally:
        mm.PIECES_A_REGS = 0


def ptx_summary(compiled) -> str:
    """The tensor-core instructions of a compiled kernel (wgmma shapes and how often each appears) and its waits for
    them (wait_group N: N groups may stay in flight; 0 = the warpgroup stops until all its MMAs are done)."""
    import collections
    import re

    ptx = (getattr(compiled, "asm", {}) or {}).get("ptx", "")
    shapes = collections.Counter(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)", ptx))
    waits = collections.Counter(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx))
    a_in_regs = len(re.findall(r"wgmma\.mma_async[^;]*\}\s*,\s*\{", ptx))  # {accumulators}, {A registers}, ...
    return f"wgmma {dict(shapes)} (A from registers: {a_in_regs}) waits {dict(waits)}"
PIECES_SIZES = tuple(int(x) for x in os.environ.get("PIECES_SIZES", "2056,2064,3072,1536,2048,4096").split(","))
PIECES_SHAPES = ((517, 528, 560), (2057, 2064, 200), (203, 392, 1032))  # M odd; N, K 16-byte rows; partial pieces


def section_pieces():
    """Composite tiles: checked on odd shapes against float64 (output poisoned with NaN), then timed beside cuBLAS."""
    target = gpu.live_target()
    mm.probe_floor_us(target)
    params = mm.Params()
    ok = {}
    only = os.environ.get("PIECES_ONLY")  # comma-separated names: only those variants
    for name, cfg in [(k, v) for k, v in PIECES.items() if not only or k in only.split(",")]:
        errs, res = [], {}
        try:
            for m, n, k in PIECES_SHAPES:
                a, b = mm.operands(m, n, k, "bf16")
                out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                _, path, compiled = with_a_regs(name, lambda: mm.triton_matmul(a, b, "bf16", out, cfg, "auto"))
                errs.append(timing.check_close(out, mm.reference(a, b), "bf16", f"{name} {m}x{n}x{k}"))
                assert path == "tma", path
            res = mm._compiled_resources(compiled)
            res["spills"] = getattr(compiled, "n_spills", None)
            res["ptx"] = ptx_summary(compiled)
            ok[name] = cfg
            print(f"check {name:<11} {cfg.label:<36} max rel err {max(errs):.2e} ok  {res}", flush=True)
        except Exception as exc:
            print(f"check {name:<11} FAILED: {exc!r}"[:400], flush=True)
        record("pieces_check", name=name, config=cfg.label, errs=errs, ok=name in ok, **res)
    print(f"{'N':>5} {'cuBLAS':>7} {'lab':>11} " + " ".join(f"{k:>15}" for k in ok) + "  lab config", flush=True)
    for n in PIECES_SIZES:
        if elapsed() > DEADLINE:
            print("deadline: pieces stopped", flush=True)
            break
        a, b, out, cub = cublas_point(n)
        row = {"n": n, "cublas": cub}
        lab_cfg = mm.config_for(params, "bf16", n, target.sm_count, target.compute_capability)
        for name, cfg in [("lab", lab_cfg)] + list(ok.items()):
            out.fill_(float("nan"))
            with_a_regs(name, lambda: mm.triton_matmul(a, b, "bf16", out, cfg, "auto"))
            mm.check_sampled(out, a, b, "bf16", f"{name} {n}")
            ms = with_a_regs(name, lambda: mm.kernel_ms(lambda: mm.triton_matmul(a, b, "bf16", out, cfg, "auto")))
            row[name] = timing.tflops(2 * n**3, ms)
            row[name + "_pred"] = mm.predict_point(n, "bf16", cfg, target).get("predicted_tflops") or float("nan")
        record("pieces", lab_config=lab_cfg.label, **row)
        cells = [f"{row[x] / cub:5.2f}[{row[x + '_pred']:4.0f}]".rjust(11 if x == "lab" else 15) for x in ["lab", *ok]]
        print(f"{n:>5} {cub:7.1f} " + " ".join(cells) + f"  {lab_cfg.label}", flush=True)
        del a, b, out
    save()


def section_floor():
    """The model's probes (the smallest product; a load's latency), and the smallest products of both kernels."""
    target = gpu.live_target()
    rows = {"floor_us": mm.probe_floor_us(target), "load_latency_us": mm.load_latency_us(target)}
    for n in (64, 128):
        a, b = mm.operands(n, n, n, "bf16")
        out = torch.empty((n, n), device="cuda", dtype=torch.bfloat16)
        cfg = T(64, 64, 64, 8, 4, 4)
        rows[f"ours_{n}_us"] = 1e3 * mm.kernel_ms(lambda: mm.triton_matmul(a, b, "bf16", out, cfg, "auto"))
        rows[f"cublas_{n}_us"] = 1e3 * mm.kernel_ms(lambda: mm.cublas_matmul(a, b, "bf16", out))
    record("floor", **rows)
    print("floor:", " ".join(f"{k}={v:.2f}" for k, v in rows.items()), flush=True)


def beside_cublas(section, n, cub_ms, out, variants, extra=None):
    """Time each variant beside cuBLAS: name -> (fn, check). Each runs once on a NaN-poisoned output, `check()` then
    compares what it wrote with float64, and only then is it timed (graph replay, same timer as cuBLAS). Records
    the ratio to cuBLAS, us, registers and spills (and `extra(compiled)`), and prints one line per variant."""
    timer = lambda f: timing.time_ms(f, 10, 50)  # noqa: E731
    row, cells = {"n": n, "cublas_us": cub_ms * 1e3}, []
    for name, (fn, check) in variants.items():
        if elapsed() > DEADLINE:
            break
        try:
            out.fill_(float("nan"))
            res = fn()
            check()
            ms = timing.graph_time_ms(fn, timer=timer)
            comp = res[2] if isinstance(res, tuple) and len(res) > 2 else None
            regs, spills = getattr(comp, "n_regs", None), getattr(comp, "n_spills", None)
            more = extra(comp) if extra and comp is not None else ""
            row[name] = {"ratio": cub_ms / ms, "us": ms * 1e3, "regs": regs, "spills": spills, "extra": more}
            cells.append(f"{name}={cub_ms / ms:.3f}({ms * 1e3:.1f}us {2 * n**3 / ms / 1e9:.0f}TF r{regs} s{spills}"
                         f"{' ' + more if more else ''})")
        except Exception as exc:
            print(f"   {name} at {n} failed: {exc!r}"[:600], flush=True)
    record(section, **row)
    print(f"N={n} cuBLAS={cub_ms * 1e3:.1f}us\n   " + "\n   ".join(cells), flush=True)


def check_odd_shapes(section, shapes, tiles, run):
    """run(a, b, out, config) for every shape (m, n, k) and tile, each output against a whole float64 product."""
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        b = torch.randn(k, n, device="cuda").to(torch.bfloat16)
        for cfg in tiles:
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            run(a, b, out, cfg)
            timing.check_close(out, a.double() @ b.double(), "bf16", f"{section} {cfg.label} {m}x{n}x{k}")
    print(f"{section}: checks passed", flush=True)


def cublas_timed(n):
    a, b, out, _ = cublas_point(n)
    return a, b, out, timing.graph_time_ms(lambda: mm.cublas_matmul(a, b, "bf16", out),
                                          timer=lambda f: timing.time_ms(f, 10, 50))


ALIGN_SIZES = tuple(int(x) for x in os.environ.get("ALIGN_SIZES", "2056,2064,2048").split(","))
ALIGN_TILES = (T(128, 256, 64, 8, 8, 3), T(128, 256, 64, 8, 8, 4), T(128, 128, 64, 8, 4, 4), T(128, 128, 64, 8, 8, 4),
               T(256, 128, 64, 8, 8, 3), T(128, 256, 32, 8, 8, 5))
ALIGN_CHECK = ((517, 520, 536), (1001, 1032, 2056), (2056, 2056, 2056))


def aligned_ptr(a, b, out, cfg, align=8):
    return mm.triton_matmul(a, b, "bf16", out, cfg, "off", extra_meta={"ALIGN": align})


def section_align():
    """The pointer path with ALIGN: every variant checked against float64 (whole product on odd shapes), then timed
    beside cuBLAS on the interior (whole 128 x 256 tiles) and on the whole product ("plain": the 128 x 256 tile
    over the whole matrix, TMA)."""
    check_odd_shapes("align", ALIGN_CHECK, ALIGN_TILES[:3], aligned_ptr)
    for n in ALIGN_SIZES:
        if elapsed() > DEADLINE:
            break
        a, b, out, cub_ms = cublas_timed(n)
        r, c = mm.edge_interior(n, n, BIG)
        inner = lambda name: (lambda: mm.check_sampled(out[:r, :c], a[:r], b[:, :c], "bf16", f"{name} {n}"))  # noqa
        whole = lambda name: (lambda: mm.check_sampled(out, a, b, "bf16", f"{name} {n}"))  # noqa: E731
        v = {"plain": (lambda: mm.triton_matmul(a, b, "bf16", out, None, "auto"), whole("plain")),
             "tma_int": (lambda: mm.triton_matmul(a[:r], b[:, :c], "bf16", out[:r, :c], BIG, "auto"), inner("tma"))}
        for cfg in ALIGN_TILES:
            v[f"ptr_int {cfg.label}"] = (lambda cfg=cfg: aligned_ptr(a[:r], b[:, :c], out[:r, :c], cfg), inner(cfg.label))
        v["ptr_int1 " + BIG.label] = (lambda: aligned_ptr(a[:r], b[:, :c], out[:r, :c], BIG, 1), inner("align 1"))
        for cfg in ALIGN_TILES[:3]:
            v[f"ptr_all {cfg.label}"] = (lambda cfg=cfg: aligned_ptr(a, b, out, cfg), whole(cfg.label))
        beside_cublas("align", n, cub_ms, out, v)
        del a, b, out
    save()


SPREAD_SIZES = tuple(int(x) for x in os.environ.get("SPREAD_SIZES", "2064,2056,4104").split(","))


def section_spread():
    """The spread edge against the lab's choice (strips in their own launches) and the interior alone, whole outputs
    checked against float64 first."""
    target = gpu.live_target()
    eg = mm.dataclasses.replace(BIG, edge=True)
    for n in SPREAD_SIZES:
        if elapsed() > DEADLINE:
            break
        a, b, out, cub_ms = cublas_timed(n)
        ref = a.double() @ b.double()
        r, c = mm.edge_interior(n, n, BIG)
        lab_cfg = mm.config_for(mm.Params(), "bf16", n, target.sm_count, target.compute_capability)
        whole = lambda name: (lambda: timing.check_close(out, ref, "bf16", f"{name} {n}"))  # noqa: E731
        v = {"lab": (lambda: mm.triton_matmul(a, b, "bf16", out, lab_cfg, "auto"), whole("lab")),
             "spread": (lambda: mm._spread_matmul(a, b, "bf16", out, eg), whole("spread")),
             "spread_g16": (lambda: mm._spread_matmul(a, b, "bf16", out, mm.dataclasses.replace(eg, group_m=16)),
                            whole("spread_g16")),
             "interior": (lambda: mm.triton_matmul(a[:r], b[:, :c], "bf16", out[:r, :c], BIG, "auto"),
                          lambda: timing.check_close(out[:r, :c], ref[:r, :c], "bf16", f"interior {n}"))}
        beside_cublas("spread", n, cub_ms, out, v)
        del a, b, out, ref
    save()


LANES_SIZES = tuple(int(x) for x in os.environ.get("LANES_SIZES", "2049,1793,4097").split(","))
LANES_TILES = (T(128, 256, 64, 8, 8, 3), T(128, 256, 32, 8, 8, 3), T(128, 128, 64, 8, 4, 3), T(128, 128, 32, 8, 4, 4),
               T(64, 128, 64, 8, 4, 3))


def with_lanes(on, fn):
    before = mm.LANES
    mm.LANES = on
    try:
        return fn()
    finally:
        mm.LANES = before


def load_summary(compiled) -> str:
    """The PTX's global loads and shared stores by width (how the compiler laid the tile's loads out)."""
    import collections
    import re

    ptx = (getattr(compiled, "asm", None) or {}).get("ptx", "")
    ops = collections.Counter(re.findall(r"\b(ld\.global[\w.]*|st\.shared[\w.]*|cp\.async[\w.]*)", ptx))
    return ",".join(f"{k.replace('ld.global', 'ldg').replace('st.shared', 'sts')}:{v}" for k, v in ops.most_common(4))


def section_lanes():
    """Odd N: the plain pointer kernel against matmul_lanes_kernel in a few tiles, checked against float64 on odd
    shapes first, then beside cuBLAS with the PTX's load summary."""
    check_odd_shapes("lanes", ((517, 333, 351), (129, 77, 1001)), LANES_TILES,
                     lambda a, b, out, cfg: with_lanes(True, lambda: mm.triton_matmul(a, b, "bf16", out, cfg, "off")))
    for n in LANES_SIZES:
        if elapsed() > DEADLINE:
            break
        a, b, out, cub_ms = cublas_timed(n)
        check = lambda: mm.check_sampled(out, a, b, "bf16", f"lanes {n}")  # noqa: E731
        v = {"plain " + BIG.label: (lambda: with_lanes(False, lambda: mm.triton_matmul(a, b, "bf16", out, BIG, "auto")),
                                    check)}
        v.update({"lanes " + c.label: (lambda c=c: with_lanes(True, lambda: mm.triton_matmul(a, b, "bf16", out, c, "auto")),
                                       check) for c in LANES_TILES})
        beside_cublas("lanes", n, cub_ms, out, v, extra=load_summary)
        del a, b, out
    save()


def section_lab(*args, name="matmul_lab.json"):
    """The lab's own default run, as the CLI makes it."""
    import subprocess

    path = os.path.join(OUT or "/tmp", name)
    t = time.monotonic()
    subprocess.run([sys.executable, "-m", "labs", "run", "matmul", *args, "--out", path], check=True)
    print(f"lab run {' '.join(args)}: {time.monotonic() - t:.1f} s", flush=True)
    show([path])


def section_labsk():
    """The lab's default sweep with stream-K on (the big tile, partial waves shared out), for comparison."""
    section_lab("streamk=on", name="matmul_lab_sk.json")


def show(paths):
    """Print result files of `python -m labs run matmul` compactly, with our/cuBLAS ratios."""
    for path in paths:
        data = json.load(open(path))
        print(f"== {path}: complete={data['complete']} duration_s={data['meta'].get('duration_s')}")
        for m in data.get("messages", []):
            print("  message:", m)
        cub = {r["n"]: r.get("measured_tflops") for r in data["rows"] if r.get("kernel") == "cublas"}
        errs = []
        for r in data["rows"]:
            if r.get("kernel") != "triton":
                continue
            ratio = (r.get("measured_tflops") or 0) / cub[r["n"]] if cub.get(r["n"]) else float("nan")
            errs.append(abs(r["error_pct"]) if r.get("error_pct") is not None else None)
            print(f"  N={r['n']:>5} {r.get('path', ''):<5} ours={fmt(r.get('measured_tflops'))} "
                  f"cublas={fmt(cub.get(r['n']))} x={ratio:.2f} model={fmt(r.get('predicted_tflops'))} "
                  f"err={fmt(r.get('error_pct'))}% {r.get('config')} regs={r.get('kernel_regs')}")
        known = [e for e in errs if e is not None]
        if known:
            print(f"  within 15 %: {sum(e <= 15 for e in known)}/{len(known)}; over 50 %: {sum(e > 50 for e in known)}")


def main():
    if sys.argv[1:2] == ["show"]:
        return show(sys.argv[2:])
    info = gpu.detect()
    results["gpu"] = {"name": info.name, "cc": info.compute_capability, "sms": info.sm_count,
                      "versions": gpu.software_versions()}
    print("GPU:", results["gpu"], flush=True)
    for name in sys.argv[1:] or ["check", "variants"]:
        if elapsed() > DEADLINE:
            print(f"deadline reached before section {name}", flush=True)
            break
        t = time.monotonic()
        try:
            globals()[f"section_{name}"]()
        except Exception as exc:
            print(f"section {name} failed: {exc!r}"[:800], flush=True)
        print(f"-- section {name}: {time.monotonic() - t:.1f} s", flush=True)
        save()


if __name__ == "__main__":
    main()
