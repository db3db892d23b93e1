// Torn-packet stress test (docs/design.md §3.2, issue 9): each GPU pushes 16-byte packets into its
// peer's receive window while receiving the peer's, both directions at once. A packet's data
// is a function of (round, index); a receiver that sees the round's flag with other data has
// caught a torn packet. Two windows alternate by round parity; a receiver block acknowledges
// a round (a drain) before its sender block may overwrite that window two rounds later.
//
// Blocks [0, pairs) send, blocks [pairs, 2*pairs) receive; block b's slice of the window is
// [b * per_block, (b + 1) * per_block). Every wait is bounded by timeout_ns.
#include "sync.cuh"

typedef unsigned int u32;
typedef unsigned long long u64;
using purlin::sync::Packet16;

__device__ __forceinline__ u64 packet_payload(u64 round, u64 index) {
  u64 x = (round << 40) ^ (index * 0x9e3779b97f4a7c15ull);
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  return x ^ (x >> 32);
}

// result[b] for receiver block b: {packets checked, torn, timed out (0/1), rounds done}.
extern "C" __global__ void __launch_bounds__(512) purlin_packet_stress(
    Packet16* peer_window,  // the peer's receive window (2 halves), written by my senders
    Packet16* my_window,    // my receive window, written by the peer's senders
    u64* peer_acks,         // the peer's ack words, one per block pair: written by my receivers
    u64* my_acks,           // my ack words: written by the peer's receivers, read by my senders
    u32 pairs, u32 per_block, u32 rounds, u64 timeout_ns, u64* result) {
  __shared__ u64 partial[512][2];
  __shared__ int failed;
  const u32 half = pairs * per_block;
  const bool sender = blockIdx.x < pairs;
  const u32 b = sender ? blockIdx.x : blockIdx.x - pairs;
  u64 checked = 0, torn = 0;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  u32 r = 1;
  for (; r <= rounds; ++r) {
    Packet16* window = (sender ? peer_window : my_window) + (r & 1) * half + b * per_block;
    if (sender) {
      // The window half was last used in round r-2: wait for its drain.
      if (threadIdx.x == 0 && r > 2 && !purlin::sync::wait_geq_sys(&my_acks[b], r - 2, timeout_ns)) failed = 1;
      __syncthreads();
      if (failed) break;
      for (u32 i = threadIdx.x; i < per_block; i += blockDim.x) {
        const u64 index = (u64)b * per_block + i;
        purlin::sync::st_packet16_sys(&window[i], packet_payload(r, index), r);
      }
    } else {
      const u64 start = purlin::sync::now_ns();
      for (u32 i = threadIdx.x; i < per_block; i += blockDim.x) {
        const u64 index = (u64)b * per_block + i;
        Packet16 p = purlin::sync::ld_packet16_sys(&window[i]);
        while (p.flag != r) {
          if (purlin::sync::now_ns() - start > timeout_ns) {
            failed = 1;
            break;
          }
          p = purlin::sync::ld_packet16_sys(&window[i]);
        }
        if (p.flag == r) {
          ++checked;
          if (p.data != packet_payload(r, index)) ++torn;
        }
      }
      __syncthreads();
      if (failed) break;
      // All reads of this half performed: drain it to its owner, the peer's sender block b.
      if (threadIdx.x == 0) purlin::sync::st_release_sys(&peer_acks[b], r);
    }
  }
  if (!sender) {
    partial[threadIdx.x][0] = checked;
    partial[threadIdx.x][1] = torn;
    __syncthreads();
    if (threadIdx.x == 0) {
      u64 c = 0, t = 0;
      for (u32 i = 0; i < blockDim.x; ++i) {
        c += partial[i][0];
        t += partial[i][1];
      }
      result[4 * b + 0] = c;
      result[4 * b + 1] = t;
      result[4 * b + 2] = failed;
      result[4 * b + 3] = r - 1;
    }
  }
}
