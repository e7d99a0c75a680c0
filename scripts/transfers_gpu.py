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


def cudart_lib():
    """The CUDA runtime library this process has loaded (torch's), through ctypes."""
    import ctypes
    torch.cuda.init()
    with open("/proc/self/maps") as f:
        paths = sorted({line.split()[-1] for line in f if "libcudart.so" in line})
    lib = ctypes.CDLL(paths[0])
    lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.cudaEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.cudaEventSynchronize.argtypes = [ctypes.c_void_p]
    lib.cudaEventCreateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
    return lib


def diy_staging(lib, src_ptr: int, dev_ptr: int, nbytes: int, pinned_ptrs: list, piece: int, stream) -> None:
    """A pageable host->device copy done by hand as the driver is said to: one CPU thread copies each piece into
    a pinned staging buffer (memcpy), the copy engine moves it on, the thread reuses a buffer only once its last
    copy is done (events). len(pinned_ptrs) buffers in rotation."""
    import ctypes
    events = diy_staging.events
    for i, off in enumerate(range(0, nbytes, piece)):
        n = min(piece, nbytes - off)
        b = i % len(pinned_ptrs)
        if i >= len(pinned_ptrs):
            lib.cudaEventSynchronize(events[b])
        ctypes.memmove(pinned_ptrs[b], src_ptr + off, n)
        lib.cudaMemcpyAsync(dev_ptr + off, pinned_ptrs[b], n, 1, stream)
        lib.cudaEventRecord(events[b], stream)
    torch.cuda.current_stream().synchronize()


def diy_main(sizes_mib, rounds):
    import ctypes
    lib = cudart_lib()
    events = []
    for _ in range(8):
        e = ctypes.c_void_p()
        lib.cudaEventCreateWithFlags(ctypes.byref(e), 2)  # cudaEventDisableTiming
        events.append(e)
    diy_staging.events = events
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    largest = max(sizes_mib) * MiB
    host = torch.empty(largest // 4, dtype=torch.float32)
    host.copy_(torch.randn(largest // 4))
    dev = torch.empty(largest // 4, dtype=torch.float32, device="cuda")
    staging = [torch.empty(4 * MiB, dtype=torch.uint8, pin_memory=True) for _ in range(4)]
    variants = [(piece, k) for piece in (256 * 1024, 1 * MiB, 2 * MiB, 4 * MiB) for k in (1, 2, 4)]
    # correctness of the hand-made staging once, on an odd size
    n = 3 * MiB + 4 * 777
    dev.zero_()
    diy_staging(lib, host.data_ptr(), dev.data_ptr(), n, [s.data_ptr() for s in staging[:2]], MiB, stream)
    ok = torch.equal(dev.view(torch.uint8)[:n].cpu(), host.view(torch.uint8)[:n])
    print("diy staging bit-exact:", ok, flush=True)
    pairs = {}
    for s in sizes_mib:
        nb = s * MiB
        pairs[(s, "driver")] = ((lambda nb=nb: dev[:nb // 4].copy_(host[:nb // 4])), None)
        for piece, k in variants:
            ptrs = [t.data_ptr() for t in staging[:k]]
            pairs[(s, f"diy{piece >> 10}Kx{k}")] = ((lambda nb=nb, ptrs=ptrs, piece=piece: diy_staging(
                lib, host.data_ptr(), dev.data_ptr(), nb, ptrs, piece, stream)), None)
    timed = tr.timed_in_turns(pairs, rounds=rounds)
    for s in sizes_mib:
        line = " ".join(f"{name} {s * MiB / (timed[(s, name)][0] * 1e-3) / 1e9:5.1f}"
                        for (size, name) in pairs if size == s)
        print(f"h2d {s:5d} MiB GB/s: {line}", flush=True)


if __name__ == "__main__":
    if "--diy" in sys.argv:
        sys.argv.remove("--diy")
        diy_main([1, 4, 16, 64, 256, 1024], 4)
    else:
        main()
