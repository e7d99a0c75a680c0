// The first two rungs of the matmul ladder, in plain CUDA C++ (built by labs/matmul_ladder/kernels.py).
//
//   C[M, N] = A[M, K] @ B[K, N], all row-major, inputs float / half / bfloat16, FP32 arithmetic on the
//   CUDA cores (no tensor cores), the result rounded to the input type once at the end.
//
// 1. naive: one thread per output element; it walks a row of A and a column of B straight from
//    global memory, so every input element is requested N times (once per output that needs it).
// 2. tiled: a TILE x TILE block of threads copies a TILE x TILE tile of A and of B into shared memory,
//    waits, and every thread then runs TILE multiply-adds out of shared memory. Each input element is
//    now requested from global memory N / TILE times.

#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

// ---- element type <-> float ---------------------------------------------------------------------
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

// ---- 1. naive -------------------------------------------------------------------------------------
template <typename T>
__global__ void naive_kernel(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
                             int M, int N, int K) {
    int row = blockIdx.y * blockDim.y + threadIdx.y;  // output row of this thread
    int col = blockIdx.x * blockDim.x + threadIdx.x;  // output column: neighbouring threads, neighbouring columns
    if (row >= M || col >= N) return;                 // the edge blocks stick out of C
    float acc = 0.0f;
    for (int k = 0; k < K; ++k)                        // 2 loads per multiply-add, both from global memory
        acc += to_float(A[(size_t)row * K + k]) * to_float(B[(size_t)k * N + col]);
    C[(size_t)row * N + col] = from_float<T>(acc);
}

// ---- 2. shared-memory tiled -----------------------------------------------------------------------
template <typename T, int TILE>
__global__ void tiled_kernel(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
                             int M, int N, int K) {
    __shared__ float As[TILE][TILE];  // this step's tile of A, converted to float once
    __shared__ float Bs[TILE][TILE];  // ... and of B
    int ty = threadIdx.y, tx = threadIdx.x;
    int row = blockIdx.y * TILE + ty;
    int col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        // each thread copies one element of each tile (zeros past the edges keep the sums right)
        int ka = k0 + tx, kb = k0 + ty;
        As[ty][tx] = (row < M && ka < K) ? to_float(A[(size_t)row * K + ka]) : 0.0f;
        Bs[ty][tx] = (kb < K && col < N) ? to_float(B[(size_t)kb * N + col]) : 0.0f;
        __syncthreads();  // the whole tile is in shared memory before anyone reads it
#pragma unroll
        for (int k = 0; k < TILE; ++k)  // TILE multiply-adds, operands from shared memory
            acc += As[ty][k] * Bs[k][tx];
        __syncthreads();  // nobody overwrites the tile while a neighbour still reads it
    }
    if (row < M && col < N) C[(size_t)row * N + col] = from_float<T>(acc);
}

// ---- launchers ------------------------------------------------------------------------------------
static void check_args(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda() && c.is_cuda(), "matmul: tensors must be on the GPU");
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2, "matmul: 2-D tensors expected");
    TORCH_CHECK(a.is_contiguous() && b.is_contiguous() && c.is_contiguous(), "matmul: row-major tensors expected");
    TORCH_CHECK(a.size(1) == b.size(0) && c.size(0) == a.size(0) && c.size(1) == b.size(1), "matmul: shapes do not match");
    TORCH_CHECK(a.scalar_type() == b.scalar_type() && b.scalar_type() == c.scalar_type(), "matmul: one dtype for all");
}

static void check_launch(const char* what) {
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, what, " launch failed: ", cudaGetErrorString(err));
}

template <typename T>
static void naive_typed(const torch::Tensor& a, const torch::Tensor& b, torch::Tensor& c) {
    int M = a.size(0), K = a.size(1), N = b.size(1);
    dim3 block(16, 16);  // 256 threads: x runs along the columns of C
    dim3 grid((N + 15) / 16, (M + 15) / 16);
    auto stream = c10::cuda::getCurrentCUDAStream();
    naive_kernel<T><<<grid, block, 0, stream>>>(static_cast<const T*>(a.data_ptr()), static_cast<const T*>(b.data_ptr()),
                                                static_cast<T*>(c.data_ptr()), M, N, K);
    check_launch("naive matmul");
}

