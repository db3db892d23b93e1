// The device executor: one kernel per call that runs a SNAC plan (crates/purlin-snac, the
// plan contract in its crate docs) on one rank. Block b interprets its program from the
// parameter block: a __grid_constant__ kernel parameter (reads through the constant cache:
// measured at ~70 ns per dependent word, round 20) in CUDA graphs, device memory for eager
// launches (exec.cuh, PURLIN_EXEC_ENTRY_POINTS). Data moves through the Atom (atom.cuh);
// every memory-ordering operation is a call into sync.cuh.
//
// Compile-time part (the kernel key, as -D options): PURLIN_T (an Atom element type),
// PURLIN_OP (an Atom reduce operator; the collectives' Avg is Mean), PURLIN_PACKET (8 or 16
// bytes per packet), PURLIN_PARAM_WORDS (the by-value parameter block's capacity).
// Everything else is run time.
#include "exec.cuh"

namespace purlin {
namespace snac {

// A shared stage (purlin_snac::Share): this block copies `piece`-byte pieces of the lane's
// `len` bytes, each taken from the ticket, until none is left. The next piece is taken while
// the current one is copied, so the atomic's latency hides behind the copy.
__shared__ u64 s_piece[2];

__device__ void stage_shared(const Ctx& x, u8* dst, const u8* src, u64 len, u64 piece, u64 ticket_word) {
  u64* ticket = (u64*)x.rt->counters + ticket_word;
  const bool lead = purlin::atom::tid() == 0;
  if (lead) s_piece[0] = purlin::sync::ticket_take(ticket);
  __syncthreads();
  u64 k = s_piece[0];
  for (u32 i = 0; k * piece < len; ++i) {
    if (lead) s_piece[(i + 1) & 1] = purlin::sync::ticket_take(ticket);
    const u64 start = k * piece;
    const u64 n = len - start < piece ? len - start : piece;
    purlin::atom::copy(dst + start, src + start, n, x.smem);
    __syncthreads();  // the next piece number is visible; this piece's copy is done
    k = s_piece[(i + 1) & 1];
  }
}

// ------------------------------------------------------------------ the interpreter


// Runs the record `r` (word `at` of the parameter block) for chunk c. Block-uniform; returns
// after a block barrier wherever the step's contract needs one. `fresh`: every step of this
// block before this one was a signal, so the block has neither written nor acquired anything
// in this kernel.
__device__ void run_step(const Ctx& x, const u64* r, u64 at, u64 c, bool fresh) {
  const u32 op = (u32)(r[0] & 0xff);
  const u32 count = (u32)(r[0] >> 24);
  const bool lead = purlin::atom::tid() == 0;
  switch (op) {
    case kStage:
    case kGather: {
      if (!admits(r + 1, c)) return;
      const u64 len = len_at(r + 13, c);
      if (len == 0) return;
      u8* dst = region_ptr(x, r + 3, c);
      if (op == kGather && r[17] != 0) {
        note_wait(gather_packets(x, dst, r + 8, len, val_at(x, r + 18, c), purlin::sync::now_ns(), c), 0, at, c);
        __syncthreads();
      } else if (op == kStage && r[17] != 0) {
        stage_shared(x, dst, region_ptr(x, r + 8, c), len, r[17], idx_at(r[18], c));
      } else {
        purlin::atom::copy(dst, region_ptr(x, r + 8, c), len, x.smem);
      }
      return;
    }
    case kReduce: {
      if (!admits(r + 1, c)) return;
      const u64 len = len_at(r + 8, c);
      if (len == 0) return;
      u8* dst = region_ptr(x, r + 3, c);
      const u64* srcs = r + 15;
      bool packets = false;
      for (u32 i = 0; i < count; ++i) packets = packets || space_kind(srcs + 5 * i) == kWindow;
      if (packets) {
        note_wait(reduce_packets(x, dst, srcs, count, len, val_at(x, r + 13, c), purlin::sync::now_ns(), c), 0, at, c);
        __syncthreads();
        return;
      }
      // One thread per source writes its address into the Atom's shared table (a serial
      // loop into a local array cost every thread count region lookups and 128 B of stack).
      const u32 n = count < purlin::atom::kMaxSources ? count : purlin::atom::kMaxSources;
      u64* table = purlin::atom::source_table();
      __syncthreads();  // the block's previous Atom call is done with the table and workspace
      for (u32 i = purlin::atom::tid(); i < n; i += purlin::atom::nthreads()) {
        table[i] = (u64)region_ptr(x, srcs + 5 * i, c);
      }
      __syncthreads();  // the table is visible to every thread
      const u64 elems = len / sizeof(Storage);
      // Avg is the Atom's Mean (PURLIN_OP): it divides by n, which Plan::check makes the world.
      purlin::atom::reduce_table<Elem, ReduceOp>(dst, n, elems, x.smem);
      return;
    }
    case kPutPackets: {
      if (!admits(r + 1, c)) return;
      const u64 len = len_at(r + 13, c);
      if (len == 0) return;
      put_packets(x, r + 3, region_ptr(x, r + 8, c), len, val_at(x, r + 17, c), c);
      return;
    }
    case kSignal: {
      if (!admits(r + 1, c)) return;
      __syncthreads();  // every thread's prior operations of this block are performed
      if (lead) {
        // A fresh block has nothing of its own to publish: what came before it on this
        // stream (earlier kernels, copies) finished before the kernel began, so an entry
        // signal skips the system fence (round 83: 1.2-1.6 us on the critical path of every
        // one-copy call, whose block 0 signals its entry first).
        if (!fresh) purlin::sync::publish_fence();
        notify_store(x, r + 3, c);
      }
      return;
    }
    case kWait: {
      if (!admits(r + 1, c)) return;
      if (lead) {
        u64* flag = (u64*)x.rt->flags[x.rank] + idx_at(r[3], c);
        const WaitResult res = purlin::sync::wait_geq_bounded(flag, val_at(x, r + 4, c), (const u64*)x.rt->control,
                                                              purlin::sync::now_ns(), x.rt->timeout_ns);
        note_wait(res, 0, at, c);
      }
      __syncthreads();  // the acquire above orders every thread's later accesses
      return;
    }
    case kArrive: {
      if (!admits(r + 1, c)) return;
      __syncthreads();
      // A shared stage's ticket, zeroed by the round's last arrival (after every piece).
      const u64* reset = r + 5 + 4 * count;
      if (lead && r[4] == 1) {
        // A lane with one arriver (the usual lane): it is always the last, and its counter
        // would only go 0 -> 1 -> 0, so the atomic round trip is skipped.
        if (reset[0] != 0) purlin::sync::counter_reset((u64*)x.rt->counters + idx_at(reset[1], c));
        purlin::sync::publish_fence();
        for (u32 i = 0; i < count; ++i) notify_store(x, r + 5 + 4 * i, c);
      } else if (lead) {
        u64* counter = (u64*)x.rt->counters + idx_at(r[3], c);
        const u64 arrivals = r[4];
        const u64 before = purlin::sync::atom_add_acq_rel_gpu(counter, 1);
        // The arrival that brings the counter to `arrivals` is the last of its round: it
        // puts the counter back to zero (the plan contract), so the next round — or the
        // next call, whatever its arrival count — starts from zero.
        if (before + 1 == arrivals) {
          purlin::sync::counter_reset(counter);
          if (reset[0] != 0) purlin::sync::counter_reset((u64*)x.rt->counters + idx_at(reset[1], c));
          purlin::sync::publish_fence();
          for (u32 i = 0; i < count; ++i) notify_store(x, r + 5 + 4 * i, c);
        }
      }
      return;
    }
    case kHandshakeSend: {
      if (lead) {
        const u32 peer = (u32)r[1];
        const u64 local = x.w[5] == 1 ? x.w[6] : 0;  // header: advance_kind, advance_value
        u8* packets = (u8*)(x.rt->window[peer] + off_at(r + 2, 0, x.sense) / kPayload * kPacketBytes);
        put_packet(packets, 0, local, val_at(x, r + 6, 0));
      }
      return;
    }
    case kHandshakeWait: {
      if (lead) {
        const u32 peer = (u32)r[1];
        const u8* packets = (const u8*)(x.rt->window[x.rank] + off_at(r + 2, 0, x.sense) / kPayload * kPacketBytes);
        u64 value = 0;
        const WaitResult res = get_packet(x, packets, 0, val_at(x, r + 6, 0), purlin::sync::now_ns(), &value);
        note_wait(res, peer + 1, at, c);
        if (value > s_agreed) s_agreed = value;
      }
      __syncthreads();
      return;
    }
    default:
      if (lead) fail(3, 0, at, c);
      __syncthreads();
      return;
  }
}

// A barrier-separated check: did any thread of the block fail?
__device__ __forceinline__ bool block_failed() {
  __syncthreads();
  return s_failure.code != 0;
}

// Words of a block's step records copied into shared memory when the parameter block lies in
// device memory (eager launches; 4 KiB, a larger program is read where it lies). Every step
// reads its record through a chain of dependent loads, each an L2 round trip from device
// memory; the copy's coalesced loads overlap the entry's. Not from a by-value block: its
// constant-bank reads are already fast for the uniform addresses of a step, and 512 threads
// reading distinct words serialise there (round 78: graph calls 1 us slower with the copy,
// eager ones 1.3 us faster).
constexpr u64 kCachedRecordWords = 512;
__shared__ u64 s_records[kCachedRecordWords];

// Inlined into both entry points (a shared out-of-line interpreter made every call slower,
// round 8); `in_device_memory`: the words are in device memory (the `_global` entry point).
__device__ __forceinline__ void run_block(const u64* w, const Runtime* rt, bool in_device_memory) {
  // 128-byte aligned: when the shared-stage bookkeeping grew the static shared variables by
  // 16 bytes, the Atom's pipeline buffers after them lost their 64-byte alignment and every
  // copy and reduce got 10-20% slower (2-32 MiB calls, rounds 30-33).
  extern __shared__ __align__(128) u8 smem[];
  const ParamHeader* h = (const ParamHeader*)w;
  u64* control = (u64*)rt->control;
  const u32 t = purlin::atom::tid();
  if (rt->trace != 0 && t == 0) {
    // Trace header, third word: when the block began (before its first load).
    ((u64*)rt->trace + (u64)PURLIN_CALL_BLOCK * rt->trace_capacity * kTraceWords)[2] = purlin::sync::now_ns();
  }
  __shared__ u64 s_epoch;
  __shared__ int s_skip;
  // The block's records are [first, end): encode() writes each block's after the previous
  // one's, the last block's up to total_words. Copied only from a well-formed block.
  const bool well_formed = h->magic == kParamMagic && h->version == kParamVersion && PURLIN_CALL_BLOCK < h->grid;
  const u64* entry = w + h->block_table + 3 * PURLIN_CALL_BLOCK;  // role | shape, first record, steps
  const u64 first = well_formed ? entry[1] : 0;
  const bool last = PURLIN_CALL_BLOCK + 1 >= h->grid;
  const u64 end = !well_formed ? 0 : last ? h->total_words : entry[3 + 1];
  const bool cached =
      in_device_memory && first <= end && end - first <= kCachedRecordWords && end <= h->total_words;
  if (cached) {
    for (u64 i = t; i < end - first; i += purlin::atom::nthreads()) s_records[i] = w[first + i];
  }
  // The record of word `at`: from the copy when there is one.
  const u64* records = cached ? s_records : w;
  const u64 base = cached ? first : 0;
  if (t == 0) {
    s_failure = Failure{0, 0, 0, 0};
    s_agreed = 0;
    s_trace_count = 0;
    // A poisoned communicator runs nothing (the rest of a captured graph exits at once).
    s_skip = purlin::sync::poisoned(control) || !well_formed;
    s_epoch = ((const u64*)rt->epochs)[PURLIN_CALL_BLOCK];
  }
  __syncthreads();  // also: the record copy is complete
  if (s_skip) return;
  Ctx x{w, rt, s_epoch, s_epoch & 1, h->world, h->rank, smem};
  u64 at = first;
  const u64 steps = entry[2];
  bool ok = true;
  bool fresh = true;  // only signals so far (run_step)
  for (u64 s = 0; s < steps && ok; ++s) {
    const u64* r = records + (at - base);
    const u64 tag = r[0];
    const u64 record_words = (tag >> 8) & 0xffff;
    if ((tag & 0xff) == kLoop && r[1] != 1) {
      const u64 trips = r[1];
      const u64 body = tag >> 24;
      for (u64 c = 0; c < trips && ok; ++c) {
        u64 b_at = at + record_words;
        for (u64 i = 0; i < body && ok; ++i) {
          const u64* b = records + (b_at - base);
          trace(x, b_at, c);
          run_step(x, b, b_at, c, fresh);
          fresh = fresh && (b[0] & 0xff) == kSignal;
          ok = !block_failed();
          b_at += (b[0] >> 8) & 0xffff;
        }
      }
      // Skip the body's records.
      u64 next = at + record_words;
      for (u64 i = 0; i < body; ++i) next += (records[next - base] >> 8) & 0xffff;
      at = next;
    } else {
      // A top-level step, or the body of a loop of one trip (a one-copy plan's while a
      // transfer fits one chunk, a staged plan's up to its minimum chunk): chunk 0 as a
      // literal, so that guards, offsets and lengths fold; hence this second call site of
      // run_step beside the loop's. Measured against running one-trip loops as loops:
      // one-copy calls up to 1.1 us faster, staged 0.24-0.9 up to 4 MiB, where their loops
      // have one trip (round 110; at 16 MiB, with more trips, 0.2-3.1 faster too: code layout).
      const bool loop = (tag & 0xff) == kLoop;
      const u64 body = loop ? tag >> 24 : 1;
      u64 b_at = loop ? at + record_words : at;
      for (u64 i = 0; i < body && ok; ++i) {
        const u64* b = records + (b_at - base);
        trace(x, b_at, 0);
        run_step(x, b, b_at, 0, fresh);
        fresh = fresh && (b[0] & 0xff) == kSignal;
        ok = !block_failed();
        b_at += (b[0] >> 8) & 0xffff;
      }
      at = b_at;  // past the step or the loop's body (a failed block stops here anyway)
    }
  }
  trace_end(x, ok);
  if (!ok) {
    if (purlin::atom::tid() == 0 && s_failure.code != 2) {
      purlin::sync::poison_with(control, s_failure.peer_plus_one, x.epoch, PURLIN_CALL_BLOCK, s_failure.step,
                                s_failure.chunk);
    }
    return;  // a failed call does not advance: the communicator is poisoned from here on
  }
  advance_epochs(h, rt, x.epoch);
}

}  // namespace snac
}  // namespace purlin

// A fused kernel (kernels/include/purlin/collective.cuh) calls run_block itself.
#ifndef PURLIN_FUSED
PURLIN_EXEC_ENTRY_POINTS(purlin_snac_exec, purlin::snac::run_block)
#endif
