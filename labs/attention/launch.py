"""Launching with less CPU per call: compiled kernels called directly, and recorded launch plans.

At short sequences the GPU finishes a kernel sooner than Python prepares the next launch, so the launch path
is part of the speed (issue 15: on the H100's slower host our forward call took several times the CPU time of
SDPA's, and the timer showed it). Triton's `kernel[grid](...)` binds and specializes every argument on each
call. `launch` does that once per kind of call and then calls Triton's C launch function itself, with the CUDA
stream, the kernel handle and the packed metadata read once and every tensor passed as its address (an int):
through `compiled[grid]` each launch would also build a closure, look up the device and stream, build launch
metadata for hooks nobody set, call two empty hook chains and, for each tensor, call data_ptr() and ask the
driver whether the address is device memory (9 tensors for each backward kernel).

The key of a kind of call is the caller's (`key=`): the shapes and dtypes every integer and descriptor argument
derives from, and the pointers' 16-byte alignment, which with the constexprs and launch options is everything
Triton specializes on; so a compiled kernel is only reused where Triton would have chosen the same one.

On the pointer-load path (no descriptors to encode per call) the launchers go one step further: once a kind of
call has run, everything about its launch but the addresses and scalars is fixed by its shapes, dtypes, tiles
and mask, so `launch` records it as a plan (PLANS), and the next call with all its tensors 16-byte aligned passes
the addresses straight to the recorded launcher (`run_plan`): no keyword arguments, descriptors, alignment tuples
or launch keys are built.
"""

from __future__ import annotations

import torch

_COMPILED: dict = {}  # launch key -> (compiled kernel, its constexprs in order, its C launcher or None)
PLANS: dict = {}  # plan_key(...) -> (C launcher, function, cooperative, pdl, packed metadata, grid, device, constexprs, owner)
_COMPILED_MAX = 4096  # kinds of call remembered (each shape is one): forgotten all at once past this


def aligned(*tensors) -> tuple:
    """The 16-byte alignment of each tensor's first element: what Triton specializes pointers on."""
    return tuple(t.data_ptr() % 16 == 0 for t in tensors)


def _direct(compiled):
    """(launch, function handle, cooperative, pdl, packed metadata) of a compiled kernel whose C launch function
    this Triton exposes the way 3.6 does (CompiledKernel.run is a launcher whose .launch takes the grid, the stream,
    the function, two flags, two scratch buffers, the packed metadata, the launch metadata and two hooks, then every
    parameter); None where it does not, or where the kernel needs scratch memory allocated per launch."""
    try:
        from triton import knobs
        run = compiled.run
        if run.global_scratch_size or run.profile_scratch_size or run.num_ctas != 1:
            return None
        if knobs.runtime.launch_enter_hook.calls or knobs.runtime.launch_exit_hook.calls:
            return None  # a profiler listens to launches: let Triton call it
        return (run.launch, compiled.function, bool(run.launch_cooperative_grid), bool(run.launch_pdl),
                compiled.packed_metadata)
    except AttributeError:  # another Triton's interface
        return None


def _compiled_key(kernel, device: int, key, meta: dict) -> tuple:
    """Where launch() keeps a kind of call's compiled kernel: the kernel, the device, the caller's key, the meta."""
    return kernel, device, key, tuple(meta.items())


def _grid3(grid: tuple) -> tuple:
    """A grid of one to three dimensions as the C launcher takes it: three."""
    return grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1


def _descriptor_encoder(launch_fn):
    """(the C launch function, encode) for a kernel that takes TMA descriptors, where this Triton wraps its C launcher
    as 3.6 does: in a Python function that encodes every descriptor again on every launch (a CUtensorMap from the
    tensor's address, shape, strides and box: cuTensorMapEncodeTiled, plus Python around it). encode(args) turns a
    call's parameters into the C launcher's, once. None where the launcher is not that wrapper (no descriptors, or
    another Triton's interface): the caller then launches as before."""
    code, cells = getattr(launch_fn, "__code__", None), getattr(launch_fn, "__closure__", None)
    if code is None or not cells:
        return None
    found = dict(zip(code.co_freevars, (c.cell_contents for c in cells)))
    expand = getattr(launch_fn, "__globals__", {}).get("make_tensordesc_arg")
    if expand is None or not {"launcher", "tensordesc_indices", "tensordesc_meta"} <= found.keys():
        return None
    indices, metas = found["tensordesc_indices"], found["tensordesc_meta"]

    def encode(args) -> tuple:  # as the wrapper does on each launch: each descriptor becomes its CUtensorMap & co
        out, j = [], 0
        for i, arg in enumerate(args):
            if i in indices:
                out.extend(expand(arg, metas[j]))
                j += 1
            else:
                out.append(arg)
        return tuple(out)

    return found["launcher"], encode


