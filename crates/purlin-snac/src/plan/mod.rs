//! Plans: the data every executor interprets. See the crate documentation for the exact
//! semantics of each step; this module holds the data structure, constructors for writing
//! plans by hand, evaluation helpers and the structural (well-formedness) checks.
//!
//! # Files
//!
//! - `mod.rs`: the data structure, constructors for writing plans by hand, evaluation
//!   helpers, accessors and the call digest.
//! - `check.rs`: the structural checks, [`Plan::check`] and [`check_set`].
//! - `display.rs`: the readable forms (`Display`) of regions, values, steps and plans.
//! - `codec.rs`: bincode (de)serialization, [`encode_plans`] and [`decode_plans`].

mod check;
mod codec;
mod display;
pub mod engine;
pub mod landed;

use serde::{Deserialize, Serialize};

use crate::spec::{CollectiveSpec, SpecError};
use crate::types::{PacketFormat, Regime, StagingSide};

pub use check::check_set;
pub use codec::{CodecError, decode_plans, encode_plans};
pub use engine::{EngineProgram, EngineStep, Phase};

/// A byte offset affine in the chunk index `c` and the sense `s` (0 or 1):
/// `base + (chunk_modulus == 0 ? c : c % chunk_modulus) * chunk_stride + s * sense_stride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct Offset {
    pub base: u64,
    pub chunk_stride: u64,
    /// 0: no modulus. Otherwise the chunk index is taken modulo this (cyclic slots).
    pub chunk_modulus: u64,
    pub sense_stride: u64,
}

impl Offset {
    /// A fixed offset.
    pub const fn fixed(base: u64) -> Self {
        Offset { base, chunk_stride: 0, chunk_modulus: 0, sense_stride: 0 }
    }
    /// Adds `stride` per chunk.
    pub const fn chunk(mut self, stride: u64) -> Self {
        self.chunk_stride = stride;
        self
    }
    /// Takes the chunk index modulo `m` (cyclic slots).
    pub const fn modulo(mut self, m: u64) -> Self {
        self.chunk_modulus = m;
        self
    }
    /// Adds `stride` when the sense is 1.
    pub const fn sense(mut self, stride: u64) -> Self {
        self.sense_stride = stride;
        self
    }
    /// The offset at chunk `c` and sense `s`.
    pub fn at(&self, c: u64, s: u64) -> u64 {
        let k = if self.chunk_modulus == 0 { c } else { c % self.chunk_modulus };
        self.base + k * self.chunk_stride + s * self.sense_stride
    }
}

/// The memory a region lives in, as seen from the rank whose plan contains it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub enum Space {
    /// This rank's input buffer (local, not reachable by peers).
    Input,
    /// This rank's output buffer (local, not reachable by peers).
    Output,
    /// Rank `r`'s symmetric staging buffer (this rank's own when `r` is this rank).
    Staging(u32),
    /// Rank `r`'s packet receive window, addressed in *payload* bytes (the packet format
    /// decides the physical footprint).
    Window(u32),
    /// Rank `r`'s output buffer, registered on every rank (symmetric memory), in `r`'s output
    /// coordinates; written only, by `Gather` steps of the one-copy path. A peer's buffers are
    /// this call's only from the peer's entry into the call until its exit, which the plan
    /// must order its accesses within.
    PeerOutput(u32),
    /// Rank `r`'s input buffer, registered on every rank (symmetric memory), in `r`'s input
    /// coordinates; read only (`Gather` and `Reduce` sources of the one-copy path, which pull
    /// a peer's contribution), within the peer's entry into the call and its exit.
    PeerInput(u32),
}

/// A region: a space and an offset; its length is the step's [`Len`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Region {
    pub space: Space,
    pub offset: Offset,
}

impl Region {
    pub const fn new(space: Space, offset: Offset) -> Self {
        Region { space, offset }
    }
    pub const fn input(offset: Offset) -> Self {
        Region { space: Space::Input, offset }
    }
    pub const fn output(offset: Offset) -> Self {
        Region { space: Space::Output, offset }
    }
    pub const fn staging(rank: u32, offset: Offset) -> Self {
        Region { space: Space::Staging(rank), offset }
    }
    pub const fn window(rank: u32, offset: Offset) -> Self {
        Region { space: Space::Window(rank), offset }
    }
    pub const fn peer_output(rank: u32, offset: Offset) -> Self {
        Region { space: Space::PeerOutput(rank), offset }
    }
    pub const fn peer_input(rank: u32, offset: Offset) -> Self {
        Region { space: Space::PeerInput(rank), offset }
    }
}

