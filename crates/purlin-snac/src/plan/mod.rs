//! Plans: the data every executor interprets. See the crate documentation for the exact
//! semantics of each step; this module holds the data structure, constructors for writing
//! plans by hand, evaluation helpers and the structural (well-formedness) checks.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::spec::{CollectiveSpec, SpecError};
use crate::types::{PacketFormat, ReduceOp, Regime, StagingSide};

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
    /// The co-residency bound this plan was made under (DESIGN.md §3.3).
    pub max_coresident_blocks: u32,
    /// Derived as a one-copy plan (every rank's buffers registered, `PlanConfig::peer_outputs`
    /// and `peer_inputs`): true on every rank of such a call, also on a rank whose plan
    /// touches no peer's buffer (all its V partitions empty).
    #[serde(default)]
    pub one_copy: bool,
    pub blocks: Vec<BlockProgram>,
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
        found
    }

    /// A 32-bit digest of what every rank's plan of one call must agree on: the spec (the
    /// collective, world, element type, operation, reduction mode and every count) and
    /// whether it is a one-copy plan (which meets only one-copy plans). Not the rank, the
    /// regime, the grid or the alias: those may differ between ranks of one call, or follow
    /// from the spec. The executors compare it across ranks at every call, so ranks that
    /// make different calls get an error instead of one rank finishing on the other's bytes.
    /// FNV-1a over the spec's `Debug` text: the same on every rank of one build, which is
    /// what ranks of one communicator run.
    pub fn call_digest(&self) -> u32 {
        let hash = crate::key::fnv1a(format!("{:?}|{}", self.spec, u8::from(self.one_copy)).as_bytes());
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

    fn space_size(&self, space: Space) -> u64 {
        match space {
            Space::Input => self.resources.input_bytes,
            Space::Output => self.resources.output_bytes,
            Space::Staging(_) => self.resources.staging_bytes,
            Space::Window(_) => self.resources.window_bytes,
            Space::PeerOutput(p) => self.spec.output_bytes(p),
            Space::PeerInput(p) => self.spec.input_bytes(p),
        }
    }

    /// Structural checks of one plan: ranks in range, loops only at the top level and of fewer
    /// than 2^32 trips, offsets cycling over fewer than 2^32 slots (executors may compute
    /// chunks and slots in 32 bits), regions in bounds for every chunk the step can run at
    /// and both senses, flag and counter indices in range, window sources exactly where
    /// `expect` is given, blocks within the co-residency bound and the epoch words.
    pub fn check(&self) -> Result<(), PlanError> {
        self.spec.validate()?;
        let (rank, world) = (self.rank, self.spec.world);
        if rank >= world {
            return Err(SpecError::RankOutOfRange { rank, world }.into());
        }
        if self.blocks.len() > self.max_coresident_blocks as usize {
            return Err(PlanError::TooManyBlocks {
                rank,
                blocks: self.blocks.len(),
                bound: self.max_coresident_blocks,
            });
        }
        if self.blocks.len() > self.resources.epoch_words as usize {
            return Err(PlanError::EpochWords { rank, blocks: self.blocks.len(), words: self.resources.epoch_words });
        }
        let r = &self.resources;
        let fits = |off: u64, inner: u64, outer: u64| off.checked_add(inner).is_some_and(|e| e <= outer);
        let ok = match r.alias {
            None => true,
            Some(Alias::InputInOutput(o)) => fits(o, r.input_bytes, r.output_bytes),
            Some(Alias::OutputInInput(o)) => fits(o, r.output_bytes, r.input_bytes),
        };
        if !ok {
            return Err(PlanError::Other { rank, what: "in-place alias lies outside its buffer".into() });
        }
        let mut err: Option<PlanError> = None;
        for (b, block) in self.blocks.iter().enumerate() {
            for (i, s) in block.steps.iter().enumerate() {
                if let Step::ChunkLoop { body, trips } = s {
                    // The plan contract: executors may count chunks in 32 bits.
                    if *trips > u64::from(u32::MAX) {
                        return Err(PlanError::Step {
                            rank,
                            block: b,
                            step: format!("{i}"),
                            what: format!("a chunk loop of {trips} trips (at most 2^32 - 1)"),
                        });
                    }
                    if body.iter().any(|t| matches!(t, Step::ChunkLoop { .. })) {
                        return Err(PlanError::Step {
                            rank,
                            block: b,
                            step: format!("{i}"),
                            what: "nested chunk loop".into(),
                        });
                    }
                    if body.iter().any(|t| matches!(t, Step::HandshakeSend { .. } | Step::HandshakeWait { .. })) {
                        return Err(PlanError::Step {
                            rank,
                            block: b,
                            step: format!("{i}"),
                            what: "handshake inside a chunk loop".into(),
                        });
                    }
                }
            }
        }
        self.for_each_step(|path, s, range| {
            if err.is_some() {
                return;
            }
            if let Err(what) = self.check_step(s, range) {
                err = Some(PlanError::Step { rank, block: path.0, step: fmt_path(path), what });
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
        self.check_shares().map_err(|what| PlanError::Other { rank, what })
    }

    /// The shape shared stages need ([`Share`]): each followed by its writers' arrival that
    /// resets its ticket; exactly `writers` identical stages per ticket; tickets apart from
    /// every arrival counter; no reset without its shared stage.
    fn check_shares(&self) -> Result<(), String> {
        // Per ticket: its share, the stage's guard, the stage itself and how many blocks run it.
        let mut groups: Vec<(Share, Guard, &Step, u32)> = vec![];
        let mut resets: Vec<Index> = vec![];
        let mut counters: BTreeSet<u32> = BTreeSet::new();
        for (b, block) in self.blocks.iter().enumerate() {
            for (i, s) in block.steps.iter().enumerate() {
                let (body, trips): (&[Step], u64) = match s {
                    Step::ChunkLoop { trips, body } => (body, *trips),
                    s => (std::slice::from_ref(s), 1),
                };
                for (j, t) in body.iter().enumerate() {
                    let g = t.guard();
                    let range = (g.from, g.until.min(trips));
                    if let Step::Arrive { counter, reset, .. } = t {
                        counters.extend(idx_set(counter, range));
                        resets.extend(*reset);
                    }
                    let Step::Stage { share: Some(sh), guard, .. } = t else { continue };
                    let follows = matches!(body.get(j + 1), Some(Step::Arrive { arrivals, reset, guard: ag, .. })
                        if *arrivals == sh.writers && *reset == Some(sh.ticket) && ag == guard);
                    if !follows {
                        return Err(format!(
                            "block {b} step {i}.{j}: a shared stage must be followed by an arrival of its {} \
                             writers that resets ticket {}",
                            sh.writers, sh.ticket
                        ));
                    }
                    match groups.iter_mut().find(|(g, ..)| g.ticket == sh.ticket) {
                        Some((.., first, n)) if *first == t => *n += 1,
                        Some(_) => return Err(format!("ticket {} shared by stages that differ", sh.ticket)),
                        None => groups.push((*sh, *guard, t, 1)),
                    }
                }
            }
        }
        let trips = self.max_trips().max(1);
        for (sh, guard, _, n) in &groups {
            let ticket = sh.ticket;
            if *n != sh.writers {
                return Err(format!("ticket {ticket}: {n} blocks share a stage declared for {} writers", sh.writers));
            }
            let tickets = idx_set(&ticket, (guard.from, guard.until.min(trips)));
            if let Some(i) = tickets.iter().find(|i| counters.contains(i)) {
                return Err(format!("ticket word {i} is also an arrival counter"));
            }
            for (other, ..) in groups.iter().filter(|(o, ..)| o.ticket != ticket) {
                let o = idx_set(&other.ticket, (0, trips));
                if tickets.iter().any(|i| o.contains(i)) {
                    return Err(format!("tickets {ticket} and {} overlap", other.ticket));
                }
            }
        }
        if let Some(t) = resets.iter().find(|t| !groups.iter().any(|(g, ..)| g.ticket == **t)) {
            return Err(format!("an arrival resets ticket {t}, which no shared stage uses"));
        }
        Ok(())
    }

    fn check_region(&self, r: &Region, len: &Len, (lo, hi): (u64, u64)) -> Result<(), String> {
        let world = self.spec.world;
        match r.space {
            Space::Staging(p) | Space::Window(p) | Space::PeerOutput(p) | Space::PeerInput(p) if p >= world => {
                return Err(format!("{:?} names a rank outside world {world}", r.space));
            }
            _ => {}
        }
        if r.offset.chunk_modulus > u64::from(u32::MAX) {
            return Err(format!("region {r:?} cycles over more than 2^32 - 1 slots"));
        }
        if lo >= hi {
            return Ok(());
        }
        let size = self.space_size(r.space);
        let o = &r.offset;
        let end = |c: u64| -> Option<u64> {
            let l = len.at(c);
            if l == 0 {
                return Some(0);
            }
            let mut worst = 0u64;
            for s in [0, 1] {
                let st = o
                    .base
                    .checked_add(o.chunk_stride.checked_mul(if o.chunk_modulus == 0 {
                        c
                    } else {
                        c % o.chunk_modulus
                    })?)?
                    .checked_add(o.sense_stride.checked_mul(s)?)?;
                worst = worst.max(st.checked_add(l)?);
            }
            Some(worst)
        };
        // Candidate chunks where `offset(c) + len(c)` can peak: the range ends, the last chunk
        // whose length is unclamped and the one after it, and (cyclic) the last slot index.
        let mut cands = vec![lo, hi - 1];
        if let Some(full) = len.total.saturating_sub(len.base).saturating_sub(len.max).checked_div(len.chunk_stride) {
            cands.extend([full, full + 1]);
        }
        if o.chunk_modulus > 0 {
            let m = o.chunk_modulus;
            // Conservative for cyclic offsets: the largest slot offset with the largest length.
            let worst_off = o.base + (m - 1).min(hi - 1) * o.chunk_stride + o.sense_stride;
            if len.at(lo) > 0 && worst_off + len.max.min(len.at(lo)) > size {
                return Err(format!("cyclic region {r:?} can exceed {:?} of {size} bytes", r.space));
            }
        }
        for c in cands.into_iter().filter(|c| (lo..hi).contains(c)) {
            match end(c) {
                Some(e) if e <= size => {}
                _ => return Err(format!("region {r:?} at chunk {c} exceeds {:?} of {size} bytes", r.space)),
            }
        }
        Ok(())
    }

    fn check_index(&self, idx: &Index, words: u32, (lo, hi): (u64, u64), what: &str) -> Result<(), String> {
        if lo >= hi {
            return Ok(());
        }
        let max = if idx.chunk_modulus == 0 {
            idx.base as u64
        } else {
            idx.base as u64 + (idx.chunk_modulus as u64 - 1).min(hi - 1)
        };
        if max >= words as u64 {
            return Err(format!("{what} index {max} outside {words} words"));
        }
        Ok(())
    }

    fn check_val(&self, v: &EpochVal, (lo, hi): (u64, u64)) -> Result<(), String> {
        if lo < hi && v.eval(0, lo).is_none() {
            return Err(format!("epoch value {v:?} negative at chunk {lo} (guard it)"));
        }
        Ok(())
    }

    fn check_peer(&self, p: u32) -> Result<(), String> {
        if p >= self.spec.world { Err(format!("peer {p} outside world {}", self.spec.world)) } else { Ok(()) }
    }

    fn check_step(&self, s: &Step, range: (u64, u64)) -> Result<(), String> {
        let r = &self.resources;
        let win = |x: &Region| matches!(x.space, Space::Window(_));
        let peer_out = |x: &Region| matches!(x.space, Space::PeerOutput(_));
        let peer_in = |x: &Region| matches!(x.space, Space::PeerInput(_));
        match s {
            Step::Stage { dst, .. }
            | Step::Gather { dst, .. }
            | Step::Reduce { dst, .. }
            | Step::PutPackets { dst, .. }
                if peer_in(dst) =>
            {
                return Err("a peer's input is only read".into());
            }
            Step::Stage { src, .. } | Step::PutPackets { src, .. } if peer_in(src) => {
                return Err("a peer's input is read only by a gather or a reduce".into());
            }
            Step::Stage { src, .. } | Step::PutPackets { src, .. } if peer_out(src) => {
                return Err("a peer's output is only written, never read".into());
            }
            Step::Reduce { dst, srcs, .. } if peer_out(dst) || srcs.iter().any(peer_out) => {
                return Err("only a gather may write a peer's output, and nothing reads it".into());
            }
            _ => {}
        }
        match s {
            Step::ChunkLoop { .. } => Ok(()),
            Step::Stage { dst, src, len, share, .. } => {
                if !matches!(dst.space, Space::Staging(_)) {
                    return Err("stage must write a staging region".into());
                }
                if let Some(sh) = share {
                    if sh.writers == 0 || sh.piece == 0 {
                        return Err("a shared stage needs writers and a piece size".into());
                    }
                    self.check_index(&sh.ticket, r.counter_words, range, "ticket")?;
                }
                if win(src) {
                    return Err("stage cannot read a window".into());
                }
                self.check_region(dst, len, range)?;
                self.check_region(src, len, range)
            }
            Step::Gather { dst, src, len, expect, .. } => {
                if win(dst) {
                    return Err("gather cannot write a window (use put-packets)".into());
                }
                if peer_out(src) {
                    return Err("a peer's output is only written, never read".into());
                }
                if win(src) != expect.is_some() {
                    return Err("expect must be given exactly for window sources".into());
                }
                if let Some(v) = expect {
                    self.check_val(v, range)?;
                }
                if let Space::Window(p) = src.space {
                    if p != self.rank {
                        return Err("packets are read from this rank's own window only".into());
                    }
                }
                self.check_region(dst, len, range)?;
                self.check_region(src, len, range)
            }
            Step::Reduce { dst, srcs, len, expect, .. } => {
                if srcs.is_empty() {
                    return Err("reduce without sources".into());
                }
                // Executors divide an Avg by its source count as they combine (the Atom's Mean,
                // one rounding), so an Avg reduce has every rank's contribution as a source.
                if self.spec.op == Some(ReduceOp::Avg) && srcs.len() != self.spec.world as usize {
                    return Err(format!(
                        "an Avg reduce combines every rank: {} sources in world {}",
                        srcs.len(),
                        self.spec.world
                    ));
                }
                if win(dst) {
                    return Err("reduce cannot write a window".into());
                }
                if srcs.iter().any(win) != expect.is_some() {
                    return Err("expect must be given exactly when a source is a window".into());
                }
                if let Some(v) = expect {
                    self.check_val(v, range)?;
                }
                if srcs.iter().any(|x| matches!(x.space, Space::Window(p) if p != self.rank)) {
                    return Err("packets are read from this rank's own window only".into());
                }
                self.check_region(dst, len, range)?;
                srcs.iter().try_for_each(|x| self.check_region(x, len, range))
            }
            Step::PutPackets { dst, src, len, flag, .. } => {
                if !win(dst) {
                    return Err("put-packets must write a window".into());
                }
                if win(src) {
                    return Err("put-packets cannot read a window".into());
                }
                self.check_val(flag, range)?;
                self.check_region(dst, len, range)?;
                self.check_region(src, len, range)
            }
            Step::Signal { notify, .. } => self.check_notify(notify, range),
            Step::Wait { flag, value, .. } => {
                self.check_index(flag, r.flag_words, range, "flag")?;
                self.check_val(value, range)
            }
            Step::Arrive { counter, arrivals, then, reset, .. } => {
                if *arrivals == 0 {
                    return Err("arrive with zero arrivals".into());
                }
                self.check_index(counter, r.counter_words, range, "counter")?;
                if let Some(t) = reset {
                    self.check_index(t, r.counter_words, range, "ticket")?;
                }
                then.iter().try_for_each(|n| self.check_notify(n, range))
            }
            Step::HandshakeSend { peer, dst, flag } => {
                self.check_peer(*peer)?;
                self.check_val(flag, range)?;
                self.check_region(&Region::window(*peer, *dst), &Len::fixed(8), range)
            }
            Step::HandshakeWait { peer, src, expect } => {
                self.check_peer(*peer)?;
                self.check_val(expect, range)?;
                self.check_region(&Region::window(self.rank, *src), &Len::fixed(8), range)
            }
        }
    }

    fn check_notify(&self, n: &Notify, range: (u64, u64)) -> Result<(), String> {
        self.check_peer(n.peer)?;
        self.check_index(&n.flag, self.resources.flag_words, range, "flag")?;
        self.check_val(&n.value, range)
    }
}

/// Formats a step path as `i` or `i.j` (loop body).
pub fn fmt_path((_, i, j): StepPath) -> String {
    match j {
        Some(j) => format!("{i}.{j}"),
        None => format!("{i}"),
    }
}

fn idx_set(idx: &Index, (lo, hi): (u64, u64)) -> BTreeSet<u32> {
    let mut out = BTreeSet::new();
    if lo >= hi {
        return out;
    }
    if idx.chunk_modulus == 0 {
        out.insert(idx.base);
    } else {
        let m = idx.chunk_modulus as u64;
        for c in lo..hi.min(lo + m) {
            out.insert(idx.at(c));
        }
    }
    out
}

/// Checks a whole call's plan set: one plan per rank in rank order, each well-formed, all
/// agreeing on the spec and on the symmetric resources, and every wait matched by a
/// notification to that flag word in some rank's plan, every handshake wait by a send, and
/// every packet read by some put into that window.
pub fn check_set(plans: &[Plan]) -> Result<(), PlanError> {
    let Some(first) = plans.first() else {
        return Err(PlanError::SetSize { world: 0, got: 0 });
    };
    let world = first.spec.world;
    if plans.len() != world as usize {
        return Err(PlanError::SetSize { world, got: plans.len() });
    }
    for (i, p) in plans.iter().enumerate() {
        if p.rank != i as u32 {
            return Err(PlanError::RankOrder { index: i, rank: p.rank });
        }
        p.check()?;
        let dis = |what| Err(PlanError::Disagree { rank: p.rank, what });
        if p.spec != first.spec {
            return dis("the spec");
        }
        let (a, b) = (&p.resources, &first.resources);
        if (a.staging_bytes, a.window_bytes, a.flag_words, a.epoch_words)
            != (b.staging_bytes, b.window_bytes, b.flag_words, b.epoch_words)
        {
            return dis("the symmetric resources");
        }
        if p.regime != first.regime || p.packet != first.packet {
            return dis("the regime or packet format");
        }
        if p.one_copy != first.one_copy || p.call_digest() != first.call_digest() {
            return dis("one-copy or not (the call digest)");
        }
    }
    // Every notification target, handshake send and packet put, per rank.
    let mut flags: Vec<BTreeSet<u32>> = vec![BTreeSet::new(); world as usize];
    let mut hs: BTreeSet<(u32, u32, u64)> = BTreeSet::new();
    let mut puts: Vec<Vec<(u64, u64)>> = vec![vec![]; world as usize];
    for p in plans {
        p.for_each_step(|_, s, range| {
            let mut note = |n: &Notify| flags[n.peer as usize].extend(idx_set(&n.flag, range));
            match s {
                Step::Signal { notify, .. } => note(notify),
                Step::Arrive { then, .. } => then.iter().for_each(&mut note),
                Step::HandshakeSend { peer, dst, .. } => {
                    hs.insert((*peer, p.rank, dst.base));
                }
                Step::PutPackets { dst: Region { space: Space::Window(q), offset }, len, .. }
                    if range.0 < range.1 && len.at(range.0) > 0 =>
                {
                    puts[*q as usize].push((offset.base, offset.base + len.max));
                }
                _ => {}
            }
        });
    }
    for p in plans {
        let mut err = None;
        p.for_each_step(|path, s, range| {
            if err.is_some() || range.0 >= range.1 {
                return;
            }
            let fail = |what: String| Some(PlanError::Step { rank: p.rank, block: path.0, step: fmt_path(path), what });
            match s {
                Step::Wait { flag, .. } => {
                    let want = idx_set(flag, range);
                    if let Some(i) = want.iter().find(|i| !flags[p.rank as usize].contains(i)) {
                        err = fail(format!("waits on flag {i}, which no plan ever notifies"));
                    }
                }
                Step::HandshakeWait { peer, src, .. } => {
                    if !hs.contains(&(p.rank, *peer, src.base)) {
                        err = fail(format!("handshake wait on rank {peer}, which never sends it"));
                    }
                }
                _ => {
                    for (off, l) in window_reads(s) {
                        if l > 0 && !puts[p.rank as usize].iter().any(|&(a, b)| a <= off && off < b) {
                            err = fail(format!("reads packets at window offset {off}, which no plan puts"));
                        }
                    }
                }
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
    }
    Ok(())
}

fn window_reads(s: &Step) -> Vec<(u64, u64)> {
    match s {
        Step::Gather { src: Region { space: Space::Window(_), offset }, len, guard, .. } => {
            vec![(offset.base, len.at(guard.from))]
        }
        Step::Reduce { srcs, len, guard, .. } => srcs
            .iter()
            .filter(|r| matches!(r.space, Space::Window(_)))
            .map(|r| (r.offset.base, len.at(guard.from)))
            .collect(),
        _ => vec![],
    }
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sp = match self.space {
            Space::Input => "in".to_string(),
            Space::Output => "out".to_string(),
            Space::Staging(r) => format!("stg{r}"),
            Space::Window(r) => format!("win{r}"),
            Space::PeerOutput(r) => format!("out{r}"),
            Space::PeerInput(r) => format!("in{r}"),
        };
        let o = &self.offset;
        write!(f, "{sp}[{}", o.base)?;
        if o.chunk_stride != 0 {
            if o.chunk_modulus != 0 {
                write!(f, "+(c%{})*{}", o.chunk_modulus, o.chunk_stride)?;
            } else {
                write!(f, "+c*{}", o.chunk_stride)?;
            }
        }
        if o.sense_stride != 0 {
            write!(f, "+s*{}", o.sense_stride)?;
        }
        write!(f, "]")
    }
}

impl fmt::Display for EpochVal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "E")?;
        if self.chunk_mul == 1 {
            write!(f, "+c")?;
        } else if self.chunk_mul > 1 {
            write!(f, "+{}c", self.chunk_mul)?;
        }
        match self.add {
            0 => Ok(()),
            a if a > 0 => write!(f, "+{a}"),
            a => write!(f, "{a}"),
        }
    }
}

impl fmt::Display for Index {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.chunk_modulus == 0 {
            write!(f, "{}", self.base)
        } else {
            write!(f, "{}+c%{}", self.base, self.chunk_modulus)
        }
    }
}

impl fmt::Display for Notify {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = match self.kind {
            NotifyKind::Ready => "signal",
            NotifyKind::Drain => "drain",
        };
        write!(f, "{k} r{}.flag[{}]={}", self.peer, self.flag, self.value)
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = self.guard();
        let gs = if g == Guard::ALWAYS {
            String::new()
        } else if g.until == u64::MAX {
            format!(" if c>={}", g.from)
        } else {
            format!(" if {}<=c<{}", g.from, g.until)
        };
        let l = |l: &Len| format!("{}B", l.max);
        match self {
            Step::ChunkLoop { trips, body } => write!(f, "loop c in 0..{trips} ({} steps)", body.len()),
            Step::Stage { dst, src, len, share: None, .. } => write!(f, "stage {dst} <- {src} {}{gs}", l(len)),
            Step::Stage { dst, src, len, share: Some(sh), .. } => write!(
                f,
                "stage {dst} <- {src} {} shared by {} in {}B pieces of ticket[{}]{gs}",
                l(len),
                sh.writers,
                sh.piece,
                sh.ticket
            ),
            Step::Gather { dst, src, len, expect, .. } => {
                write!(f, "gather {dst} <- {src} {}", l(len))?;
                if let Some(e) = expect {
                    write!(f, " (packets =={e})")?;
                }
                write!(f, "{gs}")
            }
            Step::Reduce { dst, srcs, len, expect, .. } => {
                let s: Vec<String> = srcs.iter().map(|r| r.to_string()).collect();
                write!(f, "reduce {dst} <- [{}] {}", s.join(", "), l(len))?;
                if let Some(e) = expect {
                    write!(f, " (packets =={e})")?;
                }
                write!(f, "{gs}")
            }
            Step::PutPackets { dst, src, len, flag, .. } => {
                write!(f, "put-packets {dst} <- {src} {} flag={flag}{gs}", l(len))
            }
            Step::Signal { notify, .. } => write!(f, "{notify}{gs}"),
            Step::Wait { flag, value, .. } => write!(f, "wait flag[{flag}] >= {value}{gs}"),
            Step::Arrive { counter, arrivals, then, reset, .. } => {
                let t: Vec<String> = then.iter().map(|n| n.to_string()).collect();
                let z = reset.map(|i| format!(" reset ticket[{i}]")).unwrap_or_default();
                write!(f, "arrive ctr[{counter}] of {arrivals}{z} then [{}]{gs}", t.join("; "))
            }
            Step::HandshakeSend { peer, dst, flag } => {
                write!(f, "handshake-send r{peer} {} flag={flag}", Region::window(*peer, *dst))
            }
            Step::HandshakeWait { peer, src, expect } => {
                write!(f, "handshake-wait r{peer} at {} =={expect}", Offset::at(src, 0, 0))
            }
        }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.resources;
        writeln!(
            f,
            "rank {} of {}: {} {:?}{} {:?}, {} blocks (bound {}), advance {:?}",
            self.rank,
            self.spec.world,
            self.spec.collective.name(),
            self.regime,
            self.staging_side.map(|s| format!("/{s:?}")).unwrap_or_default(),
            self.spec.dtype,
            self.blocks.len(),
            self.max_coresident_blocks,
            self.advance
        )?;
        writeln!(
            f,
            "  in {}B out {}B{} staging {}B window {}B flags {} counters {} epochs {}",
            r.input_bytes,
            r.output_bytes,
            r.alias.map(|a| format!(" (in-place {a:?})")).unwrap_or_default(),
            r.staging_bytes,
            r.window_bytes,
            r.flag_words,
            r.counter_words,
            r.epoch_words
        )?;
        for (b, block) in self.blocks.iter().enumerate() {
            writeln!(f, "  block {b} ({:?}):", block.role)?;
            for (i, s) in block.steps.iter().enumerate() {
                writeln!(f, "    {i}: {s}")?;
                if let Step::ChunkLoop { body, .. } = s {
                    for (j, t) in body.iter().enumerate() {
                        writeln!(f, "      {i}.{j}: {t}")?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Why serialized plans could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("encoding plans: {0}")]
    Encode(#[from] bincode::error::EncodeError),
    #[error("decoding plans: {0}")]
    Decode(#[from] bincode::error::DecodeError),
    #[error("{0} trailing bytes after the plans")]
    Trailing(usize),
}

/// Serializes a call's plans (one per rank) with bincode v2 (standard configuration).
pub fn encode_plans(plans: &[Plan]) -> Result<Vec<u8>, CodecError> {
    Ok(bincode::serde::encode_to_vec(plans, bincode::config::standard())?)
}

/// Reads plans written by [`encode_plans`].
pub fn decode_plans(bytes: &[u8]) -> Result<Vec<Plan>, CodecError> {
    let (plans, used): (Vec<Plan>, usize) = bincode::serde::decode_from_slice(bytes, bincode::config::standard())?;
    if used != bytes.len() {
        return Err(CodecError::Trailing(bytes.len() - used));
    }
    Ok(plans)
}
