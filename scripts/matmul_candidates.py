"""Tiles and schedules of the matmul lab's Triton kernel beside cuBLAS (issue 33, bf16, M = N = K) where an H100 missed
0.90x (docs/matmul-every128), near misses and controls: each through kernels.triton_matmul, checked against float64
on a sample (every element finite), timed as the lab times it (graph replay, L2 flushed, median of 5, spread).
"current" is this checkout's tuned_config; a candidate with the same launches as an earlier one is not timed again.
    OUT=DIR python3 scripts/matmul_candidates.py   (a GPU, ~2 min on an H100) | --tiny under TRITON_INTERPRET=1: CPU"""

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from labs.engine import timing  # noqa: E402
from labs.engine.results import git_commit, software_versions  # noqa: E402
import labs.matmul.configs as configs  # noqa: E402
from labs.matmul.configs import NARROW_TILE, TileConfig as T  # noqa: E402
from labs.matmul.kernels import cublas_matmul, operands, out_dtype, sm_count_of, triton_matmul  # noqa: E402
from labs.matmul.measure import check_sampled, kernel_ms  # noqa: E402

DTYPE, TOTAL_S = "bf16", 140  # no size starts past TOTAL_S seconds (compiles count)
BIG = configs.DEFAULT_CONFIGS[DTYPE]  # 128x256x64 w8 s3, 144 KiB
RT, RT_NARROW = dataclasses.replace(BIG, row_tail=True), dataclasses.replace(NARROW_TILE, row_tail=True)
# Row-tail tiles: configs.TAIL_TILES (64x64, 128x64 and 128x128), and 64x64 s6: more loads in flight for short tails
T64, T128x64, T128, T64S6 = configs.ROW_TAIL_TILE, configs.TALL_TAIL_TILE, NARROW_TILE, T(64, 64, 64, 8, 4, 6)
CANDIDATES = {  # name -> (config, row-tail tile or None)
    "big": (BIG, None), "big-RT-t64x64": (RT, T64), "big-RT-t128x64": (RT, T128x64), "big-RT-t128x128": (RT, T128),
    "big-RT-t64x64s6": (RT, T64S6), "big-SK": (dataclasses.replace(BIG, streamk=True), None),
    "n128-RT-t64x64s6": (RT_NARROW, T64S6), "n128-SK": (dataclasses.replace(NARROW_TILE, streamk=True), None),
    "s64x64w4s4": (T(64, 64, 64, 8, 4, 4), None), "s64x128w4s3": (T(64, 128, 64, 8, 4, 3), None),
    "s64x128s6-RT-t64x64": (T(64, 128, 64, 8, 4, 6, row_tail=True), T64)}
MID = ("current", "big", "big-RT-t64x64", "big-RT-t128x64", "big-RT-t128x128")
CONTROL = ("current", "big", "big-RT-t64x64", "big-RT-t128x128")
SIZES = {  # the misses (H100, c549f57) first, then near misses, then controls (2064: taught, kept from getting worse)
    2432: MID + ("big-SK",), 3200: MID, 3840: MID + ("big-SK",), 4352: MID, 4736: MID, 2944: MID + ("big-RT-t64x64s6",),
    1152: ("current", "s64x64w4s4", "s64x128w4s3", "s64x128s6-RT-t64x64", "n128-SK"),
    1664: ("current", "s64x128w4s3", "big", "big-SK", "n128-RT-t64x64s6", "n128-SK"),
    3072: MID + ("big-RT-t64x64s6",), 4224: MID + ("big-RT-t64x64s6",), 4864: MID,
    2688: ("current", "big-RT-t128x64", "big-RT-t128x128"), 1536: ("current", "n128-RT-t64x64s6"), 2064: ("current",),
    **{n: CONTROL for n in (2304, 2176, 3712, 5632, 6656, 5888, 6400, 7552)},
    **{n: MID for n in (5120, 5504, 6272, 6528, 6912)}}  # the tail tile rule (configs.tail_choice) moved, unmeasured
TINY = {320: tuple(dict.fromkeys(c for cs in SIZES.values() for c in cs))}  # every candidate on 4 "SMs" of the CPU


