"""The counting worker: runs inside the sandbox, beside harness.py, in Triton's interpreter (TRITON_INTERPRET=1).

    python interpret_worker.py ... WORKDIR        (the last argument is the run's folder)

For each timing point of the exercise it calls the learner's function once, at the point's real size, with
CPU tensors. Every kernel launch is recorded: its name, grid, num_warps, num_stages and constexpr values.
Inside a launch, only a sample of evenly spread programs (the first and the last among them) runs; each
sampled program's loads and stores (bytes of the lanes its masks let through, and the lanes masked off),
its tl.dot work and its exponentials are counted through the interpreter's own builder methods. The app
scales the sample up to the whole grid (labs.workbench.interpret). The other programs return at once, so the
outputs are not the answer: correctness is checked by harness.py, in its own run.

Nothing here imports the repository: the sandbox hides it. The counts come from the learner's process, so
they teach; they never decide a verdict.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import signal
import sys
import time
import traceback
import types
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported: @triton.jit then builds interpreted functions
for _threads in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):  # one thread: a BLAS pool on a busy CPU crawls
    os.environ.setdefault(_threads, "1")

WORK = Path(sys.argv[-1]) if len(sys.argv) > 1 else Path.cwd()
QUANTITIES = ("load_bytes", "store_bytes", "load_lanes", "masked_load_lanes", "store_lanes", "masked_store_lanes",
              "load_calls", "store_calls", "dot_flops", "dot_operand_bytes", "exps")


def write_result(**result) -> None:
    (WORK / "result.json").write_text(json.dumps(result))


class Counter:
    """The launches of one timing point, and the program being counted now (None between programs)."""

    def __init__(self) -> None:
        self.launches: list = []
        self.program: dict | None = None

    def memory(self, kind: str, ptrs, mask) -> None:
        if self.program is None:
            return
        import numpy as np

        lanes = int(np.size(ptrs.data))
        active = lanes if mask is None else int(np.count_nonzero(np.broadcast_to(mask.data, np.shape(ptrs.data))))
        size = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
        p = self.program
        p[f"{kind}_bytes"] += active * size
        p[f"{kind}_lanes"] += active
        p[f"masked_{kind}_lanes"] += lanes - active
        p[f"{kind}_calls"] += 1

    def dot(self, a, b) -> None:
        if self.program is None:
            return
        m, k = a.data.shape[-2], a.data.shape[-1]
        n = b.data.shape[-1]
        batch = int(a.data.size // (m * k)) if m * k else 1
        self.program["dot_flops"] += 2 * batch * m * n * k
        self.program["dot_operand_bytes"] += (a.data.size * a.dtype.primitive_bitwidth
                                              + b.data.size * b.dtype.primitive_bitwidth) // 8

    def exp(self, arg) -> None:
        if self.program is not None:
            self.program["exps"] += int(arg.data.size)


def sample_of(programs: int, samples: int) -> set:
    """Evenly spread program numbers (the first and the last among them); every program when there are few."""
    if programs <= samples:
        return set(range(programs))
    return {round(i * (programs - 1) / (samples - 1)) for i in range(samples)}


def install(counter: Counter, samples: int) -> None:
    """Count through the interpreter's builder; run only a sample of each launch's programs."""
    import numpy as np
    from triton.runtime import interpreter as interp

    builder = interp.InterpreterBuilder
    load, store, dot = builder.create_masked_load, builder.create_masked_store, builder.create_dot
    exp, exp2 = builder.create_exp, builder.create_exp2

    def masked_load(self, ptrs, mask, other, *rest, **kw):
        counter.memory("load", ptrs, mask)
        return load(self, ptrs, mask, other, *rest, **kw)

    def masked_store(self, ptrs, value, mask, *rest, **kw):
        counter.memory("store", ptrs, mask)
        return store(self, ptrs, value, mask, *rest, **kw)

    def counted_dot(self, a, b, d, *rest, **kw):
        counter.dot(a, b)
        if a.data.dtype == b.data.dtype == np.float16 and d.data.dtype == np.float32:
            # numpy multiplies float16 without BLAS (seconds per tile): the same product through float32
            product = np.matmul(a.data.astype(np.float32), b.data.astype(np.float32))
            return interp.TensorHandle(product + d.data, d.dtype.scalar)
        return dot(self, a, b, d, *rest, **kw)

    def counted_exp(self, arg):
        counter.exp(arg)
        return exp(self, arg)

    def counted_exp2(self, arg):
        counter.exp(arg)
        return exp2(self, arg)

    builder.create_masked_load, builder.create_masked_store, builder.create_dot = masked_load, masked_store, counted_dot
    builder.create_exp, builder.create_exp2 = counted_exp, counted_exp2

    def run(self, *args, grid, warmup, **kwargs):
        if warmup:
            return None
        fn = self.rewrite()
        constexprs = {k: v for k, v in kwargs.items() if isinstance(v, (int, float, bool, str)) and
                      k not in ("num_warps", "num_stages", "num_ctas")}
        launch = {"kernel": self.fn.__name__, "num_warps": int(kwargs.get("num_warps") or 4),
                  "num_stages": int(kwargs.get("num_stages") or 3), "constexprs": constexprs, "sampled": []}
        counter.launches.append(launch)

        quantities, pick = QUANTITIES, sample_of  # closure variables: the wrapper runs with the kernel's globals

        def sampled(**named):
            b = interp.interpreter_builder
            (gx, gy, gz), (x, y, z) = b.grid_dim, b.grid_idx
            programs = gx * gy * gz
            if "grid" not in launch:
                launch.update(grid=[gx, gy, gz], programs=programs, wanted=pick(programs, samples))
            number = x + gx * (y + gy * z)
            if number not in launch["wanted"]:
                return None
            counter.program = dict.fromkeys(quantities, 0) | {"program": number}
            try:
                return fn(**named)
            finally:
                launch["sampled"].append(counter.program)
                counter.program = None

        # the interpreter looks for triton.language among the function's globals: the kernel's own
        sampled = types.FunctionType(sampled.__code__, fn.__globals__, fn.__name__, None, sampled.__closure__)
        sampled.__signature__ = inspect.signature(fn)  # GridExecutor binds the launch's arguments by this
        sampled.__annotations__ = dict(getattr(fn, "__annotations__", {}))
        try:
            executor = interp.GridExecutor(sampled, self.arg_names, grid, self.pre_run_hooks)
        except TypeError:  # older Triton: no pre-run hooks
            executor = interp.GridExecutor(sampled, self.arg_names, grid)
        result = executor(*args, **kwargs)
        launch.pop("wanted", None)
        return result

    interp.InterpretedFunction.run = run


def load_solution(entry: str):
    spec = importlib.util.spec_from_file_location("solution", WORK / "solution.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, entry, None)
    if not callable(fn):
        raise LookupError(f"solution.py must define a function named {entry}(...)")
    return fn


def make_input(spec, torch):
    if not isinstance(spec, dict):
        return spec
    return torch.randn(spec["shape"], dtype=torch.float32).to(getattr(torch, spec["dtype"]))


def where_it_broke(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.endswith("solution.py")]
    line = f"solution.py line {frames[-1].lineno}: " if frames else ""
    return f"{line}{type(exc).__name__}: {str(exc)[:500]}"


def out_of_cpu_time(signum, frame) -> None:
    write_result(status="error", message="The interpreted count used up its CPU-time limit.")
    os._exit(3)


def main() -> None:
    signal.signal(signal.SIGXCPU, out_of_cpu_time)
    started = time.monotonic()
    job = json.loads((WORK / "job.json").read_text())
    counter = Counter()
    try:
        install(counter, int(job.get("samples", 12)))
        import torch

        fn = load_solution(job["entry"])
        points = []
        for point in job["points"]:
            counter.launches = []
            args = [make_input(a, torch) for a in point["args"]]
            fn(*args)
            points.append({"label": point["label"], "launches": counter.launches})
            del args
    except BaseException as exc:  # noqa: BLE001 - the learner's code: whatever it raises is the message
        write_result(status="error", message=where_it_broke(exc))
        return
    write_result(status="ok", points=points, seconds=time.monotonic() - started)


if __name__ == "__main__":
    main()
