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

// A thread's share of a pipelined stream of tiles (VECS vectors per thread per tile, the
// whole tiles unmasked and the last, partial one cut at `rem` vectors of the tile).
template <u32 VECS>
struct TileShape {
  u32 t, nt, stride;  // thread, threads, bytes between a thread's vectors (shared and global)
  u64 tile_bytes;     // one tile of the block
  u64 whole;          // whole tiles
  u32 rem;            // vectors of the last, partial tile (0: none)
  __device__ __forceinline__ TileShape(u64 nvec) {
    t = tid();
    nt = nthreads();
    stride = nt * 16u;
    const u64 tile = (u64)VECS * nt;
    tile_bytes = tile * 16u;
    whole = nvec / tile;
    rem = (u32)(nvec - whole * tile);
  }
  // Does the thread hold vector v of the partial tile?
  __device__ __forceinline__ bool in_rem(u32 v) const { return v * nt + t < rem; }
  // consume(masked) once per tile: the whole tiles unmasked in a loop left rolled (NVRTC
  // unrolled the copy's four times, round 132, which made every copy slower), then the
  // partial one masked; then the pipeline drained.
  template <class Consume>
  __device__ __forceinline__ void walk(Consume& consume) const {
#pragma unroll 1
    for (u64 k = 0; k < whole; ++k) consume(false);
    if (rem) consume(true);
    cp_async_wait<0>();
  }
};

// One source's issue cursor: the thread's address in the next tile to load, as bytes, and
// the end of the source's whole tiles (no tile index, no per-tile clamp).
template <u32 VECS>
struct IssueCursor {
  u64 cur, end;
  __device__ __forceinline__ IssueCursor(u64 src, const TileShape<VECS>& sh)
      : cur(src + sh.t * 16u), end(src + sh.t * 16u + sh.whole * sh.tile_bytes) {}
  // One item: the next tile into the stage at `addr`, one commit group, empty past the end
  // (the waits count items).
  __device__ __forceinline__ void issue(u32 addr, const TileShape<VECS>& sh) {
    if (cur < end) {
#pragma unroll
      for (u32 v = 0; v < VECS; ++v) cp_async16(addr + v * sh.stride, (const void*)(cur + (u64)v * sh.stride));
    } else if (cur == end) {
#pragma unroll
      for (u32 v = 0; v < VECS; ++v) {
        if (sh.in_rem(v)) cp_async16(addr + v * sh.stride, (const void*)(cur + (u64)v * sh.stride));
      }
    }
    cp_async_commit();
    cur += sh.tile_bytes;
  }
};

// The thread's ring of STAGES stages in the workspace: `here` is the stage of the item to
// read; `last` the stage read one item earlier, which the next issue refills (behind the
// wait and the uses of the values read from it). Item k lives in stage k % STAGES.
template <u32 STAGES, u32 VECS>
struct StageRing {
  u32 begin, final_stage, slot_bytes, here, last;
  __device__ __forceinline__ StageRing(void* smem, const TileShape<VECS>& sh) {
    slot_bytes = VECS * sh.stride;
    begin = smem_addr(smem) + sh.t * 16u;
    final_stage = begin + (STAGES - 1) * slot_bytes;
    here = begin;
    last = final_stage;  // item STAGES - 1, the first issued after the prologue
  }
  __device__ __forceinline__ u32 stage(u32 k) const { return begin + k * slot_bytes; }
  __device__ __forceinline__ void advance() {
    last = here;
    here = here == final_stage ? begin : here + slot_bytes;
  }
};

// Which reduces take reduce_two at two sources: those whose pair combines without
// unpacking to a wider accumulator (Pairwise words), and f32 and f16 sums (f16 combines
// in f32, one conversion per lane each way: faster, round 135).
template <class T, class Op>
struct TwoSourcePipeline {
  static constexpr bool value = Pairwise<T, Op>::value;
};
template <>
struct TwoSourcePipeline<F32, Sum> {
  static constexpr bool value = true;
};
template <>
struct TwoSourcePipeline<F16, Sum> {
  static constexpr bool value = true;
};
// Mean (the executor's Avg): fp8 through its Pairwise halving; bf16 unpacked (below); the
// others as their sum. (fp8 unpacked added ~5000 instructions, round 132.)
template <class T>
struct TwoSourcePipeline<T, Mean> {
  static constexpr bool value =
      Pairwise<T, Mean>::value || (TwoSourcePipeline<T, Sum>::value && !Pairwise<T, Sum>::value);
};
template <>
struct TwoSourcePipeline<BF16, Mean> {
  static constexpr bool value = true;
};

template <u32 STAGES, u32 VECS>
struct CpAsyncEngine {
  static_assert(STAGES >= 2, "the pipeline needs at least two stages");
  static constexpr u32 kSmemPerThread = STAGES * VECS * 16;
  static constexpr u32 kInFlightPerThread = (STAGES - 1) * VECS * 16;

