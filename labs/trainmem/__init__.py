"""
Training memory: what a training step keeps on the GPU, with ZeRO over many GPUs
=================================================================================

What you will learn:
- what training keeps that inference does not: gradients (one per weight), Adam's two fp32 moments and,
  under mixed precision, an fp32 master copy of the weights: 2 + 2 + 4 + 8 = 16 bytes per parameter for
  bf16 weights, before a single activation;
- the activations the backward pass needs, counted tensor by tensor for a Llama-style block, and what
  activation checkpointing leaves of them (each block's input; one block is rebuilt at a time);
- how ZeRO shards those 16 bytes over N data-parallel GPUs: stage 1 the optimizer states (12 bytes),
  stage 2 also the gradients, stage 3 also the weights;
- why the rule of thumb "training needs about 6x the memory of inference" is only a rough case.

The calculator needs no GPU. The lab checks it on the GPU: a small Llama-style model (bf16 weights,
fp32 master weights and Adam moments) takes real training steps, and torch.cuda.max_memory_allocated is
compared with the model's peak, part by part (model state, saved activations, the peak itself).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from labs import memcalc
from labs.memcalc import activation_parts, block_numbers_per_token, block_small_bytes_per_token  # noqa: F401
from labs.engine.gpu import GB, Target, datasheet_by_name, free_memory_bytes
from labs.engine.lab import Headline, Lab
from labs.engine.params import ParamError, param

ZERO_STAGES = (0, 1, 2, 3)
ADAM_TEMP_NUMBERS = 2  # our update makes an fp32 copy of one gradient and one fp32 denominator at a time
EPS = 1e-6


# ---------------------------------------------------------------------------------------------
# Activations: what autograd keeps for a Llama-style block (as written in `block` below)
# ---------------------------------------------------------------------------------------------
def block_backward_bytes_per_token(d: int, ff: int, act_bytes: float = 2.0) -> float:
    """Gradients alive at once inside a block's backward: the MLP's 4 ff plus a few d-wide ones."""
    return (4 * ff + 3 * d) * act_bytes


# ---------------------------------------------------------------------------------------------
# The calculator: any model, ZeRO stage and GPU count
# ---------------------------------------------------------------------------------------------
@dataclass
class TrainEstimate:
    params: float
    parts: dict  # per GPU, bytes
    total_bytes: float
    rule_bytes: float  # the 6x rule: 6 x parameters x bytes per weight
    gpu_memory_bytes: float
    fits: bool

    def to_rows(self) -> list[dict]:
        return [{"component": k, "bytes": v, "gb": v / GB, "share_pct": 100 * v / self.total_bytes}
                for k, v in self.parts.items()]


def model_state_bytes(n_params: float, precision: str, zero_stage: int, gpus: int) -> dict:
    """Per GPU: weights, gradients, fp32 master and Adam moments, each sharded over the GPUs by ZeRO."""
    if zero_stage not in ZERO_STAGES:
        raise ParamError(f"ZeRO stage {zero_stage} does not exist; choose 0 (none), 1, 2 or 3.")
    if gpus < 1:
        raise ParamError("gpus must be at least 1.")
    w = memcalc.PRECISION_BYTES[precision]
    shard = {part: (gpus if zero_stage >= stage else 1) for part, stage in
             (("weights", 3), ("gradients", 2), ("master", 1), ("adam", 1))}
    master = 0.0 if precision == "fp32" else memcalc.MASTER_BYTES_PER_PARAM
    return {"weights": n_params * w / shard["weights"],
            "gradients": n_params * w / shard["gradients"],
            "fp32 master weights": n_params * master / shard["master"],
            "Adam moments (fp32)": n_params * memcalc.ADAM_BYTES_PER_PARAM / shard["adam"]}


def estimate(p: memcalc.MemParams, zero_stage: int = 0, gpus: int = 1) -> TrainEstimate:
    """One GPU's bytes when training model `p` (batch = sequences per GPU) with ZeRO over `gpus` GPUs."""
    p = memcalc.check(dataclasses.replace(p, mode="training"))
    n = memcalc.n_params(p)
    parts = model_state_bytes(n, p.precision, zero_stage, gpus)
    act_bytes = memcalc.activation_dtype_bytes(p)
    tokens = p.batch * p.context
    acts = activation_parts(p.d_model, p.kv_dim, p.d_ff, p.n_layers, p.vocab, p.n_heads, p.checkpointing, act_bytes)
    parts["activations"] = tokens * sum(acts.values())
    if p.checkpointing:  # one block is rebuilt at a time during the backward pass
        parts["one block rebuilt (checkpointing)"] = tokens * block_numbers_per_token(p.d_model, p.kv_dim, p.d_ff) * act_bytes
    if zero_stage == 3:  # the layer being computed is gathered whole
        per_layer = (memcalc.count_params(p) - 2 * p.vocab * p.d_model) / p.n_layers
        parts["gathered layer (ZeRO-3)"] = per_layer * memcalc.PRECISION_BYTES[p.precision]
    total = sum(parts.values())
    memory = datasheet_by_name(p.gpu).memory_gb * GB
    return TrainEstimate(params=n, parts=parts, total_bytes=total,
                         rule_bytes=memcalc.RULE_OF_THUMB["training"] * n * memcalc.PRECISION_BYTES[p.precision],
                         gpu_memory_bytes=memory, fits=total <= memory * (1 - p.headroom_pct / 100))


