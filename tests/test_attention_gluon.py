"""The Gluon FlashAttention-3 rung in the attention lab: left out with a note where it cannot run, its parameters and
checks, its model (what the ping-pong overlap buys), its ratios beside cuDNN, the page; on a Hopper GPU (marked
`gpu`), the lab's check and launch against float64 on odd shapes and a short run of the lab.

The kernel itself (its barriers, host arithmetic and odd shapes) is tested in tests/test_gluon_fa3.py.
"""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from labs import attention as A
from labs.attention import compare as C, counters as Co, fa3_issue as I, fa3_model as F, gluon_rung as G, measure as Me, model as M
from labs.attention.naive import reference
from labs.engine import gpu, timing
from labs.engine.params import from_strings
from labs.hopper import gluon_support

H100 = gpu.datasheet_target(gpu.datasheet_by_name("H100 SXM"))
H200 = gpu.datasheet_target(gpu.datasheet_by_name("H200"))
A100 = gpu.datasheet_target(gpu.datasheet_by_name("A100 80GB"))
ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------------------------
# Left out, with a note, where it cannot run
# ------------------------------------------------------------------------------------------------
def test_the_rung_is_left_out_with_a_note_without_hopper_or_gluon():
    params = M.Params()
    assert M.GLUON_IMPL in params.impls  # the default run asks for it
    for cc, why in ((None, "no CUDA GPU"), ("8.0", "compute capability 8.0")):
        run, notes = G.gluon_notes(params, cc)
        assert M.GLUON_IMPL not in run.impls and set(run.impls) == set(params.impls) - {M.GLUON_IMPL}
        assert len(notes) == 1 and why in notes[0] and "left out" in notes[0] and M.GLUON_IMPL in notes[0]
    assert G.gluon_notes(dataclasses.replace(params, impls=("ours",)), None) == (
        dataclasses.replace(params, impls=("ours",)), [])  # not asked for: nothing to say


def test_where_it_runs_the_rung_runs_both_passes_without_a_note(monkeypatch):
    monkeypatch.setattr(gluon_support, "attention_unavailable_reason", lambda cc: None)
    params = M.Params()
    assert G.gluon_notes(params, "9.0") == (params, [])
    forward = dataclasses.replace(params, modes=("fwd",))
    assert G.gluon_notes(forward, "9.0") == (forward, [])
    shape = M.Shape(4, 16, 4096, 4096, 128, True, "bf16")
    assert M.gluon_runs(shape, "fwd+bwd", H100) and not M.gluon_runs(shape, "fwd+bwd", A100)


def test_cases_the_kernel_does_not_take_are_named():
    assert G.gluon_case_reason("bf16", 64) is None and G.gluon_case_reason("bf16", 128) is None
    assert "bf16" in G.gluon_case_reason("fp16", 64) and "64 and 128" in G.gluon_case_reason("bf16", 32)
    assert Me.unavailable_reason(M.GLUON_IMPL, "fp32", 64, False) == G.gluon_case_reason("fp32", 64)
    assert G.gluon_keys_ok("bf16", 128, "fwd") and G.gluon_keys_ok("bf16", 128, "fwd+bwd")
    assert not G.gluon_keys_ok("fp16", 128, "fwd+bwd")


def test_the_cli_and_the_params_accept_the_rung():
    params = from_strings(M.Params, {"impls": "gluon-fa3,sdpa-cudnn", "seq_lens": "2048,4096", "modes": "fwd"})
    assert params.impls == (M.GLUON_IMPL, "sdpa-cudnn") and params.seq_lens == (2048, 4096)


def test_the_run_checks_the_rung_in_both_passes_with_its_own_configuration():
    params = M.Params(dtypes=("bf16", "fp16"), head_dims=(32, 64, 128))
    keys = Me.check_keys(params, lambda shape, mode: M.planned_config(shape, mode, H200))
    gluon = [k for k in keys if k[0] == M.GLUON_IMPL]
    assert sorted(gluon) == sorted((M.GLUON_IMPL, "bf16", d, causal, mode, None) for d in (64, 128)
                                   for causal in (False, True) for mode in M.MODES)  # one per case, not per N


def test_model_only_runs_and_counters_leave_the_rung_out_on_a_cpu():
    from labs.engine import runner

    result = runner.model(A.LAB, M.Params(seq_lens=(2048,), impls=(M.GLUON_IMPL, "ours")), H100)
    assert {r["impl"] for r in result.rows} == {M.GLUON_IMPL, "ours"}
    if not torch.cuda.is_available():
        assert {p["impl"] for p in Co.points(M.Params())} == {"naive", "ours"}


