"""Device-side checks for the matmul lab (issue 15): the stream-K kernel against float64, then our kernel
beside cuBLAS at every size of the default sweep, with the model's error.

Run on a GPU:  python scripts/matmul_gpu.py [check] [sweep] [floor] [lab] [labsk]   (default: check sweep floor)
  check  every tile config and schedule the lab can pick, on odd shapes and odd program counts, against float64
  sweep  bf16 at every N of DEFAULT_SIZES: cuBLAS, the lab's choice, and the candidate schedules side by side
  floor  the model's probes (the smallest product, and a load's latency) beside cuBLAS's smallest products
  lab    the lab's own default run (python -m labs run matmul), summarised
  labsk  the same with streamk=on
Prints a compact table per section; with $OUT set, writes matmul_gpu.json there. Sections stop being started
once DEADLINE_S (env, seconds since start, default 220) has passed.
"""
import json
import os
import sys
import time

import torch

from labs import bench, gpu, matmul as mm

T0 = time.monotonic()
DEADLINE = float(os.environ.get("DEADLINE_S", "220"))
OUT = os.environ.get("OUT")
results: dict = {"rows": []}
T = mm.TileConfig
BIG = mm.DEFAULT_CONFIGS["bf16"]
CANDIDATES = {  # name -> (config, SK_EXTRA_WAVE); "dp" = the per-size tile without stream-K
    "dp": (None, True),
    "dp_big": (BIG, True),
    "sk_big": (T(128, 256, 64, 8, 8, 3, True), True),
    "sk_big1": (T(128, 256, 64, 8, 8, 3, True), False),
    "sk_128w4": (T(128, 128, 64, 8, 4, 4, True), True),
}
SEEN: set = set()


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


def run_ours(a, b, out, cfg, extra_wave, programs=None):
    mm.SK_EXTRA_WAVE = extra_wave
    return mm.triton_matmul(a, b, "bf16", out, cfg, "auto", programs=programs)


def section_check():
    """Each stream-K config on odd shapes (M odd, N and K 16-byte multiples) and odd program counts,
    output poisoned with NaN, against a full float64 product; the counters must come back to zero."""
    shapes = [(517, 528, 560), (1001, 1032, 2056), (2057, 2064, 200), (264, 264, 4104)]
    print(f"{'config':<26} {'M x N x K':<16} {'progs':>5} {'rel err':>9}  ok")
    for name, (cfg, extra) in CANDIDATES.items():
        if cfg is None or not cfg.streamk and name != "dp_big":
            continue
        for m, n, k in shapes:
            for progs in (None, 7):
                a, b = mm.operands(m, n, k, "bf16")
                out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                try:
                    _, path, _ = run_ours(a, b, out, cfg, extra, progs)
                    torch.cuda.synchronize()
                    err = bench.check_close(out, mm.reference(a, b), "bf16", f"{name} {m}x{n}x{k} p{progs}")
                    clean = all(int(t.abs().sum()) == 0 for t in mm._SCRATCH["cuda:0"][1:]) if cfg.streamk else True
                    ok = "yes" if clean else "COUNTERS LEFT NONZERO"
                except Exception as exc:
                    err, ok = float("nan"), f"FAIL {exc}"[:200]
                record("check", config=name, shape=f"{m}x{n}x{k}", programs=progs, err=err, ok=ok)
                print(f"{name:<26} {f'{m}x{n}x{k}':<16} {str(progs):>5} {err:9.2e}  {ok}", flush=True)
    mm.SK_EXTRA_WAVE = True


def section_sweep():
    """bf16 at every size: cuBLAS, the lab's choice (config_for), and the candidates (aligned sizes only)."""
    target = gpu.live_target()
    params = mm.Params()
    print("ceilings:", target.describe_ceilings(), flush=True)
    mm.probe_floor_us(target)
    head = f"{'N':>5} {'cuBLAS':>7} {'lab':>7} {'x':>5} {'model':>7} {'err%':>6}  lab config"
    names = list(CANDIDATES)
    print(head + "  | " + " ".join(f"{n:>9}" for n in names), flush=True)
    for n in mm.DEFAULT_SIZES:
        if elapsed() > DEADLINE:
            print("deadline: sweep stopped", flush=True)
            return
        a, b = mm.operands(n, n, n, "bf16")
        out = torch.full((n, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        c = mm.cublas_matmul(a, b, "bf16", out)
        mm.check_sampled(c, a, b, "bf16", f"cublas {n}")
        cub = bench.tflops(2 * n**3, mm.kernel_ms(lambda: mm.cublas_matmul(a, b, "bf16", out)))
        cfg = mm.config_for(params, "bf16", n, target.sm_count, target.compute_capability)
        out.fill_(float("nan"))
        _, path, compiled = mm.triton_matmul(a, b, "bf16", out, cfg, "auto")
        mm.check_sampled(out, a, b, "bf16", f"lab {n}")
        lab = bench.tflops(2 * n**3, mm.kernel_ms(lambda: mm.triton_matmul(a, b, "bf16", out, cfg, "auto")))
        pred = mm.predict_point(n, "bf16", cfg, target).get("predicted_tflops") or float("nan")
        row = {"n": n, "cublas": cub, "lab": lab, "ratio": lab / cub, "model": pred,
               "err_pct": 100 * (lab - pred) / pred, "config": cfg.label, "path": path,
               **mm._compiled_resources(compiled)}
        cand = {}
        if path == "tma" and n >= 1024 or n in (512, 768):
            for name, (c_cfg, extra) in CANDIDATES.items():
                c_cfg = c_cfg or mm.tuned_config(n, "bf16", target.sm_count, target.compute_capability)
                try:
                    out.fill_(float("nan"))
                    _, _, comp = run_ours(a, b, out, c_cfg, extra)
                    mm.check_sampled(out, a, b, "bf16", f"{name} {n}")
                    if name not in SEEN:
                        SEEN.add(name)
                        res = mm._compiled_resources(comp)
                        print(f"   {name}: {res} spills={getattr(comp, 'n_spills', '?')}", flush=True)
                    ms = mm.kernel_ms(lambda: run_ours(a, b, out, c_cfg, extra))
                    cand[name] = bench.tflops(2 * n**3, ms)
                except Exception as exc:
                    cand[name] = float("nan")
                    print(f"   {name} at {n} failed: {exc}"[:300], flush=True)
            mm.SK_EXTRA_WAVE = True
        row.update(cand)
        record("sweep", **row)
        print(f"{n:>5} {cub:7.1f} {lab:7.1f} {lab / cub:5.2f} {pred:7.1f} {row['err_pct']:+6.1f}  {cfg.label:<24}"
              + "  | " + " ".join(f"{cand.get(x, float('nan')) / cub:9.2f}" for x in names), flush=True)
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
    for name in sys.argv[1:] or ["check", "sweep", "floor"]:
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
