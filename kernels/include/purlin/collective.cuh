// A Purlin collective inside your own kernel (`purlin_collectives::FusedKernel`).
//
// The host prepares a call (`Comm::prepare`, `Comm::prepare_in_place`): a verified SNAC plan,
// the same one `Comm`'s own launch would run (a copy collective's with a shard-landed word per
// source rank, for wait_shard), and passes it to the kernel as its first
// parameter, `const __grid_constant__ purlin::Collective call`. The contract:
//   - the kernel is launched with `FusedCall::launch` on the communicator's stream, with
//     purlin::atom::kThreads threads per block, at least `call.blocks` blocks, and at least
//     `call.smem_bytes` bytes of dynamic shared memory; the launch is cooperative and checks
//     that the whole grid is co-resident, so blocks may wait for each other;
//   - blocks 0 .. call.blocks - 1 each call purlin::run_collective(call, block) exactly once,
//     with every thread, `block` = their blockIdx.x (the contracted blocks); other blocks
//     never call it;
//   - run_collective reads the call's input and writes its output and the communicator's
//     workspace; while any block may be inside it, no block writes the input or touches the
//     output, except as purlin::wait_shard allows. purlin::grid_barrier(call) orders the grid:
//     what any block wrote before it, every block sees after it (compute the input, barrier,
//     run the collective, barrier, consume the output);
//   - a copy collective (AllGather, AllToAll, their V forms) lands shard by shard: once
//     purlin::wait_shard(call, q) returned true in a block, that block may read source rank
//     q's part of the output (its final bytes: no step of the call writes them again), while
//     the collective goes on with the other shards. A block that waits must not be one the
//     collective needs to progress: call it from blocks past call.blocks, or from a contracted
//     block after its run_collective;
//   - the dynamic shared memory of a contracted block belongs to the collective during
//     run_collective (the Atom's workspace).
// When every contracted block has returned from run_collective (a grid_barrier after it),
// this rank's output is complete, exactly as at the end of Comm's own kernel. A failed call
// (a peer that never came, a mismatch) poisons the communicator as any call does.
#pragma once

namespace purlin {
namespace fused {
// The contracted block this block runs and their count (exec.cuh's PURLIN_CALL_BLOCK/GRID).
__shared__ unsigned s_block;
__shared__ unsigned s_blocks;
}  // namespace fused
}  // namespace purlin

#define PURLIN_CALL_BLOCK (purlin::fused::s_block)
#define PURLIN_CALL_GRID (purlin::fused::s_blocks)
#define PURLIN_FUSED 1
#include "purlin_snac_executor.cuh"

namespace purlin {

// The prepared call, passed by value (`FusedCall`'s `CollectiveArgs` mirrors it field for field).
struct Collective {
  snac::Runtime rt;        // the call's pointers (input, output, every rank's workspace)
  const snac::u64* words;  // the verified plan's parameter words, in device memory
  unsigned* barrier;       // grid_barrier's two words: arrivals, generation
  unsigned blocks;         // contracted blocks: the plan's grid, and the call check's block
  unsigned smem_bytes;     // dynamic shared memory each contracted block needs
  const snac::u64* landed;    // a copy collective's shard-landed words (one per source rank), zeroed
                              // before the launch; null for other collectives
  unsigned landed_at_launch;  // bit q: shard q is there at launch (empty, or in place)
  unsigned world;             // ranks of the call
};
// CollectiveArgs' size (fused.rs): the Runtime, three pointers and four 32-bit words.
static_assert(sizeof(Collective) == sizeof(snac::Runtime) + 3 * 8 + 4 * 4, "Collective must match CollectiveArgs");

// Runs contracted block `block` of the call; every thread of the block calls it once.
__device__ __forceinline__ void run_collective(const Collective& call, unsigned block) {
  if (threadIdx.x == 0) {
    fused::s_block = block;
    fused::s_blocks = call.blocks;
  }
  __syncthreads();
  if (snac::call_check_block(call.rt)) {
    snac::run_call_check((const snac::ParamHeader*)call.words, &call.rt);
  } else {
    snac::run_block(call.words, &call.rt, true);
  }
  __syncthreads();
}

// Waits until source rank `q`'s shard of this rank's output has landed: every byte of it holds
// its final value, and no step of the call writes it again (the plan's shard-landed words,
// which the verifier checks: purlin_snac::Landed). Every thread of the block calls it; the
// block's later reads of the shard see its bytes. False if the call failed (the communicator
// is poisoned or the wait outlived the call's timeout), if `q` is no rank, or if the call is
// not a copy collective: then the shard's bytes are not to be read.
__device__ __forceinline__ bool wait_shard(const Collective& call, unsigned q) {
  __shared__ int s_landed;
  __syncthreads();  // an earlier call's readers of s_landed are done
  if (threadIdx.x == 0) {
    bool ok = q < call.world && call.landed != nullptr;
    if (ok && !((call.landed_at_launch >> q) & 1u)) {
      const snac::u64 start = sync::now_ns();
      ok = sync::wait_geq_bounded(call.landed + q, 1, (const snac::u64*)call.rt.control, start,
                                  call.rt.timeout_ns) == sync::kWaitOk;
    }
    s_landed = ok;
  }
  __syncthreads();  // thread 0's acquire orders every thread's later reads
  return s_landed != 0;
}

// A barrier of every block of the launch (co-resident: FusedCall::launch checks). Writes of any
// block before it are visible to every block after it. Reusable: launch after launch, replay
// after replay (the generation word only grows).
__device__ __forceinline__ void grid_barrier(const Collective& call) {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned* generation = call.barrier + 1;
    const unsigned seen = *generation;
    __threadfence();
    const unsigned total = gridDim.x * gridDim.y * gridDim.z;
    if (atomicAdd(call.barrier, 1u) == total - 1) {
      call.barrier[0] = 0;
      __threadfence();
      atomicAdd(call.barrier + 1, 1u);
    } else {
      while (*generation == seen) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}

}  // namespace purlin