def test_counters_hold_the_tensor_pipe_to_what_the_model_says_the_overlap_buys():
    params = M.Params(seq_lens=(4096,), head_dims=(128,), masks=("full",), modes=("fwd",))
    rows = {r["impl"]: r for r in M.predict(params, H100)}
    point = {"mode": "fwd", "causal": False, "dtype": "bf16", "head_dim": 128, "seq_len": 4096}
    share = {impl: Co.model(params, point | {"impl": impl}, rows[impl], H100)["tensor_pipe_pct"]
             for impl in ("naive", "ours", M.GLUON_IMPL)}
    peak = H100.datasheet.matmul_tflops("bf16")
    assert share["ours"] == pytest.approx(100 * rows["ours"]["predicted_tflops"] / peak)
    assert 0 < share["naive"] < share["ours"] < share[M.GLUON_IMPL] < 100  # the overlap keeps the tensor cores busier
    library = Co.model(params, point | {"impl": Co.LIBRARY}, {}, H100)  # cuDNN: the rung's bytes, nothing else
    assert library == {"dram_bytes": rows[M.GLUON_IMPL]["predicted_hbm_bytes"]}


# ------------------------------------------------------------------------------------------------
# The model: what the overlap buys
# ------------------------------------------------------------------------------------------------
def test_predicted_only_where_it_runs():
    rows = M.predict(M.Params(dtypes=("bf16", "fp16"), head_dims=(32, 64, 128)), H100)
    gluon = [r for r in rows if r["impl"] == M.GLUON_IMPL]
    assert {(r["mode"], r["dtype"]) for r in gluon} == {("fwd", "bf16"), ("fwd+bwd", "bf16")}
    assert {r["head_dim"] for r in gluon} == {64, 128}
    assert len(gluon) == 2 * 2 * 5 * 2  # d x mask x N x mode
    assert all(r["predicted_peak_bytes"] == M._shape(M.Params(), r["seq_len"], r["head_dim"], "full",
                                                     "bf16").q_bytes for r in gluon if r["mode"] == "fwd")  # O
    assert not [r for r in M.predict(M.Params(), A100) if r["impl"] == M.GLUON_IMPL]  # no wgmma on an A100


L2 = 50 * 2**20  # an H100's L2: the kernel's groups of heads


def test_model_by_hand_one_head_two_tiles():
    """B = H = 1, N = 256, d = 128, no mask: two query tiles of 128 rows, each two key blocks of 128, on two of
    the SMs. A key block costs g + max(g, c) (g one warpgroup's two GEMMs, c its softmax); at a clock fast enough
    for the softmax's chain to be short, c is the exponentials' s, and s < g."""
    shape = M.Shape(1, 1, 256, 256, 128, False, "bf16")
    mma, exp, sms, clock = 700e12, 4e12, 132, 10e9
    g = 2 * 2 * 128 * (64 * 128) / (mma / sms)
    s = 64 * 128 / (exp / sms)
    assert I.softmax_chain_seconds(64, 128, 128, False, clock) < s < g  # at d = 128 the softmax hides whole
    got = F.fa3_forward(shape, mma, exp, 3e12, sms, clock, L2)
    launch = gpu.KERNEL_LAUNCH_US * 1e-6
    assert got["s"] == pytest.approx(2 * (g + g) + 2 * launch)
    assert got["mma_s"] == pytest.approx(4 * 2 * g / sms) and got["exp_s"] == pytest.approx(4 * 2 * s / sms)
    assert got["hidden_s"] == pytest.approx(got["exp_s"])
    assert got["mem_s"] == pytest.approx(4 * 256 * 128 * 2 / 3e12)  # Q, K, V read, O written, once each


