"""
The training-memory lab's measurement: the model's gradients checked against float64 on a small odd shape, then
two real training steps per point, the second's memory read from torch's allocator counters.
"""

from __future__ import annotations

import dataclasses

import torch

from labs.engine.gpu import GB, Target, free_memory_bytes
from labs.engine.params import ParamError
from labs.trainmem.kernels import MixedPrecisionAdam, loss_of, make_model, parameters
from labs.trainmem.model import step_model


def check(p, target: Target) -> None:
    if p.d_model % p.n_heads:
        raise ParamError(f"n_heads = {p.n_heads} does not divide d_model = {p.d_model}.")
    worst = max(step_model(p, b, c)["peak_bytes"] for b in p.batch for c in p.checkpointing)
    free = free_memory_bytes() if target.live else target.memory_bytes
    if worst > 0.85 * free:
        raise ParamError(f"The largest step needs about {worst / GB:.1f} GB; this GPU has {free / GB:.1f} GB free. "
                         "Choose a smaller batch, seq or model.")


def batch_data(p, batch: int, device, seed: int):
    g = torch.Generator(device=device).manual_seed(seed)
    ids = torch.randint(0, p.vocab, (batch, p.seq), generator=g, device=device)
    return ids, torch.roll(ids, -1, dims=1)  # predict the next token


def measure_step(p, batch: int, checkpointing: bool, device="cuda") -> dict:
    """Two real steps (the first warms up); the second's memory, read from torch's allocator counters."""
    torch.cuda.empty_cache()
    ids, targets = batch_data(p, batch, device, seed=batch)
    base = torch.cuda.memory_allocated()  # the inputs are not the model's: count from here
    model = make_model(p, device)
    opt = MixedPrecisionAdam(parameters(model))
    losses = []
    for _ in range(2):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        loss = loss_of(model, ids, targets, p.n_heads, checkpointing)
        after_forward = torch.cuda.memory_allocated()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        del loss
    torch.cuda.synchronize()
    row = {"measured_peak_bytes": torch.cuda.max_memory_allocated() - base, "measured_state_bytes": before - base,
           "measured_activation_bytes": after_forward - before, "loss_first": losses[0], "loss_second": losses[1]}
    del model, opt, ids, targets
    torch.cuda.empty_cache()
    return row


def check_training(p, device="cuda") -> float:
    """The model's gradients against float64 autograd on a small odd shape (attention, norms, loss and all)."""
    small = dataclasses.replace(p, seq=37, n_layers=2, d_model=48, n_heads=3, d_ff=72, vocab=101)
    model = make_model(small, device)
    ids, targets = batch_data(small, 3, device, seed=1)
    loss_of(model, ids, targets, small.n_heads, True).backward()  # the checkpointed path, rebuilt in backward
    model64 = make_model(small, device, torch.float64)
    with torch.no_grad():
        for a, b in zip(parameters(model64), parameters(model)):
            a.copy_(b.double())
    loss_of(model64, ids, targets, small.n_heads, False).backward()
    got = torch.cat([t.grad.flatten().double() for t in parameters(model)])
    ref = torch.cat([t.grad.flatten() for t in parameters(model64)])
    err = float((got - ref).norm() / ref.norm())
    if not err <= 5e-2:  # bf16 through two blocks and a softmax
        raise AssertionError(f"training step gradients: relative error {err:.3g} against float64 exceeds 5e-2")
    return err


def measure(p, target: Target, progress):
    total = len(p.batch) * len(p.checkpointing) + 1
    progress(0.0, "checking the model's gradients against float64 on a small odd shape")
    err = check_training(p)
    done = 1
    for ckpt in p.checkpointing:
        for batch in p.batch:
            progress(done / total, f"batch {batch}, checkpointing {'on' if ckpt else 'off'}: two training steps")
            row = measure_step(p, batch, ckpt)
            done += 1
            yield {"batch": batch, "checkpointing": ckpt, "check_rel_error": err, **row}
    progress(1.0, "done")
