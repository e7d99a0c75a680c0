"""Tests of the Gluon FlashAttention-3 forward (labs/attention/gluon_fa3.py).

On CPU: the kernel is hidden with a reason where Gluon or a Hopper GPU is missing (launching it says why), and
the host-side arithmetic (the tile order, the register and shared-memory budgets) is checked by hand. On a Hopper
GPU (marked `gpu`): the kernel against float64 on odd shapes (lengths not multiples of the tiles, Lq != Lk,
causal and not, d 64 and 128), on three programs so each walks several (head, query block) tiles.
"""

import dataclasses

import pytest
import torch

from labs.attention.naive import reference
from labs.engine import timing
from labs.hopper import gluon_support


def _fa3():
    """The kernel's module, where this Triton has the Gluon features it uses (its import needs them)."""
    reason = gluon_support.attention_gluon_missing()
    if reason:
        pytest.skip(f"this Triton cannot build the kernel: {reason}")
    from labs.attention import gluon_fa3

    return gluon_fa3


# ---------------------------------------------------------------------------------------------
# Hidden where it cannot run
# ---------------------------------------------------------------------------------------------
def test_hidden_with_a_reason_without_hopper_or_gluon(monkeypatch):
    """No GPU, a GPU that is not Hopper, or a Triton lacking a Gluon feature the kernel calls: each gives a reason
    (looked for, not read from a version), and a Hopper GPU with every feature gives none."""
    assert "no CUDA GPU" in gluon_support.attention_unavailable_reason(None)
    assert "compute capability 8.0" in gluon_support.attention_unavailable_reason("8.0")  # an A100: no wgmma
    gluon_support.gluon_missing.cache_clear()
    gluon_support.attention_gluon_missing.cache_clear()
    monkeypatch.setitem(gluon_support.ATTENTION_REQUIRED, "triton.experimental.gluon.language",
                        ("DotOperandLayout", "a_feature_no_triton_has"))
    assert "a_feature_no_triton_has" in gluon_support.attention_unavailable_reason("9.0")
    assert "a_feature_no_triton_has" not in (gluon_support.unavailable_reason("9.0") or "")  # the matmul needs none
    monkeypatch.undo()
    gluon_support.attention_gluon_missing.cache_clear()
    if gluon_support.attention_gluon_missing() is None:
        assert gluon_support.attention_unavailable_reason("9.0") is None


def test_launching_without_a_hopper_gpu_says_why():
    fa3 = _fa3()
    cc = gluon_support.device_capability("cuda")
    if cc is not None and cc.startswith("9."):
        pytest.skip("this machine has a Hopper GPU: the kernel runs (tested below)")
    q = torch.zeros(1, 1, 64, 64, dtype=torch.bfloat16)
    with pytest.raises(gluon_support.GluonUnavailable, match="no CUDA GPU|compute capability"):
        fa3.gluon_attention(q, q, q, causal=False)


# ---------------------------------------------------------------------------------------------
# The host's arithmetic
# ---------------------------------------------------------------------------------------------
def test_tile_order_covers_every_tile_once_longest_causal_first():
    fa3 = _fa3()
    heads, q_blocks, group = 5, 4, 2
    for causal in (False, True):
        items, cut, pieces = fa3.work_table(heads, q_blocks, causal, group, "cpu", 20, (3, 3, 3, 3))
        # 20 tiles on 20 programs: none cut
        assert cut == pieces == 0 and items[:, 2:].tolist() == [[0, 3, -1]] * 20
        order = items[:, :2].tolist()
        assert sorted(map(tuple, order)) == [(h, b) for h in range(heads) for b in range(q_blocks)]
        # heads 0-1, then 2-3, then 4: a group's K and V are done before the next group starts
        assert [h for h, _ in order[:8]] == [0, 1] * 4 and [h for h, _ in order[16:]] == [4] * 4
        blocks = [b for _, b in order[:8:2]]
        assert blocks == ([3, 2, 1, 0] if causal else [0, 1, 2, 3])  # causal: the most keys first


def test_the_last_rounds_tiles_are_cut_along_their_keys():
    """N 2048, d 64, 64 heads: 704 tiles of 192 queries on 132 programs leave 44 for a sixth round. Each is cut into
    three pieces of 5, 5 and 6 of its 16 key blocks, so the last round has one piece for every program; the pieces'
    slots number them in turn, three to a tile."""
    from labs.attention import fa3_model as F

    order = F.tile_sequence(64, 11, False, 25, 132, (16,) * 11)
    items, split = F.work_items(order, (16,) * 11, 132, False)
    assert len(items) == 660 + 132 and len(split) == 44
    assert all(slot == -1 and (lo, hi) == (0, 16) for _, _, lo, hi, slot in items[:660])
    pieces = items[660:]
    assert [hi - lo for _, _, lo, hi, _ in pieces[:3]] == [5, 5, 6] and [p[4] for p in pieces] == list(range(132))
    for head, qb, first, n in split:
        mine = [p for p in pieces if (p[0], p[1]) == (head, qb)]
        assert n == 3 and first % 3 == 0 and [p[4] for p in mine] == [first, first + 1, first + 2]
        assert [(p[2], p[3]) for p in mine] == [(0, 5), (5, 10), (10, 16)]  # the key blocks, each once
    whole = {(h, b) for h, b, *_ in items[:660]} | {(h, b) for h, b, *_ in split}
    assert len(whole) == 704  # every tile, whole or cut, once
    fa3 = _fa3()
    table, cut, each = fa3.work_table(64, 11, False, 25, "cpu", 132, (16,) * 11)
    assert table.tolist() == [list(item) for item in items] and (cut, each) == (44, 3)


