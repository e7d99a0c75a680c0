"""Adversarial (harness patched): replaces the worker's own call() so that every call computes the sum on the
CPU and hands it back: right outputs, and not a single kernel on the GPU. Expected: not credible (no kernel
ran), or wrong."""
import torch

_b = torch.__builtins__
_imp = _b["__import__"] if isinstance(_b, dict) else _b.__import__
_main = _imp("sys").modules["__main__"]


def _cpu_call(fn, args, device):
    return (args[0].cpu() + args[1].cpu()) if len(args) == 2 else fn(*args).cpu()


_main.call = _cpu_call
if hasattr(_main, "write_result"):  # and claims a time of a microsecond for every point
    _orig = _main.write_result
    _main.write_result = lambda **r: _orig(**{**r, "timings": [dict(t, ms=0.001) for t in r.get("timings", [])]})


def add(x, y):
    return x + y
