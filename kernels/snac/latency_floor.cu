// Kernels of the latency-floor experiment (examples/latency_floor.rs): what a graph-launched
// kernel costs before SNAC does anything, and the least a one-shot 8-byte AllReduce at world
// 2 can cost (one 16-byte packet each way, through the protocol's own sync primitives).
#include "sync.cuh"

typedef unsigned long long u64;

// The executor's parameter block is this size (crates/purlin-collectives/src/kernels.rs).
struct BigParams {
  u64 w[3968];
};

// Nothing at all, one 8-byte parameter.
extern "C" __global__ void floor_empty(u64 sink) {
  if (sink == 1 && threadIdx.x == 0 && blockIdx.x == 0) *(u64*)sink = 0;
}

// Nothing, with the executor's 31 KiB parameter block (one word read, as the executor does).
extern "C" __global__ void floor_empty_big(const __grid_constant__ BigParams p, u64* sink) {
  if (threadIdx.x == 0 && blockIdx.x == 0 && p.w[0] == 1) sink[0] = p.w[1];
}

// The executor's entry and exit without a plan: poison word and this block's epoch loaded
// by thread 0, a barrier, the epoch stored back advanced.
extern "C" __global__ void floor_entry(const __grid_constant__ BigParams p, const u64* control, u64* epochs) {
  __shared__ u64 s_epoch;
  __shared__ int s_skip;
  if (threadIdx.x == 0) {
    s_skip = purlin::sync::poisoned(control) || p.w[0] != 0;
    s_epoch = epochs[blockIdx.x];
  }
  __syncthreads();
  if (s_skip) return;
  __syncthreads();
  if (threadIdx.x == 0) epochs[blockIdx.x] = s_epoch + 1;
}

// The least one-shot 8-byte AllReduce (u64 sum) at world 2: thread 0 of block 0 loads its
// epoch e, stores {x, e + 1} into the peer's slot (e + 1) & 1, polls its own slot for flag
// e + 1, writes x + y and stores e + 1. Two slots suffice: a rank reaches call e + 2 only
// after the peer finished call e + 1, which it starts only after reading call e's packet.
extern "C" __global__ void floor_exchange(const __grid_constant__ BigParams p, purlin::sync::Packet16* peer_slots,
                                          const purlin::sync::Packet16* my_slots, u64* epoch, const u64* in,
                                          u64* out, const u64* control, u64 timeout_ns) {
  if (threadIdx.x != 0 || blockIdx.x != 0 || p.w[0] != 0) return;
  const u64 e = *epoch + 1;
  const u64 x = *in;
  purlin::sync::st_packet16_sys(peer_slots + (e & 1), x, e);
  u64 y = 0;
  const purlin::sync::WaitResult r =
      purlin::sync::poll_packet16(my_slots + (e & 1), e, control, purlin::sync::now_ns(), timeout_ns, &y);
  if (r != purlin::sync::kWaitOk) return;
  *out = x + y;
  *epoch = e;
}

// How the executor reads its program. `floor_chain`: thread 0 follows 8 dependent parameter
// words (each names the next, 128 bytes apart), as an interpreter reading records from the
// constant bank does. `floor_prefetch_ldc` / `floor_prefetch_generic`: every thread first
// copies the first 1024 words into shared memory (indexed parameter reads / 16-byte loads
// through the generic address space, as the executor does), then thread 0 follows the same
// chain there. The host writes the chain (w[16k] = 16(k + 1), w[128] = 0).
constexpr unsigned int kFloorChainHops = 8;
constexpr unsigned int kFloorPrefetch = 1024;

extern "C" __global__ void floor_chain(const __grid_constant__ BigParams p, u64* sink) {
  if (threadIdx.x != 0) return;
  u64 at = 0;
  for (unsigned int i = 0; i < kFloorChainHops; ++i) at = p.w[at];
  if (at != 0) sink[0] = at;
}

extern "C" __global__ void floor_prefetch_ldc(const __grid_constant__ BigParams p, u64* sink) {
  __shared__ u64 s[kFloorPrefetch];
  for (unsigned int i = threadIdx.x; i < kFloorPrefetch; i += blockDim.x) s[i] = p.w[i];
  __syncthreads();
  if (threadIdx.x != 0) return;
  u64 at = 0;
  for (unsigned int i = 0; i < kFloorChainHops; ++i) at = s[at];
  if (at != 0) sink[0] = at;
}

extern "C" __global__ void floor_prefetch_generic(const __grid_constant__ BigParams p, u64* sink) {
  __shared__ __align__(16) u64 s[kFloorPrefetch];
  for (unsigned int i = threadIdx.x; i < kFloorPrefetch / 2; i += blockDim.x) {
    u64 a, b;
    asm("ld.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p.w + 2 * i));
    s[2 * i] = a;
    s[2 * i + 1] = b;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  u64 at = 0;
  for (unsigned int i = 0; i < kFloorChainHops; ++i) at = s[at];
  if (at != 0) sink[0] = at;
}
