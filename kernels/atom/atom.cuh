// The Atom interface (docs/design.md §4): the only Atom header an executor may include.
//
// Every generation's implementation defines, in namespace purlin::atom:
//
//   constants
//     kGeneration      1 generic, 2 Ampere, 3 Hopper, 4 Blackwell
//     kThreads         threads per block the Atom is tuned for (any block size works)
//     kAlign           16: pointers with equal alignment mod 16 take the vector path
//     kMaxSources      16: the most sources one reduce() combines
//     kSmemPerThread   shared-memory workspace bytes per thread
//     smem_bytes(t)    workspace bytes for a block of t threads; kSmemBytes = smem_bytes(kThreads)
//     kBytesInFlight   bytes of loads one block of kThreads keeps in flight
//   element types      F32, F16, BF16, E4M3, E5M2, I32, U32
//   reduce operators   Sum, Prod, Min, Max
//   helpers           tid(), nthreads(): the thread's index in its block, the block's size
//   for one block's share of the work (every thread of the block calls with the same arguments):
//     copy(dst, src, bytes, smem)
//     reduce<T, Op>(dst, srcs, n, count, [src_offset,] smem)
//     reduce_table<T, Op>(dst, n, count, smem): reduce with the n source addresses already
//       in source_table(), the block's shared u64[kMaxSources], which the caller fills (one
//       thread per source) between a barrier after its previous Atom call and one before
//       this call
//
// dst and sources may be local or peer pointers. `smem` is the block's dynamic shared
// memory workspace (at least smem_bytes(blockDim) bytes, 16-byte aligned); it belongs to
// the Atom during the call (the Atom enters with a block barrier, so the caller's earlier
// uses of it are safe).
//
// reduce combines in rank order (dst = ((s0 op s1) op s2) ...), deterministic, accumulating
// 8- and 16-bit floats in f32 and rounding once to nearest even; e4m3 saturates to +-448,
// e5m2 overflows to +-Inf, NaN stays NaN, min/max propagate NaN, integers wrap.
//
// Completion: when copy()/reduce() returns in every thread of the block, all its reads of
// the sources and writes of the destination are performed and visible to ordinary
// (generic-proxy) accesses of that block: the Atom waits for its own asynchronous copies
// (cp.async.wait_group, bulk-copy waits, proxy fences) and ends with a block barrier.
// Ordering towards other blocks and other GPUs is the caller's (kernels/snac/sync.cuh).
//
// The generation's implementation is supplied by the compiler (purlin-atom) under the
// include name "atom_impl.cuh"; this header never names an architecture's file.
#pragma once

#if __has_include("atom_impl.cuh")
#include "atom_impl.cuh"

// The contract, checked at compile time for whichever implementation was supplied.
static_assert(purlin::atom::kGeneration >= 1 && purlin::atom::kGeneration <= 4, "unknown Atom generation");
static_assert(purlin::atom::kThreads > 0 && purlin::atom::kThreads <= 1024, "kThreads out of range");
static_assert(purlin::atom::kAlign == 16, "the vector paths are 16 bytes wide");
static_assert(purlin::atom::kMaxSources == 16, "reduce takes up to 16 sources");
static_assert(purlin::atom::kSmemBytes == purlin::atom::smem_bytes(purlin::atom::kThreads), "workspace size");
static_assert(purlin::atom::kSmemBytes % 16 == 0, "workspace is 16-byte granular");
static_assert(purlin::atom::kBytesInFlight > 0, "an Atom keeps loads in flight");
#endif
