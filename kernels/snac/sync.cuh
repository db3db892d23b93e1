// The memory-ordering contract of SNAC (docs/design.md §3.6). This is the only file under
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

// One fence for N peers: the last arriver of a lane issues it before the flag stores.
__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

// The chunk's arrival counter: block-level producers meet here (device scope suffices,
// the counter is local; the system-scope edge is the fence above).
__device__ __forceinline__ u64 atom_add_acq_rel_gpu(u64* p, u64 v) {
  u64 old;
  asm volatile("atom.add.acq_rel.gpu.global.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  return old;
}

// Takes the next piece number of a shared stage's ticket. Relaxed: the ticket only hands out
// work; the writers' arrival counter (acq_rel above) orders the pieces before the signal.
__device__ __forceinline__ u64 ticket_take(u64* p) {
  u64 old;
  asm volatile("atom.add.relaxed.gpu.global.u64 %0, [%1], 1;" : "=l"(old) : "l"(p) : "memory");
  return old;
}

// The last arriver of a round puts its counter back to zero (before publish_fence and the
// notifications, which order the reset before any arrival of the counter's next round).
__device__ __forceinline__ void counter_reset(u64* p) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(0ull) : "memory");
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

// A 16-byte packet of the latency regime (docs/design.md §3.2): 8 bytes of data and an 8-byte
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

// An 8-byte packet (NCCL's LL shape): 4 bytes of data and a 4-byte flag in one 8-byte
// store. The flag carries the low 32 bits of the epoch-derived value.
struct Packet8 {
  unsigned int data;
  unsigned int flag;
};

__device__ __forceinline__ void st_packet8_sys(Packet8* p, unsigned int data, unsigned int flag) {
  asm volatile("st.relaxed.sys.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(data), "r"(flag) : "memory");
}

__device__ __forceinline__ Packet8 ld_packet8_sys(const Packet8* p) {
  Packet8 v;
  asm volatile("ld.relaxed.sys.global.v2.u32 {%0, %1}, [%2];" : "=r"(v.data), "=r"(v.flag) : "l"(p) : "memory");
  return v;
}

// Outcome of a bounded wait.
enum WaitResult { kWaitOk = 0, kWaitTimeout = 1, kWaitPoisoned = 2 };

// How many polls pass between looks at the clock and at the poison word.
constexpr unsigned int kPollsPerCheck = 64;

// Waits (one thread) until *flag >= target. Gives up when `timeout_ns` has passed since
// `start_ns` or when the communicator's poison word becomes nonzero (another block or
// kernel already failed). Every poll is an acquire load, so the load that sees the value
// is the acquire: a flag already set costs one system-scope round trip, not two (a relaxed
// poll, then an acquire; round 83).
__device__ __forceinline__ WaitResult wait_geq_bounded(const u64* flag, u64 target, const u64* poison, u64 start_ns,
                                                      u64 timeout_ns) {
  unsigned int polls = 0;
  while (ld_acquire_sys(flag) < target) {
    if (++polls % kPollsPerCheck == 0) {
      if (ld_relaxed_sys(poison) != 0) return kWaitPoisoned;
      if (now_ns() - start_ns > timeout_ns) return kWaitTimeout;
    }
  }
  return kWaitOk;
}

// Polls one packet until its flag equals `expect` (low 32 bits for 8-byte packets); the
// data arrives in the same load, so no acquire is needed. Bounded like wait_geq_bounded.
__device__ __forceinline__ WaitResult poll_packet16(const Packet16* p, u64 expect, const u64* poison, u64 start_ns,
                                                    u64 timeout_ns, u64* data) {
  unsigned int polls = 0;
  Packet16 v = ld_packet16_sys(p);
  while (v.flag != expect) {
    if (++polls % kPollsPerCheck == 0) {
      if (ld_relaxed_sys(poison) != 0) return kWaitPoisoned;
      if (now_ns() - start_ns > timeout_ns) return kWaitTimeout;
    }
    v = ld_packet16_sys(p);
  }
  *data = v.data;
  return kWaitOk;
}

__device__ __forceinline__ WaitResult poll_packet8(const Packet8* p, u64 expect, const u64* poison, u64 start_ns,
                                                   u64 timeout_ns, u64* data) {
  unsigned int polls = 0;
  const unsigned int want = (unsigned int)expect;
  Packet8 v = ld_packet8_sys(p);
  while (v.flag != want) {
    if (++polls % kPollsPerCheck == 0) {
      if (ld_relaxed_sys(poison) != 0) return kWaitPoisoned;
      if (now_ns() - start_ns > timeout_ns) return kWaitTimeout;
    }
    v = ld_packet8_sys(p);
  }
  *data = v.data;
  return kWaitOk;
}

// Publishes this block's completed writes (after a block barrier) and sets flag words of
// peers: one system-scope fence for all of them, then relaxed stores (docs/design.md §3.6).
__device__ __forceinline__ void publish_fence() { fence_acq_rel_sys(); }

// Marks the communicator poisoned and records why: control[1] = peer + 1 (0: unknown),
// control[2] = epoch, control[3] = block, control[4] = step record, control[5] = chunk.
// The record is written before the poison word, so a host that sees the word sees it.
__device__ __forceinline__ void poison_with(u64* control, u64 peer_plus_one, u64 epoch, u64 block, u64 step,
                                            u64 chunk) {
  st_relaxed_sys(&control[1], peer_plus_one);
  st_relaxed_sys(&control[2], epoch);
  st_relaxed_sys(&control[3], block);
  st_relaxed_sys(&control[4], step);
  st_relaxed_sys(&control[5], chunk);
  fence_acq_rel_sys();
  st_relaxed_sys(&control[0], 1);
}

// Marks the communicator poisoned because a peer's call differs from this rank's (the call
// check, exec.cuh): control[0] = 2, control[1] = peer + 1, control[6] and control[7] = this
// rank's and the peer's call words (number << 32 | digest).
__device__ __forceinline__ void poison_call_mismatch(u64* control, u64 peer, u64 mine, u64 theirs) {
  st_relaxed_sys(&control[1], peer + 1);
  st_relaxed_sys(&control[6], mine);
  st_relaxed_sys(&control[7], theirs);
  fence_acq_rel_sys();
  st_relaxed_sys(&control[0], 2);
}

__device__ __forceinline__ bool poisoned(const u64* control) { return ld_relaxed_sys(control) != 0; }

}  // namespace sync
}  // namespace purlin
