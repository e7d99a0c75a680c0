"""
The recompute lab's model: each version's kernels as accesses of an element-sized tensor and sigmoids computed;
a kernel takes the slower of its bytes at the copy ceiling and its exponentials and reciprocals on the special
function units, plus the kernel launch cost (labs.engine.gpu.KERNEL_LAUNCH_US). Once a run has read the CPU's clock
at each launch, the step is the GPU's kernels fed by those launches (step_ms).

Pure arithmetic; nothing here needs a GPU or launches a kernel.
"""

from __future__ import annotations

from typing import Optional

from labs.engine import timing
from labs.engine.gpu import KERNEL_LAUNCH_US, MiB, Target, sm_shape
from labs.engine.params import from_dict

NAME = "recompute"


# Each version's kernels as (accesses of an element-sized tensor, sigmoids computed), and the
# activations it keeps for the backward pass beyond x and out (in element-sized tensors).
KERNELS = {
    "stored": [(1 + 3, 3), (3 + 1, 1)],  # forward: read x, write s1 s2 out; backward: read dout s1 s2, write dx
    "recomputed": [(1 + 1, 3), (2 + 1, 3)],  # forward: read x, write out; backward: read dout x, write dx
    "autograd": [(1 + 1, 1)] * 3 + [(2 + 1, 0)] * 3,  # 3 sigmoids; 3 sigmoid_backward (read grad and s)
}
SAVED = {"stored": 2, "recomputed": 0, "autograd": 2}
SFU_OPS_PER_SIGMOID = 2  # 1 / (1 + exp(-x)): one exponential and one reciprocal on the special function units


def sfu_ops_per_s(target: Target) -> float:
    """Special-function-unit results per second. Every SM has 16 SFU lanes against 128 FP32 lanes
    (64 on compute capability 7.x and 8.0), so the SFU rate follows from the measured FMA rate."""
    sm = sm_shape(target.compute_capability)
    return target.ceilings.fma_tflops * 1e12 / 2 * sm.sfu_lanes / sm.fp32_lanes


def kernel_ms(accesses: int, sigmoids: int, nbytes: int, dtype: str, target: Target) -> tuple:
    """(ms, limit) of one elementwise kernel: the slower of its bytes and its exp/reciprocal work."""
    memory = accesses * nbytes / (target.ceilings.copy_tbps * 1e12) * 1e3
    n = nbytes // timing.element_bytes(dtype)
    sfu = sigmoids * SFU_OPS_PER_SIGMOID * n / sfu_ops_per_s(target) * 1e3
    return max(memory, sfu) + KERNEL_LAUNCH_US * 1e-3, ("memory" if memory >= sfu else "special functions")


def timer_host_floor_ms(host_ms: float, target: Target) -> float:
    """The shortest time the timer can report for a call whose CPU side takes host_ms: all of it.

    The timer clears the L2 with a 256 MB write before each call. If the CPU starts preparing the call while that
    write runs, the events see only part of the CPU's time, and how much they miss depends on how long the write
    takes on this GPU (0.09 ms on an H100, 0.06 ms on an H200): the 2026-11-23 recordings of this lab had CPU-bound
    steps 0.03-0.06 ms under their CPU time on the H100 and 0-0.02 ms under it on the H200. This lab's timer
    therefore waits for the write to finish before it starts the clock (time_step), so the floor is the CPU's whole
    time on every GPU. (The overlap was measured on both GPUs; that experiment was dropped.)
    """
    return host_ms


# How many of each version's KERNELS its forward pass launches (the rest are the backward pass's).
FORWARD_KERNELS = {"stored": 1, "recomputed": 1, "autograd": 3}


def launch_times_ms(variant: str, marks_ms: list) -> tuple:
    """(the CPU's clock at each kernel launch, at the end of the forward pass, at the end of the backward pass),
    from the marks of one timed step (time_step; in order of the calls to mark()).

    Our Triton versions read the clock right after each launch: [forward launch, forward end, backward launch,
    backward end]. Autograd's six kernels are launched inside PyTorch, where no clock can be read ([forward end,
    backward end]): each pass's launches are spread evenly over its CPU time, each at the end of its share.
    """
    if variant != "autograd":
        launch_forward, forward_end, launch_backward, backward_end = marks_ms
        return [launch_forward, launch_backward], forward_end, backward_end
    forward_end, backward_end = marks_ms
    k_forward = FORWARD_KERNELS[variant]
    k_backward = len(KERNELS[variant]) - k_forward
    launches = [forward_end * (j + 1) / k_forward for j in range(k_forward)]
    launches += [forward_end + (backward_end - forward_end) * (j + 1) / k_backward for j in range(k_backward)]
    return launches, forward_end, backward_end


def step_ms(kernels_ms: list, launches_ms: list, host_ms: float) -> float:
    """One training step from an idle GPU, with the CPU launching what the GPU runs.

    The CPU's clock starts with the GPU's (time_step) and launches kernel i at launches_ms[i]. The GPU starts a
    kernel once it is launched and the previous one is done. The step ends when both the GPU's last kernel and the
    CPU's last record (host_ms) are done. A step whose Python outlasts its kernels takes host_ms; one whose kernels
    outlast the Python takes the first launch (the CPU's lead-in, which the idle GPU waits for) plus the kernels.
    """
    done = 0.0
    for launch, ms in zip(launches_ms, kernels_ms):
        done = max(done, launch) + ms
    return max(done, host_ms)


