// Warp divergence and data-dependent work: the CUDA C++ kernels of the divergence lab (loaded by labs/divergence/kernels.py).
//
// Every thread reads one element x, runs a long chain of fused multiply-adds on it in registers and
// writes one result. The chains are compute-bound by design (thousands of FMAs per 8 bytes moved), so
// time counts instructions issued, and an instruction issued for a warp costs the same whether 1 or
// 32 of its lanes want it.
//
//   branches_kernel      two branches; which one a thread takes depends on (global thread index / g)
//   varying_work_kernel  one path, but element i needs k[i] trips of its loop
//
// Why the compiler cannot merge or predicate the two branches away:
//   - each branch is a loop whose trip count arrives at run time, so it cannot be if-converted into
//     straight-line selects (there is no fixed number of instructions to predicate);
//   - the two loops have different bodies (path A: four chains of 8 FMAs per trip, path B: eight chains
//     of 4) on different run-time constants, so no pass can fold them into one loop with selected
//     operands. The lab's g-sweep shows the result: 2x the time below g = 32, none above.
//
// The arithmetic is exact: inputs are multiples of 1/256, a = c = 1 and b, d are multiples of 1/4, so
// every partial sum is representable in fp32 and the float64 reference matches bit for bit. The
// constants are kernel arguments, so the compiler must emit every FMA (it cannot know a == 1).

#ifndef ROOFLINE_KERNELS_ONLY
#include <torch/types.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#endif

constexpr int THREADS = 256;  // threads per block (8 warps)

// Path A: four independent chains y <- y * a + b, 8 FMAs each per trip = 32 FMAs per trip.
// Independent chains let the scheduler issue the next FMA while the previous ones are in flight.
__device__ __forceinline__ float path_a(float x, int trips, float a, float b) {
    float y0 = x, y1 = x + 1.0f, y2 = x + 2.0f, y3 = x + 3.0f;
    for (int t = 0; t < trips; ++t) {
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            y0 = fmaf(y0, a, b);
            y1 = fmaf(y1, a, b);
            y2 = fmaf(y2, a, b);
            y3 = fmaf(y3, a, b);
        }
    }
    return (y0 + y1) + (y2 + y3);  // a = 1: 4x + 6 + 32 * trips * b
}

// Path B: eight independent chains z <- z * c + d, 4 FMAs each per trip = 32 FMAs per trip.
// (The chains start at different values, so the compiler cannot fold them into one.)
__device__ __forceinline__ float path_b(float x, int trips, float c, float d) {
    float z[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) z[j] = x + 0.5f * j;
    for (int t = 0; t < trips; ++t) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
#pragma unroll
            for (int j = 0; j < 8; ++j) z[j] = fmaf(z[j], c, d);
        }
    }
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) sum += z[j];
    return sum;  // c = 1: 8x + 14 + 32 * trips * d
}

// Groups of g consecutive threads alternate between the branches. A warp is 32 consecutive threads:
// for g < 32 every warp holds threads of both groups and must run both loops, one after the other,
// with the other half of its lanes masked off; for g >= 32 (a power of two) each warp runs one.
__global__ void __launch_bounds__(THREADS) branches_kernel(const float* __restrict__ x, float* __restrict__ y,
                                                           int n, int g, int trips_a, int trips_b,
                                                           float a, float b, float c, float d) {
    const int i = blockIdx.x * THREADS + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    if ((i / g) & 1) {
        y[i] = path_b(v, trips_b, c, d);
    } else {
        y[i] = path_a(v, trips_a, a, b);
    }
}

// Element i needs k[i] trips. The warp keeps issuing the loop until its slowest lane is done, so a
// warp costs max(k) over its 32 lanes; lanes that finished early sit masked off.
__global__ void __launch_bounds__(THREADS) varying_work_kernel(const int* __restrict__ k,
                                                               const float* __restrict__ x,
                                                               float* __restrict__ y, int n, float a, float b) {
    const int i = blockIdx.x * THREADS + threadIdx.x;
    if (i >= n) return;
    y[i] = path_a(x[i], k[i], a, b);
}

#ifndef ROOFLINE_KERNELS_ONLY
static void check_float_vector(const torch::Tensor& t, const char* name) {
    TORCH_CHECK(t.is_cuda() && t.scalar_type() == torch::kFloat32 && t.is_contiguous() && t.dim() == 1,
                name, " must be a contiguous 1-D float32 CUDA tensor");
}

static int blocks_for(int64_t n) { return static_cast<int>((n + THREADS - 1) / THREADS); }

void branches(torch::Tensor x, torch::Tensor y, int64_t g, int64_t trips_a, int64_t trips_b,
              double a, double b, double c, double d) {
    check_float_vector(x, "x");
    check_float_vector(y, "y");
    TORCH_CHECK(x.numel() == y.numel() && x.numel() < (int64_t{1} << 31), "x and y: same size, under 2^31");
    TORCH_CHECK(g >= 1 && trips_a >= 0 && trips_b >= 0, "g >= 1 and trip counts >= 0");
    const int n = static_cast<int>(x.numel());
    if (n == 0) return;
    branches_kernel<<<blocks_for(n), THREADS, 0, c10::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), n, static_cast<int>(g), static_cast<int>(trips_a),
        static_cast<int>(trips_b), static_cast<float>(a), static_cast<float>(b), static_cast<float>(c),
        static_cast<float>(d));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void varying_work(torch::Tensor k, torch::Tensor x, torch::Tensor y, double a, double b) {
    check_float_vector(x, "x");
    check_float_vector(y, "y");
    TORCH_CHECK(k.is_cuda() && k.scalar_type() == torch::kInt32 && k.is_contiguous() && k.numel() == x.numel(),
                "k must be a contiguous int32 CUDA tensor the size of x");
    TORCH_CHECK(x.numel() == y.numel() && x.numel() < (int64_t{1} << 31), "x and y: same size, under 2^31");
    const int n = static_cast<int>(x.numel());
    if (n == 0) return;
    varying_work_kernel<<<blocks_for(n), THREADS, 0, c10::cuda::getCurrentCUDAStream()>>>(
        k.data_ptr<int>(), x.data_ptr<float>(), y.data_ptr<float>(), n, static_cast<float>(a),
        static_cast<float>(b));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}
#endif