def test_where_the_exponentials_outlast_the_gemms_they_show():
    """An SFU rate so low that s > g: at d = 64 (three consumer warpgroups) the block costs 3s (their
    exponentials share the SM's lanes), and 3 (s - g) of every block leaves the tensor cores idle. N = 256 makes two
    query tiles of 192 rows (the second ragged), one a program, two key blocks each."""
    shape = M.Shape(1, 1, 256, 256, 64, False, "bf16")
    mma, exp, sms = 700e12, 1e12, 132
    g, s = F.block_seconds(64, 128, mma, exp, sms)
    assert s > g and F.FA3_CONSUMERS[64] == 3
    got = F.fa3_forward(shape, mma, exp, 3e12, sms, 10e9, L2)
    assert got["s"] == pytest.approx(2 * (3 * s) + 2 * gpu.KERNEL_LAUNCH_US * 1e-6)  # two blocks a program
    assert got["exp_s"] - got["hidden_s"] == pytest.approx(4 * 3 * (s - g) / sms)


def test_the_softmax_chain_by_hand_at_d64():
    """One consumer warp, one unmasked 64 x 128 block at d = 64: 64 scores a thread at 4.5 instructions, 2 rows at
    14, 32 output elements at 1, 24 for the barriers and fences, 4 + 8 wgmma = 384, each 4 clocks after the one it
    waits for: 1,536 clocks. On an H100 (1.915 GHz, 679 TFLOP/s) that outlasts the other warpgroup's GEMMs (g,
    about 780 clocks), so a block costs g + c and the tensor cores wait a third of it; the exponentials' lanes
    (512 clocks) are not what binds."""
    assert I.warp_instructions(64, 64, 128, masked=False) == 64 * 4.5 + 2 * 14 + 32 + 24 + 12 == 384
    assert I.warp_instructions(64, 64, 128, masked=True) == 384 + 64 * 2
    clock = 1.915e9
    chain = I.softmax_chain_seconds(64, 64, 128, False, clock)
    assert chain == pytest.approx(1536 / clock)
    g, s = F.block_seconds(64, 128, 679e12, 4.04e12, 132)
    assert s < g < chain
    assert F.block_period(64, 128, g, s, False, clock, consumers=2) == pytest.approx(g + chain)
    assert 0.3 < 1 - 2 * g / (g + chain) < 0.36


def test_causal_tiles_and_the_persistent_round_robin_by_hand():
    # N = 384, causal: query tiles 0, 1, 2 see 1, 2, 3 key blocks; taken longest first, every head of a group at each
    assert F.tile_blocks(384, 384, 128, True, heads=2, group=2, block_m=128) == [3, 3, 2, 2, 1, 1]
    assert F.tile_blocks(384, 384, 128, True, heads=2, group=1, block_m=128) == [3, 2, 1, 3, 2, 1]  # one head at a time
    assert F.tile_blocks(384, 384, 128, False, heads=1, group=1, block_m=128) == [3, 3, 3]
    assert F.tile_sequence(2, 3, True, 1) == [(0, 2), (0, 1), (0, 0), (1, 2), (1, 1), (1, 0)]
    assert F.key_blocks(0, 100, 300, 128, True, 128) == 3  # Lk > Lq: the first rows already see 201 keys
    # programs take tiles p, p + P, ...: with 4 programs, 3 + 1, 3, 2, 2
    assert F.persistent_span([3, 3, 2, 2, 1, 1], 4) == 4
    assert F.persistent_span([3, 3, 2, 2, 1, 1], 8) == 3 and F.persistent_span([], 4) == 0
    # K and V of 1 MiB a head (N 2048, d 128): 25 heads a group in an H100's 50 MiB at half share
    assert F.heads_per_group(2048, 128, L2) == 25


def test_the_kernels_groups_of_heads_set_the_causal_span():
    """N = 2048 causal, 64 heads on an H100: in groups of 25 heads the programs get a worse mix of long and short
    tiles than with every head at each query block (89 key blocks for the slowest program against 72)."""
    blocks = F.tile_blocks(2048, 2048, 128, True, heads=64, group=25, block_m=128)
    assert F.persistent_span(blocks, 132) == 89
    assert F.persistent_span(F.tile_blocks(2048, 2048, 128, True, heads=64, group=64, block_m=128), 132) == 72