def plan_note(config, tail, n: int, sms: int) -> str:
    """Wave arithmetic: tiles, slots, waves; the row tail's rows, tiles and slots."""
    plain = dataclasses.replace(config, row_tail=False, tail="", streamk=False)
    tiles, slots = configs.tiles_of(n, plain), sms * max(1, configs.blocks_per_sm(plain, DTYPE, "tma", "9.0"))
    note = f"tiles {tiles} slots {slots} waves {tiles / slots:.2f}"
    if tail is not None:
        rows = n - configs.row_tail_rows(n, n, plain, slots)
        tiles = -(-rows // tail.block_m) * -(-n // tail.block_n)
        note += f" | tail rows {rows} tiles {tiles} slots {sms * configs.blocks_per_sm(tail, DTYPE, 'tma', '9.0')}"
    return note


def timed(fn) -> tuple:
    """(ms, spread %) of one call by the engine's rule."""
    with timing.collecting() as got:
        ms = kernel_ms(fn)
    return ms, round(max((t.spread_pct for t in got.timings), default=0.0), 2)


def run_size(n: int, names, sms: int, device: str, timing_on: bool) -> list:
    a, b = operands(n, n, n, DTYPE, device)
    out = torch.full((n, n), float("nan"), device=device, dtype=out_dtype(DTYPE))
    rows, seen, library_ms = [], {}, None
    if timing_on:
        check_sampled(cublas_matmul(a, b, DTYPE, out), a, b, DTYPE, f"cuBLAS N={n}")
        library_ms, spread = timed(lambda: cublas_matmul(a, b, DTYPE, out))
        rows.append(say({"n": n, "candidate": "cublas", "ms": library_ms, "spread_pct": spread, "x_cublas": 1.0,
                         "tflops": timing.tflops(2.0 * n**3, library_ms)}))
    for name in names:
        config, tail = (configs.tuned_config(n, DTYPE, sms), None) if name == "current" else CANDIDATES[name]
        tail = tail or (configs.tail_tile(config) if config.row_tail else None)
        launches = (dataclasses.replace(config, tail="").label, tail and tail.label)  # " RTT" runs as " RT" + 128x64
        if launches in seen:
            rows.append(say({"n": n, "candidate": name, "same_as": seen[launches]}))
            continue
        seen[launches] = name
        run = lambda: triton_matmul(a, b, DTYPE, out, config, "auto" if timing_on else "on", tail_config=tail)  # noqa
        row = {"n": n, "candidate": name, "config": config.label, "tail": tail and tail.label,
               "plan": plan_note(config, tail, n, sms)}
        try:
            out.fill_(float("nan"))
            row["path"] = run()[1]
            row["check_rel_error"] = check_sampled(out, a, b, DTYPE, f"{name} N={n}")
            if timing_on:
                row["ms"], row["spread_pct"] = timed(run)
                row.update(tflops=timing.tflops(2.0 * n**3, row["ms"]), x_cublas=library_ms / row["ms"])
        except Exception as exc:  # a candidate that fails says so; the others go on
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        rows.append(say(row))
    return rows


def say(row: dict) -> dict:
    what = ("same launches as " + row["same_as"] if "same_as" in row else "ERROR " + row["error"] if "error" in row else
            f"{row['tflops']:6.1f} TFLOP/s  x{row['x_cublas']:.3f}  spread {row['spread_pct']:.2f}%" if "ms" in row else
            f"checked (rel err {row['check_rel_error']:.1e})")
    print(f"{row['n']:5d}  {row['candidate']:20s}  {what}  {row.get('config', '')}  {row.get('plan', '')}", flush=True)
    return row


def main() -> None:
    tiny = "--tiny" in sys.argv[1:]  # tiny sizes, checks only (the CPU interpreter)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    timing_on, sizes = device == "cuda" and not tiny, TINY if tiny else SIZES
    sms, start, rows = sm_count_of(torch.device(device)), time.time(), []
    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"{gpu}, {sms} SMs, {DTYPE}", flush=True)
    for n, names in sizes.items():
        if time.time() - start > TOTAL_S:
            print(f"{n}: skipped (past {TOTAL_S} s)", flush=True)
            continue
        rows.extend(run_size(n, names, sms, device, timing_on))
    for n in dict.fromkeys(r["n"] for r in rows if "ms" in r):  # per size: the candidates, fastest first
        done = {r["candidate"]: r["x_cublas"] for r in rows if r["n"] == n and "ms" in r and r["candidate"] != "cublas"}
        print(f"{n:5d} x cuBLAS: " + ", ".join(f"{c} {x:.3f}" for c, x in sorted(done.items(), key=lambda i: -i[1])))
    meta = {"gpu": gpu, "sm_count": sms, "dtype": DTYPE, "versions": software_versions(), "git_commit": git_commit(),
            "duration_s": round(time.time() - start, 1), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "matmul_candidates.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"done in {meta['duration_s']} s", flush=True)


if __name__ == "__main__":
    main()
