"""The model of the Gluon FlashAttention-3 forward (gluon_fa3.py): what its overlap buys, from the GPU's facts.

Pure arithmetic like model.py (no torch, no Triton): it predicts for any Hopper GPU of the datasheet on a laptop.
model.py calls it with its own rates (the measured bf16 matrix rate, the SFUs' exponential rate) and a Shape.

Our FlashAttention-2 (model.py, schedule.py) pays, per tile, the tensor cores' time *plus* the exponentials', less
the half of the shorter one that the SM's second program hides. FlashAttention-3's schedule overlaps them on
purpose. Each program (one per SM, persistent) has W consumer warpgroups of 64 query rows each (W = 2 at d = 128,
3 at d = 64: fa3_consumers); they take turns on the tensor cores. While one warpgroup's two GEMMs (S = Q K^T of the
next key block, O += P V of the last) run, the others compute their softmax. For one key block of the program's
W x 64 queries, with g one warpgroup's GEMM time, c its softmax time and s its exponentials' time through the SM's
special-function lanes:

    period = max(W g, g + c, W s, (W - 1) s + c)

the tensor cores' turns (W g); one warpgroup's own GEMMs, then its softmax (g + c); every warpgroup's
exponentials through the same lanes (W s), and those of the others while one runs its softmax ((W - 1) s + c).
With two warpgroups g + c binds: warpgroup 0's GEMMs, then warpgroup 1's while warpgroup 0 runs its softmax. With
three at d = 64, two are in their softmax at any time and the lanes' share binds: the round costs about 10 %
more than two warpgroups' but covers half as many queries again.

c is the longer of the warpgroup's exponentials (s) and its softmax as a chain of dependent instructions
(fa3_issue.softmax_chain_seconds). The chain is what binds on a Hopper GPU: about 1,500 clocks a block against 512
for the exponentials. At d = 128 the other warpgroup's GEMMs last about as long, and the tensor cores barely wait;
at d = 64 they last half as long, which is why d = 64 takes a third warpgroup. The code means the softmax to
overlap the warpgroup's own P V product too (it waits for S alone), but ptxas puts a wait for every GEMM before the
softmax (WARPGROUP.DEPBAR.LE gsb0, 0x0 in the sm_90a SASS, read on an H200), so the softmax follows both of the
warpgroup's GEMMs, g whole.

The programs take the tiles in the kernel's order (tile_sequence): one head at a time, or under the causal mask
heads in groups whose K and V fit the L2 where that evens the programs' ends (tile_group). Under
the causal mask that order decides the mix of long and short tiles each program gets, and the slowest program
ends the call; where reversing every other round of tiles evens that mix, the kernel and the model take that
order instead. Without the mask a thin last round is cut along the keys into one piece a program (tail_pieces,
work_items); the model plays the pieces out as their share of a tile's blocks and adds the FP32 rows they write and
read back (combine_bytes).
"""

from __future__ import annotations

import functools

from labs.attention.fa3_issue import softmax_chain_seconds
from labs.attention.schedule import SIMULATED_PROGRAMS
from labs.engine.gpu import KERNEL_LAUNCH_US

# as gluon_fa3.DEFAULT_CONFIGS and WG_ROWS (tests/test_attention_gluon.py checks they agree where Gluon imports)
FA3_WG_ROWS = 64  # query rows per consumer warpgroup: one m64 wgmma
FA3_CONSUMERS = {64: 3, 128: 2}  # consumer warpgroups by head dim: a program's query tile is 192 or 128 rows
SHORT_CAUSAL_LQ = 2048  # at d = 64 under the causal mask up to this many queries: two consumers (fa3_consumers)
FA3_BLOCK_N = {64: 128, 128: 128}  # keys per block, by head dim
FA3_HEAD_DIMS = tuple(FA3_BLOCK_N)
FA3_DTYPE = "bf16"


