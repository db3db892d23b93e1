// What both device executors share (kernels/snac/executor.cu interprets any plan,
// kernels/snac/shaped.cu runs latency plans of one compiled shape): the kernel key's -D
// options, the per-call pointers, reading records of the parameter block, packets, the
// failure record and the debug trace.
#pragma once

#include "atom.cuh"
#include "params.cuh"
#include "sync.cuh"

#ifndef PURLIN_T
#define PURLIN_T U32
#endif
#ifndef PURLIN_OP
#define PURLIN_OP Sum
#endif
#ifndef PURLIN_PACKET
#define PURLIN_PACKET 8
#endif
#ifndef PURLIN_PARAM_WORDS
#define PURLIN_PARAM_WORDS 3968
#endif
// The executor's block index and block count: the launch's, or in a fused kernel
// (kernels/include/purlin/collective.cuh) the contracted blocks' own numbering.
#ifndef PURLIN_CALL_BLOCK
#define PURLIN_CALL_BLOCK blockIdx.x
#define PURLIN_CALL_GRID gridDim.x
#endif

namespace purlin {
namespace snac {

typedef unsigned int u32;
typedef long long i64;
typedef unsigned char u8;
using purlin::sync::Packet16;
using purlin::sync::Packet8;
using purlin::sync::WaitResult;

constexpr u32 kMaxWorld = 16;

// Per-call pointers, filled by the host (purlin-collectives/src/exec/device.rs mirrors this
// struct; a CI test checks its size and offsets).
struct Runtime {
  u64 input;
  u64 output;
  u64 staging[kMaxWorld];  // every rank's staging base, as mapped on this rank
  u64 window[kMaxWorld];   // every rank's packet-window base
  u64 flags[kMaxWorld];    // every rank's flag words (signals and drains)
  u64 counters;            // this rank's arrival counters
  u64 epochs;              // this rank's per-block epochs
  u64 control;             // this rank's poison word and failure record
  u64 timeout_ns;          // bound of every wait
  u64 trace;               // debug trace (0: off): per block, trace_capacity entries of 5 words
  u32 trace_capacity;  // trace entries per block
  u32 call_number;     // this rank's count of launched calls, this one included (the call check; 0: off)
  u64 peer_output[kMaxWorld];  // every rank's registered output, as mapped here (one-copy plans)
  u64 peer_input[kMaxWorld];   // every rank's registered input, as mapped here (one-copy plans)
};
// ExecRuntime's size (kernels.rs EXEC_RUNTIME_BYTES): 2 + 5 * 16 + 6 words.
static_assert(sizeof(Runtime) == 8 * (2 + 5 * kMaxWorld + 6), "Runtime must match ExecRuntime");

template <u32 WORDS>
struct ParamBlock {
  u64 w[WORDS];
};

typedef purlin::atom::PURLIN_T Elem;
typedef purlin::atom::PURLIN_OP ReduceOp;
typedef typename Elem::storage Storage;
typedef typename Elem::acc Acc;
constexpr u64 kPacketBytes = PURLIN_PACKET;
constexpr u64 kPayload = kPacketBytes / 2;  // payload bytes per packet
static_assert(kPacketBytes == 8 || kPacketBytes == 16, "packets are 8 or 16 bytes");
static_assert(kPayload % sizeof(Storage) == 0, "an element never straddles two packets");
constexpr u32 kLanes = kPayload / sizeof(Storage);

// ------------------------------------------------------------------ record field access

struct Ctx {
  const u64* w;        // the parameter words
  const Runtime* rt;
  u64 epoch;           // E: this block's epoch at entry
  u64 sense;           // E & 1
  u64 world;
  u64 rank;
  u8* smem;
};

// Chunk c's slot among m slots (m > 0), for chunks past the first m. Plans keep chunk counts
// and slot counts below 2^32 (Plan::check), so a 32-bit remainder does: a 64-bit one is a
// slow subroutine on sm_90 (rounds 98 and 102). Out of line, so that it runs only where
// called: inlined, it slowed the one-copy calls, whose plans have no slot counts (round 99).
__device__ __noinline__ u64 chunk_slot_divide(u64 c, u64 m) { return (u64)((u32)c % (u32)m); }

__device__ __forceinline__ u64 off_at(const u64* o, u64 c, u64 s) {
  // (No slot count, or a chunk below it: the chunk itself. A literal chunk 0 folds to 0.)
  const u64 k = o[2] == 0 || c < o[2] ? c : chunk_slot_divide(c, o[2]);
  return o[0] + k * o[1] + s * o[3];
}

__device__ __forceinline__ u64 len_at(const u64* l, u64 c) {
  const u64 start = l[2] + c * l[3];
  const u64 left = l[1] > start ? l[1] - start : 0;
  return left < l[0] ? left : l[0];
}

__device__ __forceinline__ u64 val_at(const Ctx& x, const u64* v, u64 c) { return x.epoch + c * v[0] + (u64)(i64)v[1]; }

__device__ __forceinline__ u64 idx_at(u64 word, u64 c) {
  const u64 base = word & 0xffffffffull, modulus = word >> 32;
  return base + (modulus == 0 ? 0 : c < modulus ? c : chunk_slot_divide(c, modulus));
}

__device__ __forceinline__ bool admits(const u64* g, u64 c) { return g[0] <= c && c < g[1]; }

__device__ __forceinline__ u32 space_kind(const u64* r) { return (u32)(r[0] >> 32); }
__device__ __forceinline__ u32 space_rank(const u64* r) { return (u32)(r[0] & 0xffffffffull); }

// The Runtime word that holds a space's base: input 0, output 1, then a rank's staging,
// window, peer output or peer input. Arithmetic on one constant, not a switch: the switch
// compiled to a jump table read from the constant bank and an indirect branch per region,
// which slowed every kind of call (round 107). A kind past kPeerInput reads as a window, as
// the switch's default did.
__device__ __forceinline__ u32 runtime_base_word(u32 kind, u32 rank) {
  // Runtime's layout in words (NVRTC has no offsetof): input, output, staging[16], window[16],
  // flags[16], six single words (the last: trace_capacity and call_number), peer_output[16], peer_input[16].
  constexpr u64 kStagingWord = 2, kWindowWord = kStagingWord + kMaxWorld;
  constexpr u64 kPeerOutputWord = kWindowWord + 2 * kMaxWorld + 6, kPeerInputWord = kPeerOutputWord + kMaxWorld;
  static_assert(kPeerInputWord + kMaxWorld == sizeof(Runtime) / sizeof(u64), "Runtime's layout changed");
  constexpr u64 kFirstWord = 0ull | 1ull << 8 | kStagingWord << 16 | kWindowWord << 24 | kPeerOutputWord << 32 |
                             kPeerInputWord << 40;
  const u32 k = kind > kPeerInput ? (u32)kWindow : kind;
  // (A checked plan's ranks are below kMaxWorld; the remainder keeps any word inside Runtime.)
  return (u32)((kFirstWord >> (8 * k)) & 0xff) + (k >= kStaging ? rank % kMaxWorld : 0);
}

// A non-window region's address at chunk c.
__device__ __forceinline__ u8* region_ptr(const Ctx& x, const u64* r, u64 c) {
  const u64 base = ((const u64*)x.rt)[runtime_base_word(space_kind(r), space_rank(r))];
  return (u8*)(base + off_at(r + 1, c, x.sense));
}

// A window region's first packet at chunk c (offsets count payload bytes).
__device__ __forceinline__ u8* window_packets(const Ctx& x, const u64* r, u64 c) {
  return (u8*)(x.rt->window[space_rank(r)] + off_at(r + 1, c, x.sense) / kPayload * kPacketBytes);
}

// ------------------------------------------------------------------ packets

// Loads up to kPayload bytes of a payload word (zero-padded past `bytes`). A partial or
// misaligned payload (a call's last elements, a buffer at an odd offset) takes the widest
// aligned loads that fit: byte by byte, one partial payload slowed small calls (round 52).
__device__ __forceinline__ u64 load_payload(const u8* src, u64 bytes) {
  if (bytes >= kPayload && ((u64)src % kPayload) == 0) {
    return kPayload == 8 ? *(const u64*)src : (u64) * (const u32*)src;
  }
  const u64 n = bytes < kPayload ? bytes : kPayload;
  u64 v = 0, i = 0;
  if ((u64)src % 4 == 0) {
#pragma unroll
    for (u32 k = 0; k < kPayload / 4; ++k) {
      if (i + 4 <= n) {
        v |= (u64) * (const u32*)(src + i) << (8 * i);
        i += 4;
      }
    }
  }
  if (i + 2 <= n && (u64)(src + i) % 2 == 0) {
    v |= (u64) * (const unsigned short*)(src + i) << (8 * i);
    i += 2;
  }
  for (; i < n; ++i) v |= (u64)src[i] << (8 * i);
  return v;
}

// Stores the first `bytes` (at most kPayload) bytes of a payload word, like load_payload.
__device__ __forceinline__ void store_payload(u8* dst, u64 v, u64 bytes) {
  if (bytes >= kPayload && ((u64)dst % kPayload) == 0) {
    if (kPayload == 8) {
      *(u64*)dst = v;
    } else {
      *(u32*)dst = (u32)v;
    }
    return;
  }
  const u64 n = bytes < kPayload ? bytes : kPayload;
  u64 i = 0;
  if ((u64)dst % 4 == 0) {
#pragma unroll
    for (u32 k = 0; k < kPayload / 4; ++k) {
      if (i + 4 <= n) {
        *(u32*)(dst + i) = (u32)(v >> (8 * i));
        i += 4;
      }
    }
  }
  if (i + 2 <= n && (u64)(dst + i) % 2 == 0) {
    *(unsigned short*)(dst + i) = (unsigned short)(v >> (8 * i));
    i += 2;
  }
  for (; i < n; ++i) dst[i] = (u8)(v >> (8 * i));
}

__device__ __forceinline__ void put_packet(u8* packets, u64 i, u64 data, u64 flag) {
  if (kPacketBytes == 16) {
    purlin::sync::st_packet16_sys((Packet16*)packets + i, data, flag);
  } else {
    purlin::sync::st_packet8_sys((Packet8*)packets + i, (u32)data, (u32)flag);
  }
}

__device__ __forceinline__ WaitResult get_packet(const Ctx& x, const u8* packets, u64 i, u64 expect, u64 start,
                                                 u64* data) {
  const u64* poison = (const u64*)x.rt->control;
  if (kPacketBytes == 16) {
    return purlin::sync::poll_packet16((const Packet16*)packets + i, expect, poison, start, x.rt->timeout_ns, data);
  }
  return purlin::sync::poll_packet8((const Packet8*)packets + i, expect, poison, start, x.rt->timeout_ns, data);
}

// ------------------------------------------------------------------ failure

struct Failure {
  int code;  // 0 none, 1 timeout, 2 poisoned elsewhere, 3 malformed plan
  u64 peer_plus_one;
  u64 step;
  u64 chunk;
};

__shared__ Failure s_failure;

__device__ __forceinline__ void fail(int code, u64 peer_plus_one, u64 step, u64 chunk) {
  // Any thread may fail; the first writer's record is as good as any.
  if (s_failure.code == 0) s_failure = Failure{code, peer_plus_one, step, chunk};
}

__device__ __forceinline__ void note_wait(WaitResult r, u64 peer_plus_one, u64 step, u64 chunk) {
  if (r == purlin::sync::kWaitTimeout) fail(1, peer_plus_one, step, chunk);
  if (r == purlin::sync::kWaitPoisoned) fail(2, peer_plus_one, step, chunk);
}

// ------------------------------------------------------------------ data steps

// Two sources of a bf16 or fp8 Sum or an fp8 Mean (`Pairwise`, which the Atom adds in
// bf16x2 / f16x2): at world 2 a payload is combined without decoding its lanes to f32 and
// encoding each in software, which is faster (rounds 128, 129 and 140).
constexpr bool kPairwise = purlin::atom::Pairwise<Elem, ReduceOp>::value;

// Element-wise reduce of `len` bytes where some sources are packets in this rank's window.
// Each thread stops at its first failed wait (bounded from `start`) and returns its result.
__device__ WaitResult reduce_packets(const Ctx& x, u8* dst, const u64* srcs, u32 n, u64 len, u64 expect,
                                     u64 start, u64 c) {
  const u64 words = (len + kPayload - 1) / kPayload;
  for (u64 i = purlin::atom::tid(); i < words; i += purlin::atom::nthreads()) {
    const u64 bytes = len - i * kPayload < kPayload ? len - i * kPayload : kPayload;
    Acc acc[kLanes];
    // Local sources are loaded before any packet is polled, so their load latency overlaps
    // the packets' flight instead of following it; the combination stays in rank order.
    u64 local[kMaxWorld];
    for (u32 r = 0; r < n && r < kMaxWorld; ++r) {
      const u64* reg = srcs + 5 * r;
      if (space_kind(reg) != kWindow) local[r] = load_payload(region_ptr(x, reg, c) + i * kPayload, bytes);
    }
    // kPairwise at n == 2: rank 0's word waits in `first` and the pair is combined packed.
    u64 first = 0, out = 0;
    bool combined = false;
    for (u32 r = 0; r < n && r < kMaxWorld; ++r) {
      const u64* reg = srcs + 5 * r;
      u64 word = 0;
      if (space_kind(reg) == kWindow) {
        const WaitResult res = get_packet(x, window_packets(x, reg, c), i, expect, start, &word);
        if (res != purlin::sync::kWaitOk) return res;
      } else {
        word = local[r];
      }
      // (NVRTC unrolls this loop kMaxWorld times; testing r first folds the combine away in
      // the copies for r >= 2. Carried in all 16, it slowed bf16's staged calls in the same
      // kernel, round 128.)
      if constexpr (kPairwise) {
        if (r == 0 && n == 2) {
          first = word;
          continue;
        }
        if (r == 1 && n == 2) {
          if (purlin::atom::combine_two_payload<Elem, ReduceOp, kPayload / 4>(first, word, out)) {
            combined = true;
            break;
          }
          // The rare payload with a NaN lane: rank 0's lanes into acc, then rank 1's below.
#pragma unroll
          for (u32 l = 0; l < kLanes; ++l) acc[l] = Elem::decode((Storage)(first >> (8 * sizeof(Storage) * l)));
        }
      }
#pragma unroll
      for (u32 l = 0; l < kLanes; ++l) {
        const Acc v = Elem::decode((Storage)(word >> (8 * sizeof(Storage) * l)));
        acc[l] = r == 0 ? v : ReduceOp::apply(acc[l], v);
      }
    }
    if (!combined) {
#pragma unroll
      for (u32 l = 0; l < kLanes; ++l) {
        out |= (u64)Elem::encode(purlin::atom::finish<Elem, ReduceOp>(acc[l], n)) << (8 * sizeof(Storage) * l);
      }
    }
    store_payload(dst + i * kPayload, out, bytes);
  }
  return purlin::sync::kWaitOk;
}

// Copies `len` bytes of packets in this rank's window to dst; returns like reduce_packets.
__device__ WaitResult gather_packets(const Ctx& x, u8* dst, const u64* src, u64 len, u64 expect, u64 start,
                                     u64 c) {
  const u8* packets = window_packets(x, src, c);
  const u64 words = (len + kPayload - 1) / kPayload;
  for (u64 i = purlin::atom::tid(); i < words; i += purlin::atom::nthreads()) {
    u64 word = 0;
    const WaitResult res = get_packet(x, packets, i, expect, start, &word);
    if (res != purlin::sync::kWaitOk) return res;
    const u64 bytes = len - i * kPayload < kPayload ? len - i * kPayload : kPayload;
    store_payload(dst + i * kPayload, word, bytes);
  }
  return purlin::sync::kWaitOk;
}

__device__ void put_packets(const Ctx& x, const u64* dst, const u8* src, u64 len, u64 flag, u64 c) {
  u8* packets = window_packets(x, dst, c);
  const u64 words = (len + kPayload - 1) / kPayload;
  for (u64 i = purlin::atom::tid(); i < words; i += purlin::atom::nthreads()) {
    const u64 bytes = len - i * kPayload < kPayload ? len - i * kPayload : kPayload;
    put_packet(packets, i, load_payload(src + i * kPayload, bytes), flag);
  }
}

// ------------------------------------------------------------------ notifications

// Stores a notification's value into the flag word of its peer (after publish_fence).
__device__ __forceinline__ void notify_store(const Ctx& x, const u64* n, u64 c) {
  const u32 peer = (u32)(n[0] & 0xffffffffull);
  u64* flag = (u64*)x.rt->flags[peer] + idx_at(n[1], c);
  purlin::sync::st_relaxed_sys(flag, val_at(x, n + 2, c));
}

__shared__ u64 s_agreed;  // the advance maximum seen by this block's handshake waits

// Words per trace entry: block, step record offset, chunk, epoch, start time (ns).
constexpr u64 kTraceWords = 5;

// Steps this block traced so far (thread 0 only; written to the trace header at the end, so
// tracing adds no global load per step).
__shared__ u64 s_trace_count;

__device__ __forceinline__ void trace(const Ctx& x, u64 at, u64 c) {
  if (x.rt->trace == 0 || purlin::atom::tid() != 0) return;
  u64* t = (u64*)x.rt->trace + (u64)PURLIN_CALL_BLOCK * x.rt->trace_capacity * kTraceWords;
  const u64 n = s_trace_count++;
  if (n + 1 < x.rt->trace_capacity) {
    u64* e = t + kTraceWords * (n + 1);
    e[0] = PURLIN_CALL_BLOCK;
    e[1] = at;
    e[2] = c;
    e[3] = x.epoch;
    e[4] = purlin::sync::now_ns();
  }
}

// The trace header (entry 0): steps recorded, then when the block's last step finished (0 if
// the block failed); its third word holds when the block began.
__device__ __forceinline__ void trace_end(const Ctx& x, bool ok) {
  if (x.rt->trace == 0 || purlin::atom::tid() != 0) return;
  u64* t = (u64*)x.rt->trace + (u64)PURLIN_CALL_BLOCK * x.rt->trace_capacity * kTraceWords;
  t[0] = s_trace_count;
  if (ok) t[1] = purlin::sync::now_ns();
}

// A completed call advances every epoch word of this rank (s_agreed settled before the
// caller's last barrier). Every thread of every block shares the stores: a grid of one block
// must advance all epoch words, and one thread storing a thousand of them serially was
// measured at several microseconds.
__device__ __forceinline__ void advance_epochs(const ParamHeader* h, const Runtime* rt, u64 epoch) {
  u64 advance = h->advance_value;
  if (h->advance_kind == 1) {
    advance = (advance > s_agreed ? advance : s_agreed) | 1;
  }
  u64* epochs = (u64*)rt->epochs;
  const u64 stride = h->grid * purlin::atom::nthreads();
  for (u64 j = PURLIN_CALL_BLOCK + h->grid * purlin::atom::tid(); j < h->epoch_words; j += stride) {
    epochs[j] = epoch + advance;
  }
}

// ------------------------------------------------------------------ the call check

// A rank's call words end where its flag words begin (workspace.rs CALL_WORDS): word p holds
// rank p's word for its latest call.
constexpr u64 kCallWords = 32;
static_assert(kMaxWorld <= kCallWords, "a call word per rank");

__device__ __forceinline__ u64* call_words(const Runtime* rt, u64 rank) {
  return (u64*)rt->flags[rank % kMaxWorld] - kCallWords;
}

// The call check, run by one block past the plan's grid (the launch adds it): stores
// `number << 32 | digest` (Runtime::call_number, counted by the host; ParamHeader::call_digest)
// into each peer's call words and compares each peer's word of the same number with its own.
// Ranks that make different calls (another size, type or operation, another collective, a
// one-copy buffer against a plain one) then both fail with a mismatch, where one would
// finish on the other's bytes and the other wait for the device timeout. The block takes no
// part in the plan: it reads and writes only call words and orders nothing. A peer number
// past this rank's means the peer finished this call, and so compared the digests already.
// A captured graph replays its calls' numbers, unique per call site, so a word stale from an
// earlier replay carries the same digest: no false mismatch. (Counting in device memory
// instead cost the same, round 145.) Out of line, so that its code does not sit between the
// entry's branch and the plan's first step. (What small calls paid with the check off was
// the parameter layout, not this code: round 149, params.rs VERSION 5.)
__device__ __noinline__ void run_call_check(const ParamHeader* h, const Runtime* rt) {
  if (purlin::atom::tid() != 0) return;  // one thread does it all
  u64* control = (u64*)rt->control;
  // A poisoned communicator runs nothing; a malformed block fails in the plan's blocks.
  if (purlin::sync::poisoned(control) || h->magic != kParamMagic || h->version != kParamVersion) return;
  const u64 rank = h->rank, world = h->world;
  u64* mine = call_words(rt, rank);
  const u64 number = rt->call_number;
  const u64 word = number << 32 | (h->call_digest & 0xffffffffull);
  for (u64 p = 0; p < world; ++p) {
    if (p != rank) purlin::sync::st_relaxed_sys(call_words(rt, p) + rank, word);
  }
  const u64 start = purlin::sync::now_ns();
  for (u64 p = 0; p < world; ++p) {
    if (p == rank) continue;
    for (u32 polls = 1;; ++polls) {
      const u64 theirs = purlin::sync::ld_relaxed_sys(mine + p);
      const int ahead = (int)((u32)(theirs >> 32) - (u32)number);
      if (ahead > 0) break;
      if (ahead == 0) {
        if ((u32)theirs == (u32)word) break;
        purlin::sync::poison_call_mismatch(control, p, word, theirs);
        return;
      }
      if (polls % purlin::sync::kPollsPerCheck == 0) {
        if (purlin::sync::poisoned(control)) return;
        if (purlin::sync::now_ns() - start > rt->timeout_ns) {
          // The peer never made this call: as any wait for it that expired.
          purlin::sync::poison_with(control, p + 1, number, h->grid, 0, 0);
          return;
        }
      }
    }
  }
}

// Whether this block is the call check's: the last, one past the plan's grid, which the launch
// adds where the check is on (a nonzero number). Decided from the by-value Runtime and the
// grid, so no block's entry waits on a header load.
__device__ __forceinline__ bool call_check_block(const Runtime& rt) {
  return rt.call_number != 0 && PURLIN_CALL_BLOCK + 1 == PURLIN_CALL_GRID;
}

}  // namespace snac
}  // namespace purlin

