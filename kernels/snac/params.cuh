// The CUDA side of SNAC's run-time parameter block (crates/purlin-snac/src/params.rs,
// layout version 5): a header of u64 fields, a block table (role | shape << 32, first
// record, steps) and the step records. A CI test compiles this header together with
// static_asserts generated from the Rust side's field offsets (purlin_snac::params::c_header),
// so the two cannot drift.
#pragma once

namespace purlin {
namespace snac {

typedef unsigned long long u64;

struct ParamHeader {
  u64 magic;
  u64 version;
  u64 rank;
  u64 world;
  u64 grid;
  u64 advance_kind;
  u64 advance_value;
  u64 epoch_words;
  u64 input_bytes;
  u64 output_bytes;
  u64 alias;  // offset << 2 | kind
  u64 call_digest;
  u64 staging_bytes;
  u64 window_bytes;
  u64 flag_words;
  u64 counter_words;
  u64 max_coresident_blocks;
  u64 block_table;
  u64 total_words;
};

constexpr u64 kParamMagic = 0x3152415043414e53ull;  // "SNACPAR1", little-endian
constexpr u64 kParamVersion = 5;

// Opcodes of step records.
enum Op : unsigned int {
  kLoop = 1,
  kStage = 2,
  kGather = 3,
  kReduce = 4,
  kPutPackets = 5,
  kSignal = 6,
  kWait = 7,
  kArrive = 8,
  kHandshakeSend = 9,
  kHandshakeWait = 10,
};

// Region space kinds (high 32 bits of a region's first word).
enum SpaceKind : unsigned int { kInput = 0, kOutput = 1, kStaging = 2, kWindow = 3, kPeerOutput = 4, kPeerInput = 5 };

}  // namespace snac
}  // namespace purlin