/// The byte count a data step moves at chunk `c`:
/// `min(max, total.saturating_sub(base + c * chunk_stride))` — the block's slice of chunk `c`
/// of a partition of `total` bytes, clamped at the partition's end (0 past it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Len {
    pub max: u64,
    pub total: u64,
    pub base: u64,
    pub chunk_stride: u64,
}

impl Len {
    /// Exactly `n` bytes, every chunk.
    pub const fn fixed(n: u64) -> Self {
        Len { max: n, total: n, base: 0, chunk_stride: 0 }
    }
    /// The slice `[base + c*chunk_stride, +max)` of a partition of `total` bytes, clamped.
    pub const fn slice(max: u64, total: u64, base: u64, chunk_stride: u64) -> Self {
        Len { max, total, base, chunk_stride }
    }
    /// The length at chunk `c`.
    pub fn at(&self, c: u64) -> u64 {
        self.max.min(self.total.saturating_sub(self.base.saturating_add(c.saturating_mul(self.chunk_stride))))
    }
}

/// A flag, counter index: `base + (chunk_modulus == 0 ? 0 : c % chunk_modulus)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Index {
    pub base: u32,
    pub chunk_modulus: u32,
}

impl Index {
    pub const fn fixed(base: u32) -> Self {
        Index { base, chunk_modulus: 0 }
    }
    /// `base + c % m`.
    pub const fn cyclic(base: u32, m: u32) -> Self {
        Index { base, chunk_modulus: m }
    }
    pub fn at(&self, c: u64) -> u32 {
        if self.chunk_modulus == 0 { self.base } else { self.base + (c % self.chunk_modulus as u64) as u32 }
    }
}

/// An epoch-derived flag value: `E + c * chunk_mul + add`, where `E` is the block's epoch at
/// kernel entry. A value whose arithmetic is negative is a plan error (guard the step instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EpochVal {
    pub chunk_mul: u64,
    pub add: i64,
}

impl EpochVal {
    /// `E + add`.
    pub const fn at(add: i64) -> Self {
        EpochVal { chunk_mul: 0, add }
    }
    /// `E + c + add`.
    pub const fn chunk(add: i64) -> Self {
        EpochVal { chunk_mul: 1, add }
    }
    /// The value for epoch `e` at chunk `c`; `None` if it would be negative or overflow.
    pub fn eval(&self, e: u64, c: u64) -> Option<u64> {
        let v = (e as i128) + (c as i128) * (self.chunk_mul as i128) + self.add as i128;
        u64::try_from(v).ok()
    }
}

/// A step runs at chunk `c` only if `from <= c < until` (outside a loop, `c = 0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Guard {
    pub from: u64,
    pub until: u64,
}

impl Guard {
    pub const ALWAYS: Guard = Guard { from: 0, until: u64::MAX };
    pub const fn new(from: u64, until: u64) -> Self {
        Guard { from, until }
    }
    pub fn admits(&self, c: u64) -> bool {
        self.from <= c && c < self.until
    }
}

impl Default for Guard {
    fn default() -> Self {
        Guard::ALWAYS
    }
}

/// Whether a notification says "data is ready" or "I finished reading your slot".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NotifyKind {
    Ready,
    Drain,
}

/// A release store of `value` to flag word `flag` of rank `peer` (which may be this rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Notify {
    pub kind: NotifyKind,
    pub peer: u32,
    pub flag: Index,
    pub value: EpochVal,
}

/// The role of a block: purely descriptive (kernel shapes are grouped by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub enum Role {
    /// Latency regime: puts and reads packets.
    Packets,
    /// Throughput: stages input chunks and signals consumers.
    Producer,
    /// Throughput: waits, gathers or reduces, drains.
    Consumer,
    /// Composed throughput AllReduce: reduces this rank's shard and publishes it.
    Head,
    /// Composed throughput AllReduce: gathers the peers' published shards.
    Tail,
    /// Anything a hand-written plan wants.
    Custom(u32),
    /// A plan with an engine program: the entry kernel (signals and bounded waits before the
    /// copy engines start, and an AllReduce's reduce of its shard; [`engine`]).
    CeEntry,
    /// A plan with an engine program: the exit kernel (bounded waits after the copy engines).
    CeExit,
    /// The copy-engine program as a block, in [`engine::lower`]'s plans only (the verifier's
    /// view); never a block of a plan that runs.
    CopyEngine,
    /// A reader of one landed shard, in [`landed::lower`]'s plans only (the verifier's view of
    /// [`Landed`]); never a block of a plan that runs.
    ShardReader,
}