def test_only_a_thin_unmasked_last_round_is_cut():
    from labs.attention import fa3_model as F

    assert F.tail_pieces(704, 132, 16, causal=False) == 3
    assert F.tail_pieces(704, 132, 16, causal=True) == 1  # causal tiles differ in length: the order evens them
    assert F.tail_pieces(1024, 132, 16, causal=False) == 1  # 100 of 132 in the last round: cutting gains little
    assert F.tail_pieces(660, 132, 16, causal=False) == 1  # no last round of its own
    assert F.tail_pieces(4096, 132, 64, causal=False) == 16  # d 128, N 8192: 4 tiles, pieces of 4 key blocks
    assert F.tail_pieces(704, 132, 7, causal=False) == 1  # pieces under MIN_PIECE_BLOCKS key blocks: not worth it
    assert F.tail_pieces(12, 132, 8, causal=False) == 2  # fewer tiles than programs: the first round is the last


def test_register_and_shared_memory_budgets():
    fa3 = _fa3()
    # 384 threads (two consumer warpgroups, the producer's warp rounded up to a warpgroup): 168 each at launch;
    # after setmaxnreg the second consumer has 240, the producer 24, and the first what is left: 504 - 264 = 240
    assert fa3.register_budget(fa3.FA3Config(block_n=128, stages=2)) == 168
    with pytest.raises(ValueError, match="leave the first consumer 232"):
        fa3.register_budget(fa3.FA3Config(block_n=128, stages=2, consumer_regs=248))
    # three consumers: 512 threads, 128 each at launch; 2 x 160 + 24 leave the first 168
    assert fa3.register_budget(fa3.FA3Config(block_n=128, stages=3, consumers=3, consumer_regs=160)) == 128
    with pytest.raises(ValueError, match="leave the first consumer"):
        fa3.register_budget(fa3.FA3Config(block_n=128, stages=3, consumers=3))
    # two sets of Q for both consumers, 2 x (K, V), barriers (Q 2 x 2, turns 2, rings 4 x 2)
    assert fa3.smem_bytes(128, fa3.FA3Config(block_n=128, stages=2)) == 2 * 32768 + 4 * 32768 + 8 * 18
    assert fa3.smem_bytes(128, fa3.FA3Config(block_n=128, stages=2, q_buffers=1)) == 32768 + 4 * 32768 + 8 * 14
    for d, config in fa3.DEFAULT_CONFIGS.items():
        assert fa3.smem_bytes(d, config) <= fa3.SMEM_BYTES
    assert fa3.smem_bytes(128, fa3.FA3Config(block_n=128, stages=4)) > fa3.SMEM_BYTES
    q = torch.zeros(1, 1, 8, 96, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="head dim 96"):
        fa3.check_inputs(q, q, q)
    with pytest.raises(ValueError, match="bf16"):
        fa3.check_inputs(q[..., :64].float(), q[..., :64], q[..., :64])


# ---------------------------------------------------------------------------------------------
# On a Hopper GPU
# ---------------------------------------------------------------------------------------------
def _hopper_or_skip():
    reason = gluon_support.attention_unavailable_reason(gluon_support.device_capability("cuda"))
    if reason:
        pytest.skip(f"the Gluon kernel cannot run: {reason}")
    return _fa3()


ODD_SHAPES = [(1, 2, 1000, 1000), (2, 1, 333, 333), (1, 2, 333, 1000), (1, 1, 1000, 333)]  # (B, H, Lq, Lk)


