"""The GPU in use: what it is, what its datasheet promises, and what it measurably does.

Three layers, each usable on its own:
- `detect()` reads the attached device (or says why there is none);
- `DATASHEET` holds the vendor figures of common GPUs, each row with its source;
- `labs.engine.calibration.calibrate()` measures the ceilings the models use (copy bandwidth, FMA rate, matmul rates),
  cached on disk per GPU so that it runs once.

A `Target` bundles a GPU's properties with the ceilings a model should use. Labs predict for a
Target, so the model works the same for the attached GPU, a recorded GPU or a datasheet row.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from labs.engine.params import ParamError

ROOT = Path(__file__).resolve().parents[2]  # the repository
RECORDED_DIR = ROOT / "content" / "recorded"

MB = 1e6
GB = 1e9
MiB = 2**20
GiB = 2**30


# --------------------------------------------------------------------------------------------
# Datasheet figures
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Datasheet:
    """Vendor figures for one GPU. Rates are dense (no 2:4 sparsity), in TFLOP/s."""

    name: str
    aliases: tuple  # substrings of the name the driver reports
    arch: str
    compute_capability: str
    sm_count: int
    l2_mb: float  # L2 cache size, MB (10^6 bytes) on every row; vendors' "MB" of L2 are MiB (an H100 reports
                  # 52,428,800 bytes for its "50 MB"), so each row holds MiB x 1.048576 (50 -> 52.4, 48 -> 50.3)
    memory_gb: float  # device memory, GB (10^9 bytes)
    memory_type: str
    bandwidth_tbps: float  # memory bandwidth, TB/s (10^12 bytes/s)
    fp32_tflops: float  # plain FP32 on the CUDA cores (FMA = 2 FLOPs)
    tf32_tflops: Optional[float]  # tensor cores, TF32 inputs (None: not supported)
    fp16_tflops: Optional[float]  # tensor cores, FP16 inputs, FP32 accumulation
    bf16_tflops: Optional[float]  # tensor cores, BF16 inputs, FP32 accumulation
    fp8_tflops: Optional[float]  # tensor cores, FP8 inputs (None: not supported)
    source: str
    note: str = ""
    boost_clock_mhz: Optional[int] = None  # the vendor's boost SM clock (set from _BOOST_CLOCK_MHZ below)

    def matmul_tflops(self, dtype: str) -> Optional[float]:
        return {"fp32": self.fp32_tflops, "tf32": self.tf32_tflops, "fp16": self.fp16_tflops,
                "bf16": self.bf16_tflops, "fp8": self.fp8_tflops}[dtype]


_H100_SOURCE = ("NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100): memory, bandwidth, FP32, "
                "tensor rates (dense = half the sparsity figures); SMs, L2 and the dense tensor rates to one decimal "
                "from the NVIDIA H100 Tensor Core GPU Architecture whitepaper")
DATASHEET: tuple[Datasheet, ...] = (
    Datasheet("H100 SXM", ("H100 80GB HBM3", "H100 SXM"), "Hopper", "9.0", 132, 52.4, 80, "HBM3", 3.35,
              67, 494.7, 989.4, 989.4, 1978.9, _H100_SOURCE),
    Datasheet("H100 PCIe", ("H100 PCIe",), "Hopper", "9.0", 114, 52.4, 80, "HBM2e", 2.0,
              51, 378, 756, 756, 1513, _H100_SOURCE),
    Datasheet("H200", ("H200",), "Hopper", "9.0", 132, 62.9, 141, "HBM3e", 4.8,
              67, 494.7, 989.4, 989.4, 1978.9,
              "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200): memory, bandwidth, FP32, "
              "tensor rates (dense = half the sparsity figures, equal to the H100 SXM's)",
              "SMs and L2 are not on the datasheet: the device reports 132 SMs and 60 MiB (62.9 MB) of L2."),
    Datasheet("A100 40GB", ("A100-SXM4-40GB", "A100-PCIE-40GB", "A100 40GB"), "Ampere", "8.0", 108, 41.9, 40,
              "HBM2", 1.555, 19.5, 156, 312, 312, None,
              "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/a100), dense rates; SMs and L2 "
              "from the NVIDIA A100 Tensor Core GPU Architecture whitepaper"),
    Datasheet("A100 80GB", ("A100-SXM4-80GB", "A100 80GB", "A100-PCIE-80GB"), "Ampere", "8.0", 108, 41.9, 80,
              "HBM2e", 2.039, 19.5, 156, 312, 312, None,
              "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/a100), SXM, dense rates; SMs and "
              "L2 from the NVIDIA A100 Tensor Core GPU Architecture whitepaper",
              "The A100 PCIe 80GB card has 1.935 TB/s (datasheet); this row holds the SXM figure."),
    Datasheet("L4", ("L4",), "Ada Lovelace", "8.9", 58, 50.3, 24, "GDDR6", 0.300,
              30.3, 60, 121, 121, 242.5,
              "NVIDIA L4 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/l4), dense = half the sparse figures",
              "SMs and L2 are not on the datasheet: 58 SMs (7,424 FP32 lanes / 128 per Ada SM) and the "
              "48 MiB (50.3 MB) the device reports."),
    Datasheet("L40S", ("L40S",), "Ada Lovelace", "8.9", 142, 100.7, 48, "GDDR6", 0.864,
              91.6, 183, 362, 362, 733,
              "NVIDIA L40S GPU datasheet (nvidia.com/en-us/data-center/l40s), dense = half the sparse figures",
              "SMs and L2 are not on the datasheet: 142 SMs (18,176 FP32 lanes / 128 per Ada SM) and the 96 MiB "
              "(100.7 MB) of L2 of the AD102 chip (NVIDIA Ada Lovelace architecture whitepaper)."),
    Datasheet("T4", ("Tesla T4", "T4"), "Turing", "7.5", 40, 4.2, 16, "GDDR6", 0.320,
              8.1, None, 65, None, None,
              "NVIDIA T4 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/tesla-t4)",
              "Turing has no TF32 or BF16 tensor-core path. SMs and L2 (4 MiB, 4.2 MB) from the NVIDIA Turing "
              "architecture whitepaper (TU104)."),
    Datasheet("A10G", ("A10G",), "Ampere", "8.6", 80, 6.3, 24, "GDDR6", 0.600,
              35.0, 35, 70, 70, None,
              "AWS EC2 G5 instance documentation (A10G: memory, bandwidth, tensor TF32 35 and FP16/BF16 70 TFLOP/s "
              "dense); SMs (80), boost clock and L2 (6 MiB, 6.3 MB) as the device reports",
              "NVIDIA publishes no A10G datasheet. FP32 is computed, not quoted: 80 SMs x 128 lanes x 2 FLOP x "
              "1.71 GHz = 35.0 TFLOP/s. The NVIDIA A10 is a different card (72 SMs, 31.2 TFLOP/s FP32)."),
    Datasheet("RTX 4090", ("RTX 4090",), "Ada Lovelace", "8.9", 128, 75.5, 24, "GDDR6X", 1.008,
              82.6, 82.6, 165.2, 165.2, 330.3,
              "NVIDIA Ada Lovelace architecture whitepaper, Table 2 (FP32 accumulation, dense)",
              "GeForce cards run FP16/BF16 matmul with FP32 accumulation at half the FP16-accumulate rate. L2: 72 MiB "
              "(75.5 MB), same whitepaper."),
    Datasheet("B200", ("B200",), "Blackwell", "10.0", 148, 132.1, 180, "HBM3e", 8.0,
              75, 1100, 2250, 2250, 4500,
              "NVIDIA HGX B200 specifications (nvidia.com/en-us/data-center/hgx), per GPU of 8: memory, bandwidth, "
              "FP32 (600 TFLOP/s / 8); tensor rates from the NVIDIA Blackwell architecture technical brief (HGX B200 "
              "at 1000 W, dense: TF32 1.1, BF16/FP16 2.25, FP8 4.5 PFLOP/s)",
              "SMs and L2 are not on the datasheet: 148 SMs and 126 MiB (132.1 MB) are what the device reports. "
              "The technical brief gives 80 TFLOP/s FP32 at 1000 W against the HGX page's 75."),
)

# Boost SM clocks from the vendors' datasheets (MHz), for GPUs that are not attached (the attached one reports its own).
_BOOST_CLOCK_MHZ = {"H100 SXM": 1980, "H100 PCIe": 1755, "H200": 1980, "A100 40GB": 1410, "A100 80GB": 1410,
                    "L4": 2040, "L40S": 2520, "T4": 1590, "A10G": 1710, "RTX 4090": 2520}
DATASHEET = tuple(dataclasses.replace(row, boost_clock_mhz=_BOOST_CLOCK_MHZ.get(row.name)) for row in DATASHEET)


# --------------------------------------------------------------------------------------------
# What one SM offers, by compute capability (NVIDIA CUDA C++ Programming Guide, "Technical Specifications
# per Compute Capability"): for GPUs that are not attached; the attached one reports its own.
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SmShape:
    fp32_lanes: int  # FP32 FMA lanes (2 FLOPs each per clock)
    smem_bytes: int  # the most shared memory one block may use
    max_threads: int  # resident threads
    registers: int = 65536  # 32-bit registers
    smem_per_sm_kib: int = 0  # the most shared memory one SM can give all its blocks, KiB
    l1_smem_kib: int = 0  # L1 and shared memory together, KiB
    sfu_lanes: int = 16  # special-function lanes (exp, reciprocal, sin, ...)


SM_SHAPES = {
    (7, 0): SmShape(64, 96 * 1024, 2048, smem_per_sm_kib=96, l1_smem_kib=128),
    (7, 5): SmShape(64, 64 * 1024, 1024, smem_per_sm_kib=64, l1_smem_kib=96),
    (8, 0): SmShape(64, 163 * 1024, 2048, smem_per_sm_kib=164, l1_smem_kib=192),
    (8, 6): SmShape(128, 99 * 1024, 1536, smem_per_sm_kib=100, l1_smem_kib=128),
    (8, 7): SmShape(128, 163 * 1024, 2048, smem_per_sm_kib=164, l1_smem_kib=192),
    (8, 9): SmShape(128, 99 * 1024, 1536, smem_per_sm_kib=100, l1_smem_kib=128),
    (9, 0): SmShape(128, 227 * 1024, 2048, smem_per_sm_kib=228, l1_smem_kib=256),
    (10, 0): SmShape(128, 227 * 1024, 2048, smem_per_sm_kib=228, l1_smem_kib=256),
    (12, 0): SmShape(128, 99 * 1024, 1536, smem_per_sm_kib=100, l1_smem_kib=128),
}


def compute_capability_tuple(compute_capability: str) -> tuple:
    """"9.0" -> (9, 0)."""
    try:
        major, minor = (compute_capability or "0.0").split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return 0, 0


def sm_shape(compute_capability: str) -> SmShape:
    """The SM of this compute capability, or of the nearest older one in the table (an A100's below that)."""
    cc = compute_capability_tuple(compute_capability)
    known = [k for k in SM_SHAPES if k <= cc]
    return SM_SHAPES[max(known)] if known else SM_SHAPES[(8, 0)]


L1_BYTES_PER_CLOCK = 128  # one SM's L1/shared memory moves 128 bytes (one wavefront) per clock
LSU_INSTR_PER_CLOCK = 1.0  # one warp-wide load/store instruction issued per clock per SM


def clock_hz(target: "Target") -> float:
    """The SM clock the FMA ceiling implies: FMA TFLOP/s = SMs x lanes x 2 FLOPs x clock."""
    return target.ceilings.fma_tflops * 1e12 / (target.sm_count * 2 * sm_shape(target.compute_capability).fp32_lanes)


def device_sm_count(device, in_interpreter: int) -> int:
    """SMs of a CUDA device; on the CPU (Triton's interpreter) `in_interpreter`, a few programs' worth."""
    if getattr(device, "type", str(device)) != "cuda":
        return in_interpreter
    import torch

    return torch.cuda.get_device_properties(device).multi_processor_count


# --------------------------------------------------------------------------------------------
# Launch cost: what a model charges each kernel launch before the probes have measured it
# --------------------------------------------------------------------------------------------
KERNEL_LAUNCH_US = 3.0  # a kernel's start, its first loads' trip from memory and its last store, in us


def datasheet_for(name: str) -> Optional[Datasheet]:
    """The datasheet row whose aliases match the reported device name (longest alias wins)."""
    best, best_len = None, 0
    for row in DATASHEET:
        for alias in row.aliases + (row.name,):
            if alias.lower() in name.lower() and len(alias) > best_len:
                best, best_len = row, len(alias)
    return best


def datasheet_by_name(name: str) -> Datasheet:
    for row in DATASHEET:
        if row.name == name:
            return row
    raise KeyError(f"no datasheet row named {name!r}; known: {', '.join(r.name for r in DATASHEET)}")


# --------------------------------------------------------------------------------------------
# The attached device
# --------------------------------------------------------------------------------------------
@dataclass
class GpuInfo:
    """What the attached device reports about itself (or why there is none)."""

    available: bool
    reason: str = ""  # why no GPU is usable, in words a learner can act on
    name: str = ""
    compute_capability: str = ""
    sm_count: int = 0
    l2_bytes: int = 0
    memory_bytes: int = 0
    shared_memory_per_sm_bytes: int = 0
    registers_per_sm: int = 0
    max_threads_per_sm: int = 0
    sm_clock_mhz: Optional[int] = None
    memory_clock_mhz: Optional[int] = None
    driver: str = ""
    cuda_runtime: str = ""

    @property
    def key(self) -> str:
        """A file-name-safe identifier used for caches and recordings ("nvidia-h100-80gb-hbm3")."""
        return slug(self.name) if self.available else "no-gpu"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def _nvidia_smi(query: str) -> Optional[str]:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def _int_or_none(text: Optional[str]) -> Optional[int]:
    try:
        return int(float(text)) if text not in (None, "", "[N/A]") else None
    except ValueError:
        return None


@functools.lru_cache(maxsize=1)
def detect() -> GpuInfo:
    """Read the first CUDA device. Never raises: without a GPU the reason is in `.reason`."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a hard requirement
        return GpuInfo(False, f"PyTorch is not installed ({exc}).")
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        return GpuInfo(False, f"No CUDA GPU found (torch {torch.__version__}, {build}). "
                              "Live runs are off; the models and the recorded runs of real GPUs still work.")
    p = torch.cuda.get_device_properties(0)
    smi = _nvidia_smi("driver_version,clocks.max.sm,clocks.max.memory")
    driver, sm_clock, mem_clock = (smi.split(", ") + [None, None, None])[:3] if smi else (None, None, None)
    return GpuInfo(
        available=True,
        name=p.name,
        compute_capability=f"{p.major}.{p.minor}",
        sm_count=p.multi_processor_count,
        l2_bytes=int(getattr(p, "L2_cache_size", 0)),
        memory_bytes=int(p.total_memory),
        shared_memory_per_sm_bytes=int(getattr(p, "shared_memory_per_multiprocessor", 0)),
        registers_per_sm=int(getattr(p, "regs_per_multiprocessor", 0)),
        max_threads_per_sm=int(getattr(p, "max_threads_per_multi_processor", 0)),
        sm_clock_mhz=_int_or_none(sm_clock) or _int_or_none(str(getattr(p, "clock_rate", "") or "")),
        memory_clock_mhz=_int_or_none(mem_clock),
        driver=driver or "",
        cuda_runtime=str(torch.version.cuda or ""),
    )


def free_memory_bytes() -> int:
    """Free device memory now (0 without a GPU)."""
    import torch

    if not torch.cuda.is_available():
        return 0
    free, _total = torch.cuda.mem_get_info()
    return int(free)


def software_versions() -> dict:
    import torch

    versions = {"torch": torch.__version__, "python": ".".join(map(str, __import__("sys").version_info[:3]))}
    try:
        import triton

        versions["triton"] = triton.__version__
    except ImportError:
        versions["triton"] = None
    versions["cuda"] = torch.version.cuda
    return versions


# --------------------------------------------------------------------------------------------
# Measured ceilings
# --------------------------------------------------------------------------------------------
MATMUL_DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")


@dataclass
class Ceilings:
    """The rates a model may assume, and where they came from.

    `source` is "measured" (calibrated on the GPU), "recorded" (calibrated earlier on this GPU
    kind and committed) or "datasheet" (vendor figures, when nothing was measured).
    """

    copy_tbps: float  # device-to-device copy, bytes read + bytes written per second / 1e12
    fma_tflops: float  # plain FP32 FMA rate on the CUDA cores
    matmul_tflops: dict = field(default_factory=dict)  # dtype -> TFLOP/s (missing: unsupported)
    source: str = "datasheet"
    gpu: str = ""
    date: str = ""
    versions: dict = field(default_factory=dict)
    details: dict = field(default_factory=dict)  # how each figure was measured (sizes, ms)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Ceilings":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def from_datasheet(cls, sheet: Datasheet) -> "Ceilings":
        rates = {d: sheet.matmul_tflops(d) for d in MATMUL_DTYPES if sheet.matmul_tflops(d)}
        return cls(copy_tbps=sheet.bandwidth_tbps, fma_tflops=sheet.fp32_tflops, matmul_tflops=rates,
                   source="datasheet", gpu=sheet.name)


def cache_dir(kind: str) -> Path:
    """This machine's folder for what is measured once per GPU (ROOFLINE_CACHE, else ~/.cache/roofline)."""
    base = os.environ.get("ROOFLINE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "roofline")
    return Path(base) / kind


def _cache_dir() -> Path:
    return cache_dir("ceilings")


def ceilings_cache_path(gpu_key: str) -> Path:
    return _cache_dir() / f"{gpu_key}.json"


def recorded_ceilings_path(gpu_key: str) -> Path:
    return RECORDED_DIR / gpu_key / "ceilings.json"


def load_ceilings(gpu_key: str) -> Optional[Ceilings]:
    """Measured ceilings for this GPU kind: the local cache first, then the committed recording."""
    for path, source in ((ceilings_cache_path(gpu_key), "measured"), (recorded_ceilings_path(gpu_key), "recorded")):
        if path.exists():
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            ceilings = Ceilings.from_dict(data)
            ceilings.source = source
            return ceilings
    return None


def save_ceilings(ceilings: Ceilings, gpu_key: str, record: bool = False) -> Path:
    path = recorded_ceilings_path(gpu_key) if record else ceilings_cache_path(gpu_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(ceilings.to_dict(), indent=2) + "\n")
    return path


def recorded_gpu_keys() -> list[str]:
    """GPU kinds that have committed calibrations, e.g. ["nvidia-h100-80gb-hbm3"]."""
    if not RECORDED_DIR.exists():
        return []
    return sorted(p.parent.name for p in RECORDED_DIR.glob("*/ceilings.json"))


# --------------------------------------------------------------------------------------------
# Targets: what a model predicts for
# --------------------------------------------------------------------------------------------
@dataclass
class Target:
    """A GPU as a model sees it: its shape (SMs, caches, memory) and the ceilings to assume."""

    name: str
    key: str
    sm_count: int
    l2_bytes: int
    memory_bytes: int
    compute_capability: str
    ceilings: Ceilings
    datasheet: Optional[Datasheet]
    live: bool  # True when this is the attached GPU, so `measure` can run

    @property
    def ridge_flop_per_byte(self) -> float:
        return self.ceilings.fma_tflops * 1e12 / (self.ceilings.copy_tbps * 1e12)

    def describe_ceilings(self) -> str:
        c = self.ceilings
        where = {"measured": "measured on this GPU", "recorded": f"recorded on the {c.gpu} on {c.date[:10]}",
                 "datasheet": "from the datasheet, not measured yet"}.get(c.source, c.source)
        return f"{c.copy_tbps:.2f} TB/s copy, {c.fma_tflops:.1f} TFLOP/s FP32 FMA, {where}"


def live_target() -> Optional[Target]:
    """The attached GPU as a Target, with the best ceilings known for it (None without a GPU)."""
    info = detect()
    if not info.available:
        return None
    sheet = datasheet_for(info.name)
    ceilings = load_ceilings(info.key)
    if ceilings is None:
        ceilings = Ceilings.from_datasheet(sheet) if sheet else _rough_ceilings(info)
    return Target(info.name, info.key, info.sm_count, info.l2_bytes, info.memory_bytes, info.compute_capability,
                  ceilings, sheet, live=True)


def _rough_ceilings(info: GpuInfo) -> Ceilings:
    """For a GPU with no datasheet row and no calibration: placeholders that say so."""
    return Ceilings(copy_tbps=1.0, fma_tflops=10.0, source="unknown GPU: calibrate it on the Your GPU page",
                    gpu=info.name)


def datasheet_target(sheet: Datasheet) -> Target:
    """A datasheet GPU as a Target: measured ceilings if this kind was recorded, else its datasheet."""
    key = _recorded_key_for(sheet)
    ceilings = (load_ceilings(key) if key else None) or Ceilings.from_datasheet(sheet)
    return Target(sheet.name, key or slug(sheet.name), sheet.sm_count, int(sheet.l2_mb * MB),
                  int(sheet.memory_gb * GB), sheet.compute_capability, ceilings, sheet, live=False)


def _recorded_key_for(sheet: Datasheet) -> Optional[str]:
    for key in recorded_gpu_keys():
        row = datasheet_for(key.replace("-", " "))
        if row is sheet:
            return key
    return None


def available_targets() -> list[Target]:
    """The attached GPU first (if any), then every datasheet GPU."""
    targets = []
    live = live_target()
    if live:
        targets.append(live)
    for sheet in DATASHEET:
        if live and live.datasheet is sheet:
            continue
        targets.append(datasheet_target(sheet))
    return targets


def ceilings_vs_datasheet(ceilings: Ceilings, sheet: Optional[Datasheet]) -> list[dict]:
    """One row per ceiling: what was measured, what the datasheet promises, and their ratio."""
    rows = [("copy bandwidth", "TB/s", ceilings.copy_tbps, sheet.bandwidth_tbps if sheet else None),
            ("FP32 FMA (CUDA cores)", "TFLOP/s", ceilings.fma_tflops, sheet.fp32_tflops if sheet else None)]
    for dtype in MATMUL_DTYPES:
        measured = ceilings.matmul_tflops.get(dtype)
        promised = sheet.matmul_tflops(dtype) if sheet else None
        if measured is not None or promised is not None:
            label = "FP32 matmul (no tensor cores)" if dtype == "fp32" else f"{dtype.upper()} matmul (tensor cores)"
            rows.append((label, "TFLOP/s", measured, promised))
    return [{"ceiling": name, "unit": unit, "measured": m, "datasheet": d,
             "measured / datasheet": (m / d if m is not None and d else None)} for name, unit, m, d in rows]


def gpu_properties(info: GpuInfo) -> list[dict]:
    """The device's own report, as label/value rows for a table."""
    def size(nbytes):
        return f"{nbytes / GiB:.1f} GiB" if nbytes >= GiB else f"{nbytes / MiB:.0f} MiB" if nbytes >= MiB else f"{nbytes / 1024:.0f} KiB"

    rows = [("name", info.name), ("compute capability", info.compute_capability), ("SMs", info.sm_count),
            ("L2 cache", size(info.l2_bytes)), ("device memory", size(info.memory_bytes)),
            ("shared memory per SM", size(info.shared_memory_per_sm_bytes)),
            ("32-bit registers per SM", info.registers_per_sm), ("max resident threads per SM", info.max_threads_per_sm),
            ("max SM clock", f"{info.sm_clock_mhz} MHz" if info.sm_clock_mhz else "not readable"),
            ("max memory clock", f"{info.memory_clock_mhz} MHz" if info.memory_clock_mhz else "not readable"),
            ("driver", info.driver or "not readable"), ("CUDA (torch build)", info.cuda_runtime)]
    return [{"property": k, "value": str(v)} for k, v in rows]


def datasheet_rows() -> list[dict]:
    """The whole datasheet table, for display."""
    return [{"GPU": r.name, "architecture": r.arch, "CC": r.compute_capability, "SMs": r.sm_count, "L2 (MB)": r.l2_mb,
             "memory (GB)": r.memory_gb, "memory": r.memory_type, "bandwidth (TB/s)": r.bandwidth_tbps,
             "FP32 (TFLOP/s)": r.fp32_tflops, "TF32": r.tf32_tflops, "FP16": r.fp16_tflops, "BF16": r.bf16_tflops,
             "FP8": r.fp8_tflops, "source": r.source + (f" Note: {r.note}" if r.note else "")} for r in DATASHEET]


def recorded_ceilings() -> list[Ceilings]:
    """The committed calibrations of every recorded GPU kind."""
    found = []
    for key in recorded_gpu_keys():
        data = json.loads(recorded_ceilings_path(key).read_text())
        ceilings = Ceilings.from_dict(data)
        ceilings.source = "recorded"
        found.append(ceilings)
    return found