def zero_table(n_params: float, precision: str, gpus: int) -> list[dict]:
    """Model-state bytes per GPU for every ZeRO stage (the ZeRO paper's Figure 1 comparison)."""
    return [{"zero_stage": s, **{k: v for k, v in model_state_bytes(n_params, precision, s, gpus).items()},
             "total_bytes": sum(model_state_bytes(n_params, precision, s, gpus).values())} for s in ZERO_STAGES]


# ---------------------------------------------------------------------------------------------
# The real thing: a small Llama-style model, trained in bf16 with fp32 master weights and Adam
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Params:
    batch: tuple = param((1, 4, 16), "sequences per step", min=1, max=1024)
    checkpointing: tuple = param((False, True), "activation checkpointing of every block")
    seq: int = param(1024, "tokens per sequence", unit="tokens", min=8, max=65536)
    n_layers: int = param(8, "transformer blocks", min=1, max=96)
    d_model: int = param(1024, "width", min=16, max=16384)
    n_heads: int = param(8, "attention heads", min=1, max=256)
    d_ff: int = param(4096, "MLP hidden size", min=16, max=65536)
    vocab: int = param(8192, "vocabulary", min=16, max=262144)


def shape(p: Params, batch: int = 1, checkpointing: bool = False) -> memcalc.MemParams:
    return memcalc.MemParams(n_layers=p.n_layers, d_model=p.d_model, n_heads=p.n_heads, n_kv_heads=p.n_heads,
                             d_ff=p.d_ff, vocab=p.vocab, precision="bf16", context=p.seq, batch=batch,
                             mode="training", checkpointing=checkpointing)


def rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x / rms(x) * w, in the activations' dtype (so what autograd keeps is exactly what the model counts)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def block(x: torch.Tensor, w: dict, n_heads: int) -> torch.Tensor:
    """One Llama-style block (no rotary embedding: it changes no memory). x: (B, S, d)."""
    b, s, d = x.shape
    qkv = rmsnorm(x, w["norm1"]) @ w["qkv"]  # (B, S, 3d)
    q, k, v = qkv.view(b, s, 3, n_heads, d // n_heads).unbind(2)  # views: (B, S, H, D) each
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    o2 = o.transpose(1, 2).reshape(b, s, d).clone()  # always a fresh (B, S, d) copy, whatever o's layout
    x = x + o2 @ w["o"]
    gate, up = (rmsnorm(x, w["norm2"]) @ w["gu"]).chunk(2, dim=-1)  # (B, S, ff) each, views of one tensor
    return x + (F.silu(gate) * up) @ w["down"]


def make_model(p: Params, device, dtype=torch.bfloat16, seed: int = 0) -> dict:
    """The weights as leaf tensors, scaled so activations stay near unit size."""
    g = torch.Generator(device=device).manual_seed(seed)

    def weight(*dims):
        return (torch.randn(*dims, generator=g, device=device) / math.sqrt(dims[0])).to(dtype).requires_grad_()

    def ones(n):
        return torch.ones(n, device=device, dtype=dtype, requires_grad=True)

    d, ff = p.d_model, p.d_ff
    blocks = [{"norm1": ones(d), "qkv": weight(d, 3 * d), "o": weight(d, d), "norm2": ones(d),
               "gu": weight(d, 2 * ff), "down": weight(ff, d)} for _ in range(p.n_layers)]
    return {"embed": weight(p.vocab, d), "blocks": blocks, "norm": ones(d), "head": weight(d, p.vocab)}


def parameters(model: dict) -> list:
    return [model["embed"], *(t for b in model["blocks"] for t in b.values()), model["norm"], model["head"]]


def loss_of(model: dict, ids: torch.Tensor, targets: torch.Tensor, n_heads: int, checkpointing: bool):
    from torch.utils.checkpoint import checkpoint

    x = F.embedding(ids, model["embed"])  # (B, S, d)
    for w in model["blocks"]:
        x = checkpoint(block, x, w, n_heads, use_reentrant=False) if checkpointing else block(x, w, n_heads)
    logits = rmsnorm(x, model["norm"]) @ model["head"]  # (B, S, V), bf16
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())  # fp32 log-softmax


