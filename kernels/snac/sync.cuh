// The memory-ordering contract of SNAC (DESIGN.md §3.6). This is the only file under
// kernels/snac/ that may contain acquire/release/fence/volatile code; an invariant test
// (xtask/tests/architecture.rs) enforces it.
//
// Peers are other GPUs, so protocol flags use *system* scope.
#pragma once

namespace purlin {
namespace sync {

typedef unsigned long long u64;

// Relaxed system-scope load: the polling half of a consumer's wait.
__device__ __forceinline__ u64 ld_relaxed_sys(const u64* p) {
  u64 v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Acquire system-scope load: after polling saw the value, orders later data loads.
__device__ __forceinline__ u64 ld_acquire_sys(const u64* p) {
  u64 v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Relaxed system-scope store of a flag (issued after fence_acq_rel_sys()).
__device__ __forceinline__ void st_relaxed_sys(u64* p, u64 v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Release system-scope store (drains: all reads of a slot performed, then this).
__device__ __forceinline__ void st_release_sys(u64* p, u64 v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// One fence for N peers: the last arriver of a chunk issues it before the flag stores.
__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

// The chunk's arrival counter: block-level producers meet here (device scope suffices,
// the counter is local; the system-scope edge is the fence above).
__device__ __forceinline__ u64 atom_add_acq_rel_gpu(u64* p, u64 v) {
  u64 old;
  asm volatile("atom.add.acq_rel.gpu.global.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  return old;
}

// Nanoseconds from the GPU's global timer: the clock of bounded waits.
__device__ __forceinline__ u64 now_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Waits (one thread) until *flag >= target, at most timeout_ns; polls relaxed, then
// acquires. Returns false on timeout, so no wait is ever unbounded.
__device__ __forceinline__ bool wait_geq_sys(const u64* flag, u64 target, u64 timeout_ns) {
  const u64 start = now_ns();
  while (ld_relaxed_sys(flag) < target) {
    if (now_ns() - start > timeout_ns) return false;
  }
  (void)ld_acquire_sys(flag);
  return true;
}

// A 16-byte packet of the latency regime (DESIGN.md §3.2): 8 bytes of data and an 8-byte
// flag, stored and loaded as one 16-byte vector access so that stage and notify are one
// remote write. Whether such a packet can land torn is measured by the packet stress test
// (kernels/snac/packet_stress.cu) before the executor relies on it.
struct Packet16 {
  u64 data;
  u64 flag;
};

__device__ __forceinline__ void st_packet16_sys(Packet16* p, u64 data, u64 flag) {
  asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(data), "l"(flag) : "memory");
}

__device__ __forceinline__ Packet16 ld_packet16_sys(const Packet16* p) {
  Packet16 v;
  asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];" : "=l"(v.data), "=l"(v.flag) : "l"(p) : "memory");
  return v;
}

}  // namespace sync
}  // namespace purlin