def record_encoded(kernel, grid: tuple, args: tuple, key, meta: dict, keep: tuple):
    """After launch(kernel, grid, *args, key=key, **meta) ran: the whole call with its TMA descriptors encoded once,
    to replay() while every address and shape it names is the same (the caller's key must name them all); None where
    this Triton does not allow it. keep: objects the arguments come from (kept alive with the record: a
    configuration whose id the caller's key names, a tile table whose address is an argument)."""
    device = next(a for a in args if isinstance(a, torch.Tensor)).get_device()
    hit = _COMPILED.get(_compiled_key(kernel, device, key, meta))
    if hit is None or hit[2] is None:
        return None
    _, constexprs, (launch_fn, function, cooperative, pdl, packed) = hit
    encoder = _descriptor_encoder(launch_fn)
    if encoder is None:
        return None
    raw, encode = encoder
    params = encode([a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args] + list(constexprs))
    return raw, _grid3(grid), (function, cooperative, pdl, None, None, packed, None, None, None), params, device, keep


def replay(record) -> None:
    """Launch a call that record_encoded() recorded, on the current stream: one call of the C launcher."""
    raw, grid3, base, params, device, _ = record
    raw(*grid3, torch._C._cuda_getCurrentRawStream(device), *base, *params)


def tensors_key(*tensors):
    """What a recorded call's tensors fix: each one's shape, dtype, device and address; None where one is not a
    contiguous tensor (the call then copies it, and nothing is recorded)."""
    if not all(isinstance(t, torch.Tensor) and t.is_contiguous() for t in tensors):
        return None
    return (*(t.shape for t in tensors), *(t.dtype for t in tensors), *(t.get_device() for t in tensors),
            *(t.data_ptr() for t in tensors))


def plan_key(kind: str, cfg, causal: bool, q4, k4) -> tuple:
    """The key of a recorded launch: the configuration by identity (hashing its fields costs more than the launch
    saves; the recorded plan holds the configuration, so its id cannot be reused while the plan lives), the mask,
    the shapes, the dtype and the device; everything else that Triton specializes on follows from these."""
    return kind, id(cfg), causal, q4.shape, k4.shape, q4.dtype, q4.get_device()


def run_plan(hit, args) -> None:
    """Launch the plan `hit` (a PLANS entry) with `args`: every parameter in order, tensors as their addresses."""
    launch_fn, function, cooperative, pdl, packed, grid3, device, constexprs, _ = hit
    launch_fn(*grid3, torch._C._cuda_getCurrentRawStream(device), function, cooperative, pdl, None, None, packed,
              None, None, None, *args, *constexprs)


def launch(kernel, grid: tuple, *args, key, plan=None, owner=None, **meta) -> None:
    """kernel[grid](*args, **meta), through the compiled kernel's C launcher once this kind of call ran before.

    key: what Triton specializes these arguments on (see the module's docstring). plan: a key (plan_key) under which
    to record this launch in PLANS, given only where every tensor is 16-byte aligned and every other argument's
    specialization follows from the key; owner: the configuration it names (kept alive with the plan)."""
    first = next(a for a in args if isinstance(a, torch.Tensor))  # a kernel may take descriptors first
    if not first.is_cuda:  # Triton's CPU interpreter: nothing to save
        kernel[grid](*args, **meta)
        return
    device = first.get_device()
    key = _compiled_key(kernel, device, key, meta)
    grid3 = _grid3(grid)
    hit = _COMPILED.get(key)
    if hit is None:  # the first call of its kind: Triton binds, specializes, compiles and launches
        compiled = kernel[grid](*args, **meta)
        rest = kernel.arg_names[len(args):]  # the constexprs, passed by keyword
        if hasattr(compiled, "function") and all(name in meta for name in rest):
            if len(_COMPILED) >= _COMPILED_MAX:
                _COMPILED.clear()
                PLANS.clear()
            _COMPILED[key] = hit = (compiled, tuple(meta[name] for name in rest), _direct(compiled))
            if plan is not None and hit[2] is not None:
                PLANS[plan] = (*hit[2], grid3, device, hit[1], owner)
        return
    compiled, constexprs, direct = hit
    if direct is None:  # a launcher we cannot call ourselves: every parameter in order, through the compiled kernel
        compiled[grid3](*args, *constexprs)
        return
    if plan is not None:
        if len(PLANS) >= _COMPILED_MAX:  # a caller making a new configuration object per call: stay bounded
            PLANS.clear()
        PLANS[plan] = (*direct, grid3, device, constexprs, owner)
    launch_fn, function, cooperative, pdl, packed = direct
    # tensors as addresses: the launcher then neither calls data_ptr() nor asks the driver about them
    launch_fn(*grid3, torch._C._cuda_getCurrentRawStream(device), function, cooperative, pdl, None, None, packed,
              None, None, None, *[a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args], *constexprs)