def test_the_programs_walk_one_head_at_a_time_unless_larger_groups_even_the_causal_ends():
    """Without the mask every tile is as long, and one head at a time keeps the fewest K and V in the L2. Under it,
    N = 2048, d = 128: one head at a time lets the slowest program end after 68 key blocks, groups of 25 heads after
    71, so one head. d = 64, N = 8192: groups of 12 end after 781, one head after 834, so groups of 12."""
    short = tuple(F.query_tile_blocks(2048, 2048, 128, True, 128))
    assert F.tile_group(64, short, False, 2048, 128, L2, 132) == 1
    assert F.tile_group(64, short, True, 2048, 128, L2, 132) == 1
    long = tuple(F.query_tile_blocks(8192, 8192, 128, True, F.fa3_block_m(64)))
    assert F.tile_group(64, long, True, 8192, 64, L2, 132) == F.heads_per_group(8192, 64, L2) == 12
    def span(lengths, group):
        return F.persistent_span([lengths[qb] for _, qb in F.tile_sequence(64, len(lengths), True, group, 132,
                                                                             lengths)], 132)

    assert (span(short, 1), span(short, 25)) == (68, 71)
    assert (span(long, 1), span(long, 12)) == (834, 781)


def test_the_order_snakes_where_that_ends_the_slowest_program_sooner():
    """Every other round of 132 tiles reversed: at N = 2048, d = 128 the slowest program gets 71 key blocks, not 89
    (an even share is 65.9). At d = 64, N = 8192 the reversal would pile long tiles where a round spans two groups
    of heads (938 against 781), and the order stays as it was. Either way every tile is taken once."""
    for n, d, group, before, after in ((2048, 128, 25, 89, 71), (8192, 64, 12, 781, 781)):
        block_m = F.fa3_block_m(d)
        assert F.persistent_span(F.tile_blocks(n, n, 128, True, 64, group, block_m), 132) == before
        assert F.persistent_span(F.tile_blocks(n, n, 128, True, 64, group, block_m, programs=132), 132) == after
        lengths = tuple(F.query_tile_blocks(n, n, 128, True, block_m))
        order = F.tile_sequence(64, len(lengths), True, group, 132, lengths)
        assert sorted(order) == sorted(F.tile_sequence(64, len(lengths), True, group))
    # without the mask every tile is as long: nothing to even out
    assert F.tile_sequence(4, 8, False, 2, 3, (5,) * 8) == F.tile_sequence(4, 8, False, 2)


def test_many_tiles_are_spread_over_the_programs_without_playing_them_out():
    """Past SIMULATED_PROGRAMS tiles the model takes each program's share of the work: within 1 % of the round
    robin played out, and fast at the largest parameters."""
    shape = M.Shape(64, 16, 16384, 16384, 64, True, "bf16")  # 1,024 heads x 86 query tiles: 88,064 tiles
    assert shape.b * shape.h * F.query_tiles(16384, F.fa3_block_m(64)) > F.SIMULATED_PROGRAMS
    mma, exp, sms, clock = 700e12, 4e12, 132, 1.9e9
    g, s = F.block_seconds(64, 128, mma, exp, sms)
    period = F.block_period(64, 128, g, s, False, clock, F.FA3_CONSUMERS[64])
    group = F.heads_per_group(16384, 64, L2)
    played = F.persistent_span([n * period for n in F.tile_blocks(16384, 16384, 128, True, 1024, group,
                                                                F.fa3_block_m(64))], sms)
    spread = F.fa3_forward(shape, mma, exp, 3e12, sms, clock, L2)["s"] - 2 * gpu.KERNEL_LAUNCH_US * 1e-6
    assert spread == pytest.approx(played, rel=0.01)
    huge = M.Shape(1024, 1024, 262144, 262144, 128, True, "bf16")
    assert M.gluon_model(huge, H100)["predicted_ms"] > 0


@pytest.mark.parametrize("target", [H100, H200], ids=["H100", "H200"])
def test_the_overlap_buys_time_over_our_fa2(target):
    """At N = 8192 the rung's model is faster than our FlashAttention-2's at both head dims: its softmax hides under
    the other warpgroups' GEMMs instead of adding to them; by no more than the FA2 model's exposed exponentials plus
    its waves and starts (it never beats the tensor cores' own time). At d = 64 that takes the third warpgroup: with
    two, the softmax's chain outlasted the other warpgroup's GEMMs and the rung was the slower, as both GPUs measured
    (H100 2.45 against 2.25 ms)."""
    for d in (128, 64):
        shape = M.Shape(4, 16, 8192, 8192, d, False, "bf16")
        fa2, fa3 = M.flash_model(shape, "fwd", target), M.gluon_model(shape, target)
        assert fa3["predicted_ms"] < fa2["predicted_ms"]
        assert fa3["predicted_ms"] >= fa3["predicted_mma_ms"] >= 0.99 * fa2["predicted_mma_ms"]
        exposed_fa2 = fa2["predicted_exp_ms"] - fa2["predicted_hidden_ms"]
        assert fa2["predicted_ms"] - fa3["predicted_ms"] <= exposed_fa2 + fa2["predicted_schedule_ms"]