# the schedule's switches, each on top of the lab's default config (a combination over 227 KiB is skipped)
VARIANTS = {
    "default": {},
    "no-pingpong": dict(pingpong=False),
    "Q-single-O-TMA": dict(q_buffers=1, o_tma=True),  # the output through shared memory and a TMA copy
    "P-smem": dict(p_smem=True),  # P through shared memory
    "192-rows": dict(consumers=3, consumer_regs=160, p_smem=True, o_tma=True),  # three consumers (d 64's tile)
    "192x64": dict(consumers=3, consumer_regs=160, block_n=64, stages=3),  # three consumers, P in registers
    "two-consumers": dict(consumers=2, consumer_regs=240),  # d 64's short causal tile (fa3_plan.SHORT_CAUSAL_D64)
}


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("shape", ODD_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_float64_on_odd_shapes(shape, head_dim, causal, variant):
    """Lengths not multiples of the query tile or the key block (the TMA zero-fills past the tensor, the last
    key block is masked, rows past Lq are not stored); Lq > Lk leaves causal rows that see no key (output 0);
    three programs, so each walks several tiles and the rings' phases run on across tiles."""
    fa3 = _hopper_or_skip()
    config = dataclasses.replace(fa3.DEFAULT_CONFIGS[head_dim], **VARIANTS[variant])
    if fa3.smem_bytes(head_dim, config) > fa3.SMEM_BYTES:
        pytest.skip(f"{config.label} at d {head_dim} does not fit a Hopper block's shared memory")
    batch, heads, lq, lk = shape
    q = timing.random_tensor((batch, heads, lq, head_dim), "bf16", "cuda")
    k = timing.random_tensor((batch, heads, lk, head_dim), "bf16", "cuda")
    v = timing.random_tensor((batch, heads, lk, head_dim), "bf16", "cuda")
    out = torch.full_like(q, float("nan"))  # a row the kernel forgets stays NaN and fails the check
    fa3.gluon_attention(q, k, v, causal, config, out=out, programs=3)
    ref = reference(q, k, v, causal)[0]
    timing.check_close(out, ref, "bf16", f"Gluon FA3 {config.label} {shape} d {head_dim}")
    assert (out.double() - ref).abs().max().item() < 0.05  # no single row far off (a norm could hide one)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_call_on_the_same_tensors_replays_it(causal):
    """The second call on the same tensors replays the first's launch, its TMA descriptors encoded once
    (launch.record_encoded): the same output bit for bit, new values read after the inputs are refilled in place
    (the record holds addresses, not values), and another output buffer is a new record, not a stale one."""
    fa3 = _hopper_or_skip()
    q, k, v = (timing.random_tensor((2, 3, 1000, 64), "bf16", "cuda") for _ in range(3))
    first = fa3.gluon_attention(q, k, v, causal, out=torch.full_like(q, float("nan")))
    out = torch.full_like(q, float("nan"))
    fa3.gluon_attention(q, k, v, causal, out=out)
    assert fa3._call_key(q, k, v, out, causal, None, None) in fa3._RECORDED
    again = torch.full_like(q, float("nan"))
    out.fill_(float("nan"))
    fa3.gluon_attention(q, k, v, causal, out=out)  # replayed
    assert torch.equal(out, first)
    q.copy_(timing.random_tensor(q.shape, "bf16", "cuda"))
    fa3.gluon_attention(q, k, v, causal, out=out)  # replayed, on the new values
    fa3.gluon_attention(q, k, v, causal, out=again)  # another output: launched and recorded afresh
    assert fa3._call_key(q, k, v, again, causal, None, None) in fa3._RECORDED and torch.equal(out, again)
    timing.check_close(out, reference(q, k, v, causal)[0], "bf16", "Gluon FA3 replayed on refilled inputs")


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim, programs", [(64, 8), (128, 11)])
def test_cut_tiles_give_the_rows_and_log_sum_exp_of_whole_ones(head_dim, programs):
    """A last round thin enough to cut: 18 tiles of 192 queries on 8 programs (d 64), 24 of 128 on 11 (d 128),
    each last-round tile cut into 4 pieces of its 16 key blocks (Lk 2000, the last block ragged). The output and
    the log-sum-exp the training call writes match float64, and rows past Lq keep what was there."""
    fa3 = _hopper_or_skip()
    from labs.attention.tiles import lq_pad

    batch, heads, lq, lk = 1, 3, 1000, 2000
    config = fa3.DEFAULT_CONFIGS[head_dim]
    lengths = tuple(fa3.query_tile_blocks(lq, lk, config.block_n, False, config.block_m))
    tiles = heads * len(lengths)
    _, cut, pieces = fa3.work_table(heads, len(lengths), False, 1, "cpu", programs, lengths)
    assert (cut, pieces) == (tiles % programs, 4)
    q = timing.random_tensor((batch, heads, lq, head_dim), "bf16", "cuda")
    k = timing.random_tensor((batch, heads, lk, head_dim), "bf16", "cuda")
    v = timing.random_tensor((batch, heads, lk, head_dim), "bf16", "cuda")
    out = torch.full_like(q, float("nan"))
    lse = torch.full((batch, heads, lq_pad(lq)), 12345.0, device="cuda")
    fa3.gluon_attention(q, k, v, False, config, out=out, programs=programs, lse=lse)
    ref, ref_lse = reference(q, k, v, False)
    timing.check_close(out, ref, "bf16", f"Gluon FA3 with cut tiles, d {head_dim}")
    assert (out.double() - ref).abs().max().item() < 0.05
    assert (lse[..., :lq].double() - ref_lse).abs().max().item() < 1e-3
    assert bool((lse[..., lq:] == 12345.0).all())
