"""
The memory hierarchy: how fast you can read depends on where the data lives
===========================================================================

What you will learn:
- the levels between the SMs and DRAM: registers and shared memory/L1 in each SM, one L2 shared by
  the whole chip, and HBM off the chip, each bigger and slower than the one before;
- how to see the L2 from outside: read the same buffer over and over; while it fits in the L2
  every pass after the first is served from there, and past the L2 size bandwidth falls to HBM's;
- what else limits small buffers: a pass over 256 KiB is over before the memory system is busy
  (latency: too few bytes in flight), and as one kernel launch per pass the launch costs more
  than the reading.

The experiment: a read-only kernel sums a buffer of W bytes. Its loads skip the L1 (`.cg`), so a
repeat read is served by the L2 or by HBM. Two ways to repeat:
- "loop": one kernel reads the buffer `passes` times; only the first pass starts from a cold L2
  (the timer flushes it before each call), the later ones find the buffer in the L2 if it fits;
- "launches": one kernel launch per pass, many launches replayed as one CUDA graph.
W sweeps from 256 KiB to 4 GiB, several points per octave, so the knee near the L2 size is sharp.

kernels.py holds the read kernel, model.py the napkin math and the level figures, measure.py the check and
the timing, diagram.py the picture of the levels for the page.
"""

from __future__ import annotations

from dataclasses import dataclass

from labs.engine.gpu import MiB
from labs.engine.lab import Headline, Lab
from labs.engine.params import param
from labs.hierarchy.counters import COUNTERS
from labs.hierarchy.measure import check, measure
from labs.hierarchy.model import VARIANTS, lesson_numbers, levels, predict  # noqa: F401  (the Hopper lab reads levels)


@dataclass(frozen=True)
class Params:
    min_kib: int = param(256, "smallest buffer", unit="KiB", min=4, max=1048576)
    max_mib: int = param(4096, "largest buffer (4 GiB: far beyond any L2)", unit="MiB", min=1, max=4096)
    points_per_octave: int = param(3, "buffer sizes per doubling", min=1, max=8)
    variants: tuple = param(("loop", "launches"), "how the passes are repeated: inside one kernel or one "
                            "launch each", choices=tuple(VARIANTS))


LAB = Lab(
    name="hierarchy",
    title="Memory hierarchy",
    summary="Read a buffer over and over while it grows from 256 KiB to 4 GiB: the L2 plateau, the fall to HBM "
            "at the L2 size, and the latency- and launch-bound small end.",
    terms=("memory-hierarchy", "registers", "shared-memory", "l1-cache", "l2-cache", "hbm", "memory-bandwidth",
           "launch-overhead", "littles-law", "cuda-graph", "sm"),
    Params=Params,
    predict=predict,
    measure=measure,
    key=("variant", "size_bytes"),
    metric="tbps",
    order=25,
    check=check,
    lesson_numbers=lesson_numbers,
    headline=Headline("What bandwidth will repeated reads of a 16 MiB buffer reach, passes inside one kernel?",
                      "TB/s", {"variant": "loop", "size_bytes": 16 * MiB}, "tbps"),
    counters=COUNTERS,
)
