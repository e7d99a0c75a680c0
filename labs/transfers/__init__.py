"""
Transfers: moving data between the host and the GPU over PCIe
=============================================================

What you will learn:
- how fast host -> device (H2D) and device -> host (D2H) copies go, against the PCIe link the GPU reports
  (generation x lanes gives the bandwidth per direction);
- why a small copy costs a fixed latency (microseconds) whatever its size, and a large one costs its bytes
  over the link: time = latency + bytes / bandwidth, the same alpha-beta model as for collectives;
- why pinned (page-locked) host memory is faster than ordinary pageable memory: for host -> device the
  driver's CPU thread first copies pageable data into pinned staging buffers, so the copy runs at the slower
  of that CPU copy and the link (never at a rate of the core's own cache: the copy engine touches the staging
  buffers between CPU passes); for a large device -> host copy it locks the pageable pages, copies, and
  unlocks them, paying both (each measured on the same buffer in the run);
- how a copy on one CUDA stream hides behind compute on another.

The experiments:
1. `copies`: H2D and D2H from pinned and pageable host buffers, sizes 4 KiB to 256 MiB, each copy checked
   bit for bit against its source before it is timed (wall clock, as a program waits for it); a pageable
   copy and its CPU probe are timed in turns, three rounds, the fastest of each kept.
2. `overlap`: a pinned H2D copy and a chain of bf16 matmuls of about the same duration, run one after the
   other on one stream, then on two streams at once (the four in turns, three rounds, the fastest kept).
3. `staging`: a pageable H2D copy staged by hand, the way the driver is described to do it (one CPU thread
   copies each piece of your buffer into one of two pinned staging buffers while the copy engine moves the
   piece before), checked bit for bit and timed in turns with the driver's own copy of the same buffer and the
   CPU probe. The model of staging describes the hand-made copy, whose every step is known; where the driver's
   copy parts from both, the driver does something it does not document.

The package: model.py (the PCIe link and the alpha-beta model, pure), kernels.py (the copies, checked bit for bit,
and the hand-made staging), measure.py (the probes and the timing).
"""

from __future__ import annotations

from dataclasses import dataclass

from labs.engine.gpu import MiB
from labs.engine.lab import Headline, Lab
from labs.engine.params import param
from labs.transfers import measure, model
from labs.transfers.model import DIRECTIONS, EXPERIMENTS, MEMORIES, NAME
from labs.transfers.model import repredict  # noqa: F401 - tests/test_repredict.py calls transfers.repredict


@dataclass(frozen=True)
class Params:
    experiments: tuple = param(EXPERIMENTS, "what to run", choices=EXPERIMENTS)
    directions: tuple = param(DIRECTIONS, "h2d: host to device, d2h: device to host", choices=DIRECTIONS)
    memories: tuple = param(MEMORIES, "host buffer: pinned (page-locked) or pageable", choices=MEMORIES)
    # 4 KiB to 256 MiB: a 256 MiB copy already runs at the link's (or the CPU's) full rate; 1 GiB (or up to 4 GiB)
    # is there to ask for, but by default its copies and CPU probes took most of a run's minute
    sizes_kib: tuple = param(tuple(4 * 4**k for k in range(9)), "copy sizes", unit="KiB", min=4, max=4 * 1048576)
    overlap_mib: int = param(256, "overlap experiment: bytes copied while the matmuls run", unit="MiB",
                             min=1, max=4096)
    staging_mib: tuple = param((4, 16, 64, 256), "staging experiment: pageable h2d copies staged by hand",
                               unit="MiB", min=1, max=4096)


LAB = Lab(
    name=NAME,
    title="Host transfers: PCIe",
    summary="Copy 4 KiB to 1 GiB between host and GPU, pinned and pageable, against latency + bytes over the PCIe "
            "link the GPU reports; then hide a copy behind compute with two streams.",
    terms=("pcie", "pinned-memory", "cuda-stream"),
    Params=Params,
    predict=model.predict,
    measure=measure.measure,
    key=("experiment", "direction", "memory", "size_bytes", "schedule"),
    metric="ms",
    order=70,
    check=measure.check,
    lesson_numbers=model.lesson_numbers,
    headline=Headline("What GB/s will a 256 MiB host-to-device copy from pinned memory reach?", "GB/s",
                      {"experiment": "copies", "direction": "h2d", "memory": "pinned", "size_bytes": 256 * MiB},
                      "gbps"),
)
