// The cp.async engine (sm_80+): an asynchronous global -> shared pipeline of STAGES
// stages, VECS 16-byte vectors per thread per stage, STAGES - 1 stages in flight.
//
// Each thread reads back only the shared-memory slots it filled itself, so the pipeline
// needs no block barrier: cp.async.wait_group makes a thread's own async copies visible
// to that thread. A slot is refilled one iteration after it was read, behind the wait
// and the uses of the values read from it. Slot (s, v) of thread t lives at byte
// ((s * VECS + v) * nthreads + t) * 16 of the workspace: consecutive threads touch
// consecutive 16-byte words (no bank conflicts).
//
// Reduce is rank-interleaved: pipeline item k is (tile k / n, rank k % n), so the loads
// of all ranks of a tile, and of the next tiles, are in flight while a tile is combined.
#pragma once
#include "atom_common.cuh"

namespace purlin {
namespace atom {

__device__ __forceinline__ void cp_async16(u32 saddr, const void* gsrc) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(saddr), "l"(gsrc) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <u32 N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

template <u32 STAGES, u32 VECS>
struct CpAsyncEngine {
  static_assert(STAGES >= 2, "the pipeline needs at least two stages");
  static constexpr u32 kSmemPerThread = STAGES * VECS * 16;
  static constexpr u32 kInFlightPerThread = (STAGES - 1) * VECS * 16;

  static __device__ __forceinline__ void copy_vectors(V16* dst, const V16* src, u64 nvec, void* smem) {
    const u32 t = tid(), nt = nthreads();
    const u32 my = smem_addr(smem) + t * 16u;
    const u32 stride = nt * 16u;
    const u64 tile = (u64)VECS * nt;
    const u64 items = (nvec + tile - 1) / tile;
    u64 next = 0;  // next item to issue
    u32 next_slot = 0;
#pragma unroll
    for (u32 s = 0; s + 1 < STAGES; ++s) {
      if (next < items) {
#pragma unroll
        for (u32 v = 0; v < VECS; ++v) {
          const u64 i = next * tile + (u64)v * nt + t;
          if (i < nvec) cp_async16(my + (next_slot * VECS + v) * stride, src + i);
        }
      }
      cp_async_commit();
      ++next;
      next_slot = next_slot + 1 == STAGES ? 0 : next_slot + 1;
    }
    u32 slot = 0;
    for (u64 k = 0; k < items; ++k) {
      cp_async_wait<STAGES - 2>();
#pragma unroll
      for (u32 v = 0; v < VECS; ++v) {
        const u64 i = k * tile + (u64)v * nt + t;
        if (i < nvec) st_global_v16(dst + i, ld_shared_v16(my + (slot * VECS + v) * stride));
      }
      if (next < items) {
#pragma unroll
        for (u32 v = 0; v < VECS; ++v) {
          const u64 i = next * tile + (u64)v * nt + t;
          if (i < nvec) cp_async16(my + (next_slot * VECS + v) * stride, src + i);
        }
      }
      cp_async_commit();
      ++next;
      next_slot = next_slot + 1 == STAGES ? 0 : next_slot + 1;
      slot = slot + 1 == STAGES ? 0 : slot + 1;
    }
    cp_async_wait<0>();
  }

  template <class T, class Op>
  static __device__ __forceinline__ void reduce_vectors(V16* dst, const u64* srcs, u64 off, u32 n, u64 nvec,
                                                        void* smem) {
    typedef typename T::acc A;
    constexpr u32 E = T::kLanes;
    const u32 t = tid(), nt = nthreads();
    const u32 my = smem_addr(smem) + t * 16u;
    const u32 stride = nt * 16u;
    const u64 tile = (u64)VECS * nt;
    const u64 tiles = (nvec + tile - 1) / tile;
    const u64 items = tiles * n;
    // Issue side: item (itile, irank) into islot.
    u64 itile = 0, issued = 0;
    u32 irank = 0, islot = 0;
    auto issue = [&]() {
      if (issued < items) {
        const V16* s = (const V16*)(srcs[irank] + off);
#pragma unroll
        for (u32 v = 0; v < VECS; ++v) {
          const u64 i = itile * tile + (u64)v * nt + t;
          if (i < nvec) cp_async16(my + (islot * VECS + v) * stride, s + i);
        }
      }
      cp_async_commit();
      ++issued;
      islot = islot + 1 == STAGES ? 0 : islot + 1;
      if (++irank == n) {
        irank = 0;
        ++itile;
      }
    };
#pragma unroll
    for (u32 s = 0; s + 1 < STAGES; ++s) issue();
    A a[VECS][E];
    u64 ctile = 0;
    u32 crank = 0, cslot = 0;
    for (u64 k = 0; k < items; ++k) {
      cp_async_wait<STAGES - 2>();
#pragma unroll
      for (u32 v = 0; v < VECS; ++v) {
        const u64 i = ctile * tile + (u64)v * nt + t;
        if (i < nvec) {
          const V16 x = ld_shared_v16(my + (cslot * VECS + v) * stride);
          if (crank == 0) {
            T::unpack(x, a[v]);
          } else {
            A b[E];
            T::unpack(x, b);
#pragma unroll
            for (u32 e = 0; e < E; ++e) a[v][e] = Op::apply(a[v][e], b[e]);
          }
        }
      }
      if (crank + 1 == n) {
#pragma unroll
        for (u32 v = 0; v < VECS; ++v) {
          const u64 i = ctile * tile + (u64)v * nt + t;
          if (i < nvec) st_global_v16(dst + i, T::pack(a[v]));
        }
      }
      issue();
      cslot = cslot + 1 == STAGES ? 0 : cslot + 1;
      if (++crank == n) {
        crank = 0;
        ++ctile;
      }
    }
    cp_async_wait<0>();
  }
};

}  // namespace atom
}  // namespace purlin
