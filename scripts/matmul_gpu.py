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


def cublas_time(a, b, dtype, out=None, graph=True):
    with bench.tf32(dtype == "tf32"):
        c = mm.cublas_matmul(a, b, dtype, out)
        mm.check_sampled(c, a, b, dtype, "cublas")
        fn = lambda: mm.cublas_matmul(a, b, dtype, out)
        return mm.kernel_ms(fn) if graph else bench.time_ms(fn)


def triton_time(a, b, dtype, cfg, tma, graph=True):
    out = torch.full((a.shape[0], b.shape[1]), float("nan"), device="cuda", dtype=mm.out_dtype(dtype))
    t = time.monotonic()
    _, path, compiled = mm.triton_matmul(a, b, dtype, out, cfg, tma)
    torch.cuda.synchronize()
    first_s = time.monotonic() - t
    err = mm.check_sampled(out, a, b, dtype, f"triton {cfg.label} {tma}")
    fn = lambda: mm.triton_matmul(a, b, dtype, out, cfg, tma)
    ms = mm.kernel_ms(fn) if graph else bench.time_ms(fn)
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
    """The default bf16 and fp16 configs against cuBLAS at N = 4096 and 8192: do_bench on CUDA-graph replays
    (as the lab times) and plain do_bench (Python launch cost included), same inputs."""
    for dtype in ("bf16", "fp16"):
        cfg = mm.DEFAULT_CONFIGS[dtype]
        for n in (4096, 8192):
            a, b = mm.operands(n, n, n, dtype)
            for graph in (True, False):
                cub = cublas_time(a, b, dtype, graph=graph)
                ms, path, err, first_s, res = triton_time(a, b, dtype, cfg, "auto", graph=graph)
                record("configs", dtype=dtype, n=n, graph=graph, config=cfg.label, path=path,
                       cublas_tflops=bench.tflops(2 * n**3, cub), triton_tflops=bench.tflops(2 * n**3, ms),
                       vs_cublas=cub / ms)
            del a, b
    save()


def section_dtypes():
    """fp8, tf32 and fp32: a couple of configs each, B row-major against B k-major for tf32."""
    T = mm.TileConfig
    plan = [("tf32", True, [T(128, 128, 32, 8, 8, 3), T(128, 128, 64, 8, 8, 2), T(128, 256, 32, 8, 8, 2),
                            T(64, 256, 32, 8, 4, 3), T(128, 64, 64, 8, 4, 3), T(128, 128, 32, 8, 4, 4)]),
            ("fp32", False, [T(128, 128, 32, 8, 8, 3), T(128, 64, 32, 8, 4, 3), T(64, 128, 32, 8, 4, 4),
                             T(128, 128, 16, 8, 8, 4)]),
            ("fp8", True, [T(128, 128, 128, 8, 4, 4), T(128, 256, 128, 8, 8, 3)])]
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
        for d in (0, 1, 2, 4, 8, 16, 32):
            if elapsed() > DEADLINE:
                return
            n = base + d
            a, b = mm.operands(n, n, n, "bf16")
            cub = cublas_time(a, b, "bf16")
            record("align", n=n, kernel="cublas", tflops=bench.tflops(2 * n**3, cub))
            for tma in ("auto", "off"):
                if tma == "off" and d in (1, 2, 4):
                    continue  # not 16-byte aligned: the pointer path either way
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


def show(paths):
    """Print result files of `python -m labs run` compactly."""
    for path in paths:
        data = json.load(open(path))
        print(f"== {path}: {data['lab']} complete={data['complete']} duration_s={data['meta'].get('duration_s')}")
        for m in data.get("messages", []):
            print("  message:", m)
        cols = ["kernel", "dtype", "n", "pow2", "path", "measured_tflops", "predicted_tflops", "error_pct",
                "measured_pct_of_cublas", "predicted_pct_of_cublas", "measured_request_tbps", "kernel_regs",
                "kernel_smem_bytes", "waves", "check_rel_error", "note"]
        for r in data["rows"]:
            print("  " + " ".join(f"{c}={r[c]:.4g}" if isinstance(r.get(c), float) else f"{c}={r[c]}"
                                  for c in cols if r.get(c) is not None))


def main():
    if sys.argv[1:2] == ["show"]:
        return show(sys.argv[2:])
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
