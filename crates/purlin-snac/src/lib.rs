//! SNAC — Stage, Notify, And Consume: the one protocol that decides where and when
//! data moves, derived from a collective's input and output layouts.
//!
//! Architecture invariant: this crate knows nothing about CUDA, pointers or Atoms. It has
//! no GPU dependency (checked from `cargo metadata` by `xtask/tests/architecture.rs`) and
//! forbids unsafe code, so plans can be derived and verified on any machine.
//!
//! # Module map
//!
//! - [`types`]: layouts, consume/reduce ops, element types, regime, staging side, packets.
//! - [`spec`]: collective specs, validation, and their meaning ([`CollectiveSpec::segments`]).
//! - [`plan`]: the plan data structure (the contract below), hand-construction helpers,
//!   structural checks ([`Plan::check`], [`check_set`]), bincode (de)serialization.
//! - [`derive`](mod@derive): plan derivation for both regimes (the only producer of plans in this crate).
//! - [`key`]: [`Plan::kernel_key`], the compile-time part of a plan.
//! - [`params`]: the run-time parameter block (flat `u64` words with a documented layout).
//!
//! # The plan contract (what every executor implements)
//!
//! A call is one [`Plan`] per rank. Each rank launches `plan.blocks.len()` blocks (the grid;
//! none when it is 0 — an empty call); block `b` runs `plan.blocks[b].steps` in order.
//!
//! **Memory.** Every rank owns: its `Input` and `Output` buffers (local; one buffer when
//! `resources.alias` is set); a symmetric `Staging` of `staging_bytes` and a packet `Window` of
//! `window_bytes` payload bytes, both reachable by every peer (`Staging(r)` / `Window(r)`
//! name rank `r`'s); `flag_words` 64-bit flags (peers write them, the owner polls them);
//! `counter_words` 64-bit arrival counters (local); `epoch_words` 64-bit epochs, one per block
//! index. Flags, counters, windows and epochs are zero at communicator set-up and never reset
//! by a call (counters reset themselves, see `Arrive`). When the runtime registered every
//! rank's output (symmetric memory, [`PlanConfig::peer_outputs`]), `PeerOutput(r)` names rank
//! `r`'s output as mapped here, in `r`'s output coordinates (same alias as `r`'s `Output`);
//! only a `Gather` may write it, and nothing reads it. `PeerInput(r)` is rank `r`'s
//! registered input (`PlanConfig::peer_inputs`), which `Gather` and `Reduce` steps read and
//! nothing writes.
//!
//! **Epoch and sense.** At entry, block `b` reads `E = epoch[b]`; `s = E & 1` is the sense.
//! Every epoch-valued field ([`EpochVal`]) means `E + c * chunk_mul + add`. At exit, after its
//! last step, block `b` writes `epoch[j] = E + A` for every `j < epoch_words` with
//! `j % grid == b` (so blocks beyond the grid advance too), where `A` is the advance:
//! [`Advance::Fixed`]`(a)` → `a`; [`Advance::AgreedMaxChunks`] → `(max(local, values read by
//! this block's HandshakeWaits)) | 1`. All epochs of all ranks are equal between calls.
//!
//! **Chunks.** Outside a [`Step::ChunkLoop`], `c = 0`. A loop runs its body for
//! `c = 0..trips`, in order; loops do not nest. `trips` and every offset's slot count
//! (`chunk_modulus`) stay below 2^32 ([`Plan::check`]), so an executor may compute chunks and
//! slots in 32 bits. A step whose [`Guard`] does not admit `c` is skipped (guards depend only
//! on `c`, so a block's control flow is uniform). Offsets are
//! [`Offset::at`]`(c, s)`, lengths [`Len::at`]`(c)` bytes, indices [`Index::at`]`(c)`.
//! A data step whose length is 0 does nothing (but still takes part in ordering).
//!
//! **Steps.**
//! - `Stage { dst, src, len }`, `Gather { dst, src, len, expect: None }`: copy `len` bytes
//!   (the Atom's `copy`). `dst` of a stage is a staging region.
//! - `Stage { share: Some(Share { ticket, writers, piece }) }`: `writers` blocks run this same
//!   step and copy its `len` bytes together: each repeatedly adds 1 to counter word `ticket`
//!   (relaxed, device scope) and copies piece `k = old value` (bytes `[k*piece, (k+1)*piece)`,
//!   clamped) until `k*piece >= len`. The next step of each writer is an `Arrive` with
//!   `arrivals == writers` and `reset == Some(ticket)` ([`Plan::check`] rejects anything else).
//! - `Gather { src: Window(me), expect: Some(v) }`: poll each packet of the source until its
//!   flag `== v` (relaxed system-scope loads), then copy its payload. No other wait is implied.
//! - `Reduce { dst, srcs, len, expect }`: `dst[i] = op(srcs[0][i], srcs[1][i], ...)`,
//!   combining sources in list order (deterministic mode: rank order), with `Avg` dividing by
//!   the source count, which must be `world`, before its one rounding; window sources are
//!   polled for `expect` first, as above. `dst` may equal a source exactly (in place,
//!   element-wise); partial overlap is not allowed.
//! - `PutPackets { dst: Window(q), src, len, flag }`: write `len` payload bytes of `src` as
//!   packets flagged `flag` (one store per packet) into `q`'s window; offsets and lengths count
//!   payload bytes, the packet format fixes the physical footprint.
//! - `Signal { notify }`: after every thread's prior memory operations of this block are
//!   performed, release-store (system scope) `notify.value` into flag `notify.flag` of rank
//!   `notify.peer`. `NotifyKind::Ready` says "staged", `NotifyKind::Drain` "I finished reading
//!   the slot"; the semantics are the same.
//! - `Wait { flag, value }`: poll this rank's flag word until it is `>= value`, then acquire
//!   (system scope) before any later memory operation of the block.
//! - `Arrive { counter, arrivals, then }`: after the block's prior memory operations are
//!   performed, add 1 to counter `counter` (acq_rel, device scope). The arrival that brings it to
//!   `arrivals` stores 0 into it (and into counter word `reset`, a shared stage's ticket, when
//!   given) and issues every notification of `then` as `Signal` does (after a system-scope
//!   fence: it publishes the other arrivers' writes too).
//! - `HandshakeSend { peer, dst, flag }`: write one packet carrying this rank's advance bound
//!   (`local` of [`Advance::AgreedMaxChunks`], else 0) flagged `flag` at `dst` of `peer`'s window.
//! - `HandshakeWait { peer, src, expect }`: poll the packet at `src` of this rank's window until
//!   its flag `== expect`; its value joins the block's advance maximum.
//!
//! **What the plan guarantees** (checked by the verifier, docs/design.md §3.3): a consumer reads
//! staged data only after a `Wait` whose value the producer's last `Arrive`/`Signal` of exactly
//! that chunk and epoch writes; a slot is overwritten only after its readers' drains or under
//! the other sense; an access to a peer's output is ordered after the peer's entry into the
//! call, and before the peer's exit; every rank advances by the same amount; every call makes every rank's exit
//! happen after every peer's entry (through data or the handshake); the grid never exceeds
//! `max_coresident_blocks`, so the runtime must launch all blocks co-resident (cooperative
//! launch); and where a plan has shard-landed words ([`Landed`]), a shard's word is set only
//! after every write of the shard, and none follows it. The executor owns fences and scopes;
//! the verifier proves the happens-before structure under sequential consistency.
//!
//! **Shard-landed words** are ordinary steps (an `Arrive` whose last arrival signals this
//! rank's own flag), so executors run them without knowing; a runtime that lets code read a
//! shard during the call may zero the words before each launch and test them for non-zero.
#![forbid(unsafe_code)]

pub mod derive;
pub mod fuzz;
pub mod key;
pub mod params;
pub mod plan;
pub mod spec;
pub mod types;
pub mod verify;

pub use derive::{AllReduceAlgo, DeriveError, PlanConfig, derive, derive_rank, gcd, in_place_alias};
pub use key::{BlockShape, KernelKey, ShapeOp};
pub use plan::{
    Advance, Alias, BlockProgram, CodecError, EngineProgram, EngineStep, EpochVal, Guard, Index, Landed, Len, Notify,
    NotifyKind, Offset, Phase, Plan, PlanError, Region, Resources, Role, Shard, Share, Space, Step, check_set,
    decode_plans, encode_plans,
};
pub use spec::{Collective, CollectiveSpec, Counts, Segment, SpecError};
pub use types::{ConsumeOp, DataType, Layout, PacketFormat, ReduceOp, ReductionMode, Regime, StagingSide};

/// The most ranks of one world: the one limit every layer (plans, executors, the machine
/// description, the kernels' `kMaxWorld`) shares.
pub const MAX_WORLD: usize = 16;

/// Smallest and largest world (number of ranks) one scale-up domain supports.
pub const WORLD_RANGE: std::ops::RangeInclusive<usize> = 2..=MAX_WORLD;
