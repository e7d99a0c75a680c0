"""
How much GPU memory does a model need?
======================================

A calculator that needs no GPU: give it a transformer's shape (or pick a published one), a precision,
a context length and a batch size, and it adds up the bytes:

- weights:     parameters x bytes per parameter (70 B parameters in bf16 = 140 GB);
- KV cache:    2 (K and V) x layers x batch x context x kv_heads x head_dim x bytes;
- activations: inference keeps one layer's working set alive at a time (the prefill of the whole prompt
               is the peak); training keeps every layer's inputs for the backward pass;
- training adds gradients (one per weight, in the training precision), Adam's two moments (fp32 each)
               and an fp32 master copy of the weights (when the weights themselves are not fp32).

It also says how many GPUs of a datasheet kind hold that much, and puts the notes' rule of thumb
(inference ~ 1 x, training ~ 6 x parameters x bytes per parameter) beside the breakdown.

Everything here is plain arithmetic on Python numbers, so tests can check it against hand-computed cases.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from labs.engine.gpu import DATASHEET, GB, datasheet_by_name
from labs.engine.params import ParamError, param, validate

# Bytes per stored number. int4 packs two numbers per byte.
PRECISION_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
TRAINING_PRECISIONS = ("fp32", "bf16", "fp16")  # what the weights and gradients are kept in while training
ADAM_BYTES_PER_PARAM = 8.0  # two fp32 moments (m and v)
MASTER_BYTES_PER_PARAM = 4.0  # fp32 copy the optimizer updates when the weights are 16-bit
LOGIT_BYTES = 4.0  # logits are turned into probabilities in fp32
RULE_OF_THUMB = {"inference": 1, "training": 6}  # the notes' multipliers on parameters x bytes


# ---------------------------------------------------------------------------------------------
# Published shapes
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Preset:
    """A published model shape (from the model's paper or its released config)."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int  # < n_heads: grouped-query attention (several query heads share one K/V head)
    d_ff: int  # hidden size of the gated MLP (three d_model x d_ff matrices)
    vocab: int
    published_params_b: float  # what the authors report, in billions
    source: str


PRESETS: tuple[Preset, ...] = (
    Preset("Llama 2 7B", 32, 4096, 32, 32, 11008, 32000, 6.74, "Llama 2 paper (Touvron et al., 2023); released config"),
    Preset("Llama 3 8B", 32, 4096, 32, 8, 14336, 128256, 8.03, "Llama 3 model card and released config (2024)"),
    Preset("Mistral 7B", 32, 4096, 32, 8, 14336, 32000, 7.24, "Mistral 7B paper (Jiang et al., 2023), Table 1"),
    Preset("Llama 2 13B", 40, 5120, 40, 40, 13824, 32000, 13.0, "Llama 2 paper (Touvron et al., 2023); released config"),
    Preset("Llama 2 70B", 80, 8192, 64, 8, 28672, 32000, 69.0, "Llama 2 paper (Touvron et al., 2023); released config"),
    Preset("Llama 3 70B", 80, 8192, 64, 8, 28672, 128256, 70.6, "Llama 3 model card and released config (2024)"),
)


def preset(name: str) -> Preset:
    for p in PRESETS:
        if p.name == name:
            return p
    raise ParamError(f"unknown preset {name!r}; choose from {', '.join(p.name for p in PRESETS)}.")


# ---------------------------------------------------------------------------------------------
# The inputs
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemParams:
    n_layers: int = param(32, "transformer blocks", min=1, max=1000)
    d_model: int = param(4096, "width of the residual stream", min=1, max=65536)
    n_heads: int = param(32, "query heads (d_model / n_heads = head dim)", min=1, max=1024)
    n_kv_heads: int = param(8, "key/value heads (fewer than n_heads: grouped-query attention)", min=1, max=1024)
    d_ff: int = param(14336, "MLP hidden size (gated MLP: three d_model x d_ff matrices)", min=1, max=524288)
    vocab: int = param(128256, "vocabulary size (embedding and output matrices)", min=1, max=1_000_000)
    params_b: float = param(0.0, "parameter count in billions (0: count it from the shape)", unit="B",
                            min=0.0, max=100000.0)
    precision: str = param("bf16", "weight precision", choices=tuple(PRECISION_BYTES))
    kv_precision: str = param("bf16", "KV-cache precision", choices=("fp32", "bf16", "fp16", "fp8", "int8"))
    context: int = param(8192, "tokens per sequence (prompt + generated)", unit="tokens", min=1, max=10_000_000)
    batch: int = param(1, "sequences at once", min=1, max=100_000)
    mode: str = param("inference", "inference or training (training adds gradients and Adam)",
                      choices=("inference", "training"))
    checkpointing: bool = param(False, "training: keep only each layer's input and recompute the rest")
    gpu: str = param("H100 SXM", "GPU kind (datasheet memory)", choices=tuple(r.name for r in DATASHEET))
    headroom_pct: float = param(10.0, "memory kept free for the framework, fragmentation and buffers", unit="%",
                                min=0.0, max=90.0)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "MemParams":
        p = preset(name)
        shape = dict(n_layers=p.n_layers, d_model=p.d_model, n_heads=p.n_heads, n_kv_heads=p.n_kv_heads,
                     d_ff=p.d_ff, vocab=p.vocab)
        return cls(**(shape | overrides))

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_dim(self) -> int:
        """Width of one token's K (or V) in one layer."""
        return self.n_kv_heads * self.head_dim


def check(p: MemParams) -> MemParams:
    """Refuse shapes that are not a transformer, in words that say what to change."""
    if isinstance(p.n_layers, int) and p.n_layers < 1:
        raise ParamError(f"n_layers = {p.n_layers}: a model needs at least one layer.")
    if isinstance(p.n_heads, int) and p.n_heads < 1:
        raise ParamError(f"n_heads = {p.n_heads}: attention needs at least one head.")
    validate(p)
    if p.d_model % p.n_heads:
        near = [h for h in (p.n_heads - 1, p.n_heads + 1, p.n_heads // 2, p.n_heads * 2) if h >= 1 and p.d_model % h == 0]
        hint = f" (for example n_heads = {near[0]})" if near else ""
        raise ParamError(f"n_heads = {p.n_heads} does not divide d_model = {p.d_model}: each head gets d_model / n_heads "
                         f"dimensions, which must be a whole number{hint}.")
    if p.n_heads % p.n_kv_heads:
        raise ParamError(f"n_kv_heads = {p.n_kv_heads} does not divide n_heads = {p.n_heads}: each K/V head serves a "
                         "whole group of query heads. Use a divisor of n_heads (n_kv_heads = n_heads is plain "
                         "multi-head attention).")
    if p.mode == "training" and p.precision not in TRAINING_PRECISIONS:
        raise ParamError(f"Training in {p.precision} is not modelled: gradients and updates need fp32, bf16 or fp16 "
                         f"weights ({p.precision} weights are for inference; fine-tuning them freezes the quantized "
                         "weights and trains small adapters instead).")
    return p


# ---------------------------------------------------------------------------------------------
# The arithmetic
# ---------------------------------------------------------------------------------------------
def count_params(p: MemParams) -> int:
    """Parameters of a Llama-style decoder: embeddings + untied output matrix + blocks + final norm.

    Per block: Q and O (d_model x d_model each), K and V (d_model x kv_dim each), the gated MLP
    (3 x d_model x d_ff) and two norm weight vectors (d_model each).
    """
    attention = 2 * p.d_model * p.d_model + 2 * p.d_model * p.kv_dim
    mlp = 3 * p.d_model * p.d_ff
    per_layer = attention + mlp + 2 * p.d_model
    return 2 * p.vocab * p.d_model + p.n_layers * per_layer + p.d_model


def n_params(p: MemParams) -> float:
    return p.params_b * 1e9 if p.params_b > 0 else float(count_params(p))


def kv_cache_bytes(p: MemParams) -> float:
    """K and V of every layer, for every token of every sequence."""
    return 2 * p.n_layers * p.batch * p.context * p.kv_dim * PRECISION_BYTES[p.kv_precision]


def kv_bytes_per_token(p: MemParams) -> float:
    return 2 * p.n_layers * p.kv_dim * PRECISION_BYTES[p.kv_precision]


def activation_dtype_bytes(p: MemParams) -> float:
    """Activations are computed in fp32 for fp32 models and in 16-bit otherwise (quantized weights included)."""
    return 4.0 if p.precision == "fp32" else 2.0


def inference_activation_bytes(p: MemParams) -> float:
    """Peak working set while the whole prompt goes through one layer (later layers reuse the memory).

    Per token: attention phase = residual, normed input, Q, K and V, attention output (4 d_model + 2 kv_dim);
    MLP phase = residual, normed input, gate, up and their product (2 d_model + 3 d_ff). The larger one counts,
    plus the last position's logits in fp32. (FlashAttention never stores the context x context scores.)
    """
    per_token = max(4 * p.d_model + 2 * p.kv_dim, 2 * p.d_model + 3 * p.d_ff)
    return p.batch * p.context * per_token * activation_dtype_bytes(p) + p.batch * p.vocab * LOGIT_BYTES


def block_numbers_per_token(d: int, kv: int, ff: int) -> int:
    """Numbers one block saves per token for its backward pass, tensor by tensor.

    norm 1: its input x, x * rsqrt, the normed output a (3 d)   qkv projection output (d + 2 kv)
    attention output o and its re-laid copy o2 (2 d)            norm 2: x_mid, x_mid * rsqrt, b (3 d)
    gate and up (2 ff), silu(gate) (ff), silu(gate) * up (ff)   = 9 d + 2 kv + 4 ff
    """
    return 9 * d + 2 * kv + 4 * ff


def block_small_bytes_per_token(n_heads: int) -> int:
    """Per token and block: two rsqrt factors (bf16) and attention's log-sum-exp per head (fp32)."""
    return 2 * 2 + 4 * n_heads


def activation_parts(d: int, kv: int, ff: int, n_layers: int, vocab: int, n_heads: int,
                     checkpointing: bool, act_bytes: float = 2.0) -> dict:
    """Saved bytes per token, by part (what is alive when the forward pass ends)."""
    per_block = block_numbers_per_token(d, kv, ff) * act_bytes + block_small_bytes_per_token(n_heads)
    blocks = n_layers * (d * act_bytes if checkpointing else per_block)  # checkpointing keeps block inputs
    return {"blocks": blocks, "final norm": 3 * d * act_bytes + 2, "log-probabilities (fp32)": 4 * vocab,
            "token ids and targets": 16}


def training_activation_bytes(p: MemParams) -> float:
    """What the backward pass needs, stored during the forward pass (the training-memory lab's count).

    Per layer and token the tensors autograd keeps for a Llama-style block (block_numbers_per_token),
    then the final norm, every position's log-probabilities (fp32) and the token ids. With checkpointing
    only each layer's input is kept, and one layer's full set is rebuilt at a time during the backward pass.
    The training-memory lab checks this count against torch.cuda.max_memory_allocated of real steps.
    """
    act_bytes = activation_dtype_bytes(p)
    tokens = p.batch * p.context
    kept = tokens * sum(activation_parts(p.d_model, p.kv_dim, p.d_ff, p.n_layers, p.vocab, p.n_heads,
                                         p.checkpointing, act_bytes).values())
    rebuilt = tokens * block_numbers_per_token(p.d_model, p.kv_dim, p.d_ff) * act_bytes if p.checkpointing else 0
    return kept + rebuilt


@dataclass
class Estimate:
    params: float  # number of parameters
    parts: dict  # component -> bytes, in the order they are charted
    total_bytes: float
    gpu: str
    gpu_memory_bytes: float  # datasheet memory of one GPU
    usable_bytes: float  # after the headroom
    gpus_needed: int
    rule_factor: int  # the notes' multiplier (1 inference, 6 training)
    rule_bytes: float  # rule_factor x params x bytes per parameter
    rule_gpus: int  # the rule's GPU count (no headroom, as the notes write it)
    bytes_per_param: float  # total state bytes per parameter (weights + grads + optimizer + master)

    def to_rows(self) -> list[dict]:
        """The breakdown as table rows (component, bytes, GB, share)."""
        return [{"component": name, "bytes": b, "gb": b / GB, "share_pct": 100 * b / self.total_bytes}
                for name, b in self.parts.items()]


def estimate(p: MemParams) -> Estimate:
    """Bytes per component, GPUs needed, and the rule of thumb beside them."""
    check(p)
    n = n_params(p)
    w = PRECISION_BYTES[p.precision]
    parts = {"weights": n * w}
    if p.mode == "inference":
        parts["KV cache"] = kv_cache_bytes(p)
        parts["activations"] = inference_activation_bytes(p)
    else:
        parts["gradients"] = n * w
        parts["Adam moments (fp32)"] = n * ADAM_BYTES_PER_PARAM
        parts["fp32 master weights"] = 0.0 if p.precision == "fp32" else n * MASTER_BYTES_PER_PARAM
        parts["activations"] = training_activation_bytes(p)
    total = sum(parts.values())
    sheet = datasheet_by_name(p.gpu)
    memory = sheet.memory_gb * GB
    usable = memory * (1 - p.headroom_pct / 100)
    factor = RULE_OF_THUMB[p.mode]
    rule = factor * n * w
    state = sum(v for k, v in parts.items() if k not in ("KV cache", "activations"))
    return Estimate(params=n, parts=parts, total_bytes=total, gpu=p.gpu, gpu_memory_bytes=memory, usable_bytes=usable,
                    gpus_needed=max(1, math.ceil(total / usable - 1e-9)), rule_factor=factor, rule_bytes=rule,
                    rule_gpus=max(1, math.ceil(rule / memory - 1e-9)), bytes_per_param=state / n)


def max_context(p: MemParams) -> int:
    """The longest context whose inference estimate still fits on one GPU of the chosen kind (0: none)."""
    if p.mode != "inference":
        raise ParamError("max_context answers for inference only.")
    e = estimate(dataclasses.replace(p, context=1))
    per_token = (kv_bytes_per_token(p) + max(4 * p.d_model + 2 * p.kv_dim, 2 * p.d_model + 3 * p.d_ff)
                 * activation_dtype_bytes(p)) * p.batch
    fixed = e.total_bytes - per_token  # weights and logits
    return max(0, int((e.usable_bytes - fixed) // per_token))
