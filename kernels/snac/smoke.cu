// Device smoke test (cargo xtask gpu-round): a kernel that writes a known pattern, and a
// flag ping-pong between two GPUs through the protocol's own sync primitives.
#include "sync.cuh"

typedef unsigned int u32;
typedef unsigned long long u64;

extern "C" __global__ void purlin_smoke_fill(u32* out, u32 n, u32 seed) {
  for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    out[i] = (i * 2654435761u) ^ seed;
  }
}

// One thread per GPU. The initiator stores round r into the peer's flag and waits for r
// in its own; the responder mirrors it. `result[0]` receives the rounds completed and
// `result[1]` the elapsed nanoseconds (initiator), so round trip = result[1] / result[0].
extern "C" __global__ void purlin_smoke_pingpong(u64* my_flag, u64* peer_flag, u32 rounds, u32 initiator,
                                                 u64 timeout_ns, u64* result) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const u64 start = purlin::sync::now_ns();
  u32 done = 0;
  for (u32 r = 1; r <= rounds; ++r) {
    if (initiator) {
      purlin::sync::st_relaxed_sys(peer_flag, r);
      if (!purlin::sync::wait_geq_sys(my_flag, r, timeout_ns)) break;
    } else {
      if (!purlin::sync::wait_geq_sys(my_flag, r, timeout_ns)) break;
      purlin::sync::st_relaxed_sys(peer_flag, r);
    }
    done = r;
  }
  result[0] = done;
  result[1] = purlin::sync::now_ns() - start;
}