  // Copy through the ring: item k is tile k, one commit group per item; the whole tiles
  // unmasked, the last, partial one cut at `rem` vectors.
  static __device__ __forceinline__ void copy_vectors(V16* dst, const V16* src, u64 nvec, void* smem) {
    const TileShape<VECS> sh(nvec);
    IssueCursor<VECS> in((u64)src, sh);
    StageRing<STAGES, VECS> ring(smem, sh);
#pragma unroll
    for (u32 k = 0; k + 1 < STAGES; ++k) in.issue(ring.stage(k), sh);
    u8* d = (u8*)dst + (u64)sh.t * 16u;
    auto consume = [&](const bool masked) {
      cp_async_wait<STAGES - 2>();
#pragma unroll
      for (u32 v = 0; v < VECS; ++v) {
        if (!masked || sh.in_rem(v)) st_global_v16(d + (u64)v * sh.stride, ld_shared_v16(ring.here + v * sh.stride));
      }
      in.issue(ring.last, sh);
      ring.advance();
      d += sh.tile_bytes;
    };
    sh.walk(consume);
  }

  // Reduce of two sources (every reduce at world 2): reduce_vectors's pipeline with its
  // bookkeeping cut to what two sources need. Item k is (tile k / 2, source k % 2), so every
  // issue's source is known at compile time and its cursor is in registers (no shared-table
  // read per item); the first source's vectors stay packed until the second's arrive
  // (combine_pair).
  template <class T, class Op>
  static __device__ __forceinline__ void reduce_two(V16* dst, u64 src0, u64 src1, u64 nvec, void* smem) {
    const TileShape<VECS> sh(nvec);
    IssueCursor<VECS> in[2] = {IssueCursor<VECS>(src0, sh), IssueCursor<VECS>(src1, sh)};
    StageRing<STAGES, VECS> ring(smem, sh);
    constexpr u32 kLag = STAGES - 1;  // items in flight; item k's read issues item k + kLag
#pragma unroll
    for (u32 k = 0; k < kLag; ++k) in[k % 2].issue(ring.stage(k), sh);
    u8* d = (u8*)dst + (u64)sh.t * 16u;
    auto consume = [&](const bool masked) {
      V16 x[VECS];
      cp_async_wait<STAGES - 2>();
#pragma unroll
      for (u32 v = 0; v < VECS; ++v) {
        if (!masked || sh.in_rem(v)) x[v] = ld_shared_v16(ring.here + v * sh.stride);
      }
      in[kLag % 2].issue(ring.last, sh);
      ring.advance();
      cp_async_wait<STAGES - 2>();
#pragma unroll
      for (u32 v = 0; v < VECS; ++v) {
        if (!masked || sh.in_rem(v)) {
          st_global_v16(d + (u64)v * sh.stride, combine_pair<T, Op>(x[v], ld_shared_v16(ring.here + v * sh.stride)));
        }
      }
      in[(kLag + 1) % 2].issue(ring.last, sh);
      ring.advance();
      d += sh.tile_bytes;
    };
    sh.walk(consume);
  }

  // Reduce, rank-interleaved: pipeline item k is (tile k / n, rank k % n), one commit group
  // per item. The consumer walks tiles, and within a tile the ranks, so the accumulators
  // stay in registers without a per-item branch; addresses advance by additions (no 64-bit
  // multiplies per item) and only the last, partial tile is masked.
  // Instruction cost, bf16 sum of 2 sources (one on the peer), 64 MiB, 8 blocks, Hopper
  // 512 x 5 x 2 on an H200 (ncu smsp__inst_executed per 16-byte output vector per thread):
  // 220 with the former item loop (per-item 64-bit index arithmetic, accumulator copies,
  // per-vector bounds tests; 67 static instructions per store for the software bf16
  // encode), 94 then (145 with PURLIN_ATOM_SOFT_CONVERT=1); f32: 113 -> 56. (Measured before
  // reduce_two, which now takes two-source bf16, fp8, f16 and f32 sums.)
  template <class T, class Op>
  static __device__ __forceinline__ void reduce_vectors(V16* dst, const u64* srcs, u64 off, u32 n, u64 nvec,
                                                        void* smem) {
    // Only where a pair combines cheaply (Pairwise words, f32 and f16 sums): round 132 saw the
    // unpacked two-source path spill in the 32-bit prod/min/max kernels and add ~5000
    // instructions to fp8 prod/min/max, which gain nothing from it.
    if constexpr (TwoSourcePipeline<T, Op>::value) {
      if (n == 2) {
        reduce_two<T, Op>(dst, srcs[0] + off, srcs[1] + off, nvec, smem);
        return;
      }
    }
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
        if (!masked || v * nt + t < rem) {
#pragma unroll
          for (u32 e = 0; e < E; ++e) a[v][e] = finish<T, Op>(a[v][e], n);
          st_global_v16((V16*)(d + (u64)v * stride), T::pack(a[v]));
        }
      }
      d += tile_bytes;
    };
    const u64 whole = nvec / tile;
    for (u64 ct = 0; ct < whole; ++ct) consume(false, 0);
    if (whole < tiles) consume(true, (u32)(nvec - whole * tile));
    cp_async_wait<0>();
  }
};

}  // namespace atom
}  // namespace purlin