def test_model_constants_follow_the_kernel():
    if gluon_support.attention_gluon_missing():
        pytest.skip(f"this Triton cannot build the kernel: {gluon_support.attention_gluon_missing()}")
    from labs.attention import gluon_fa3

    assert F.FA3_WG_ROWS == gluon_fa3.WG_ROWS
    assert F.FA3_BLOCK_N == {d: c.block_n for d, c in gluon_fa3.DEFAULT_CONFIGS.items()}
    assert F.FA3_CONSUMERS == {d: c.consumers for d, c in gluon_fa3.DEFAULT_CONFIGS.items()}


def test_the_plan_and_the_model_take_the_same_consumers():
    """Two consumers at d = 64 under the causal mask up to SHORT_CAUSAL_LQ queries (measured faster there), the
    head dim's default elsewhere; the plan's configuration and the model's tile agree, and every one fits."""
    from labs.attention import fa3_plan

    for d in (64, 128):
        for causal in (False, True):
            for lq in (333, 1024, F.SHORT_CAUSAL_LQ, F.SHORT_CAUSAL_LQ + 1, 8192):
                config = fa3_plan.config_for(d, causal, lq)
                assert config.consumers == F.fa3_consumers(d, causal, lq)
                assert config.block_m == F.fa3_block_m(d, causal, lq)
                assert fa3_plan.smem_bytes(d, config) <= 227 * 1024 and fa3_plan.register_budget(config)  # Hopper
    assert F.fa3_consumers(64, True, 2048) == 2 and F.fa3_consumers(64, True, 4096) == 3
    assert F.fa3_consumers(64, False, 1024) == 3 and F.fa3_consumers(128, True, 1024) == 2
    assert F.fa3_consumers(64, True) == 3  # no length: a long sequence
    # the model plays out the tiles the kernel runs: 128-query tiles for a short causal d = 64 call
    short = M.Shape(4, 16, 2048, 2048, 64, True, "bf16")
    assert F.query_tile_seconds(short, 128, (1.0, 1.0)) == [float(n) for n in F.query_tile_blocks(2048, 2048, 128,
                                                                                                   True, 128)]


def test_short_calls_get_the_cpu_floor_with_the_rungs_own_model():
    shape = M.Shape(4, 16, 1024, 1024, 64, False, "bf16")
    assert M._needs_host_floor(shape, "fwd", H200, M.GLUON_IMPL)
    row = M.host_floor_row({}, shape, "fwd", 1.0, H200, M.GLUON_IMPL)
    assert row["gpu_model_ms"] == pytest.approx(M.gluon_model(shape, H200)["predicted_ms"])
    assert row["limited_by"] == "CPU" and row["predicted_ms"] == 1.0
    params = M.Params(seq_lens=(1024,), head_dims=(64,), masks=("full",), impls=(M.GLUON_IMPL,), modes=("fwd",))
    recorded = [{"impl": M.GLUON_IMPL, "mode": "fwd", "causal": False, "dtype": "bf16", "head_dim": 64,
                 "seq_len": 1024, "measured_ms": 1.0, "host_ms": 1.0}]
    again = M.repredict({"params": dataclasses.asdict(params), "rows": recorded}, H200)
    assert again[0]["gpu_model_ms"] == pytest.approx(row["gpu_model_ms"]) and again[0]["predicted_ms"] == 1.0


def test_lesson_numbers_give_the_rungs_prediction():
    numbers = M.lesson_numbers(H100)
    assert float(numbers["fa3_d128_tflops"]) > float(numbers["predicted_d128_tflops"])
    assert float(numbers["fa3_d64_tflops"]) > float(numbers["predicted_d64_tflops"])  # with a third warpgroup
    assert float(numbers["fa3_d128_tflops"]) <= float(numbers["bf16_matmul_tflops"])  # never above the GEMMs