/// A stage made by several blocks together: each of the `writers` blocks that run an identical
/// shared `Stage` takes `piece`-byte pieces of the region in turn from this rank's counter
/// word `ticket` (an atomic add per piece) until none is left, so blocks that NVLink serves
/// faster copy more (on 2×H200 writer blocks of one chunk finished up to 56 µs apart with
/// equal static slices). The stage must be followed by the writers' `Arrive` on one counter
/// with `arrivals == writers` and `reset == Some(ticket)`: its last arrival, which comes after
/// every block's last piece, zeroes the ticket for the next round. [`Plan::check`] enforces
/// this shape; the verifier counts the region written only once every writer has staged it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Share {
    pub ticket: Index,
    pub writers: u32,
    pub piece: u64,
}

/// One step of a block's program. Semantics: see the crate documentation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Step {
    /// Runs `body` for `c = 0..trips` in order. Only at the top level of a program.
    ChunkLoop { trips: u64, body: Vec<Step> },
    /// Copies `len` bytes from `src` into `dst` (`dst` in a staging space). With `share`,
    /// the copy is one lane's, made by `share.writers` blocks together (see [`Share`]).
    Stage { dst: Region, src: Region, len: Len, guard: Guard, share: Option<Share> },
    /// Copies `len` bytes from `src` into `dst`; if `src` is a window, first polls every packet
    /// of it until its flag equals `expect`.
    Gather { dst: Region, src: Region, len: Len, expect: Option<EpochVal>, guard: Guard },
    /// `dst = op(srcs[0], srcs[1], ...)` over `len` bytes, sources combined in list order;
    /// window sources are polled for `expect` as in `Gather`.
    Reduce { dst: Region, srcs: Vec<Region>, len: Len, expect: Option<EpochVal>, guard: Guard },
    /// Writes `len` bytes of `src` as packets flagged `flag` into `dst` (a peer's window).
    PutPackets { dst: Region, src: Region, len: Len, flag: EpochVal, guard: Guard },
    /// A notification (signal or drain) issued by this block alone.
    Signal { notify: Notify, guard: Guard },
    /// Waits until this rank's flag word `flag` is `>= value`.
    Wait { flag: Index, value: EpochVal, guard: Guard },
    /// Adds one to this rank's counter `counter`; the arrival that brings the counter to a
    /// multiple of `arrivals` issues every notification of `then`, after putting this rank's
    /// counter word `reset` (a shared stage's ticket) back to zero.
    Arrive { counter: Index, arrivals: u32, then: Vec<Notify>, guard: Guard, reset: Option<Index> },
    /// Writes one packet carrying this rank's `local` advance bound, flagged `flag`, to `dst`
    /// in `peer`'s window.
    HandshakeSend { peer: u32, dst: Offset, flag: EpochVal },
    /// Polls the packet at `src` in this rank's window until its flag equals `expect`; its value
    /// joins this block's agreed maximum.
    HandshakeWait { peer: u32, src: Offset, expect: EpochVal },
}

impl Step {
    /// A short name for traces and summaries.
    pub fn name(&self) -> &'static str {
        match self {
            Step::ChunkLoop { .. } => "loop",
            Step::Stage { .. } => "stage",
            Step::Gather { .. } => "gather",
            Step::Reduce { .. } => "reduce",
            Step::PutPackets { .. } => "put-packets",
            Step::Signal { notify, .. } => match notify.kind {
                NotifyKind::Ready => "signal",
                NotifyKind::Drain => "drain",
            },
            Step::Wait { .. } => "wait",
            Step::Arrive { .. } => "arrive",
            Step::HandshakeSend { .. } => "handshake-send",
            Step::HandshakeWait { .. } => "handshake-wait",
        }
    }

    /// The step's guard (loops and handshakes always run).
    pub fn guard(&self) -> Guard {
        match self {
            Step::Stage { guard, .. }
            | Step::Gather { guard, .. }
            | Step::Reduce { guard, .. }
            | Step::PutPackets { guard, .. }
            | Step::Signal { guard, .. }
            | Step::Wait { guard, .. }
            | Step::Arrive { guard, .. } => *guard,
            _ => Guard::ALWAYS,
        }
    }

    /// Mutable access to the guard, if the step has one.
    pub fn guard_mut(&mut self) -> Option<&mut Guard> {
        match self {
            Step::Stage { guard, .. }
            | Step::Gather { guard, .. }
            | Step::Reduce { guard, .. }
            | Step::PutPackets { guard, .. }
            | Step::Signal { guard, .. }
            | Step::Wait { guard, .. }
            | Step::Arrive { guard, .. } => Some(guard),
            _ => None,
        }
    }
}

