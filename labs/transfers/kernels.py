"""
The transfers lab's copies: what moves the bytes between the host and the GPU.

What you will learn here:
- a copy is one call (`dst.copy_(src)`); from pinned memory it can be queued (`non_blocking=True`) and the copy
  engine moves it while the CPU goes on; from pageable memory the driver stages it through pinned buffers first;
- every copy is checked bit for bit (fresh random source, destination poisoned with NaN) before it is timed;
- a copy on a side stream runs at the same time as compute on the current one;
- staging by hand: what the driver is described to do with a pageable copy, written out step by step with the
  CUDA runtime's own calls (a CPU memcpy into a pinned buffer, then an asynchronous copy of that buffer).
"""

from __future__ import annotations

import statistics
import time

import torch

from labs.engine import timing
from labs.transfers.model import HAND_BUFFERS, HAND_PIECE_BYTES


def host_buffer(nbytes: int, pinned: bool) -> torch.Tensor:
    """A host buffer of nbytes (fp32 elements): pinned (page-locked, the copy engine reads it directly) or pageable."""
    return torch.empty(nbytes // 4, dtype=torch.float32, pin_memory=pinned)


def checked_copy(direction: str, host: torch.Tensor, device: torch.Tensor, n: int) -> float:
    """Fill the source with fresh random numbers, poison the destination, copy, compare bit for bit."""
    src, dst = (host[:n], device[:n]) if direction == "h2d" else (device[:n], host[:n])
    src.copy_(torch.randn(n, device=src.device))
    dst.fill_(float("nan"))
    dst.copy_(src)
    torch.cuda.synchronize()
    return timing.check_close(dst, src, "fp32", f"{direction} copy of {n * 4} bytes", tol=0.0)


def stream_copy_then_compute(copy, compute, side) -> None:
    """The copy queued on the side stream first, then the matmuls on the current one: both run at once."""
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        copy()
    compute()
    torch.cuda.current_stream().wait_stream(side)


class HandStager:
    """Pageable host -> device copies staged by hand: one CPU thread (this one) copies each piece of the source
    into one of HAND_BUFFERS pinned buffers (a plain memcpy), then queues the copy engine's copy of that buffer
    to the device (cudaMemcpyAsync) and an event behind it; a buffer is refilled only once its event has passed.
    The CUDA runtime is called through ctypes (the library torch has loaded), so each piece costs a few calls
    of C, not of PyTorch's Python layer. Raises RuntimeError where that library cannot be found."""

    def __init__(self):
        import ctypes

        self._ct = ctypes
        self.lib = _cudart()
        self.piece = HAND_PIECE_BYTES
        self.pinned = [torch.empty(self.piece, dtype=torch.uint8, pin_memory=True) for _ in range(HAND_BUFFERS)]
        self.events = []
        for _ in range(HAND_BUFFERS):
            event = ctypes.c_void_p()
            _cuda_ok(self.lib.cudaEventCreateWithFlags(ctypes.byref(event), 2), "cudaEventCreateWithFlags")
            self.events.append(event)  # flag 2: cudaEventDisableTiming (only ordering is needed)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, queue_times: list = None) -> None:
        """dst (on the GPU) <- src (pageable host memory), both contiguous, same size; returns when it is done.
        With `queue_times`, each piece's queueing calls are timed into it (seconds): see queue_us."""
        nbytes = src.numel() * src.element_size()
        stream = self._ct.c_void_p(torch.cuda.current_stream().cuda_stream)
        src_ptr, dst_ptr, lib = src.data_ptr(), dst.data_ptr(), self.lib
        for i, off in enumerate(range(0, nbytes, self.piece)):
            n, b = min(self.piece, nbytes - off), i % len(self.pinned)
            if i >= len(self.pinned):
                lib.cudaEventSynchronize(self.events[b])  # the engine has moved this buffer's last piece
            buf = self.pinned[b].data_ptr()
            self._ct.memmove(buf, src_ptr + off, n)  # the CPU's half: the piece into pinned memory
            started = time.perf_counter()
            lib.cudaMemcpyAsync(dst_ptr + off, buf, n, 1, stream)  # the engine's half (1: host to device)
            lib.cudaEventRecord(self.events[b], stream)
            if queue_times is not None:
                queue_times.append(time.perf_counter() - started)
        torch.cuda.current_stream().synchronize()

    def queue_us(self, dst: torch.Tensor, src: torch.Tensor, pieces: int = 8) -> float:
        """What the CPU spends queueing one piece, in microseconds: the runtime calls `copy` makes per piece
        besides its memcpy (cudaMemcpyAsync of the pinned buffer just filled, cudaEventRecord), timed inside one
        copy of up to `pieces` pieces, the median: timed alone, on an idle engine and a buffer not just written,
        the calls cost less than they do inside the copy (3.5 us on an H100 host)."""
        n = min(src.numel(), pieces * self.piece // src.element_size())
        times = []
        self.copy(dst[:n], src[:n], times)
        return 1e6 * statistics.median(times)

    def close(self) -> None:
        for event in self.events:
            self.lib.cudaEventDestroy(event)
        self.events = []


def _cudart():
    """The CUDA runtime library this process has loaded for torch, through ctypes, with the argument types of
    the few calls HandStager makes."""
    import ctypes
    import ctypes.util

    torch.cuda.init()
    paths = []
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "libcudart.so" in line})
    except OSError:
        pass
    name = paths[0] if paths else ctypes.util.find_library("cudart")
    if not name:
        raise RuntimeError("the CUDA runtime library (libcudart) was not found in this process")
    lib = ctypes.CDLL(name)
    lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.cudaEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.cudaEventSynchronize.argtypes = [ctypes.c_void_p]
    lib.cudaEventDestroy.argtypes = [ctypes.c_void_p]
    lib.cudaEventCreateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
    return lib


def _cuda_ok(code: int, what: str) -> None:
    if int(code) != 0:
        raise RuntimeError(f"{what} failed with CUDA error {int(code)}")
