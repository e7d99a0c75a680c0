"""Exercise 4, our solution: 128x256 tiles, 64-deep steps, three stages in
flight, GROUP_M = 8.

Each program computes a 128x256 tile of C with 8 warps; each step along K
brings a 128x64 tile of A and a 64x256 tile of B (48 kB in fp16) into shared
memory while the tensor cores work on the previous ones. Programs are
numbered in bands of 8 tile rows, so the tiles that run at the same moment
share rows of A and columns of B, and those come from the L2 rather than
from device memory.

On Hopper (and newer) the tiles are fetched by the tensor memory accelerator
(TMA): a copy engine that moves a whole tile per instruction and fills the
parts outside the matrix with zeros, so no masks. It needs rows that start
on 16-byte boundaries; other shapes take the pointer path.
"""
import torch
import triton
import triton.language as tl

BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, WARPS, STAGES = 128, 256, 64, 8, 8, 3
USE_TMA = True


@triton.jit
def tile_position(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Program number -> (tile row, tile column): down a band of GROUP_M tile rows first, then across."""
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    band_size = GROUP_M * tiles_n
    first_m = (pid // band_size) * GROUP_M
    rows_in_band = tl.minimum(tiles_m - first_m, GROUP_M)  # the last band may be thinner
    return first_m + (pid % band_size) % rows_in_band, (pid % band_size) // rows_in_band


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """Pointer path: any shape and strides."""
    tile_m, tile_n = tile_position(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # rows of A past the edge re-read row 0 (their results are never stored): no mask along M
    a_tile = a_ptr + tl.where(rm < M, rm, 0)[:, None] * stride_am + rk[None, :] * stride_ak
    b_tile = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_tile, mask=rk[None, :] < K - k0, other=0.0)  # a partial last step adds zeros
        b = tl.load(b_tile, mask=(rk[:, None] < K - k0) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_tile += BLOCK_K * stride_ak
        b_tile += BLOCK_K * stride_bk
    c = c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c, acc.to(tl.float16), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def matmul_tma_kernel(a_desc, b_desc, c_desc, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """TMA path: whole tiles per copy, zeros outside the matrix, the store clipped at its edges."""
    tile_m, tile_n = tile_position(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = a_desc.load([tile_m * BLOCK_M, k0])  # (BLOCK_M, BLOCK_K)
        b = b_desc.load([k0, tile_n * BLOCK_N])  # (BLOCK_K, BLOCK_N)
        acc = tl.dot(a, b, acc)
    c_desc.store([tile_m * BLOCK_M, tile_n * BLOCK_N], acc.to(tl.float16))


def rows_aligned(*tensors) -> bool:
    """TMA needs each row to start on a 16-byte boundary."""
    return all(t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0
               for t in tensors)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    (M, K), N = a.shape, b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=torch.float16)
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
    hopper = not a.is_cuda or torch.cuda.get_device_capability(a.device)[0] >= 9  # the interpreter has TMA too
    if USE_TMA and hopper and rows_aligned(a, b, c):
        from triton.tools.tensor_descriptor import TensorDescriptor

        a_desc = TensorDescriptor.from_tensor(a, [BLOCK_M, BLOCK_K])
        b_desc = TensorDescriptor.from_tensor(b, [BLOCK_K, BLOCK_N])
        c_desc = TensorDescriptor.from_tensor(c, [BLOCK_M, BLOCK_N])
        matmul_tma_kernel[grid](a_desc, b_desc, c_desc, M, N, K, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                                GROUP_M=GROUP_M, num_warps=WARPS, num_stages=STAGES)
    else:
        matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                            c.stride(1), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M,
                            num_warps=WARPS, num_stages=STAGES)
    return c
