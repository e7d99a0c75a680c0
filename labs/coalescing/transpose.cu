// Matrix transpose, three rungs of a ladder (loaded by labs/coalescing/kernels.py).
//
//   out (cols x rows) = in (rows x cols)^T, fp32, both row-major.
//
// 1. naive:  one thread per element. A warp reads 32 neighbours of one input row (coalesced) and
//            writes them down one output column: 32 addresses `rows` floats apart, 32 sectors.
// 2. tiled:  a block stages a TILE x TILE tile in shared memory. It reads the tile row by row and
//            writes it out row by row (both coalesced); the transpose happens in shared memory,
//            where a warp reads a tile *column*: with TILE a multiple of 32 every address of that
//            column sits in the same bank, a 32-way bank conflict.
// 3. padded: the same with each shared row one float longer (TILE + 1). Column i then starts in bank
//            i mod 32, the 32 reads of a column hit 32 different banks, and the conflict is gone.
//
// Napkin math: every rung moves 2 * rows * cols * 4 bytes through DRAM, exactly as much as a copy,
// so the best we can hope for is copy bandwidth; what each rung loses is L2 transactions (naive)
// or shared-memory cycles (bank conflicts).

// Plain CUDA, no torch headers (so nvcc builds it in seconds): launchers take raw pointers and a
// stream and return the launch status. transpose.cpp wraps them for torch tensors.

#include <cuda_runtime.h>
#include <cstdint>

namespace {

constexpr int WARP = 32;

__global__ void transpose_naive_kernel(const float* __restrict__ in, float* __restrict__ out, int rows, int cols) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;  // input column: consecutive lanes, consecutive addresses
  const int r = blockIdx.y * blockDim.y + threadIdx.y;  // input row
  if (r < rows && c < cols) {
    out[(size_t)c * rows + r] = in[(size_t)r * cols + c];  // the write strides by `rows` floats across lanes
  }
}

// Block = WARP x ROWS threads; each thread moves (TILE / WARP) x (TILE / ROWS) elements of a TILE x TILE tile.
template <int TILE, int ROWS, int PAD>
__global__ void transpose_tiled_kernel(const float* __restrict__ in, float* __restrict__ out, int rows, int cols) {
  __shared__ float tile[TILE][TILE + PAD];  // PAD = 1 shifts each row by one bank
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int row0 = blockIdx.y * TILE, col0 = blockIdx.x * TILE;  // this tile's corner in `in`

  // load: lanes walk along an input row (coalesced), the block's ROWS warps take turns down the tile
#pragma unroll
  for (int i = 0; i < TILE; i += ROWS) {
#pragma unroll
    for (int j = 0; j < TILE; j += WARP) {
      const int r = row0 + ty + i, c = col0 + tx + j;
      if (r < rows && c < cols) tile[ty + i][tx + j] = in[(size_t)r * cols + c];
    }
  }
  __syncthreads();  // every element of the tile is in shared memory before anyone reads a column

  // store: lanes walk along an output row (coalesced); they read a tile column (bank conflicts if PAD = 0)
#pragma unroll
  for (int i = 0; i < TILE; i += ROWS) {
#pragma unroll
    for (int j = 0; j < TILE; j += WARP) {
      const int orow = col0 + ty + i, ocol = row0 + tx + j;  // out is cols x rows
      if (orow < cols && ocol < rows) out[(size_t)orow * rows + ocol] = tile[tx + j][ty + i];
    }
  }
}

template <int TILE, int ROWS, int PAD>
void launch_tiled(const float* in, float* out, int rows, int cols, cudaStream_t stream) {
  const dim3 block(WARP, ROWS);
  const dim3 grid((cols + TILE - 1) / TILE, (rows + TILE - 1) / TILE);
  transpose_tiled_kernel<TILE, ROWS, PAD><<<grid, block, 0, stream>>>(in, out, rows, cols);
}

}  // namespace

int transpose_naive_launch(const float* in, float* out, int rows, int cols, void* stream) {
  const dim3 block(WARP, 8);
  const dim3 grid((cols + WARP - 1) / WARP, (rows + 7) / 8);
  transpose_naive_kernel<<<grid, block, 0, (cudaStream_t)stream>>>(in, out, rows, cols);
  return (int)cudaGetLastError();
}

// tile in {32, 64}, rows_per_block in {8, 16, 32} (<= tile), pad in {0, 1}; returns -1 for other shapes
int transpose_tiled_launch(const float* in, float* out, int rows, int cols, int tile, int rows_per_block, int pad,
                           void* stream) {
  cudaStream_t s = (cudaStream_t)stream;
#define ROOFLINE_TILED(T, R)                                     \
  if (tile == T && rows_per_block == R) {                        \
    if (pad) launch_tiled<T, R, 1>(in, out, rows, cols, s);      \
    else launch_tiled<T, R, 0>(in, out, rows, cols, s);          \
    return (int)cudaGetLastError();                              \
  }
  ROOFLINE_TILED(32, 8)
  ROOFLINE_TILED(32, 16)
  ROOFLINE_TILED(64, 8)
  ROOFLINE_TILED(64, 16)
  ROOFLINE_TILED(64, 32)
#undef ROOFLINE_TILED
  return -1;
}
