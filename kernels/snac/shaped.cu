// The shaped executor (docs/design.md §3.4): runs latency-regime plans whose block programs all
// have shapes compiled into this module (-DPURLIN_SHAPES, from the plan's kernel key), with
// each shape's step sequence unrolled at compile time. The parameter block is the
// interpreter's (crates/purlin-snac/src/params.rs); the shape fixes where each record lies
// relative to the block's first one, so every field is read at a constant offset and no step
// waits on decoding the one before. It exists because interpreting cost an 8-byte AllReduce
// about 2 us over a hand-written exchange (rounds 45-47).
//
// What differs from the interpreter (executor.cu), all inside the plan contract:
// - every thread runs the program on its own packet indices; a block barrier separates two
//   steps only after a reduce or gather (a later step may read what it wrote) and ends the
//   call;
// - the first put's payload is loaded before the entry's checks resolve, beside the poison
//   word and the epoch;
// - every wait of the call is bounded by one deadline counted from the kernel's start;
// - a gather's local part is copied by the block's threads directly (latency-regime slices
//   are small; no Atom pipeline, no dynamic shared memory).
//
// PURLIN_SHAPES lists shapes as {steps, {{op, count, record_words, packets}, ...}}, in the
// order of the kernel key; the block table's role word carries each block's shape index in
// its high 32 bits.
#include "exec.cuh"

#ifndef PURLIN_SHAPES
#define PURLIN_SHAPES {0, {}}
#endif

