// Example (b) of a fused kernel (crates/purlin-collectives/examples/fused_gather_consume.rs):
// an AllGather of row shards fused with its consumer, out[r] = dot(row r, w) for every row of
// the gathered matrix. While the contracted blocks gather, the other blocks consume this
// rank's own rows (its input, there from the start), then each peer's rows as soon as that
// peer's shard has landed (purlin::wait_shard), while the other shards are still on the way.
#include <purlin/collective.cuh>

// dot(row, w) over `cols` floats by one block, in a fixed order (bit-identical run to run).
__device__ float row_dot(const float* row, const float* w, unsigned cols) {
  __shared__ float partial[32];
  float acc = 0.0f;
  for (unsigned j = threadIdx.x; j < cols; j += blockDim.x) acc = fmaf(row[j], w[j], acc);
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
  const unsigned warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  __syncthreads();  // an earlier call's readers of `partial` are done
  if (threadIdx.x % 32 == 0) partial[warp] = acc;
  __syncthreads();
  float total = 0.0f;
  if (threadIdx.x == 0) {
    for (unsigned i = 0; i < warps; ++i) total += partial[i];
  }
  return total;  // thread 0's
}

// out[first..end) from rows first..end, row r at rows[(r - first) * cols]; block `b` of
// `blocks` takes every blocks-th row.
__device__ void consume(const float* rows, const float* w, float* out, unsigned first, unsigned end, unsigned cols,
                        unsigned b, unsigned blocks) {
  for (unsigned r = first + b; r < end; r += blocks) {
    const float d = row_dot(rows + (unsigned long long)(r - first) * cols, w, cols);
    if (threadIdx.x == 0) out[r] = d;
  }
}

extern "C" __global__ void __launch_bounds__(purlin::atom::kThreads)
    gather_consume(const __grid_constant__ purlin::Collective call, const float* shard, const float* gathered,
                   const float* w, float* out, unsigned rows_per_rank, unsigned cols, unsigned rank,
                   unsigned world) {
  const unsigned mine = rank * rows_per_rank;
  const unsigned spare = gridDim.x - call.blocks;  // blocks beyond the contracted ones
  if (blockIdx.x < call.blocks) {
    purlin::run_collective(call, blockIdx.x);
  } else {
    // This rank's rows, from its shard, while the gather runs (`out` is not the call's).
    consume(shard, w, out, mine, mine + rows_per_rank, cols, blockIdx.x - call.blocks, spare);
  }
  if (spare == 0) consume(shard, w, out, mine, mine + rows_per_rank, cols, blockIdx.x, gridDim.x);
  // The peers' rows, shard by shard as each lands (from the next rank on, as the plans send),
  // by every block: the spare ones at once, the contracted ones once their part is done.
  for (unsigned step = 1; step < world; ++step) {
    const unsigned q = (rank + step) % world;
    if (!purlin::wait_shard(call, q)) return;  // the call failed: its output is not to be read
    const float* rows = gathered + (unsigned long long)q * rows_per_rank * cols;
    consume(rows, w, out, q * rows_per_rank, (q + 1) * rows_per_rank, cols, blockIdx.x, gridDim.x);
  }
}

// The unfused twin's second launch (after Comm::all_gather): every row from the gathered matrix.
extern "C" __global__ void consume_all(const float* gathered, const float* w, float* out, unsigned rows, unsigned cols) {
  consume(gathered, w, out, 0, rows, cols, blockIdx.x, gridDim.x);
}