def fa3_supports(dtype: str, head_dim: int, compute_capability: str) -> bool:
    """Where the kernel runs at all: bf16, d 64 or 128, a Hopper GPU (wgmma, setmaxnreg: compute capability 9.x)."""
    return dtype == FA3_DTYPE and head_dim in FA3_HEAD_DIMS and str(compute_capability).startswith("9.")


def fa3_consumers(head_dim: int, causal: bool = False, lq: int = None) -> int:
    """Consumer warpgroups the kernel takes (fa3_plan.config_for): FA3_CONSUMERS, but two at d = 64 under the
    causal mask up to SHORT_CAUSAL_LQ queries (lq None: a long sequence). That is a measured choice, and this model
    follows it rather than makes it: on an H100, causal N 1024 and 2048 ran 1.11x and 1.05x cuDNN with two and 0.93x
    with three; at 4096 they tied, and unmasked three won (1.05x against 0.94x at 4096). The model puts three
    ahead at every length: its period for three is about 20 % fast on short causal tiles."""
    if head_dim == 64 and causal and lq is not None and lq <= SHORT_CAUSAL_LQ:
        return 2
    return FA3_CONSUMERS[head_dim]


def fa3_block_m(head_dim: int, causal: bool = False, lq: int = None) -> int:
    """Query rows of one program's tile: 64 a consumer warpgroup (fa3_consumers)."""
    return fa3_consumers(head_dim, causal, lq) * FA3_WG_ROWS