template <typename T, int TILE>
static void tiled_typed(const torch::Tensor& a, const torch::Tensor& b, torch::Tensor& c) {
    int M = a.size(0), K = a.size(1), N = b.size(1);
    dim3 block(TILE, TILE);
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    auto stream = c10::cuda::getCurrentCUDAStream();
    tiled_kernel<T, TILE><<<grid, block, 0, stream>>>(static_cast<const T*>(a.data_ptr()),
                                                      static_cast<const T*>(b.data_ptr()),
                                                      static_cast<T*>(c.data_ptr()), M, N, K);
    check_launch("tiled matmul");
}

template <typename T>
static void tiled_dispatch(const torch::Tensor& a, const torch::Tensor& b, torch::Tensor& c, int64_t tile) {
    switch (tile) {
        case 8: tiled_typed<T, 8>(a, b, c); break;
        case 16: tiled_typed<T, 16>(a, b, c); break;
        case 32: tiled_typed<T, 32>(a, b, c); break;
        default: TORCH_CHECK(false, "tiled matmul: TILE must be 8, 16 or 32, not ", tile);
    }
}

void matmul_naive(torch::Tensor a, torch::Tensor b, torch::Tensor c) {
    check_args(a, b, c);
    switch (a.scalar_type()) {
        case torch::kFloat: naive_typed<float>(a, b, c); break;
        case torch::kHalf: naive_typed<__half>(a, b, c); break;
        case torch::kBFloat16: naive_typed<__nv_bfloat16>(a, b, c); break;
        default: TORCH_CHECK(false, "naive matmul: float, half or bfloat16 only");
    }
}

void matmul_tiled(torch::Tensor a, torch::Tensor b, torch::Tensor c, int64_t tile) {
    check_args(a, b, c);
    switch (a.scalar_type()) {
        case torch::kFloat: tiled_dispatch<float>(a, b, c, tile); break;
        case torch::kHalf: tiled_dispatch<__half>(a, b, c, tile); break;
        case torch::kBFloat16: tiled_dispatch<__nv_bfloat16>(a, b, c, tile); break;
        default: TORCH_CHECK(false, "tiled matmul: float, half or bfloat16 only");
    }
}