def with_host_floor(row: dict, gpu_ms: float, host_ms: float, nbytes_moved: float, target: Target) -> dict:
    """The model once the CPU's time per call is known (measured in the run): the larger of the GPU's time
    and the part of the CPU's time the timer sees."""
    floor_ms = timer_host_floor_ms(host_ms, target)
    ms = max(gpu_ms, floor_ms)
    return {**row, "host_ms": host_ms, "gpu_model_ms": gpu_ms, "predicted_ms": ms,
            "predicted_tbps": nbytes_moved / (ms * 1e-3) / 1e12, "limited_by": "CPU" if floor_ms > gpu_ms else "GPU"}


def with_step_model(row: dict, variant: str, nbytes: int, dtype: str, host_ms: float, marks_ms: list,
                    target: Target) -> dict:
    """The model once the step's CPU times are known (measured in the run by time_step): the GPU's kernels,
    each from the roofline, fed by the CPU's launches (step_ms)."""
    kernels = [kernel_ms(a, s, nbytes, dtype, target)[0] for a, s in KERNELS[variant]]
    launches, forward_end, backward_end = launch_times_ms(variant, marks_ms)
    ms = step_ms(kernels, launches, host_ms)
    accesses = sum(a for a, _ in KERNELS[variant])
    ours = variant != "autograd"  # our Triton kernels' launches were read; autograd's are spread
    return {**row, "host_ms": host_ms, "host_forward_ms": forward_end, "host_backward_ms": backward_end,
            "host_forward_launch_ms": launches[0] if ours else None,
            "host_backward_launch_ms": launches[1] if ours else None, "gpu_model_ms": sum(kernels),
            "predicted_ms": ms, "predicted_tbps": accesses * nbytes / (ms * 1e-3) / 1e12,
            "limited_by": "CPU" if host_ms > sum(kernels) else "GPU"}


def predict_ms(variant: str, nbytes: int, target: Target, dtype: str = "fp32") -> float:
    return sum(kernel_ms(a, s, nbytes, dtype, target)[0] for a, s in KERNELS[variant])


def predict(params, target: Target) -> list[dict]:
    rows = []
    for dtype in params.dtypes:
        for size in params.sizes_mib:
            nbytes = size * MiB
            stored_ms = predict_ms("stored", nbytes, target, dtype)
            for variant, kernels in KERNELS.items():
                ms = predict_ms(variant, nbytes, target, dtype)
                accesses = sum(a for a, _ in kernels)
                limits = {kernel_ms(a, s, nbytes, dtype, target)[1] for a, s in kernels}
                rows.append({"dtype": dtype, "size_mib": size, "variant": variant, "predicted_kernels": len(kernels),
                             "accesses": accesses, "bytes_moved": accesses * nbytes, "sigmoids": sum(s for _, s in kernels),
                             "bound": " and ".join(sorted(limits)), "predicted_ms": ms,
                             "predicted_speedup": stored_ms / ms, "predicted_activation_bytes": SAVED[variant] * nbytes,
                             "predicted_tbps": accesses * nbytes / (ms * 1e-3) / 1e12})
    return rows


def recorded_marks(row: dict) -> Optional[list]:
    """A recorded row's CPU times in the order time_step's marks come (see launch_times_ms), or None where the
    recording predates them."""
    names = ["host_forward_ms", "host_backward_ms"]
    if row.get("variant") != "autograd":
        names = ["host_forward_launch_ms", "host_forward_ms", "host_backward_launch_ms", "host_backward_ms"]
    marks = [row.get(name) for name in names]
    return marks if all(isinstance(m, (int, float)) for m in marks) else None


def repredict(recording: dict, target: Target) -> list[dict]:
    """The model of a recorded run with the CPU time per step that run measured at each point."""
    from labs.engine.registry import get_lab  # the lab's Params (labs/recompute/__init__.py)

    params = from_dict(get_lab(NAME).Params, recording["params"])
    measured = {(r["dtype"], r["size_mib"], r["variant"]): r for r in recording["rows"]
                if r.get("host_ms") is not None}
    rows = []
    for row in predict(params, target):
        key = (row["dtype"], row["size_mib"], row["variant"])
        got = measured.get(key)
        nbytes, accesses = row["size_mib"] * MiB, sum(a for a, _ in KERNELS[row["variant"]])
        marks = recorded_marks(got) if got is not None else None
        if marks is not None:
            row = with_step_model(row, row["variant"], nbytes, row["dtype"], got["host_ms"], marks, target)
        elif got is not None:  # recorded before the launches' CPU times were: the CPU floor alone
            row = with_host_floor(row, predict_ms(row["variant"], nbytes, target, row["dtype"]), got["host_ms"],
                                  accesses * nbytes, target)
        rows.append(row)
    return rows


def lesson_numbers(target: Target) -> dict:
    nbytes = 1024 * MiB
    ms = {v: predict_ms(v, nbytes, target) for v in KERNELS}
    bf16 = {v: predict_ms(v, nbytes, target, "bf16") for v in KERNELS}
    return {
        "gpu": target.name,
        "bandwidth_tbps": f"{target.ceilings.copy_tbps:.2f}",
        "ceilings_source": target.describe_ceilings(),
        "stored_1gib_ms": f"{ms['stored']:.2f}",
        "recomputed_1gib_ms": f"{ms['recomputed']:.2f}",
        "autograd_1gib_ms": f"{ms['autograd']:.2f}",
        "speedup": f"{ms['stored'] / ms['recomputed']:.2f}",
        "autograd_speedup": f"{ms['autograd'] / ms['recomputed']:.2f}",
        "bf16_speedup": f"{bf16['stored'] / bf16['recomputed']:.2f}",
        "sfu_tops": f"{sfu_ops_per_s(target) / 1e12:.1f}",
        "fma_tflops": f"{target.ceilings.fma_tflops:.1f}",
    }
