// Torch bindings for transpose.cu (passed to load_inline as its C++ source).
// Checks the tensors, launches on torch's current stream and turns a failed launch into an error.

#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

int transpose_naive_launch(const float* in, float* out, int rows, int cols, void* stream);
int transpose_tiled_launch(const float* in, float* out, int rows, int cols, int tile, int rows_per_block, int pad,
                           void* stream);

static void check_args(const torch::Tensor& in, const torch::Tensor& out) {
  TORCH_CHECK(in.is_cuda() && out.is_cuda(), "transpose: tensors must be on the GPU");
  TORCH_CHECK(in.scalar_type() == torch::kFloat32 && out.scalar_type() == torch::kFloat32,
              "transpose: tensors must be float32");
  TORCH_CHECK(in.dim() == 2 && in.is_contiguous() && out.is_contiguous(), "transpose: contiguous 2-D tensors only");
  TORCH_CHECK(out.size(0) == in.size(1) && out.size(1) == in.size(0), "transpose: out must have in.T's shape");
  TORCH_CHECK(in.size(0) < INT32_MAX && in.size(1) < INT32_MAX, "transpose: each side must be < 2^31");
}

static void check_launch(int status, const char* what) {
  TORCH_CHECK(status != -1, what, ": unsupported tile shape");
  TORCH_CHECK(status == 0, what, ": launch failed: ", cudaGetErrorString((cudaError_t)status));
}

void transpose_naive(torch::Tensor in, torch::Tensor out) {
  check_args(in, out);
  check_launch(transpose_naive_launch(in.data_ptr<float>(), out.data_ptr<float>(), in.size(0), in.size(1),
                                      at::cuda::getCurrentCUDAStream().stream()), "transpose_naive");
}

void transpose_tiled(torch::Tensor in, torch::Tensor out, int64_t tile, int64_t rows_per_block, bool pad) {
  check_args(in, out);
  check_launch(transpose_tiled_launch(in.data_ptr<float>(), out.data_ptr<float>(), in.size(0), in.size(1), tile,
                                      rows_per_block, pad ? 1 : 0, at::cuda::getCurrentCUDAStream().stream()),
               "transpose_tiled");
}
