"""Device-side experiments for the matmul labs: tile configs against cuBLAS, load paths by alignment, the model.

Run on a GPU:  python scripts/matmul_gpu.py [configs] [dtypes] [align] [model]   (default: all)
Prints a compact table per section; with $OUT set, also writes matmul_gpu.json there. Sections stop being
started once DEADLINE_S (env, seconds since start, default 240) has passed.
"""
import json
import os
import sys
import time

import torch

from labs import bench, gpu, matmul as mm

T0 = time.monotonic()
DEADLINE = float(os.environ.get("DEADLINE_S", "240"))
OUT = os.environ.get("OUT")
results: dict = {"rows": []}


def elapsed() -> float:
    return time.monotonic() - T0


def save():
    if OUT:
        with open(os.path.join(OUT, "matmul_gpu.json"), "w") as fh:
            json.dump(results, fh, indent=1)


def cublas_time(a, b, dtype, out=None):
    with bench.tf32(dtype == "tf32"):
        c = mm.cublas_matmul(a, b, dtype, out)
        mm.check_sampled(c, a, b, dtype, "cublas")
        return bench.time_ms(lambda: mm.cublas_matmul(a, b, dtype, out), 10, 60)


def triton_time(a, b, dtype, cfg, tma):
    out = torch.full((a.shape[0], b.shape[1]), float("nan"), device="cuda", dtype=mm.out_dtype(dtype))
    t = time.monotonic()
    _, path, compiled = mm.triton_matmul(a, b, dtype, out, cfg, tma)
    torch.cuda.synchronize()
    first_s = time.monotonic() - t
    err = mm.check_sampled(out, a, b, dtype, f"triton {cfg.label} {tma}")
    ms = bench.time_ms(lambda: mm.triton_matmul(a, b, dtype, out, cfg, tma), 10, 60)
    return ms, path, err, first_s, mm._compiled_resources(compiled)


def record(section, **row):
    row["section"] = section
    results["rows"].append(row)
    print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)


def probe(dtype, cfg, tma):
    m, n, k = mm.PROBE_TMA if tma != "off" else mm.PROBE_ODD
    a, b = mm.operands(m, n, k, dtype)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=mm.out_dtype(dtype))
    mm.triton_matmul(a, b, dtype, out, cfg, tma)
    return bench.check_close(out, mm.reference(a, b), dtype, f"probe {dtype} {cfg.label} {tma}")


def section_configs():
    """Tile configs for bf16 and fp16 at N = 4096 and 8192, TMA and pointer paths, against cuBLAS."""
    T = mm.TileConfig
    cands = {"bf16": [T(128, 256, 64, 8, 8, 3), T(128, 256, 64, 8, 8, 4), T(128, 128, 64, 8, 4, 4),
                      T(128, 128, 64, 8, 8, 4), T(256, 128, 64, 8, 8, 3), T(128, 256, 64, 8, 8, 2)],
             "fp16": [T(128, 256, 64, 8, 8, 3), T(128, 128, 64, 8, 8, 4)]}
    for dtype, configs in cands.items():
        ops = {n: mm.operands(n, n, n, dtype) for n in (4096, 8192)}
        cub = {n: cublas_time(*ops[n], dtype) for n in ops}
        for n in ops:
            record("configs", dtype=dtype, n=n, kernel="cublas", tflops=bench.tflops(2 * n**3, cub[n]))
        for cfg in configs:
            for tma in ("auto", "off"):
                if elapsed() > DEADLINE:
                    return
                try:
                    perr = probe(dtype, cfg, tma)
                    for n in ops:
                        ms, path, err, first_s, res = triton_time(*ops[n], dtype, cfg, tma)
                        tf = bench.tflops(2 * n**3, ms)
                        record("configs", dtype=dtype, n=n, kernel="triton", config=cfg.label, path=path,
                               tflops=tf, vs_cublas=tf / bench.tflops(2 * n**3, cub[n]), first_call_s=first_s,
                               probe_err=perr, **res)
                except Exception as exc:  # out of shared memory, compile errors: note and go on
                    record("configs", dtype=dtype, config=cfg.label, tma=tma, error=str(exc)[:300])
        del ops
        save()