# ------------------------------------------------------------------------------------------------
# Beside cuDNN
# ------------------------------------------------------------------------------------------------
def _rows():
    key = {"mode": "fwd", "causal": False, "dtype": "bf16"}
    return [key | {"impl": impl, "head_dim": d, "seq_len": n, "measured_ms": ms, "measured_tflops": 100 / ms}
            for impl, d, n, ms in (("ours", 128, 2048, 1.0), (M.GLUON_IMPL, 128, 2048, 0.9),
                                   ("sdpa-cudnn", 128, 2048, 0.8), (M.GLUON_IMPL, 64, 2048, 0.5),
                                   ("sdpa-cudnn", 64, 2048, 0.5), (M.GLUON_IMPL, 64, 1024, 0.4),
                                   ("sdpa-cudnn", 64, 1024, 0.2))]


def test_library_ratios_hold_the_rung_to_issue_33s_bars():
    got = {(r["case"], r["ours"]): r for r in M.library_ratios(_rows())}
    gluon128 = got[("fwd full bf16 d = 128 N = 2048", "ours (Gluon FA3)")]
    assert gluon128["speed_ratio"] == pytest.approx(0.8 / 0.9) and gluon128["target"] == 0.95
    assert gluon128["library"] == C.GLUON_LIBRARY_NAME  # its own cases on the scorecard
    assert got[("fwd full bf16 d = 64 N = 2048", "ours (Gluon FA3)")]["target"] == 1.0
    assert got[("fwd full bf16 d = 64 N = 1024", "ours (Gluon FA3)")]["target"] is None  # below 2048: no bar
    assert got[("fwd full bf16 d = 128 N = 2048", "ours (Triton)")]["speed_ratio"] == pytest.approx(0.8)
    assert len(got) == 4


def test_forward_and_backward_is_held_to_090_at_either_head_dim():
    rows = [r | {"mode": "fwd+bwd"} for r in _rows()]
    got = {(r["case"], r["ours"]): r for r in M.library_ratios(rows)}
    for d in (64, 128):
        assert got[(f"fwd+bwd full bf16 d = {d} N = 2048", "ours (Gluon FA3)")]["target"] == C.GLUON_TRAIN_TARGET
    assert got[("fwd+bwd full bf16 d = 64 N = 1024", "ours (Gluon FA3)")]["target"] is None


def test_the_pages_table_sets_each_kernel_beside_cudnn():
    table = C.rung_table(_rows(), "fwd", False, "bf16", 128)
    assert table == [{"N": 2048, "cuDNN (TFLOP/s)": 125, "ours (Triton) (TFLOP/s)": 100,
                      "ours (Triton) / cuDNN (x)": 0.8, "ours (Gluon FA3) (TFLOP/s)": 111,
                      "ours (Gluon FA3) / cuDNN (x)": 0.89}]
    assert C.rung_table(_rows(), "fwd", True, "bf16", 128) == []  # nothing causal timed


# ------------------------------------------------------------------------------------------------
# The page
# ------------------------------------------------------------------------------------------------
def test_page_shows_the_note_the_table_and_the_lesson_without_a_gpu():
    AppTest = pytest.importorskip("streamlit.testing.v1").AppTest
    pytest.importorskip("plotly")
    app = AppTest.from_file(str(ROOT / "pages" / "attention.py"), default_timeout=60)
    app.run()
    assert not app.exception, app.exception
    if not torch.cuda.is_available():
        assert any(M.GLUON_IMPL in i.value and "left out" in i.value for i in app.info)
    assert any("Gluon FlashAttention-3" in h.value for h in app.subheader)
    shown = " ".join(m.value for m in app.markdown)
    assert "Ping-pong" in shown and "mbarrier" in shown and "{{" not in shown
    app.radio(key="parts_kernel").set_value(M.GLUON_IMPL).run()
    assert not app.exception, app.exception
    charts = [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in app.get("plotly_chart")]
    assert any("Predicted time per part" in t for t in charts)


# ------------------------------------------------------------------------------------------------
# On a Hopper GPU
# ------------------------------------------------------------------------------------------------
def _hopper_or_skip():
    reason = gluon_support.attention_unavailable_reason(gluon_support.device_capability("cuda"))
    if reason:
        pytest.skip(f"the Gluon rung cannot run: {reason}")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_the_labs_check_of_the_rung_passes(d, causal, mode):
    _hopper_or_skip()
    assert Me._check((M.GLUON_IMPL, "bf16", d, causal, mode, None)) < timing.TOLERANCE["bf16"]