def key_blocks(qm0: int, lq: int, lk: int, block_n: int, causal: bool, block_m: int) -> int:
    """Key blocks the query tile [qm0, qm0 + block_m) visits, as the kernel's work table gives them: causal tiles stop
    at the last row's diagonal, aligned bottom right."""
    hi = min(max(qm0 + block_m + lk - lq, 0), lk) if causal else lk
    return -(-hi // block_n)


def masked_blocks(qm0: int, lq: int, lk: int, block_n: int, causal: bool, block_m: int) -> int:
    """Of the key blocks the tile visits, those some row sees only in part (the kernel's _full_blocks: the causal
    diagonal and the keys' ragged end), which run the loop with a mask."""
    full_end = min(max(qm0 + 1 + lk - lq, 0), lk) if causal else lk
    return key_blocks(qm0, lq, lk, block_n, causal, block_m) - full_end // block_n


L2_SHARE = 0.5  # of the L2 the K and V of one group of heads may fill (the rest: Q, O, other traffic)


def heads_per_group(lk: int, head_dim: int, l2_bytes: int) -> int:
    """Heads whose K and V (bf16) fit the L2's share together."""
    return max(1, int(L2_SHARE * l2_bytes) // (2 * lk * head_dim * 2))


@functools.lru_cache(maxsize=64)
def tile_group(heads: int, lengths: tuple, causal: bool, lk: int, head_dim: int, l2_bytes: int,
               programs: int) -> int:
    """How many heads the programs walk at a time (tile_sequence's group), given each query block's key blocks.
    One head at a time keeps the fewest heads' K and V in flight, so the L2 serves a smaller working set: on an
    H200 that ran 1-4 % faster without the mask, and up to 11 % faster under it at N 2048, than groups that fill
    half the L2 (heads_per_group). Under the causal mask the larger groups can mix long and short tiles better; the
    kernel takes them where they let the slowest program end sooner (persistent_span), and one head otherwise."""
    fitting = heads_per_group(lk, head_dim, l2_bytes)
    if not causal or fitting == 1:
        return 1

    def span(group: int) -> float:
        return order_span(tile_sequence(heads, len(lengths), True, group, programs, lengths), lengths, programs)

    return fitting if span(fitting) < span(1) else 1


def order_span(order: list, lengths: tuple, programs: int) -> float:
    """When the slowest of `programs` programs ends, in key blocks, taking the (head, query block) tiles of `order`
    round robin, each query block `lengths[qb]` long."""
    return persistent_span([lengths[qb] for _, qb in order], programs)


def tile_sequence(heads: int, q_blocks: int, causal: bool, group: int, programs: int = 0,
                  lengths: tuple = ()) -> list[tuple[int, int]]:
    """(head, query block) of every tile in the order the programs take them (the kernel's table, fa3_plan.work_table):
    heads in groups of `group`, within a group query blocks in turn, all the group's heads at each; causal tiles
    from the last query block (the most keys) to the first.

    Program p takes tiles p, p + programs, ...: under the causal mask the first programs of every round get its
    longest tiles. Given `programs` and each query block's key blocks (`lengths`), the order is the better of two:
    that one, or the same with every other round reversed (a snake: the program that took a round's longest tile
    takes the next round's shortest), whichever lets the slowest program end first (persistent_span, in key blocks).
    The reversal evens the load within a group of heads, but where a round spans two groups it can pile long tiles
    on a few programs, so neither order wins everywhere."""
    return list(_tile_order(heads, q_blocks, causal, group, programs, tuple(lengths)))


@functools.lru_cache(maxsize=256)
def _tile_order(heads: int, q_blocks: int, causal: bool, group: int, programs: int, lengths: tuple) -> tuple:
    """tile_sequence's order, kept: the model asks for the same ones at every rerun of a page (a third of its time)."""
    def place(tile: int) -> tuple[int, int, int]:
        head, rank = divmod(tile, q_blocks)
        return head // group, rank, head

    tiles = sorted(range(heads * q_blocks), key=place)
    order = [(t // q_blocks, q_blocks - 1 - t % q_blocks if causal else t % q_blocks) for t in tiles]
    if not (causal and programs and lengths) or len(order) <= programs:
        return tuple(order)
    snake = [tile for start in range(0, len(order), programs)
             for tile in (order[start:start + programs][::-1] if (start // programs) % 2 else
                          order[start:start + programs])]

    return tuple(snake if order_span(snake, lengths, programs) < order_span(order, lengths, programs) else order)


MIN_PIECE_BLOCKS = 4  # key blocks of a piece at least: its start (S_0 alone) and end (the last P V alone, its
# partial rows' store) then stay small beside its loop
MAX_PIECES = 16  # pieces of one tile at most: the last piece reads every one of them back, one after another


def tail_pieces(tiles: int, programs: int, blocks: int, causal: bool) -> int:
    """Into how many pieces (along the keys) each tile of the last round is cut: 1 for none. With T tiles on P
    programs the last round has T mod P of them and leaves the other programs idle: at N 2048, d 64 (704 tiles of
    192 queries on 132 SMs) 44 programs run a sixth tile while 88 wait, 11 % of the call. Cut into P // (T mod P)
    pieces, those tiles keep every program busy for a third as long; the last piece of a tile adds them up
    (gluon_fa3_store.store_piece). Unmasked tiles only: under the causal mask the tiles' lengths differ and the tile
    order already evens the programs' ends (tile_sequence)."""
    left = tiles % programs
    if causal or left == 0:
        return 1
    return max(1, min(programs // left, blocks // MIN_PIECE_BLOCKS, MAX_PIECES))


def work_items(order: list, lengths: tuple, programs: int, causal: bool) -> tuple[list, list]:
    """The kernel's table (fa3_plan.work_table): (items, split) where items are (head, query block, first key block,
    end key block, slot) in the order the programs take them, slot -1 for a whole tile and otherwise the piece's
    place in the partial results; split lists (head, query block, first slot, pieces) of each tile cut up. The
    last round's tiles (tail_pieces) are cut into pieces of nearly equal numbers of key blocks."""
    blocks = max(lengths) if lengths else 0
    pieces = tail_pieces(len(order), programs, blocks, causal) if order else 1
    whole = len(order) - (len(order) % programs if pieces > 1 else 0)
    items = [(head, qb, 0, lengths[qb], -1) for head, qb in order[:whole]]
    split = []
    for rank, (head, qb) in enumerate(order[whole:]):
        n = lengths[qb]
        split.append((head, qb, rank * pieces, pieces))
        items += [(head, qb, i * n // pieces, (i + 1) * n // pieces, rank * pieces + i) for i in range(pieces)]
    return items, split


def query_tiles(lq: int, block_m: int) -> int:
    """Query tiles of one head (the last one ragged where Lq is not a multiple of the tile)."""
    return max(1, -(-lq // block_m))


def query_tile_blocks(lq: int, lk: int, block_n: int, causal: bool, block_m: int) -> list[int]:
    """Key blocks of each query tile of one head, query block 0 first."""
    return [key_blocks(qb * block_m, lq, lk, block_n, causal, block_m) for qb in range(query_tiles(lq, block_m))]


def persistent_span(durations: list[float], programs: int) -> float:
    """When the last of `programs` persistent programs ends, program p taking tiles p, p + programs, ... of
    `durations` (seconds, in order): the kernel's static round robin, no slot taken on the fly."""
    ends = [0.0] * max(1, min(programs, len(durations)))
    for i, seconds in enumerate(durations):
        ends[i % len(ends)] += seconds
    return max(ends) if durations else 0.0


def block_seconds(d: int, block_n: int, mma_rate: float, exp_rate: float, sm_count: int) -> tuple[float, float]:
    """(g, s) for one key block on one SM: one warpgroup's two GEMMs (64 x block_n scores, 2 x 2d FLOPs each),
    and its exponentials (one a score) on the SM's special-function units."""
    scores = FA3_WG_ROWS * block_n
    return 2 * 2 * d * scores / (mma_rate / sm_count), scores / (exp_rate / sm_count)


def hbm_bytes(shape) -> int:
    """The forward's: Q read and O written once; K and V once too, since the programs walk one head, or a group
    whose K and V fit the L2, at a time (the log-sum-exp, written for the backward only, is fa3_bwd_model's)."""
    return 2 * shape.q_bytes + 2 * shape.kv_bytes


def block_period(d: int, block_n: int, g: float, s: float, masked: bool, clock_hz: float, consumers: int) -> float:
    """Seconds one SM spends on one key block of its consumers x 64 queries. The warpgroups take turns on the tensor
    cores, so a round lasts at least all their GEMMs (consumers x g), and at least one warpgroup's own GEMMs and
    softmax, one after the other (g + c, c from softmax_seconds). Every warpgroup's exponentials go through the
    same special-function lanes: a round lasts at least consumers x s, and while one warpgroup runs its softmax the
    others' exponentials pass those lanes too, (consumers - 1) x s on top of its chain. With two warpgroups g + c
    binds (g >= s at d 64 and 128); with three, two are in their softmax at any time and the lanes' share binds."""
    c = softmax_seconds(d, block_n, s, masked, clock_hz)
    return max(consumers * g, g + c, consumers * s, (consumers - 1) * s + c)


def softmax_seconds(d: int, block_n: int, s: float, masked: bool, clock_hz: float) -> float:
    """One warpgroup's softmax of one key block: its exponentials through the lanes (s) or its chain of dependent
    instructions, whichever is longer."""
    return max(s, softmax_chain_seconds(FA3_WG_ROWS, d, block_n, masked, clock_hz))


def tile_blocks(lq: int, lk: int, block_n: int, causal: bool, heads: int, group: int, block_m: int,
                programs: int = 0) -> list[int]:
    """Key blocks of every (head, query tile) in the order `programs` programs take them (tile_sequence)."""
    one_head = query_tile_blocks(lq, lk, block_n, causal, block_m)
    return [one_head[qb] for _, qb in tile_sequence(heads, len(one_head), causal, group, programs, tuple(one_head))]


def query_tile_seconds(shape, block_n: int, periods: tuple[float, float]) -> list[float]:
    """Seconds of each query tile of one head (query block 0 first), from the (unmasked, masked) key block
    periods."""
    plain, masked = periods
    block_m = fa3_block_m(shape.d, shape.causal, shape.lq)
    seconds = []
    for qb in range(query_tiles(shape.lq, block_m)):
        n = key_blocks(qb * block_m, shape.lq, shape.lk, block_n, shape.causal, block_m)
        m = masked_blocks(qb * block_m, shape.lq, shape.lk, block_n, shape.causal, block_m)
        seconds.append((n - m) * plain + m * masked)
    return seconds


def work_seconds(shape, one_head: list[float], sm_count: int, l2_bytes: int) -> tuple[float, list]:
    """(when the last program ends, the tiles cut into pieces: work_items' split). The kernel's table played out
    over the programs (static round robin): whole tiles, then the last round's pieces, each its share of its tile's
    key blocks. With more tiles than SIMULATED_PROGRAMS, each program's share of the work (its tail is under 1 %)."""
    heads = shape.b * shape.h
    if heads * len(one_head) > SIMULATED_PROGRAMS:
        return heads * sum(one_head) / sm_count, []
    blocks = tuple(query_tile_blocks(shape.lq, shape.lk, FA3_BLOCK_N[shape.d], shape.causal,
                                     fa3_block_m(shape.d, shape.causal, shape.lq)))
    group = tile_group(heads, blocks, shape.causal, shape.lk, shape.d, l2_bytes, sm_count)
    order = tile_sequence(heads, len(one_head), shape.causal, group, sm_count, blocks)
    items, split = work_items(order, blocks, sm_count, shape.causal)
    durations = [one_head[qb] if slot < 0 else one_head[qb] * (hi - lo) / blocks[qb] for _, qb, lo, hi, slot in items]
    return persistent_span(durations, sm_count), split


def combine_bytes(shape, split: list) -> int:
    """What adding the pieces up moves: each piece's rows in FP32 and their log-sum-exp, written once and read back
    once by the tile's last piece (gluon_fa3_store.store_piece)."""
    rows = fa3_block_m(shape.d, shape.causal, shape.lq)
    pieces = sum(n for *_, n in split)
    return 2 * pieces * rows * (shape.d + 1) * 4


def fa3_forward(shape, mma_rate: float, exp_rate: float, copy_bps: float, sm_count: int, clock_hz: float,
                l2_bytes: int) -> dict:
    """Predicted seconds of one forward call, with its parts: the tensor cores' work spread over the SMs (mma_s),
    the softmax's (exp_s: both warpgroups' softmax_seconds a block), how much of it the ping-pong hides (hidden_s),
    the persistent schedule's waves, starts and pieces and the masked blocks' extra (schedule_s), and the HBM time
    (mem_s: Q, K, V read once, O written, nothing else). clock_hz: the SM's clock, for the softmax's chain;
    l2_bytes: the L2's size, which sets the kernel's groups of heads."""
    block_n, consumers = FA3_BLOCK_N[shape.d], fa3_consumers(shape.d, shape.causal, shape.lq)
    g, s = block_seconds(shape.d, block_n, mma_rate, exp_rate, sm_count)
    periods = tuple(block_period(shape.d, block_n, g, s, m, clock_hz, consumers) for m in (False, True))
    work_s, split = work_seconds(shape, query_tile_seconds(shape, block_n, periods), sm_count, l2_bytes)
    start_s = KERNEL_LAUNCH_US * 1e-6  # the program's first loads and last store (and the kernel's own start)
    combine_s = combine_bytes(shape, split) / copy_bps  # the pieces' rows out and back, at the end
    span = work_s + 2 * start_s + combine_s
    blocks = shape.b * shape.h * sum(query_tile_blocks(shape.lq, shape.lk, block_n, shape.causal,
                                                       fa3_block_m(shape.d, shape.causal, shape.lq))) / sm_count
    c = softmax_seconds(shape.d, block_n, s, False, clock_hz)
    mma_s, exp_s = blocks * consumers * g, blocks * consumers * c
    exposed = blocks * (periods[0] - consumers * g)  # the softmax's part that leaves the tensor cores idle
    mem_s = hbm_bytes(shape) / copy_bps
    return {"s": max(span, mem_s), "mma_s": mma_s, "exp_s": exp_s, "hidden_s": exp_s - exposed,
            "schedule_s": span - (mma_s + exposed), "mem_s": mem_s}
