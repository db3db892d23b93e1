// Example (a) of a fused kernel (crates/purlin-collectives/examples/fused_bias_gelu.rs):
// y = gelu(x + bias) on this rank, then the sum of y over every rank, in one launch.
#include <purlin/collective.cuh>

__device__ __forceinline__ float gelu(float v) {
  return 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
}

__device__ __forceinline__ void bias_gelu(const float* x, const float* bias, float* y, unsigned long long n,
                                          unsigned long long cols) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    y[i] = gelu(x[i] + bias[i % cols]);
  }
}

// The fused kernel: every block computes its share of y (the AllReduce's input), the grid
// barrier completes y, then the contracted blocks run the AllReduce into the call's output.
extern "C" __global__ void __launch_bounds__(purlin::atom::kThreads)
    bias_gelu_all_reduce(const __grid_constant__ purlin::Collective call, const float* x, const float* bias,
                         float* y, unsigned long long n, unsigned long long cols) {
  bias_gelu(x, bias, y, n, cols);
  purlin::grid_barrier(call);
  if (blockIdx.x < call.blocks) purlin::run_collective(call, blockIdx.x);
}

// The unfused twin's first launch (the second is Comm::all_reduce): the same arithmetic, so
// the two results are bit for bit equal.
extern "C" __global__ void bias_gelu_only(const float* x, const float* bias, float* y, unsigned long long n,
                                          unsigned long long cols) {
  bias_gelu(x, bias, y, n, cols);
}
