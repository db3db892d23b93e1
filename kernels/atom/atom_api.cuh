// The Atom's device API, defined once for every generation over the generation's
// `Engine` (see atom_common.cuh). Included by each generation's file after it has
// chosen its Engine and kThreads; not an include for anyone else.
#pragma once
#include "atom_common.cuh"

namespace purlin {
namespace atom {

// Shared-memory workspace one thread needs; the block's workspace is threads x this.
constexpr u32 kSmemPerThread = Engine::kSmemPerThread;
__host__ __device__ constexpr u32 smem_bytes(u32 threads) { return threads * kSmemPerThread; }
// Workspace for a block of kThreads (dynamic shared memory, 16-byte aligned).
constexpr u32 kSmemBytes = smem_bytes(kThreads);
// Bytes of loads one block keeps in flight (per source stream) at kThreads.
constexpr u32 kBytesInFlight = kThreads * Engine::kInFlightPerThread;

// Copies `bytes` bytes for one block; every thread of the block calls it with the same
// arguments. dst and src may be local or peer pointers, of any alignment (16-byte
// aligned, or equally misaligned, pointers take the vector path).
__device__ __forceinline__ void copy(void* dst, const void* src, u64 bytes, void* smem) {
  copy_share<Engine>(dst, src, bytes, smem);
}

// dst[i] = srcs[0][i + o] (op) srcs[1][i + o] (op) ... (op) srcs[n-1][i + o] for i < count,
// o = src_offset bytes, combined in rank order; 1 <= n <= kMaxSources. dst may equal a
// source exactly (in place), but must not partially overlap one.
template <class T, class Op>
__device__ __forceinline__ void reduce(void* dst, const void* const* srcs, u32 n, u64 count, u64 src_offset,
                                       void* smem) {
  reduce_share<Engine, T, Op>(dst, srcs, n, count, src_offset, smem);
}
template <class T, class Op>
__device__ __forceinline__ void reduce(void* dst, const void* const* srcs, u32 n, u64 count, void* smem) {
  reduce_share<Engine, T, Op>(dst, srcs, n, count, 0, smem);
}

// The same reduce, for a caller that writes the n <= kMaxSources source addresses (offsets
// applied) into source_table() itself, one thread per source, between a barrier that ends
// the block's previous Atom call and one that publishes the table: no per-thread copy of
// the sources (the executor's `ptrs` array lived in local memory, 128 bytes of stack).
template <class T, class Op>
__device__ __forceinline__ void reduce_table(void* dst, u32 n, u64 count, void* smem) {
  reduce_from_table<Engine, T, Op>(dst, n, count, smem);
}

}  // namespace atom
}  // namespace purlin