def section_dtypes():
    """fp8, tf32 and fp32: a couple of configs each, B row-major against B k-major for tf32."""
    T = mm.TileConfig
    plan = [("fp8", True, [T(128, 256, 128, 8, 8, 3), T(128, 128, 128, 8, 4, 4), T(128, 256, 64, 8, 8, 4)]),
            ("tf32", True, [T(128, 128, 32, 8, 8, 3), T(128, 256, 32, 8, 8, 3), T(128, 128, 64, 8, 8, 3)]),
            ("tf32", False, [T(128, 128, 32, 8, 8, 3)]),
            ("fp32", True, [T(128, 128, 32, 8, 8, 3), T(64, 64, 32, 8, 4, 3)]),
            ("fp32", False, [T(128, 128, 32, 8, 8, 3)])]
    for dtype, kmajor, configs in plan:
        if dtype == "fp8" and torch.cuda.get_device_capability() < (8, 9):
            continue
        n = 8192 if dtype != "fp32" else 4096
        a, b = mm.operands(n, n, n, dtype, kmajor_b=kmajor)
        try:
            cub = cublas_time(a, b, dtype)
            record("dtypes", dtype=dtype, kmajor_b=kmajor, n=n, kernel="cublas", tflops=bench.tflops(2 * n**3, cub))
        except Exception as exc:
            cub = None
            record("dtypes", dtype=dtype, kmajor_b=kmajor, kernel="cublas", error=str(exc)[:300])
        for cfg in configs:
            if elapsed() > DEADLINE:
                return
            try:
                perr = probe(dtype, cfg, "auto")
                ms, path, err, first_s, res = triton_time(a, b, dtype, cfg, "auto")
                tf = bench.tflops(2 * n**3, ms)
                record("dtypes", dtype=dtype, kmajor_b=kmajor, n=n, kernel="triton", config=cfg.label, path=path,
                       tflops=tf, vs_cublas=(tf / bench.tflops(2 * n**3, cub)) if cub else None,
                       first_call_s=first_s, probe_err=perr, **res)
            except Exception as exc:
                record("dtypes", dtype=dtype, kmajor_b=kmajor, config=cfg.label, error=str(exc)[:300])
        del a, b
        save()


def section_align():
    """bf16 at N = 2048 and 4096 plus 1, 2, 4, 8, 16: cuBLAS, Triton (TMA where possible), Triton pointer path."""
    cfg = mm.DEFAULT_CONFIGS["bf16"]
    for base in (2048, 4096):
        for d in (0, 1, 2, 4, 8, 16):
            if elapsed() > DEADLINE:
                return
            n = base + d
            a, b = mm.operands(n, n, n, "bf16")
            cub = cublas_time(a, b, "bf16")
            record("align", n=n, kernel="cublas", tflops=bench.tflops(2 * n**3, cub))
            for tma in ("auto", "off"):
                if tma == "off" and d in (1,):
                    continue  # same as auto
                try:
                    ms, path, err, first_s, res = triton_time(a, b, "bf16", cfg, tma)
                    record("align", n=n, kernel=f"triton-{tma}", path=path, tflops=bench.tflops(2 * n**3, ms),
                           first_call_s=first_s, **res)
                except Exception as exc:
                    record("align", n=n, kernel=f"triton-{tma}", error=str(exc)[:300])
        save()


def section_model():
    """The default bf16 sweep's Triton points against the model (ceilings as the app would use them)."""
    target = gpu.live_target()
    print("ceilings:", target.describe_ceilings(), target.ceilings.matmul_tflops, flush=True)
    cfg = mm.DEFAULT_CONFIGS["bf16"]
    for n in (1024, 1536, 2048, 2304, 2560, 3072, 3328, 3584, 4096, 4352, 4608, 5120, 6144, 7168, 8192, 8448):
        if elapsed() > DEADLINE:
            return
        a, b = mm.operands(n, n, n, "bf16")
        ms, path, err, first_s, res = triton_time(a, b, "bf16", cfg, "auto")
        tf = bench.tflops(2 * n**3, ms)
        p = mm.predict_point(n, "bf16", cfg, target)
        record("model", n=n, path=path, tflops=tf, predicted=p.get("predicted_tflops"),
               err_pct=100 * (tf - p["predicted_tflops"]) / p["predicted_tflops"], waves=p.get("waves"),
               tiles=p.get("tiles"))
    save()


def main():
    info = gpu.detect()
    results["gpu"] = {"name": info.name, "cc": info.compute_capability, "sms": info.sm_count,
                      "versions": gpu.software_versions()}
    print("GPU:", results["gpu"], flush=True)
    sections = sys.argv[1:] or ["configs", "align", "dtypes", "model"]
    for name in sections:
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
    save()


if __name__ == "__main__":
    main()
