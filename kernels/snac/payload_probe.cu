// Packet payloads at every alignment (the device smoke test's payload case): each thread
// loads `bytes` (0..=kPayload) bytes of a payload word from its slot of `src` at offset
// `from` (0..7) with exec.cuh's load_payload and stores them with store_payload into its slot
// of `dst` at offset `to` (0..7); the host checks every slot byte for byte.
#include "exec.cuh"

using namespace purlin::snac;

// Bytes per thread's slot in src and dst.
constexpr u64 kSlot = 32;

extern "C" __global__ void purlin_payload_probe(const u8* src, u8* dst) {
  const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const u64 from = t % 8, to = t / 8 % 8, bytes = t / 64;
  if (bytes > kPayload) return;
  store_payload(dst + kSlot * t + to, load_payload(src + kSlot * t + from, bytes), bytes);
}
