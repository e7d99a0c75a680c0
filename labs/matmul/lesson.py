"""
The Matmul lesson's numbers: {{placeholders}} of content/labs/matmul.md for the GPU shown
=========================================================================================

Pure arithmetic on the tile configs and the model (no GPU): the lecture's 1792/1793 puzzle on this GPU, the waves of
N = 2048 and 2304, the row tail at 3072, interior + edge at 2064, and the ladder's rungs (prefixed ladder_).
"""

from __future__ import annotations

import math

from labs.engine import timing
from labs.engine.gpu import Target
import labs.matmul.ladder_model as ladder_model
from labs.matmul.configs import (DEFAULT_CONFIGS, EDGE_COL_TILE, EDGE_ROW_TILE, TileConfig, blocks_per_sm,
                                 edge_applies, edge_interior, row_tail_rows, tail_choice, tail_tile, tiles_of)
from labs.matmul.model import predict_point, tile_grid


def lesson_numbers(target: Target) -> dict:
    """Numbers for the lesson text, for this GPU (SM count, ceilings, the lecture's 1792/1793 puzzle)."""
    bf16 = DEFAULT_CONFIGS["bf16"]
    g1792 = tile_grid(1792, 1792, 256, 128, target.sm_count)
    g1793 = tile_grid(1793, 1793, 256, 128, target.sm_count)
    p2048 = predict_point(2048, "bf16", bf16, target)
    p2304 = predict_point(2304, "bf16", bf16, target)
    peak = target.ceilings.matmul_tflops.get("bf16") or 0.0
    e = timing.element_bytes("bf16")
    return {
        "gpu": target.name,
        "sms": str(target.sm_count),
        "bf16_tflops": f"{peak:.0f}",
        "copy_tbps": f"{target.ceilings.copy_tbps:.2f}",
        "ridge_n_bf16": f"{peak / target.ceilings.copy_tbps * (3 * e) / 2:.0f}" if peak else "?",
        "tile": f"{bf16.block_m}x{bf16.block_n}",
        "block_k": str(bf16.block_k),
        "tiles_1792": str(g1792["tiles"]), "tiles_1793": str(g1793["tiles"]),
        "waves_1792": str(g1792["waves"]), "waves_1793": str(g1793["waves"]),
        "util_1793": f"{100 * g1793['wave_util']:.0f}",
        "tiles_2048": str(p2048.get("tiles", "?")), "waves_2048": str(p2048.get("waves", "?")),
        "tiles_2304": str(p2304.get("tiles", "?")), "waves_2304": str(p2304.get("waves", "?")),
        "util_2304": f"{100 * p2304.get('last_wave_util', 0):.0f}",
        "pred_2048": f"{p2048.get('predicted_tflops', 0):.0f}", "pred_2304": f"{p2304.get('predicted_tflops', 0):.0f}",
        "ceilings_source": target.describe_ceilings(),
    } | _row_tail_numbers(target) | _edge_numbers(target) | _ladder_numbers(target)


def _row_tail_numbers(target: Target, n: int = 3072) -> dict:
    """The row tail at N = 3072 on this GPU: big tiles, full waves, the rows left over and their short tiles."""
    big = DEFAULT_CONFIGS["bf16"]
    slots = target.sm_count * max(1, blocks_per_sm(big, "bf16", "tma", target.compute_capability))
    tiles = tiles_of(n, big)
    rows = row_tail_rows(n, n, big, slots)
    choice = tail_choice(n, big, "bf16", target.sm_count, target.compute_capability)
    tail = tail_tile(TileConfig(big.block_m, big.block_n, big.block_k, row_tail=True, tail=choice or ""))
    return {"rt_tiles": str(tiles), "rt_full_waves": str(tiles // slots), "rt_last_wave": str(tiles % slots),
            "rt_big_rows": str(rows), "rt_tail_rows": str(n - rows),
            "rt_tail_tile": f"{tail.block_m}x{tail.block_n}",
            "rt_tail_tiles": str(math.ceil((n - rows) / tail.block_m) * math.ceil(n / tail.block_n))}


def _edge_numbers(target: Target, n: int = 2064) -> dict:
    """Interior + edge at N = 2064 on this GPU: tiles over all of C against whole tiles inside, and the strips."""
    big = DEFAULT_CONFIGS["bf16"]
    slots = target.sm_count * max(1, blocks_per_sm(big, "bf16", "tma", target.compute_capability))
    rows, cols = edge_interior(n, n, big)
    inner = (rows // big.block_m) * (cols // big.block_n)
    bottom = math.ceil((n - rows) / EDGE_ROW_TILE.block_m) * math.ceil(n / EDGE_ROW_TILE.block_n)
    right = math.ceil(rows / EDGE_COL_TILE.block_m) * math.ceil((n - cols) / EDGE_COL_TILE.block_n)
    return {"eg_tiles": str(tiles_of(n, big)), "eg_waves": str(math.ceil(tiles_of(n, big) / slots)),
            "eg_inner": str(inner), "eg_inner_waves": str(math.ceil(inner / slots)), "eg_rows": str(rows),
            "eg_strip": str(n - rows), "eg_edge_tiles": str(bottom + right),
            "eg_row_tile": f"{EDGE_ROW_TILE.block_m}x{EDGE_ROW_TILE.block_n}",
            "eg_col_tile": f"{EDGE_COL_TILE.block_m}x{EDGE_COL_TILE.block_n}",
            "eg_applies": "yes" if edge_applies(n, big, "bf16", target.sm_count, target.compute_capability) else "no",
            "eg_share": f"{100 * (1 - rows * cols / n**2):.1f}"}



def _ladder_numbers(target: Target) -> dict:
    """The ladder's rungs (its lesson lives in this lab's Markdown too)."""
    return {f"ladder_{k}": v for k, v in ladder_model.lesson_numbers(target).items()}
