"""Device-side check of the three memory labs (coalescing, hierarchy, precision) in one call.

Run on a GPU:
    export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ROOFLINE_CACHE=/tmp/rc
    python3 scripts/memory_gpu.py [--explore]      # run the three labs here, tables + the issue's targets
    python3 scripts/memory_gpu.py --summary DIR    # the same tables from DIR/<lab>.json written by the CLI
    python3 scripts/memory_gpu.py --strides        # strided reads: cache modifiers, L2-resident, row walk via L2

Writes the results to $OUT (if set). --explore adds the variants used to choose the labs' designs:
L2 fetch granularity, tile shapes, launch shapes, ReLU block sizes.
"""
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl

from labs import coalescing as co, hierarchy as hi, precision as pr
from labs.engine import timing
from labs.engine import gpu
from labs.engine import runner
from labs.engine.gpu import MiB

OUT = os.environ.get("OUT")
EXPLORE = "--explore" in sys.argv
T0 = time.time()


def log(msg=""):
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def save(name, obj):
    if OUT:
        with open(os.path.join(OUT, name), "w") as fh:
            fh.write(obj if isinstance(obj, str) else json.dumps(obj, indent=1))


def table(rows, cols):
    print("  " + " | ".join(f"{c:>14s}" for c in cols))
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c)
            cells.append(f"{v:14.4g}" if isinstance(v, float) else f"{str(v):>14s}")
        print("  " + " | ".join(cells), flush=True)


@triton.jit
def walk_x(x_ptr, out_ptr, n, SEG: tl.constexpr, ALONG_ROWS: tl.constexpr, BLOCK: tl.constexpr,
           UNROLL: tl.constexpr, CG: tl.constexpr):
    lines = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    seg = tl.program_id(1)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j0 in range(0, SEG, UNROLL):
        for u in tl.static_range(UNROLL):
            k = seg * SEG + j0 + u
            if ALONG_ROWS:
                offs = lines.to(tl.int64) * n + k
            else:
                offs = k.to(tl.int64) * n + lines
            if CG:
                acc += tl.load(x_ptr + offs, cache_modifier=".cg")
            else:
                acc += tl.load(x_ptr + offs)
    nseg = tl.cdiv(n, SEG)
    if ALONG_ROWS:
        tl.store(out_ptr + lines * nseg + seg, acc)
    else:
        tl.store(out_ptr + seg * n + lines, acc)


def run_lab(lab, params=None):
    started = time.time()
    result = runner.run(lab, params or lab.default_params(), use_cache=False,
                        progress=lambda f, m: None)
    log(f"{lab.name}: {time.time() - started:.1f} s for the default run, complete={result.complete}")
    save(f"{lab.name}.json", result.to_json())
    return result


# ------------------------------------------------------------------------------------------------
info = gpu.detect()
target = gpu.live_target()
log(f"{info.name} cc {info.compute_capability}, {info.sm_count} SMs, L2 {info.l2_bytes} B, "
    f"smem/SM {info.shared_memory_per_sm_bytes}, regs/SM {info.registers_per_sm}, clock {info.sm_clock_mhz} MHz")
if target.ceilings.source == "datasheet":
    log("no recorded ceilings for this GPU: calibrating")
    gpu.calibrate()
    target = gpu.live_target()
log(f"ceilings: {target.describe_ceilings()}")
x = torch.randn(2**28, device="cuda")
y = torch.empty_like(x)
copy_ms = timing.time_ms(lambda: y.copy_(x))
live_copy = timing.tbps(2 * x.numel() * 4, copy_ms)
log(f"torch copy 1 GiB now: {live_copy:.3f} TB/s (ceiling {target.ceilings.copy_tbps:.3f})")
del x, y