// ---- 3. warp-tiled, register-blocked ---------------------------------------------------------------
// The step before tensor cores: the fastest a matmul gets on the CUDA cores alone.
//   block tile  BM x BN = 128 x 128, K in slices of BK = 8 (fp32) or 16 (16-bit inputs), 256 threads (8 warps);
//   warp tile   64 x 32 (the 8 warps form a 2 x 4 grid over the block tile);
//   thread tile 8 x 8 outputs held in 64 registers, as 2 x 2 sub-tiles of 4 x 4 so that every operand
//               read from shared memory is one 16-byte (128-bit) load.
// Per slice each thread reads 8 values of A and 8 of B from shared memory and does 64 FMAs with them
// (register blocking: each value feeds 8 FMAs), and the block reads (BM + BN) x BK inputs from global
// memory for BM x BN x BK FMAs (each value feeds 128). Global loads are 128-bit vectors where the row
// length allows it; the next slice is fetched into registers while the current one is multiplied, and
// shared memory holds two slices (double buffering), so there is one barrier per slice.
// Measured on an H100 (one-off runs, not recorded; N = 4096 fp32): BK = 8 reached 45.9 TFLOP/s,
// BK = 16 37.3 (its 16 prefetched floats push the thread past 128 registers: spills); padding the rows of
// the transposed A tile by 4 floats did not help at BK = 8 (43.7); 2 blocks per SM beat 1 (45.9 vs 39.4).
#ifndef WARPTILE_BK_FP32
#define WARPTILE_BK_FP32 8  // K slice for fp32 inputs (16-bit inputs take 16: one 16-byte load each per slice)
#endif
#ifndef WARPTILE_PAD
#define WARPTILE_PAD 0  // floats added to each row of the transposed A tile (spreads its stores over banks)
#endif
namespace warptile {
constexpr int BM = 128, BN = 128, THREADS = 256, PAD = WARPTILE_PAD;
constexpr int WARP_M = 64, WARP_N = 32;  // one warp's share of the block tile
constexpr int TM = 8, TN = 8;            // one thread's share of its warp tile

// 16 bytes of T (8 halfs or 4 floats) from global memory, widened to float; zeros outside the matrix.
// VEC: the row length is a multiple of the vector, so a vector is wholly inside or wholly outside.
template <typename T, bool VEC>
__device__ __forceinline__ void load16(const T* __restrict__ base, int row, int col, int rows, int cols, int ld,
                                       float* out) {
    constexpr int W = 16 / sizeof(T);
    if (VEC) {
        if (row < rows && col < cols) {
            const int4 raw = *reinterpret_cast<const int4*>(base + (size_t)row * ld + col);  // one LDG.128
            const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
            for (int i = 0; i < W; ++i) out[i] = to_float(v[i]);
        } else {
#pragma unroll
            for (int i = 0; i < W; ++i) out[i] = 0.0f;
        }
    } else {  // rows of odd length: element by element, each one bounds-checked
#pragma unroll
        for (int i = 0; i < W; ++i)
            out[i] = (row < rows && col + i < cols) ? to_float(base[(size_t)row * ld + col + i]) : 0.0f;
    }
}

// MIN_BLOCKS: blocks the compiler must fit on one SM (2 caps a thread at 128 registers, 1 at 255).
template <typename T, bool VEC, int MIN_BLOCKS, int BK>
__global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
warptile_kernel(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, int M, int N, int K) {
    constexpr int W = 16 / sizeof(T);                    // elements per 16-byte load
    constexpr int A_LOADS = BM * BK / W / THREADS;       // 16-byte loads per thread per slice of A
    constexpr int B_LOADS = BK * BN / W / THREADS;       // ... and of B
    static_assert(A_LOADS >= 1 && B_LOADS >= 1 && (BM * BK) % (W * THREADS) == 0, "every thread loads whole vectors");
    __shared__ __align__(16) float As[2][BK][BM + PAD];  // A transposed: a column of the tile is contiguous
    __shared__ __align__(16) float Bs[2][BK][BN];
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const int wm = (warp / 4) * WARP_M, wn = (warp % 4) * WARP_N;  // this warp's corner in the block tile
    const int tr = (lane / 4) * 4, tc = (lane % 4) * 4;            // this thread's corner in its warp tile

    float acc[TM][TN] = {};
    float ra[A_LOADS][W], rb[B_LOADS][W];  // the next slice, in flight in registers

    auto fetch = [&](int k0) {
#pragma unroll
        for (int i = 0; i < A_LOADS; ++i) {
            int idx = tid + i * THREADS, r = idx / (BK / W), c = (idx % (BK / W)) * W;
            load16<T, VEC>(A, row0 + r, k0 + c, M, K, K, ra[i]);
        }
#pragma unroll
        for (int i = 0; i < B_LOADS; ++i) {
            int idx = tid + i * THREADS, r = idx / (BN / W), c = (idx % (BN / W)) * W;
            load16<T, VEC>(B, k0 + r, col0 + c, K, N, N, rb[i]);
        }
    };
    auto stash = [&](int buf) {  // registers -> shared memory (A is transposed on the way)
#pragma unroll
        for (int i = 0; i < A_LOADS; ++i) {
            int idx = tid + i * THREADS, r = idx / (BK / W), c = (idx % (BK / W)) * W;
#pragma unroll
            for (int j = 0; j < W; ++j) As[buf][c + j][r] = ra[i][j];
        }
#pragma unroll
        for (int i = 0; i < B_LOADS; ++i) {
            int idx = tid + i * THREADS, r = idx / (BN / W), c = (idx % (BN / W)) * W;
#pragma unroll
            for (int j = 0; j < W; j += 4)
                *reinterpret_cast<float4*>(&Bs[buf][r][c + j]) = make_float4(rb[i][j], rb[i][j + 1], rb[i][j + 2], rb[i][j + 3]);
        }
    };

    fetch(0);
    stash(0);
    __syncthreads();
    int buf = 0;
    for (int k0 = 0; k0 < K; k0 += BK) {
        const bool more = k0 + BK < K;
        if (more) fetch(k0 + BK);  // global loads of the next slice fly while we compute this one
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[TM], b[TN];
            // 2 + 2 loads of 16 bytes (LDS.128): rows tr..tr+3 and tr+32..tr+35, columns tc.. and tc+16..
            *reinterpret_cast<float4*>(&a[0]) = *reinterpret_cast<const float4*>(&As[buf][k][wm + tr]);
            *reinterpret_cast<float4*>(&a[4]) = *reinterpret_cast<const float4*>(&As[buf][k][wm + tr + 32]);
            *reinterpret_cast<float4*>(&b[0]) = *reinterpret_cast<const float4*>(&Bs[buf][k][wn + tc]);
            *reinterpret_cast<float4*>(&b[4]) = *reinterpret_cast<const float4*>(&Bs[buf][k][wn + tc + 16]);
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);  // 64 FMAs from registers
        }
        if (more) stash(buf ^ 1);  // the other buffer: nobody reads it during this slice
        __syncthreads();           // one barrier per slice: the new buffer is complete, the old one free
        buf ^= 1;
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        int row = row0 + wm + tr + (i % 4) + (i / 4) * 32;
        if (row >= M) continue;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            int col = col0 + wn + tc + (j % 4) + (j / 4) * 16;
            if (col < N) C[(size_t)row * N + col] = from_float<T>(acc[i][j]);
        }
    }
}

