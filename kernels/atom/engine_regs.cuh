// The register engine: 16-byte vector loads into registers, UNROLL loads in flight per
// thread before the first use (sm_75+). Used by the generic Atom.
#pragma once
#include "atom_common.cuh"

namespace purlin {
namespace atom {

template <u32 UNROLL>
struct RegEngine {
  static constexpr u32 kSmemPerThread = 0;
  static constexpr u32 kInFlightPerThread = UNROLL * 16;

  static __device__ __forceinline__ void copy_vectors(V16* dst, const V16* src, u64 nvec, void*) {
    const u32 t = tid(), nt = nthreads();
    const u64 tile = (u64)UNROLL * nt;
    u64 base = 0;
    for (; base + tile <= nvec; base += tile) {
      V16 v[UNROLL];
#pragma unroll
      for (u32 u = 0; u < UNROLL; ++u) v[u] = ld_global_v16(src + base + (u64)u * nt + t);
#pragma unroll
      for (u32 u = 0; u < UNROLL; ++u) st_global_v16(dst + base + (u64)u * nt + t, v[u]);
    }
    if (base < nvec) {
      V16 v[UNROLL];
#pragma unroll
      for (u32 u = 0; u < UNROLL; ++u) {
        const u64 i = base + (u64)u * nt + t;
        if (i < nvec) v[u] = ld_global_v16(src + i);
      }
#pragma unroll
      for (u32 u = 0; u < UNROLL; ++u) {
        const u64 i = base + (u64)u * nt + t;
        if (i < nvec) st_global_v16(dst + i, v[u]);
      }
    }
  }

  // Loads of one rank are issued together (U in flight), ranks one after another; the
  // accumulator stays at 32 registers per thread whatever the element width.
  template <class T, class Op>
  static __device__ __forceinline__ void reduce_vectors(V16* dst, const u64* srcs, u64 off, u32 n, u64 nvec, void*) {
    typedef typename T::acc A;
    constexpr u32 E = T::kLanes;
    constexpr u32 U0 = UNROLL * sizeof(typename T::storage) / 4;
    constexpr u32 U = U0 ? U0 : 1;
    const u32 t = tid(), nt = nthreads();
    for (u64 base = 0; base < nvec; base += (u64)U * nt) {
      A a[U][E];
      V16 v[U];
#pragma unroll
      for (u32 u = 0; u < U; ++u) {
        const u64 i = base + (u64)u * nt + t;
        if (i < nvec) v[u] = ld_global_v16((const V16*)(srcs[0] + off) + i);
      }
#pragma unroll
      for (u32 u = 0; u < U; ++u) T::unpack(v[u], a[u]);
      for (u32 r = 1; r < n; ++r) {
        const V16* s = (const V16*)(srcs[r] + off);
#pragma unroll
        for (u32 u = 0; u < U; ++u) {
          const u64 i = base + (u64)u * nt + t;
          if (i < nvec) v[u] = ld_global_v16(s + i);
        }
#pragma unroll
        for (u32 u = 0; u < U; ++u) {
          A b[E];
          T::unpack(v[u], b);
#pragma unroll
          for (u32 e = 0; e < E; ++e) a[u][e] = Op::apply(a[u][e], b[e]);
        }
      }
#pragma unroll
      for (u32 u = 0; u < U; ++u) {
        const u64 i = base + (u64)u * nt + t;
        if (i < nvec) {
#pragma unroll
          for (u32 e = 0; e < E; ++e) a[u][e] = finish<T, Op>(a[u][e], n);
          st_global_v16(dst + i, T::pack(a[u]));
        }
      }
    }
  }
};

}  // namespace atom
}  // namespace purlin