# ------------------------------------------------------------------------------------------------
def section(fn):
    """Run one section; a failure is printed and the next section still runs."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - report and go on: one GPU call must tell us everything
        import traceback

        log(f"SECTION {fn.__name__} FAILED: {type(exc).__name__}: {exc}")
        traceback.print_exc()


def coalescing_default(res=None):
    log("=== coalescing (default run; includes building the CUDA transpose) ===")
    if res is None:
        try:
            res = run_lab(co.LAB)
        except Exception as exc:  # noqa: BLE001
            log(f"coalescing default failed ({type(exc).__name__}: {str(exc)[-2000:]}); again without the transpose")
            res = run_lab(co.LAB, co.Params(experiments=("stride", "walk")))
    table(res.rows, ["variant", "measured_tbps", "predicted_tbps", "bound", "error_pct", "measured_ms"])
    bw = target.ceilings.copy_tbps
    by = {r["variant"]: r for r in res.rows}
    log(f"TARGET stride-1 / copy = {by['stride 1']['measured_tbps'] / bw:.3f} (>= 0.90); max |stride error| = "
        f"{max(abs(r['error_pct']) for r in res.rows if r['experiment'] == 'stride'):.1f}% (<= 15)")
    if "tiled" in by:
        best_t = max(by[v]["measured_tbps"] for v in ("naive", "tiled", "tiled+padded"))
        log(f"TARGET best transpose / copy = {best_t / bw:.3f} (>= 0.90); padded / tiled = "
            f"{by['tiled+padded']['measured_tbps'] / by['tiled']['measured_tbps']:.3f}")
    for g in co.ladder_gains(res.rows):
        print("  ", g, flush=True)


def precision_default(res=None):
    log("=== precision (default run) ===")
    res = res or run_lab(pr.LAB)
    table(res.rows, ["experiment", "dtype", "k", "measured_ms", "predicted_ms", "error_pct", "measured_tbps",
                     "measured_rel_error", "predicted_rel_error"])
    for r in pr.time_ratios(res.rows):
        log(f"TARGET time ratio fp32/{r['dtype']}: {r['measured_time_ratio']:.3f} vs bytes {r['byte_ratio']:.0f} "
            f"({r['error_pct']:+.1f}%, within 15%)")


def hierarchy_default(res=None):
    log("=== hierarchy (default run) ===")
    res = res or run_lab(hi.LAB)
    table(res.rows, ["variant", "size_bytes", "passes", "measured_us_per_pass", "measured_tbps", "predicted_tbps",
                     "error_pct"])
    knee = hi.find_knee(res.rows)
    log(f"levels: {hi.levels(target)}")
    if knee:
        log(f"TARGET knee {knee['knee_bytes'] / MiB:.1f} MiB vs L2 {target.l2_bytes / MiB:.1f} MiB: ratio "
            f"{knee['knee_bytes'] / target.l2_bytes:.3f} (0.75..1.25); plateau {knee['plateau_tbps']:.2f}, floor "
            f"{knee['floor_tbps']:.2f} TB/s")
    else:
        log("TARGET knee: not found")
    for lv in hi.hierarchy_levels(target, res.rows):
        print("  ", lv, flush=True)


def summary(folder):
    """Tables and targets from the CLI's result files (python -m labs run LAB --out DIR/LAB.json)."""
    from labs.engine.results import Result

    for name, fn in (("coalescing", coalescing_default), ("precision", precision_default),
                     ("hierarchy", hierarchy_default)):
        path = os.path.join(folder, f"{name}.json")
        if not os.path.exists(path):
            log(f"{path}: missing")
            continue
        res = Result.from_json(open(path).read())
        log(f"{name}: CLI run took {res.meta.get('duration_s')} s (measure, without imports)")
        section(lambda: fn(res))