/// How much a call advances every block's epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Advance {
    /// A constant known to every rank.
    Fixed(u64),
    /// V collectives: `(max over ranks of local) | 1`, the maximum agreed on the device through
    /// the entry handshake; `local` is this rank's largest chunk-loop trip count.
    AgreedMaxChunks { local: u64 },
}

/// The sizes of the memory a plan touches. Staging, window, flag and epoch sizes are
/// symmetric: every rank of a call must declare the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Resources {
    pub input_bytes: u64,
    pub output_bytes: u64,
    /// In-place call: input and output are one buffer (see [`Alias`]).
    pub alias: Option<Alias>,
    pub staging_bytes: u64,
    pub window_bytes: u64,
    /// Flag words per rank (signals and drains are written into the waiter's words).
    pub flag_words: u32,
    /// Local arrival counters per rank.
    pub counter_words: u32,
    /// Per-block epoch words per rank; blocks beyond the grid are advanced too.
    pub epoch_words: u32,
    /// Words holding the values of the engine program's notifies (one per notify), which the
    /// entry kernel stores for the copy engines to write ([`EngineProgram`]); 0 without one.
    #[serde(default)]
    pub ce_value_words: u32,
}

/// How an in-place call's input and output share one buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Alias {
    /// The input is the output's bytes starting at this offset (AllReduce: 0; AllGather: the
    /// rank's own partition).
    InputInOutput(u64),
    /// The output is the input's bytes starting at this offset (ReduceScatter: the rank's own
    /// partition).
    OutputInInput(u64),
}

/// One block's program.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BlockProgram {
    pub role: Role,
    pub steps: Vec<Step>,
}

/// SNAC's output for one rank of one call: which block does which step on which bytes, in
/// what order, waiting on what. Plain data.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Plan {
    pub spec: CollectiveSpec,
    pub rank: u32,
    pub regime: Regime,
    /// `None` in the latency regime.
    pub staging_side: Option<StagingSide>,
    pub packet: PacketFormat,
    pub resources: Resources,
    pub advance: Advance,
    /// The co-residency bound this plan was made under (docs/design.md §3.3).
    pub max_coresident_blocks: u32,
    /// Derived as a one-copy plan (every rank's buffers registered, `PlanConfig::peer_outputs`
    /// and `peer_inputs`): true on every rank of such a call, also on a rank whose plan
    /// touches no peer's buffer (all its V partitions empty).
    #[serde(default)]
    pub one_copy: bool,
    pub blocks: Vec<BlockProgram>,
    /// The copy-engine program of a one-copy call whose bytes the copy engines move
    /// ([`engine`]); `None` for a plan of SM blocks only.
    #[serde(default)]
    pub engine: Option<EngineProgram>,
    /// Shard-landed words of a copy collective's plan ([`Landed`]); `None` for other plans.
    #[serde(default)]
    pub landed: Option<Landed>,
}

/// Where each source rank's shard lies in this rank's output, and which of this rank's flag
/// words says it landed: a claim the plan makes to code that reads its output during the call
/// (a fused kernel's `purlin::wait_shard`), and that the verifier checks ([`landed::lower`]).
/// Once flag `flag` of shard `q` holds at least `E + 1` (`E`: the call's epoch at entry), every
/// byte of shard `q` holds its final value in this call and no step of the call writes it
/// again. Executors that zero the words before a launch may test for non-zero instead.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Landed {
    /// One per source rank, in rank order.
    pub shards: Vec<Shard>,
}

/// One source rank's part of this rank's output ([`Landed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shard {
    /// Byte offset in this rank's output coordinates.
    pub offset: u64,
    pub len: u64,
    /// The flag word that says the shard landed; `None`: it is there at launch (empty, or this
    /// rank's own part of an in-place call), so nothing signals it.
    pub flag: Option<u32>,
}

/// A structural defect of a plan or a set of plans.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("plan set has {got} plans for world {world}")]
    SetSize { world: u32, got: usize },
    #[error("plan at position {index} is for rank {rank}")]
    RankOrder { index: usize, rank: u32 },
    #[error("rank {rank}'s plan disagrees with rank 0's on {what}")]
    Disagree { rank: u32, what: &'static str },
    #[error("rank {rank}: {blocks} blocks exceed the co-residency bound {bound}")]
    TooManyBlocks { rank: u32, blocks: usize, bound: u32 },
    #[error("rank {rank}: {blocks} blocks but only {words} epoch words")]
    EpochWords { rank: u32, blocks: usize, words: u32 },
    #[error("rank {rank} block {block} step {step}: {what}")]
    Step { rank: u32, block: usize, step: String, what: String },
    #[error("rank {rank}: {what}")]
    Other { rank: u32, what: String },
}