// An executor module's two entry points, both running `RUN(words, runtime)`:
// - `NAME`: the full parameter block by value, for CUDA graphs (the graph keeps it, and in a
//   graph its size costs nothing, round 19);
// - `NAME##_global`: the block in device memory, uploaded once per prepared plan, for eager
//   launches of calls up to 1 MiB, which otherwise upload the whole block at every launch
//   (rounds 49 and 55). Longer calls, whose launches hide behind the kernel, keep the block
//   by value: from device memory their kernels ran slower (rounds 55-57), and still do with
//   the records copied into shared memory (round 79, tuning.rs).
// RUN's third argument says which: true where the words lie in device memory. The block past
// the plan's grid runs the call check instead (run_call_check).
#define PURLIN_EXEC_ENTRY_POINTS(NAME, RUN)                                                            \
  extern "C" __global__ void __launch_bounds__(purlin::atom::kThreads)                                 \
      NAME(const __grid_constant__ purlin::snac::Runtime rt,                                           \
           const __grid_constant__ purlin::snac::ParamBlock<PURLIN_PARAM_WORDS> params) {              \
    if (purlin::snac::call_check_block(rt)) {                                                          \
      purlin::snac::run_call_check((const purlin::snac::ParamHeader*)params.w, &rt);                   \
      return;                                                                                          \
    }                                                                                                  \
    RUN(params.w, &rt, false);                                                                         \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(purlin::atom::kThreads)                                 \
      NAME##_global(const __grid_constant__ purlin::snac::Runtime rt,                                  \
                    const purlin::snac::u64* __restrict__ words) {                                     \
    if (purlin::snac::call_check_block(rt)) {                                                          \
      purlin::snac::run_call_check((const purlin::snac::ParamHeader*)words, &rt);                      \
      return;                                                                                          \
    }                                                                                                  \
    RUN(words, &rt, true);                                                                             \
  }
