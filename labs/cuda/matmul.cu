// The first two rungs of the matmul ladder, in plain CUDA C++ (built by labs/matmul_ladder.py).
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