@pytest.mark.gpu
def test_gpu_the_labs_check_catches_a_backward_that_forgets_rows(monkeypatch):
    """The check poisons the backward's outputs: a backward that leaves dK's last rows unwritten fails it."""
    _hopper_or_skip()
    from labs.attention import gluon_fa3_bwd

    real = gluon_fa3_bwd.gluon_attention_backward

    def forgetful(*args, **kwargs):
        dq, dk, dv = real(*args, **kwargs)
        if kwargs.get("grads") is not None:
            dk[..., -7:, :] = kwargs["grads"][1].new_full((), float("nan"))
        return dq, dk, dv

    monkeypatch.setattr(gluon_fa3_bwd, "gluon_attention_backward", forgetful)
    with pytest.raises(timing.KernelMismatch, match="dK called directly"):
        G.check_gluon_backward("bf16", 64, False)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 3, 1000, 1000), (1, 2, 333, 1000), (1, 2, 1000, 333), (1, 1, 4097, 4097)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_the_timed_call_matches_float64_on_odd_shapes(shape, d):
    """The call the lab times (measure.impl_fn), with lengths not multiples of the tiles, Lq != Lk, causal or not."""
    _hopper_or_skip()
    b, h, lq, lk = shape
    for causal in (False, True):
        q = timing.random_tensor((b, h, lq, d), "bf16")
        k, v = (timing.random_tensor((b, h, lk, d), "bf16") for _ in range(2))
        out = Me.impl_fn(M.GLUON_IMPL, causal)(q, k, v)
        timing.check_close(out, reference(q, k, v, causal)[0], "bf16", f"gluon-fa3 {shape} d {d} causal {causal}")


@pytest.mark.gpu
def test_gpu_a_short_run_times_the_rung_both_passes_beside_cudnn():
    _hopper_or_skip()
    from labs.engine import runner

    params = M.Params(seq_lens=(2048,), head_dims=(64, 128), masks=("causal",), impls=(M.GLUON_IMPL, "sdpa-cudnn"),
                      modes=("fwd", "fwd+bwd"), batch=1, heads=8)
    result = runner.run(A.LAB, params, use_cache=False)
    gluon = [r for r in result.rows if r.get("impl") == M.GLUON_IMPL]
    assert sorted(r["mode"] for r in gluon) == ["fwd", "fwd", "fwd+bwd", "fwd+bwd"]
    assert all(r["measured_tflops"] > 0 and r["check_rel_error"] < timing.TOLERANCE["bf16"] for r in gluon)
    assert all(r.get("predicted_ms") for r in gluon)  # the model beside it
    for mode in ("fwd", "fwd+bwd"):
        assert len(C.rung_table(result.rows, mode, True, "bf16", 128)) == 1


def test_counters_count_the_training_call_where_the_lab_runs_it(monkeypatch):
    monkeypatch.setattr(Co, "_runs_here", lambda impl, dtype, d, causal: True)  # as on a Hopper GPU
    points = Co.points(M.Params())
    assert [(p["impl"], p["mode"]) for p in points] == [
        ("naive", "fwd"), ("ours", "fwd"), (M.GLUON_IMPL, "fwd"), (Co.LIBRARY, "fwd"),
        ("ours", "fwd+bwd"), (M.GLUON_IMPL, "fwd+bwd"), (Co.LIBRARY, "fwd+bwd")]  # naive trains in dozens of kernels
    assert [p["mode"] for p in Co.points(M.Params(modes=("fwd",)))] == ["fwd"] * 4
    rows = {r["impl"]: r for r in M.predict(M.Params(seq_lens=(4096,), head_dims=(128,), masks=("full",),
                                                      modes=("fwd+bwd",)), H100)}
    train = points[5]
    modelled = Co.model(M.Params(), train, rows[M.GLUON_IMPL], H100)
    assert modelled["kernels"] == 4 and modelled["dram_bytes"] == rows[M.GLUON_IMPL]["predicted_hbm_bytes"]


def test_our_training_call_is_held_to_the_multiplies_it_does():
    params = M.Params(seq_lens=(4096,), head_dims=(128,), masks=("full",), modes=("fwd+bwd",), impls=("ours",))
    row = M.predict(params, H100)[0]
    point = {"impl": "ours", "mode": "fwd+bwd", "causal": False, "dtype": "bf16", "head_dim": 128, "seq_len": 4096}
    share = Co.model(params, point, row, H100)["tensor_pipe_pct"]
    assert share == pytest.approx(100 * row["predicted_tflops"] * 9 / 7 / H100.datasheet.matmul_tflops("bf16"))
