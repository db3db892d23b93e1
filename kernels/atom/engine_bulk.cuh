// The bulk-copy (TMA) engine (sm_90+), an opt-in variant of the Hopper Atom
// (AtomParams::bulk): copy moves chunks of VECS x 16 x nthreads bytes with
// cp.async.bulk global -> shared (completing on an mbarrier per stage) and
// cp.async.bulk shared -> global, driven by one thread; STAGES stages. Reduce is the
// cp.async engine's (same workspace). Kept only if it measures faster (docs/design.md §4: the
// reference found cp.async 10-12% faster).
//
// Every wait is bounded (kBulkTimeoutNs): a fault in this engine yields wrong bytes, which
// the tests see, never a hang.
#pragma once
#include "atom_common.cuh"
#include "engine_cp_async.cuh"

namespace purlin {
namespace atom {

constexpr u64 kBulkTimeoutNs = 2000000000ull;

__device__ __forceinline__ u64 bulk_now_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_inval(u32 bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Returns false if the phase did not complete within kBulkTimeoutNs.
__device__ __forceinline__ bool mbar_wait(u32 bar, u32 parity) {
  const u64 start = bulk_now_ns();
  for (;;) {
    u32 done;
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    if (done) return true;
    if (bulk_now_ns() - start > kBulkTimeoutNs) return false;
  }
}
__device__ __forceinline__ void bulk_load(u32 smem, const void* gsrc, u32 bytes, u32 bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem),
               "l"(gsrc), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void bulk_store(void* gdst, u32 smem, u32 bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(gdst), "r"(smem), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read_le1() { asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

template <u32 STAGES, u32 VECS>
struct BulkEngine {
  static_assert(STAGES >= 2 && STAGES <= 16, "2..16 stages");
  static constexpr u32 kSmemPerThread = STAGES * VECS * 16;
  static constexpr u32 kInFlightPerThread = (STAGES - 1) * VECS * 16;

  static __device__ __forceinline__ void copy_vectors(V16* dst, const V16* src, u64 nvec, void* smem) {
    __shared__ alignas(8) u64 bars[STAGES];
    if (tid() == 0) {
      const u32 chunk = VECS * 16u * nthreads();  // bytes per stage
      const u32 base = smem_addr(smem);
      const u32 bar0 = smem_addr(bars);
      const u64 bytes = nvec * 16u;
      const u64 items = (bytes + chunk - 1) / chunk;
      for (u32 s = 0; s < STAGES; ++s) mbar_init(bar0 + 8u * s, 1);
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      auto len_of = [&](u64 k) -> u32 { return (u32)(bytes - k * chunk < chunk ? bytes - k * chunk : chunk); };
      auto load = [&](u64 k) {
        const u32 s = (u32)(k % STAGES);
        const u32 len = len_of(k);
        mbar_expect_tx(bar0 + 8u * s, len);
        bulk_load(base + s * chunk, (const u8*)src + k * chunk, len, bar0 + 8u * s);
      };
      for (u64 k = 0; k < items && k < STAGES; ++k) load(k);
      bool ok = true;
      u64 failed = 0;
      for (u64 k = 0; k < items; ++k) {
        const u32 s = (u32)(k % STAGES);
        if (!mbar_wait(bar0 + 8u * s, (u32)((k / STAGES) & 1u))) {
          ok = false;
          failed = k;
          break;
        }
        bulk_store((u8*)dst + k * chunk, base + s * chunk, len_of(k));
        bulk_commit();
        // The stage of item k - 1 is free once its store has read it: refill it.
        if (k >= 1 && k - 1 + STAGES < items) {
          bulk_wait_read_le1();
          load(k - 1 + STAGES);
        }
      }
      bulk_wait_all();
      asm volatile("fence.proxy.async.global;" ::: "memory");
      if (!ok) {
        // A load never completed: its bytes stay unwritten (the tests catch it). Wait
        // (bounded) for the loads issued after it, items failed .. failed + STAGES - 2,
        // before the workspace is given back.
        for (u64 j = failed + 1; j < items && j + 1 < failed + STAGES; ++j) {
          (void)mbar_wait(bar0 + 8u * (u32)(j % STAGES), (u32)((j / STAGES) & 1u));
        }
      }
      for (u32 s = 0; s < STAGES; ++s) mbar_inval(bar0 + 8u * s);
    }
  }

  template <class T, class Op>
  static __device__ __forceinline__ void reduce_vectors(V16* dst, const u64* srcs, u64 off, u32 n, u64 nvec,
                                                        void* smem) {
    CpAsyncEngine<STAGES, VECS>::template reduce_vectors<T, Op>(dst, srcs, off, n, nvec, smem);
  }
};

}  // namespace atom
}  // namespace purlin