class MixedPrecisionAdam:
    """Adam on fp32 master weights; the bf16 weights are copies of them. One parameter at a time, so the
    temporaries are two fp32 tensors of the largest parameter, and each gradient is freed once used."""

    def __init__(self, params: list, lr: float = 1e-4, betas=(0.9, 0.95)):
        self.params, self.lr, self.betas, self.t = params, lr, betas, 0
        self.master = [p.detach().float() for p in params]
        self.m = [torch.zeros_like(w) for w in self.master]
        self.v = [torch.zeros_like(w) for w in self.master]

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        b1, b2 = self.betas
        c1, c2 = 1 - b1**self.t, 1 - b2**self.t
        for p, w, m, v in zip(self.params, self.master, self.m, self.v):
            g = p.grad.float()
            p.grad = None
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            del g
            w.addcdiv_(m, v.div(c2).sqrt_().add_(1e-8), value=-self.lr / c1)
            p.copy_(w)


# ---------------------------------------------------------------------------------------------
# The model of one real step's peak
# ---------------------------------------------------------------------------------------------
def step_model(p: Params, batch: int, checkpointing: bool) -> dict:
    """Predicted bytes of one step: model state, saved activations, and the peak with the phase it falls in."""
    mp = shape(p, batch, checkpointing)
    n = float(memcalc.count_params(mp))
    states = model_state_bytes(n, "bf16", 0, 1)
    resident = states["weights"] + states["fp32 master weights"] + states["Adam moments (fp32)"]
    grads = states["gradients"]
    tokens = batch * p.seq
    acts = tokens * sum(activation_parts(p.d_model, p.d_model, p.d_ff, p.n_layers, p.vocab, p.n_heads,
                                         checkpointing).values())
    block_full = tokens * block_numbers_per_token(p.d_model, p.d_model, p.d_ff) * 2
    block_grads = tokens * block_backward_bytes_per_token(p.d_model, p.d_ff)
    head_grads = 2.0 * p.vocab * p.d_model * 2  # embedding and head gradients, bf16
    largest = max(p.vocab * p.d_model, p.d_model * 2 * p.d_ff)
    logprobs = 4.0 * p.vocab * tokens  # saved by the loss, freed by its backward
    inputs = tokens * p.d_model * 2.0 * p.n_layers  # checkpointing: what remains of every block
    phases = {
        # the loss's backward: the log-probabilities' gradient and the logits' gradient (fp32), all saved
        "loss backward": acts + 2 * logprobs,
        # the update: all gradients, and two fp32 temporaries of the largest parameter
        "optimizer step": grads + ADAM_TEMP_NUMBERS * 4 * largest,
    }
    if checkpointing:
        # the first block rebuilt (everything else still saved), and the last one (every gradient made)
        phases["first block rebuilt"] = acts - logprobs + head_grads + block_full + block_grads
        phases["last block rebuilt"] = acts - logprobs - inputs + grads + block_full + block_grads
    else:
        # the last block's backward begins with every block's activations still saved
        phases["last block backward"] = acts - logprobs + head_grads + block_grads
    phase = max(phases, key=phases.get)
    return {"params": n, "state_bytes": resident, "activation_bytes": acts, "peak_bytes": resident + phases[phase],
            "peak_phase": phase, "sum_of_parts_bytes": resident + grads + acts,
            "rule_of_thumb_bytes": memcalc.RULE_OF_THUMB["training"] * n * 2}