namespace purlin {
namespace snac {

constexpr u32 kMaxShapeSteps = 32;

struct ShapeStep {
  u32 op;
  u32 count;    // sources of a reduce
  u32 words;    // record words
  u32 packets;  // 1: a gather or reduce reads packets
};

struct Shape {
  u32 steps;
  ShapeStep step[kMaxShapeSteps];
};

constexpr Shape kShapes[] = {PURLIN_SHAPES};
constexpr u32 kShapeCount = sizeof(kShapes) / sizeof(kShapes[0]);

// Words from the block's first record to step K's, for shape S.
template <u32 S, u32 K>
__host__ __device__ constexpr u32 record_offset() {
  if constexpr (K == 0) {
    return 0;
  } else {
    return record_offset<S, K - 1>() + kShapes[S].step[K - 1].words;
  }
}

// The failing thread that poisons the communicator (its index + 1).
__shared__ int s_fail_owner;

// A thread's outcome: its first failed wait, the peer it names and the step's record.
struct Outcome {
  WaitResult res;
  u64 peer_plus_one;
  u64 at;
};

// Copies `len` bytes with the block's threads, 16 bytes at a time where both ends allow.
__device__ __forceinline__ void copy_plain(u8* dst, const u8* src, u64 len) {
  const u64 t = purlin::atom::tid(), n = purlin::atom::nthreads();
  u64 done = 0;
  if ((((u64)dst | (u64)src) & 15) == 0) {
    const u64 vecs = len / 16;
    for (u64 i = t; i < vecs; i += n) ((uint4*)dst)[i] = ((const uint4*)src)[i];
    done = vecs * 16;
  }
  for (u64 i = done + t; i < len; i += n) dst[i] = src[i];
}

// Puts this thread's packets; `pre` holds the payload of its first packet when `have_pre`.
__device__ __forceinline__ void put_step(const Ctx& x, const u64* r, bool have_pre, u64 pre) {
  if (!admits(r + 1, 0)) return;
  const u64 len = len_at(r + 13, 0);
  if (len == 0) return;
  u8* packets = window_packets(x, r + 3, 0);
  const u8* src = region_ptr(x, r + 8, 0);
  const u64 flag = val_at(x, r + 17, 0);
  const u64 words = (len + kPayload - 1) / kPayload;
  for (u64 i = purlin::atom::tid(); i < words; i += purlin::atom::nthreads()) {
    const u64 bytes = len - i * kPayload < kPayload ? len - i * kPayload : kPayload;
    const u64 data = have_pre && i == purlin::atom::tid() ? pre : load_payload(src + i * kPayload, bytes);
    put_packet(packets, i, data, flag);
  }
}

// One step of shape S: record r, this thread's outcome o (steps after a failed wait are
// skipped by the caller).
template <u32 S, u32 K>
__device__ __forceinline__ void shaped_step(const Ctx& x, const u64* r, u64 start, bool have_pre, u64 pre,
                                            Outcome& o) {
  constexpr ShapeStep st = kShapes[S].step[K];
  const bool lead = purlin::atom::tid() == 0;
  if constexpr (st.op == kPutPackets) {
    put_step(x, r, K == 0 && have_pre, pre);
  } else if constexpr (st.op == kReduce) {
    static_assert(st.packets == 1, "shaped reduces read packets");
    if (!admits(r + 1, 0)) return;
    const u64 len = len_at(r + 8, 0);
    if (len == 0) return;
    o.res = reduce_packets(x, region_ptr(x, r + 3, 0), r + 15, st.count, len, val_at(x, r + 13, 0), start, 0);
  } else if constexpr (st.op == kGather) {
    if (!admits(r + 1, 0)) return;
    const u64 len = len_at(r + 13, 0);
    if (len == 0) return;
    u8* dst = region_ptr(x, r + 3, 0);
    if constexpr (st.packets == 1) {
      o.res = gather_packets(x, dst, r + 8, len, val_at(x, r + 18, 0), start, 0);
    } else {
      copy_plain(dst, region_ptr(x, r + 8, 0), len);
    }
  } else if constexpr (st.op == kHandshakeSend) {
    if (lead) {
      const u32 peer = (u32)r[1];
      const u64 local = x.w[5] == 1 ? x.w[6] : 0;  // header: advance_kind, advance_value
      u8* packets = (u8*)(x.rt->window[peer] + off_at(r + 2, 0, x.sense) / kPayload * kPacketBytes);
      put_packet(packets, 0, local, val_at(x, r + 6, 0));
    }
  } else if constexpr (st.op == kHandshakeWait) {
    if (lead) {
      const u32 peer = (u32)r[1];
      const u8* packets = (const u8*)(x.rt->window[x.rank] + off_at(r + 2, 0, x.sense) / kPayload * kPacketBytes);
      u64 value = 0;
      o.res = get_packet(x, packets, 0, val_at(x, r + 6, 0), start, &value);
      if (o.res != purlin::sync::kWaitOk) o.peer_plus_one = peer + 1;
      if (value > s_agreed) s_agreed = value;
    }
  } else {
    static_assert(st.op == kPutPackets, "a step kind the shaped executor does not run");
  }
}

template <u32 S, u32 K>
__device__ __forceinline__ void shaped_steps(const Ctx& x, const u64* rec, u64 start, bool have_pre, u64 pre,
                                             Outcome& o) {
  if constexpr (K < kShapes[S].steps) {
    constexpr u32 at = record_offset<S, K>();
    // A later step may read what a reduce or gather wrote in this rank's memory.
    if constexpr (K > 0) {
      constexpr u32 prev = kShapes[S].step[K - 1].op;
      if constexpr (prev == kReduce || prev == kGather) __syncthreads();
    }
    trace(x, (u64)(rec + at - x.w), 0);
    if (o.res == purlin::sync::kWaitOk) {
      shaped_step<S, K>(x, rec + at, start, have_pre, pre, o);
      if (o.res != purlin::sync::kWaitOk && o.at == 0) o.at = (u64)(rec + at - x.w);
    }
    shaped_steps<S, K + 1>(x, rec, start, have_pre, pre, o);
  }
}

// Runs block program `rec` of shape S.
template <u32 S>
__device__ __forceinline__ void run_shape(const u64* w, const Runtime* rt, const u64* rec, u64 start) {
  const ParamHeader* h = (const ParamHeader*)w;
  const u32 t = purlin::atom::tid();
  // The first put's payload, loaded before the entry's checks resolve (its source is the
  // input or output, whose address does not depend on the epoch's sense).
  bool have_pre = false;
  u64 pre = 0;
  if constexpr (kShapes[S].steps > 0 && kShapes[S].step[0].op == kPutPackets) {
    const u64* src = rec + 8;
    const u64 len = len_at(rec + 13, 0);
    if (admits(rec + 1, 0) && space_kind(src) <= kOutput && src[4] == 0 && (u64)t * kPayload < len) {
      const Ctx x0{w, rt, 0, 0, 0, 0, nullptr};
      const u64 bytes = len - t * kPayload < kPayload ? len - t * kPayload : kPayload;
      pre = load_payload(region_ptr(x0, src, 0) + t * kPayload, bytes);
      have_pre = true;
    }
  }
  const u64 epoch = ((const u64*)rt->epochs)[blockIdx.x];
  const bool poisoned = purlin::sync::poisoned((const u64*)rt->control);
  if (t == 0) {
    s_agreed = 0;
    s_trace_count = 0;
  }
  // A poisoned communicator runs nothing; one barrier makes the decision the block's.
  if (__syncthreads_or(poisoned || h->magic != kParamMagic || h->version != kParamVersion)) return;
  const Ctx x{w, rt, epoch, epoch & 1, h->world, h->rank, nullptr};
  Outcome o{purlin::sync::kWaitOk, 0, 0};
  shaped_steps<S, 0>(x, rec, start, have_pre, pre, o);
  const bool failed = __syncthreads_or(o.res != purlin::sync::kWaitOk);
  trace_end(x, !failed);
  if (failed) {
    // One failing thread (whichever store lands) records why; a wait that saw the poison
    // word adds nothing.
    if (o.res != purlin::sync::kWaitOk) s_fail_owner = (int)t + 1;
    __syncthreads();
    if (s_fail_owner == (int)t + 1 && o.res != purlin::sync::kWaitPoisoned) {
      purlin::sync::poison_with((u64*)rt->control, o.peer_plus_one, epoch, blockIdx.x, o.at, 0);
    }
    return;  // a failed call does not advance: the communicator is poisoned from here on
  }
  advance_epochs(h, rt, epoch);
}

template <u32 S>
__device__ __forceinline__ void dispatch(u32 id, const u64* w, const Runtime* rt, const u64* rec, u64 start) {
  if constexpr (S < kShapeCount) {
    if (id == S) {
      run_shape<S>(w, rt, rec, start);
    } else {
      dispatch<S + 1>(id, w, rt, rec, start);
    }
  } else if (purlin::atom::tid() == 0) {
    // A block table naming a shape this module lacks: malformed, like an unknown opcode.
    purlin::sync::poison_with((u64*)rt->control, 0, ((const u64*)rt->epochs)[blockIdx.x], blockIdx.x,
                              (u64)(rec - w), 0);
  }
}

__device__ __forceinline__ void run_shaped_block(const u64* w, const Runtime* rt, bool /*in_device_memory*/) {
  const u64 start = purlin::sync::now_ns();
  const ParamHeader* h = (const ParamHeader*)w;
  if (rt->trace != 0 && purlin::atom::tid() == 0) {
    ((u64*)rt->trace + (u64)blockIdx.x * rt->trace_capacity * kTraceWords)[2] = start;
  }
  const u64* entry = w + h->block_table + 3 * blockIdx.x;
  dispatch<0>((u32)(entry[0] >> 32), w, rt, w + entry[1], start);
}

}  // namespace snac
}  // namespace purlin

PURLIN_EXEC_ENTRY_POINTS(purlin_snac_shaped, purlin::snac::run_shaped_block)