template <typename T>
static void launch(const torch::Tensor& a, const torch::Tensor& b, torch::Tensor& c, int64_t min_blocks) {
    int M = a.size(0), K = a.size(1), N = b.size(1);
    constexpr int W = 16 / sizeof(T);
    constexpr int BK = sizeof(T) == 4 ? WARPTILE_BK_FP32 : 16;
    // 128-bit loads need every row to start on a 16-byte boundary: row lengths a multiple of W elements
    bool vec = K % W == 0 && N % W == 0 && reinterpret_cast<uintptr_t>(a.data_ptr()) % 16 == 0 &&
               reinterpret_cast<uintptr_t>(b.data_ptr()) % 16 == 0;
    dim3 grid((N + BN - 1) / BN, (M + BM - 1) / BM);
    auto stream = c10::cuda::getCurrentCUDAStream();
    auto pa = static_cast<const T*>(a.data_ptr());
    auto pb = static_cast<const T*>(b.data_ptr());
    auto pc = static_cast<T*>(c.data_ptr());
    if (!vec) warptile_kernel<T, false, 2, BK><<<grid, THREADS, 0, stream>>>(pa, pb, pc, M, N, K);
    else if (min_blocks == 1) warptile_kernel<T, true, 1, BK><<<grid, THREADS, 0, stream>>>(pa, pb, pc, M, N, K);
    else warptile_kernel<T, true, 2, BK><<<grid, THREADS, 0, stream>>>(pa, pb, pc, M, N, K);
    check_launch("warp-tiled matmul");
}
}  // namespace warptile

void matmul_warptile(torch::Tensor a, torch::Tensor b, torch::Tensor c, int64_t min_blocks) {
    check_args(a, b, c);
    TORCH_CHECK(min_blocks == 1 || min_blocks == 2, "warp-tiled matmul: min_blocks must be 1 or 2");
    switch (a.scalar_type()) {
        case torch::kFloat: warptile::launch<float>(a, b, c, min_blocks); break;
        case torch::kHalf: warptile::launch<__half>(a, b, c, min_blocks); break;
        case torch::kBFloat16: warptile::launch<__nv_bfloat16>(a, b, c, min_blocks); break;
        default: TORCH_CHECK(false, "warp-tiled matmul: float, half or bfloat16 only");
    }
}
