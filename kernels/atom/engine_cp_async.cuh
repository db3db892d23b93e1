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

  // Reduce, rank-interleaved: pipeline item k is (tile k / n, rank k % n), one commit group
  // per item. The consumer walks tiles, and within a tile the ranks, so the accumulators
  // stay in registers without a per-item branch; addresses advance by additions (no 64-bit
  // multiplies per item) and only the last, partial tile is masked.
  // Instruction cost, bf16 sum of 2 sources (one on the peer), 64 MiB, 8 blocks, Hopper
  // 512 x 5 x 2 on an H200 (ncu smsp__inst_executed per 16-byte output vector per thread):
  // 220 with the former item loop (per-item 64-bit index arithmetic, accumulator copies,
  // per-vector bounds tests; 67 static instructions per store for the software bf16
  // encode), 94 now (145 with PURLIN_ATOM_SOFT_CONVERT=1); f32: 113 -> 56.
  template <class T, class Op>
  static __device__ __forceinline__ void reduce_vectors(V16* dst, const u64* srcs, u64 off, u32 n, u64 nvec,
                                                        void* smem) {
    typedef typename T::acc A;
    constexpr u32 E = T::kLanes;
    const u32 t = tid(), nt = nthreads();
    const u32 stride = nt * 16u;              // bytes between a thread's vectors (shared and global)
    const u32 slot_bytes = VECS * stride;     // one stage
    const u32 ring_begin = smem_addr(smem) + t * 16u;
    const u32 ring_end = ring_begin + STAGES * slot_bytes;
    const u64 tile = (u64)VECS * nt;
    const u64 tile_bytes = tile * 16u;
    const u64 tiles = (nvec + tile - 1) / tile;
    // Vectors of a tile: thread t's v-th is at tile offset v * nt + t; the last tile is cut
    // at `rem` (vectors left), clamped to a tile.
    auto in_tile = [&](u64 left) -> u32 { return left > tile ? (u32)tile : (u32)left; };

    // Issue side: item (itile, irank) into the stage at iaddr.
    u64 itile = 0, ioff = off + (u64)t * 16u, ileft = nvec;
    u32 irank = 0, iaddr = ring_begin, irem = in_tile(nvec);
    auto issue = [&]() {
      if (itile < tiles) {
        const u8* s = (const u8*)(srcs[irank] + ioff);
#pragma unroll
        for (u32 v = 0; v < VECS; ++v) {
          if (v * nt + t < irem) cp_async16(iaddr + v * stride, s + (u64)v * stride);
        }
      }
      cp_async_commit();
      iaddr += slot_bytes;
      if (iaddr == ring_end) iaddr = ring_begin;
      if (++irank == n) {
        irank = 0;
        ++itile;
        ioff += tile_bytes;
        ileft -= irem;
        irem = in_tile(ileft);
      }
    };
#pragma unroll
    for (u32 s = 0; s + 1 < STAGES; ++s) issue();

    // Consumer: the stage at caddr; the slot consumed last is refilled by the next issue.
    // Whole tiles unmasked, the last partial tile (if any) masked at `rem` vectors.
    u32 caddr = ring_begin;
    u8* d = (u8*)dst + (u64)t * 16u;
    // (`masked` is a literal at both calls: the inlined copies have no per-vector test.)
    auto consume = [&](const bool masked, const u32 rem) {
      A a[VECS][E];
      cp_async_wait<STAGES - 2>();
#pragma unroll
      for (u32 v = 0; v < VECS; ++v) {
        if (!masked || v * nt + t < rem) T::unpack(ld_shared_v16(caddr + v * stride), a[v]);
      }
      caddr += slot_bytes;
      if (caddr == ring_end) caddr = ring_begin;
      issue();
      for (u32 r = 1; r < n; ++r) {
        cp_async_wait<STAGES - 2>();
#pragma unroll
        for (u32 v = 0; v < VECS; ++v) {
          if (!masked || v * nt + t < rem) {
            A b[E];
            T::unpack(ld_shared_v16(caddr + v * stride), b);
#pragma unroll
            for (u32 e = 0; e < E; ++e) a[v][e] = Op::apply(a[v][e], b[e]);
          }
        }
        caddr += slot_bytes;
        if (caddr == ring_end) caddr = ring_begin;
        issue();
      }
#pragma unroll
      for (u32 v = 0; v < VECS; ++v) {
        if (!masked || v * nt + t < rem) st_global_v16((V16*)(d + (u64)v * stride), T::pack(a[v]));
      }
      d += tile_bytes;
    };
    // Two sources with a Pairwise combine (every reduce at world 2): the first rank's vectors
    // stay packed until the second's arrive (VECS x 4 registers, not VECS x kLanes floats).
    auto consume_two = [&](const bool masked, const u32 rem) {
      V16 x[VECS];
      cp_async_wait<STAGES - 2>();
#pragma unroll
      for (u32 v = 0; v < VECS; ++v) {
        if (!masked || v * nt + t < rem) x[v] = ld_shared_v16(caddr + v * stride);
      }
      caddr += slot_bytes;
      if (caddr == ring_end) caddr = ring_begin;
      issue();
      cp_async_wait<STAGES - 2>();
#pragma unroll
      for (u32 v = 0; v < VECS; ++v) {
        if (!masked || v * nt + t < rem) {
          st_global_v16((V16*)(d + (u64)v * stride), combine_two<T, Op>(x[v], ld_shared_v16(caddr + v * stride)));
        }
      }
      caddr += slot_bytes;
      if (caddr == ring_end) caddr = ring_begin;
      issue();
      d += tile_bytes;
    };
    const u64 whole = nvec / tile;
    if constexpr (Pairwise<T, Op>::value) {
      if (n == 2) {
        for (u64 ct = 0; ct < whole; ++ct) consume_two(false, 0);
        if (whole < tiles) consume_two(true, (u32)(nvec - whole * tile));
        cp_async_wait<0>();
        return;
      }
    }
    for (u64 ct = 0; ct < whole; ++ct) consume(false, 0);
    if (whole < tiles) consume(true, (u32)(nvec - whole * tile));
    cp_async_wait<0>();
  }
};

}  // namespace atom
}  // namespace purlin