/// Where a step sits: `(block, top-level index, index in the loop body)`.
pub type StepPath = (usize, usize, Option<usize>);

impl Plan {
    /// Total number of blocks (the grid).
    pub fn grid(&self) -> usize {
        self.blocks.len()
    }

    /// Whether any step reads a peer's input and whether any writes a peer's output (a
    /// one-copy plan, [`Space::PeerInput`], [`Space::PeerOutput`]): such a plan runs only on
    /// buffers that every rank can address.
    pub fn peer_spaces(&self) -> (bool, bool) {
        fn visit(steps: &[Step], found: &mut (bool, bool)) {
            for s in steps {
                let regions: Vec<&Region> = match s {
                    Step::ChunkLoop { body, .. } => {
                        visit(body, found);
                        vec![]
                    }
                    Step::Stage { dst, src, .. }
                    | Step::Gather { dst, src, .. }
                    | Step::PutPackets { dst, src, .. } => {
                        vec![dst, src]
                    }
                    Step::Reduce { dst, srcs, .. } => std::iter::once(dst).chain(srcs).collect(),
                    _ => vec![],
                };
                for r in regions {
                    found.0 |= matches!(r.space, Space::PeerInput(_));
                    found.1 |= matches!(r.space, Space::PeerOutput(_));
                }
            }
        }
        let mut found = (false, false);
        for b in &self.blocks {
            visit(&b.steps, &mut found);
        }
        for s in self.engine.iter().flat_map(|e| &e.steps) {
            if let EngineStep::Copy { dst, .. } = s {
                found.1 |= matches!(dst.space, Space::PeerOutput(_));
            }
        }
        found
    }

    /// A 32-bit digest of what every rank's plan of one call must agree on: the spec (the
    /// collective, world, element type, operation, reduction mode and every count) and
    /// whether it is a one-copy plan (which meets only one-copy plans) or has shard-landed
    /// words ([`Landed`], which meet only their like). Not the rank, the
    /// regime, the grid or the alias: those may differ between ranks of one call, or follow
    /// from the spec. The executors compare it across ranks at every call, so ranks that
    /// make different calls get an error instead of one rank finishing on the other's bytes.
    /// FNV-1a over the spec's `Debug` text: the same on every rank of one build, which is
    /// what ranks of one communicator run.
    pub fn call_digest(&self) -> u32 {
        // A plan with shard-landed words declares more flag words: it meets only its like.
        let landed = if self.landed.is_some() { "|landed" } else { "" };
        let hash = crate::key::fnv1a(format!("{:?}|{}{landed}", self.spec, u8::from(self.one_copy)).as_bytes());
        (hash ^ (hash >> 32)) as u32
    }

    /// Number of steps, loop bodies counted once: the plan's size, independent of the payload.
    pub fn step_count(&self) -> usize {
        self.blocks
            .iter()
            .flat_map(|b| &b.steps)
            .map(|s| match s {
                Step::ChunkLoop { body, .. } => 1 + body.len(),
                _ => 1,
            })
            .sum()
    }

    /// Visits every step with its path and the chunk range it can run for (`0..1` outside loops).
    pub fn for_each_step(&self, mut f: impl FnMut(StepPath, &Step, (u64, u64))) {
        for (b, block) in self.blocks.iter().enumerate() {
            for (i, s) in block.steps.iter().enumerate() {
                match s {
                    Step::ChunkLoop { trips, body } => {
                        for (j, t) in body.iter().enumerate() {
                            let g = t.guard();
                            f((b, i, Some(j)), t, (g.from, g.until.min(*trips)));
                        }
                    }
                    _ => {
                        let g = s.guard();
                        f((b, i, None), s, (g.from, g.until.min(1)));
                    }
                }
            }
        }
    }

    /// The largest chunk-loop trip count (0 without loops).
    pub fn max_trips(&self) -> u64 {
        self.blocks
            .iter()
            .flat_map(|b| &b.steps)
            .filter_map(|s| match s {
                Step::ChunkLoop { trips, .. } => Some(*trips),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }
}

/// Formats a step path as `i` or `i.j` (loop body).
pub fn fmt_path((_, i, j): StepPath) -> String {
    match j {
        Some(j) => format!("{i}.{j}"),
        None => format!("{i}"),
    }
}
