"""
The collectives lab's measurement: torchrun starts one process per GPU (labs/collectives/worker.py runs in each,
joined by NCCL); each collective is checked against a float64 reference on odd sizes before it is timed, and every
row comes back with the model made from the run's own probes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading

from labs.engine import timing
from labs.engine.gpu import GB, MiB, ROOT, Target
from labs.engine.params import ParamError
from labs.collectives.model import OPS, bus_gbps, link_for, message_bytes, model_terms, op_bus_gbps, predict_with

PEER_COPY_BYTES = 256 * MiB

# NVLink multicast is never used: it can take a shared host's GPUs out of service (the device notes).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
LAUNCH_TIMEOUT_S = 600


def world_size(p, target: Target) -> int:
    """GPUs the run uses: all of this machine's; a model of a datasheet GPU, or of a lone GPU, assumes two."""
    if p.gpus:
        return p.gpus
    if target.live:
        import torch

        return max(torch.cuda.device_count(), 2)
    return 2


# ---------------------------------------------------------------------------------------------
# The launcher: torchrun, one process per GPU
# ---------------------------------------------------------------------------------------------
def worker_spec(p, n: int) -> dict:
    return {"ops": list(p.ops), "sizes_bytes": [message_bytes(s, n, p.dtype) for s in p.sizes_kib],
            "dtype": p.dtype, "layer_steps": list(p.layer_steps), "layer_tokens": list(p.layer_tokens),
            "d_model": p.d_model, "d_ff": p.d_ff, "peer_copy_bytes": PEER_COPY_BYTES}


def child_env() -> dict:
    """The children's environment: ours, the repository importable, NVLink multicast forced off."""
    env = dict(os.environ) | SAFE_ENV
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def launch(spec: dict, n: int, progress=lambda f, m: None, timeout_s: float = LAUNCH_TIMEOUT_S):
    """Run the worker on `n` processes with torchrun; yield its rows as they arrive.

    Raises RuntimeError with the tail of the workers' errors if any process fails.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", f"--nproc-per-node={n}",
           "-m", "labs.collectives.worker", json.dumps(spec)]
    with tempfile.TemporaryFile(mode="w+") as errors:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=errors, text=True)
        watchdog = threading.Timer(timeout_s, proc.kill)  # a hung worker must not hold the GPU lock forever
        watchdog.start()
        try:
            for line in proc.stdout:
                kind, _, payload = line.rstrip("\n").partition(" ")
                if kind == "ROW":
                    yield json.loads(payload)
                elif kind == "PROGRESS":
                    fraction, _, message = payload.partition(" ")
                    progress(float(fraction), message)
            proc.wait(timeout=timeout_s)
        finally:
            watchdog.cancel()
            if proc.poll() is None:  # stopped early (time limit, error): take the workers down with us
                proc.kill()
                proc.wait()
        if proc.returncode != 0:
            errors.seek(0)
            tail = "\n".join(errors.read().strip().splitlines()[-12:])
            raise RuntimeError(f"the {n} worker processes failed (torchrun exit {proc.returncode}):\n{tail}")


# ---------------------------------------------------------------------------------------------
# The measurement
# ---------------------------------------------------------------------------------------------
def check(p, target: Target) -> None:
    """A multi-GPU lab needs at least two GPUs, and only as many as there are."""
    if not target.live:
        return
    import torch

    have = torch.cuda.device_count()
    n = p.gpus or have
    if have < 2 or n < 2:
        raise ParamError(f"This lab needs two or more GPUs in one machine; this one has {have}. The model and the "
                         "recorded runs of a two-GPU machine are shown instead.")
    if n > have:
        raise ParamError(f"gpus = {n}, but this machine has {have} GPUs. Choose gpus <= {have} (0 uses them all).")
    if "tp" in p.layer_steps and p.d_ff % n:
        raise ParamError(f"d_ff = {p.d_ff} does not split evenly over {n} GPUs (tensor parallelism); "
                         f"choose a multiple of {n}.")
    # every message size is held at once (they are timed in turns), plus a share of each for the gathers
    held = sum(message_bytes(s, n, p.dtype) for s in p.sizes_kib)
    need = 1.5 * held + max(message_bytes(s, n, p.dtype) for s in p.sizes_kib)
    free = torch.cuda.mem_get_info()[0]
    if need > free:
        raise ParamError(f"The messages ({held / GB:.1f} GB in all, timed in turns) need about {need / GB:.1f} GB "
                         f"per GPU; {free / GB:.1f} GB are free. Choose fewer or smaller sizes.")


def with_rates(row: dict, datasheet_gbps: float) -> dict:
    if row["experiment"] in ("collective", "collective_gpu"):
        ms, n = row["measured_ms"], row["gpus"]
        row["measured_busbw_gbps"] = bus_gbps(row["op"], row["size_bytes"], n, ms)
        row["measured_algbw_gbps"] = row["size_bytes"] / (ms * 1e-3) / 1e9
    elif row.get("measured_gbps"):  # the probes: how much of the datasheet's link they reached
        row["datasheet_link_gbps"] = datasheet_gbps
        row["of_datasheet_pct"] = 100 * row["measured_gbps"] / datasheet_gbps
    return row


def run_rows(p, target: Target, n: int, progress):
    """Launch the workers; yield every measured row with the model made from this run's own probes."""
    datasheet = link_for(target)["link_gbps"]
    measured = [with_rates(r, datasheet) for r in launch(worker_spec(p, n), n, progress)]
    terms = model_terms(measured, target)
    model = {key_of(r): r for r in predict_with(p, target, n, terms)}
    for r in measured:
        samples = r.pop("samples_ms", None)
        if samples:  # the worker's batches: this row's repeats and spread under the engine's timing rule
            timing.record_samples(samples)
        yield model.get(key_of(r), {}) | r
    yield terms_message(terms, n)


def terms_message(terms: dict, n: int) -> str:
    link = terms["link_gbps"]
    text = (f"Measured in this run: the copy engines moved {link['one direction']:.0f} GB/s to the next GPU alone "
            f"and {link['all at once']:.0f} GB/s with every GPU copying at once (datasheet: "
            f"{terms['datasheet_gbps']:.0f} GB/s per direction).")
    if terms["exchange_gbps"]:
        buses = ", ".join(f"{op.replace('_', '-')} {op_bus_gbps(op, n, terms):.0f}" for op in OPS)
        text += (f" NCCL's send/recv exchange moved {terms['exchange_gbps']:.0f} GB/s each way, so the model's "
                 f"bus bandwidths are {buses} GB/s.")
    if terms.get("simple_us"):
        fixed = ", ".join(f"{op.replace('_', '-')} {us:.0f}" for op, us in terms["simple_us"].items())
        text += (f" NCCL's Simple protocol costs per call, from the smallest message the GPUs limit: {fixed} us "
                 "(the small LL message: " + ", ".join(f"{us:.0f}" for us in terms["gpu_us"].values()) + " us).")
    return text


def key_of(row: dict) -> tuple:
    return tuple(row.get(k) for k in ("experiment", "op", "size_bytes", "gpus", "step", "tokens"))


def measure(p, target: Target, progress):
    n = world_size(p, target)
    progress(0.0, f"starting {n} processes (torchrun, NCCL)")
    yield from run_rows(p, target, n, progress)
    progress(1.0, "done")