def explore_strides():
    log("=== explore: strided reads by cache modifier and block (2 GiB span) ===")
    params = co.Params(experiments=("stride",))
    preds = {r["variant"]: r["predicted_tbps"] for r in co.predict(params, target)}
    saved = (co.STRIDE_CACHE, co.STRIDE_BLOCK, co.STRIDE_WARPS)
    for cache, block, warps in (("", 4096, 8), (".cg", 4096, 8), ("", 1024, 4), (".cg", 1024, 4)):
        co.STRIDE_CACHE, co.STRIDE_BLOCK, co.STRIDE_WARPS = cache, block, warps
        rows = [r for r in co.measure_strides(params, target, lambda f, m: None, 0, 1) if r["experiment"] == "stride"]
        errs = [100 * (r["measured_tbps"] / preds[r["variant"]] - 1) for r in rows]
        print(f"  cache={cache or 'default':7s} block={block} warps={warps}: " + ", ".join(
            f"s{r['stride']}={r['measured_tbps']:.3f} ({e:+.0f}%)" for r, e in zip(rows, errs))
            + f" | max |err| {max(map(abs, errs)):.0f}%", flush=True)
    co.STRIDE_CACHE, co.STRIDE_BLOCK, co.STRIDE_WARPS = saved

    log("=== explore: strided reads from a warm L2 (16 MiB span, 16 launches per CUDA graph) ===")
    x = torch.randn(4 * MiB, device="cuda")
    cells = []
    for stride in (1, 2, 4, 8, 16, 32, 64):
        y = torch.empty(x.numel() // stride, device="cuda")

        def replay():
            for _ in range(16):
                co.strided_read(x, stride, y)

        ms = timing.graph_time_ms(replay) / 16
        useful = timing.tbps(8 * y.numel(), ms)
        fetched = timing.tbps(y.numel() * (co.fetched_bytes_per_element(stride) + 4), ms)
        cells.append(f"s{stride}: useful {useful:.2f} fetched {fetched:.2f} ({ms * 1e3:.1f} us)")
    print("  " + " | ".join(cells), flush=True)

    log("=== explore: the walks with L1-cached and L2-only loads ===")
    n = 16384
    m = torch.randn(n, n, device="cuda")
    for along_rows in (False, True):
        for cg in (False, True):
            nseg = n // 64
            out = torch.empty((n, nseg) if along_rows else (nseg, n), device="cuda")
            fn = lambda: walk_x[(n // 128, nseg)](m, out, n, SEG=64, ALONG_ROWS=along_rows, BLOCK=128, UNROLL=8,
                                                   CG=cg, num_warps=4)
            fn()
            timing.check_close(out, co.walk_reference(m, along_rows), "fp32", "walk_x")
            ms = timing.time_ms(fn)
            print(f"  {'row' if along_rows else 'column'} walk, {'L2 only (.cg)' if cg else 'L1 + L2'}: "
                  f"{timing.tbps(4 * n * n, ms):.3f} TB/s", flush=True)


if "--summary" in sys.argv:
    summary(sys.argv[sys.argv.index("--summary") + 1])
elif "--strides" not in sys.argv:
    for fn in (coalescing_default, precision_default, hierarchy_default):
        section(fn)

if "--strides" in sys.argv:
    section(explore_strides)
if not EXPLORE:
    log("done")
    sys.exit(0)

# ------------------------------------------------------------------------------------------------
def explore_granularity():
    log("=== explore: L2 fetch granularity and the stride sweep ===")
    ext = co.transpose_ext()
    default_gran = ext.l2_fetch_granularity(0)
    log(f"L2 fetch granularity limit by default: {default_gran} B")
    for gran in (32, 128):
        now = ext.l2_fetch_granularity(gran)
        rows = [r for r in co.measure_strides(co.Params(experiments=("stride",)), target, lambda f, m: None, 0, 1)
                if r["experiment"] == "stride"]
        preds = {r["variant"]: r for r in co.predict(co.Params(experiments=("stride",)), target)}
        print(f"  granularity {now} B: " + ", ".join(
            f"s{r['stride']}={r['measured_tbps']:.3f} ({100 * (r['measured_tbps'] / preds[r['variant']]['predicted_tbps'] - 1):+.0f}%)"
            for r in rows), flush=True)
    ext.l2_fetch_granularity(default_gran)


section(explore_granularity)


def explore_walks():
    log("=== explore: walks ===")
    n = 16384
    m = torch.randn(n, n, device="cuda")
    for along_rows in (False, True):
        for block, warps, unroll, cg, seg in ((128, 4, 8, False, 64), (128, 4, 1, False, 64), (128, 4, 8, True, 64),
                                              (256, 8, 8, False, 64)):
            nseg = n // seg
            out = torch.empty((n, nseg) if along_rows else (nseg, n), device="cuda")
            fn = lambda: walk_x[(n // block, nseg)](m, out, n, SEG=seg, ALONG_ROWS=along_rows, BLOCK=block,
                                                      UNROLL=unroll, CG=cg, num_warps=warps)
            fn()
            timing.check_close(out, co.walk_reference(m, along_rows), "fp32", "walk_x")
            ms = timing.time_ms(fn)
            print(f"  {'row' if along_rows else 'col'} walk block={block} warps={warps} unroll={unroll} cg={cg} "
                  f"seg={seg}: {timing.tbps(4 * n * n, ms):.3f} TB/s", flush=True)
    del m


section(explore_walks)


def explore_transposes():
    log("=== explore: transpose tile shapes ===")
    ext = co.transpose_ext()
    for n in (8192, 16384):
        a = torch.randn(n, n, device="cuda")
        b = torch.empty_like(a)
        cells = []
        for tile, rows in ((32, 8), (32, 16), (64, 8), (64, 16), (64, 32)):
            for pad in (False, True):
                fn = lambda: ext.transpose_tiled(a, b, tile, rows, pad)
                fn()
                assert torch.equal(b, a.t())
                cells.append(f"{tile}x{rows}{'p' if pad else ' '}={timing.tbps(8 * n * n, timing.time_ms(fn)):.2f}")
        naive = timing.tbps(8 * n * n, timing.time_ms(lambda: ext.transpose_naive(a, b)))
        tt = timing.tbps(8 * n * n, timing.time_ms(lambda: b.copy_(a.t())))
        tc = timing.tbps(8 * n * n, timing.time_ms(lambda: a.t().contiguous()))
        cp = timing.tbps(8 * n * n, timing.time_ms(lambda: b.copy_(a)))
        print(f"  n={n}: naive={naive:.2f} torch copy_(t)={tt:.2f} t().contiguous()={tc:.2f} copy={cp:.2f} | "
              + " ".join(cells), flush=True)
        del a, b


section(explore_transposes)


def explore_hierarchy():
    log("=== explore: hierarchy launch shapes (loop variant) ===")
    saved = (hi.BLOCK, hi.UNROLL, hi.NUM_WARPS, hi.PROGRAMS_PER_SM)
    buf = torch.randn(1024 * MiB // 4, device="cuda")
    for shape in ((2048, 4, 8, 4), (4096, 2, 8, 4), (1024, 4, 4, 8), (2048, 8, 8, 4), (2048, 4, 8, 8), (1024, 2, 4, 16)):
        hi.BLOCK, hi.UNROLL, hi.NUM_WARPS, hi.PROGRAMS_PER_SM = shape
        cells = []
        for w in (1 * MiB, 8 * MiB, 24 * MiB, 40 * MiB, 56 * MiB, 80 * MiB, 1024 * MiB):
            xw = buf[: w // 4]
            out = torch.empty((hi.programs(xw.numel(), info.sm_count), hi.BLOCK), device="cuda")
            passes = hi.passes_for(w)
            ms = timing.time_ms(lambda: hi.read_passes(xw, passes, out, info.sm_count), warmup_ms=10, rep_ms=40)
            cells.append(f"{w // MiB}M={w * passes / (ms * 1e-3) / 1e12:.2f}")
        print(f"  BLOCK={shape[0]} UNROLL={shape[1]} warps={shape[2]} progs/SM={shape[3]}: " + " ".join(cells), flush=True)
    hi.BLOCK, hi.UNROLL, hi.NUM_WARPS, hi.PROGRAMS_PER_SM = saved
    del buf


section(explore_hierarchy)


def explore_relu():
    log("=== explore: ReLU block sizes ===")
    n = 256 * 10**6
    for dtype in ("fp32", "bf16", "fp8"):
        xx = timing.random_tensor((n,), dtype)
        yy = torch.empty_like(xx)
        cells = []
        for bb, warps in ((8192, 4), (16384, 8), (32768, 8), (65536, 16)):
            pr.BLOCK_BYTES, pr.RELU_WARPS = bb, warps
            ms = timing.time_ms(lambda: pr.relu(xx, yy))
            cells.append(f"{bb}/{warps}w={ms:.4f}ms ({timing.tbps(2 * n * xx.element_size(), ms):.2f} TB/s)")
        print(f"  {dtype}: " + " ".join(cells), flush=True)
        del xx, yy
    pr.BLOCK_BYTES, pr.RELU_WARPS = 16384, 8


section(explore_relu)

log("done")
