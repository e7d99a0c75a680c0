"""
The training-memory lab's model: the calculator (any model, ZeRO stage and GPU count) and the model of one real
step's peak, part by part, with the phase it falls in. Pure arithmetic on Python numbers (labs/memcalc does the
counting of parameters and activations); nothing here touches torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from labs import memcalc
from labs.memcalc import activation_parts, block_numbers_per_token
from labs.engine.gpu import GB, Target, datasheet_by_name
from labs.engine.params import ParamError

NAME = "trainmem"
ZERO_STAGES = (0, 1, 2, 3)
ADAM_TEMP_NUMBERS = 2  # our update makes an fp32 copy of one gradient and one fp32 denominator at a time


# ---------------------------------------------------------------------------------------------
# Activations: what autograd keeps for a Llama-style block (as written in kernels.block)
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
# The model of one real step's peak
# ---------------------------------------------------------------------------------------------
def shape(p, batch: int = 1, checkpointing: bool = False) -> memcalc.MemParams:
    return memcalc.MemParams(n_layers=p.n_layers, d_model=p.d_model, n_heads=p.n_heads, n_kv_heads=p.n_heads,
                             d_ff=p.d_ff, vocab=p.vocab, precision="bf16", context=p.seq, batch=batch,
                             mode="training", checkpointing=checkpointing)


def step_model(p, batch: int, checkpointing: bool) -> dict:
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


def predict(p, target: Target) -> list[dict]:
    rows = []
    for ckpt in p.checkpointing:
        for batch in p.batch:
            m = step_model(p, batch, ckpt)
            rows.append({"batch": batch, "checkpointing": ckpt, "tokens": batch * p.seq, "params": m["params"],
                         "predicted_peak_bytes": m["peak_bytes"], "predicted_state_bytes": m["state_bytes"],
                         "predicted_activation_bytes": m["activation_bytes"], "peak_phase": m["peak_phase"],
                         "sum_of_parts_bytes": m["sum_of_parts_bytes"], "rule_of_thumb_bytes": m["rule_of_thumb_bytes"]})
    return rows


def lesson_numbers(target: Target) -> dict:
    from labs.engine.registry import get_lab  # the lab's Params (labs/trainmem/__init__.py)

    p = get_lab(NAME).Params()
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