def predict(p: Params, target: Target) -> list[dict]:
    rows = []
    for ckpt in p.checkpointing:
        for batch in p.batch:
            m = step_model(p, batch, ckpt)
            rows.append({"batch": batch, "checkpointing": ckpt, "tokens": batch * p.seq, "params": m["params"],
                         "predicted_peak_bytes": m["peak_bytes"], "predicted_state_bytes": m["state_bytes"],
                         "predicted_activation_bytes": m["activation_bytes"], "peak_phase": m["peak_phase"],
                         "sum_of_parts_bytes": m["sum_of_parts_bytes"], "rule_of_thumb_bytes": m["rule_of_thumb_bytes"]})
    return rows


# ---------------------------------------------------------------------------------------------
# The measurement
# ---------------------------------------------------------------------------------------------
def check(p: Params, target: Target) -> None:
    if p.d_model % p.n_heads:
        raise ParamError(f"n_heads = {p.n_heads} does not divide d_model = {p.d_model}.")
    worst = max(step_model(p, b, c)["peak_bytes"] for b in p.batch for c in p.checkpointing)
    free = free_memory_bytes() if target.live else target.memory_bytes
    if worst > 0.85 * free:
        raise ParamError(f"The largest step needs about {worst / GB:.1f} GB; this GPU has {free / GB:.1f} GB free. "
                         "Choose a smaller batch, seq or model.")


def batch_data(p: Params, batch: int, device, seed: int):
    g = torch.Generator(device=device).manual_seed(seed)
    ids = torch.randint(0, p.vocab, (batch, p.seq), generator=g, device=device)
    return ids, torch.roll(ids, -1, dims=1)  # predict the next token


def measure_step(p: Params, batch: int, checkpointing: bool, device="cuda") -> dict:
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


def check_training(p: Params, device="cuda") -> float:
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


def measure(p: Params, target: Target, progress):
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


def lesson_numbers(target: Target) -> dict:
    p = Params()
    small, big = step_model(p, 1, False), step_model(p, 16, False)
    seven = memcalc.MemParams.from_preset("Llama 2 7B", params_b=7.0, gpu="H100 SXM")
    zero = {s: sum(model_state_bytes(7.5e9, "bf16", s, 64).values()) / GB for s in ZERO_STAGES}
    return {
        "gpu": target.name,
        "lab_params_m": f"{small['params'] / 1e6:.0f}",
        "lab_state_gb": f"{small['state_bytes'] / GB:.2f}",
        "lab_b16_act_gb": f"{big['activation_bytes'] / GB:.1f}",
        "seven_b_state_gb": f"{16 * 7.0:.0f}",
        "seven_b_rule_gb": f"{6 * 7.0 * 2:.0f}",
        "seven_b_total_gb": f"{estimate(dataclasses.replace(seven, batch=1, context=4096)).total_bytes / GB:.0f}",
        "zero0_gb": f"{zero[0]:.0f}", "zero1_gb": f"{zero[1]:.1f}", "zero2_gb": f"{zero[2]:.1f}",
        "zero3_gb": f"{zero[3]:.2f}",
    }


LAB = Lab(
    name="trainmem",
    title="Training memory",
    summary="Weights, gradients, Adam and activations: a calculator with ZeRO stages over many GPUs, checked "
            "against the peak memory of real training steps on this GPU.",
    terms=("training-memory", "zero", "activation-checkpointing", "mixed-precision"),
    Params=Params,
    predict=predict,
    measure=measure,
    key=("batch", "checkpointing"),
    metric="peak_bytes",
    order=74,
    check=check,
    lesson_numbers=lesson_numbers,
    headline=Headline("How many GB will one training step of the 150 M-parameter model at batch 16 (no "
                      "checkpointing) peak at?", "GB", {"batch": 16, "checkpointing": False}, "peak_bytes", scale=1e9),
)
