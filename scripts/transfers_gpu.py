"""Which CPU probe tracks the driver's staging of pageable copies? (experiment script, one device call)

For pageable host->device and device->host copies of 1 to 256 MiB, time the real copy and several candidate
probes of the CPU's share on the same buffer, all in turns (labs.transfers.timed_in_turns), and print each probe's
rate against the copy's. Also counts, per OS thread, the CPU time a burst of copies uses: if the driver staged on
more than the calling thread, it would show here.

    python3 scripts/transfers_gpu.py [--rounds 5] [--sizes-mib 1 4 16 64 256]
"""
import argparse
import concurrent.futures
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from labs import transfers as tr  # noqa: E402

MiB = 1 << 20


def thread_cpu_seconds() -> dict:
    """CPU seconds (user + system) so far of every thread of this process, by thread id."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[tid] = (int(fields[11]) + int(fields[12])) / ticks
        except OSError:
            continue
    return out


def chunked(src: np.ndarray, dst_ring: np.ndarray, reverse: bool = False):
    """Copy `src` through `dst_ring` piece by piece (reverse: from the ring out into src)."""
    step = dst_ring.size
    for i in range(0, src.size, step):
        n = min(step, src.size - i)
        if reverse:
            np.copyto(src[i:i + n], dst_ring[:n])
        else:
            np.copyto(dst_ring[:n], src[i:i + n])


def probes_for(buf: np.ndarray, direction: str, pool) -> dict:
    """Candidate probes: name -> function that makes one pass over the buffer."""
    rings = {}
    for kib in (64, 256, 1024, 2048, 8192):
        r = np.empty(min(buf.size, kib * 1024), dtype=np.uint8)
        r.fill(1)
        rings[f"ring{kib}K"] = r
    pinned = torch.empty(min(buf.size, 2 * MiB), dtype=torch.uint8, pin_memory=True).numpy()
    pinned.fill(1)
    pinned256 = torch.empty(min(buf.size, 256 * 1024), dtype=torch.uint8, pin_memory=True).numpy()
    pinned256.fill(1)
    rings["pinned2M"], rings["pinned256K"] = pinned, pinned256
    reverse = direction == "d2h"
    out = {name: (lambda r=r: chunked(buf, r, reverse)) for name, r in rings.items()}

    def two_threads(ring_kib=256):
        half = buf.size // 2
        parts = [buf[:half], buf[half:]]
        rs = [np.ones(ring_kib * 1024, dtype=np.uint8) for _ in parts]
        return lambda: list(pool.map(lambda pr: chunked(pr[0], pr[1], reverse), zip(parts, rs)))

    out["2threads256K"] = two_threads()
    if direction == "d2h":
        out["write"] = lambda: buf.fill(0)
    whole = np.empty_like(buf)
    whole.fill(1)
    out["whole_memcpy"] = (lambda: np.copyto(whole, buf)) if not reverse else (lambda: np.copyto(buf, whole))
    return out


def rate_probe(buf, probes, repeats):
    def once():
        figures = {}
        for name, fn in probes.items():
            started = time.perf_counter()
            for _ in range(repeats):
                fn()
            figures[name + "_gbps"] = repeats * buf.size / (time.perf_counter() - started) / 1e9
        return figures
    return once


def host_info() -> dict:
    info = {"cpu": platform.processor(), "l2": tr.cpu_l2_bytes(), "nproc": os.cpu_count()}
    try:
        info["lscpu"] = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        pass
    return info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    args = ap.parse_args()
    info = host_info()
    print(json.dumps({k: v for k, v in info.items() if k != "lscpu"}))
    print("\n".join(line for line in info.get("lscpu", "").splitlines() if "cache" in line or "Model name" in line))
    largest = max(args.sizes_mib) * MiB
    host = torch.empty(largest // 4, dtype=torch.float32)
    dev = torch.empty(largest // 4, dtype=torch.float32, device="cuda")
    host.copy_(torch.randn(largest // 4))
    dev.copy_(host, non_blocking=False)
    results = []
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for direction in ("h2d", "d2h"):
            pairs = {}
            for s in args.sizes_mib:
                n = s * MiB // 4
                src, dst = (host[:n], dev[:n]) if direction == "h2d" else (dev[:n], host[:n])
                buf = host[:n].numpy().view(np.uint8)
                copy = (lambda d=dst, sr=src: d.copy_(sr))
                pairs[s] = (copy, rate_probe(buf, probes_for(buf, direction, pool), max(1, 16 // s)))
            timed = tr.timed_in_turns(pairs, rounds=args.rounds)
            for s, (ms, figures) in timed.items():
                row = {"direction": direction, "size_mib": s, "copy_gbps": s * MiB / (ms * 1e-3) / 1e9} | figures
                results.append(row)
                print(direction, f"{s:4d} MiB copy {row['copy_gbps']:6.2f} GB/s | " + " ".join(
                    f"{k[:-5]} {v:5.1f}" for k, v in figures.items()), flush=True)
            # which threads work during a burst of 16 MiB copies?
            n = 16 * MiB // 4
            src, dst = (host[:n], dev[:n]) if direction == "h2d" else (dev[:n], host[:n])
            before, started = thread_cpu_seconds(), time.perf_counter()
            for _ in range(100):
                dst.copy_(src)
            torch.cuda.synchronize()
            wall, after = time.perf_counter() - started, thread_cpu_seconds()
            used = {t: round(after[t] - before.get(t, 0.0), 3) for t in after if after[t] - before.get(t, 0.0) > 0.005}
            print(direction, f"100 x 16 MiB: wall {wall:.3f} s, CPU s by thread {used}", flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, f"transfers_probes_{torch.cuda.get_device_name().replace(' ', '_')}.json"), "w") as f:
            json.dump({"host": info, "rows": results, "torch": torch.__version__}, f, indent=1)


def diy_main(sizes_mib, rounds):
    """The driver's pageable h2d copy beside the lab's hand-made staging (labs.transfers.HandStager) with several
    piece sizes and buffer counts, all in turns."""
    largest = max(sizes_mib) * MiB
    host = torch.empty(largest // 4, dtype=torch.float32)
    host.copy_(torch.randn(largest // 4))
    dev = torch.empty(largest // 4, dtype=torch.float32, device="cuda")
    stagers = {(piece, k): tr.HandStager(piece, k) for piece in (256 * 1024, 1 * MiB, 2 * MiB, 4 * MiB)
               for k in (1, 2, 4)}
    n = (3 * MiB + 4 * 777) // 4  # correctness once, on a size that is no multiple of the pieces
    dev.zero_()
    stagers[(MiB, 2)].copy(dev[:n], host[:n])
    print("diy staging bit-exact:", torch.equal(dev[:n].cpu(), host[:n]), flush=True)
    pairs = {}
    for s in sizes_mib:
        src, dst = host[:s * MiB // 4], dev[:s * MiB // 4]
        pairs[(s, "driver")] = ((lambda d=dst, x=src: d.copy_(x)), None)
        for (piece, k), stager in stagers.items():
            pairs[(s, f"diy{piece >> 10}Kx{k}")] = ((lambda st=stager, d=dst, x=src: st.copy(d, x)), None)
    timed = tr.timed_in_turns(pairs, rounds=rounds)
    for s in sizes_mib:
        line = " ".join(f"{name} {s * MiB / (timed[(size, name)][0] * 1e-3) / 1e9:5.1f}"
                        for (size, name) in pairs if size == s)
        print(f"h2d {s:5d} MiB GB/s: {line}", flush=True)
    for stager in stagers.values():
        stager.close()


if __name__ == "__main__":
    if "--diy" in sys.argv:
        sys.argv.remove("--diy")
        diy_main([1, 4, 16, 64, 256, 1024], 4)
    else:
        main()
