//! Plan derivation: from a [`CollectiveSpec`] and a [`PlanConfig`] to one [`Plan`] per rank.
//!
//! Derivation is total over valid inputs (it returns a typed [`DeriveError`] otherwise, never
//! panics) and deterministic. Plan shapes:
//!
//! | collective | latency | throughput |
//! |---|---|---|
//! | AllGather(V) | 1 role (`Packets`): put own input to every peer's window, unpack every peer's window | `Producer` (stage own input once (pull) or into every peer (push), arrive → signal), `Consumer` (wait, gather, arrive → drain) |
//! | ReduceScatter(V) | put partition `q` into rank `q`'s window; reduce own partition + packets in rank order | `Producer` (stage partition `q` for `q`), `Consumer` (wait all, reduce in rank order, drain) |
//! | AllToAll(V) | put partition `q` to `q`; unpack | like AllGather, one stream per peer |
//! | AllReduce one-shot / direct | put whole input to every peer; reduce all | `Producer` (stage whole input), `Consumer` (reduce all) |
//! | AllReduce two-shot / composed | put shard `k` to `k`; reduce own shard; put it back out; unpack | `Producer` (RS stage), `Head` (wait, reduce own shard into the seam, publish, signal), `Tail` (wait, gather published shards, drain) |
//!
//! V plans (and plans where some pair exchanges nothing) add the entry/exit handshake.
//!
//! With [`PlanConfig::peer_outputs`] (every rank's output registered symmetric memory), the
//! throughput plans of the copy collectives take the one-copy path (`one_copy.rs`): one role
//! of blocks storing straight into every destination's output; with every rank's input
//! registered ([`PlanConfig::peer_inputs`]) a ReduceScatter reduces its part straight from
//! every rank's input, and an AllReduce with both registered reduces its shard so and stores
//! it into every peer's output. Each is bounded by an entry signal and a done signal per pair
//! of ranks.

mod landed;
mod latency;
mod one_copy;
mod throughput;

use serde::{Deserialize, Serialize};

use crate::plan::{Alias, Offset, Plan, PlanError, Step};
use crate::spec::{Collective, CollectiveSpec, SpecError};
use crate::types::{PacketFormat, Regime, StagingSide};

/// How AllReduce is planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum AllReduceAlgo {
    /// One-shot/direct at world 2 (in place too: its readers wait for their own writers to
    /// stage a chunk before they overwrite it), two-shot/composed above.
    #[default]
    Auto,
    /// Every rank reduces the whole buffer from every peer (latency: one-shot packets;
    /// throughput: direct reduce).
    OneShot,
    /// ReduceScatter then AllGather (latency: two-shot packets; throughput: composition
    /// through a seam).
    TwoShot,
}

impl AllReduceAlgo {
    /// Whether an AllReduce of `spec` is planned two-shot/composed under this choice.
    pub fn composed(self, spec: &CollectiveSpec) -> bool {
        match self {
            AllReduceAlgo::OneShot => false,
            AllReduceAlgo::TwoShot => true,
            AllReduceAlgo::Auto => spec.world > 2,
        }
    }
}

/// The knobs of a derivation (docs/design.md §3.4): everything but the spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PlanConfig {
    pub regime: Regime,
    /// Throughput only.
    pub staging_side: StagingSide,
    pub allreduce: AllReduceAlgo,
    /// Bytes per chunk (throughput); a multiple of `16 * blocks_per_role`.
    pub chunk_bytes: u64,
    /// Blocks per role (the writers' in the throughput regime, see below); each block handles
    /// a `chunk_bytes / blocks_per_role` slice of every chunk.
    pub blocks_per_role: u32,
    /// Blocks of each reading role of the throughput regime (Consumer, Head, Tail) when they
    /// differ from `blocks_per_role`: readers copy or reduce locally what writers moved over the
    /// link, often more bytes per chunk (an AllGather's reader also copies its own part), so
    /// they may need more blocks to keep up. `chunk_bytes` must be a multiple of 16 × both.
    pub consumer_blocks_per_role: Option<u32>,
    /// Lanes of the throughput regime (see `derive/throughput.rs`): each chunk is signalled
    /// and drained in this many independent parts. `None`: the greatest common divisor of the
    /// writers' and readers' block counts; `Some(n)`: `n`, which must divide both.
    pub lanes: Option<u32>,
    /// Most slots per stream (cyclic staging); fewer if staging is too small.
    pub slots: u32,
    /// Throughput writers of one lane stage it together in pieces of this many bytes
    /// ([`crate::plan::Share`]), a multiple of 16; 0: each block stages its own slice. Used
    /// where a lane has more than one writer block.
    pub share_piece: u64,
    /// Symmetric staging bytes per rank (two sense halves); a multiple of 32.
    pub staging_bytes: u64,
    /// Packet window payload bytes per rank (two sense halves); a multiple of 32.
    pub window_bytes: u64,
    /// Flag words per rank (the workspace's). Throughput plans split them into `world`
    /// segments, one per writer rank ([`flag_segment`]).
    pub flag_words: u32,
    /// The co-residency bound: the most blocks of this kernel resident at once.
    pub max_coresident_blocks: u32,
    pub packet: PacketFormat,
    /// Input and output are one buffer (NCCL's in-place convention).
    pub in_place: bool,
    /// Every rank's output is registered memory every rank can address at the same offset
    /// (NCCL's symmetric windows): the throughput regime's AllGather, AllToAll and their V
    /// forms then store straight into the peers' outputs (`Space::PeerOutput`, one copy per
    /// byte, `blocks_per_role` writer blocks, no staging); an AllReduce does so with its
    /// reduced shard when `peer_inputs` is set too. Other collectives ignore it.
    pub peer_outputs: bool,
    /// Every rank's input is registered memory every rank can address (`Space::PeerInput`):
    /// the throughput regime's ReduceScatter and its V form then reduce their part straight
    /// from every rank's input (one read per byte, no staging), and an AllReduce whose output
    /// is registered too reduces its shard so and stores it into every peer's output. In
    /// place, input and output are one registered buffer: set both.
    pub peer_inputs: bool,
    /// One-copy gathers (AllGather, AllToAll, their V forms) move their bytes on the copy
    /// engines, and a one-copy AllReduce its gather half (SM blocks reduce the shard first):
    /// an entry kernel, an engine program, an exit kernel ([`crate::plan::EngineProgram`],
    /// docs/perf/copy-engines.md §3). Other plans ignore it.
    #[serde(default)]
    pub copy_engine: bool,
    /// Copy collectives (AllGather, AllToAll, their V forms) on SM blocks: the plan also sets
    /// a flag word per source rank once that rank's shard of the output is final
    /// ([`crate::plan::Landed`]), at `flag_words + q`, so the rank's words must hold
    /// `flag_words + world`. For consumers inside the call (a fused kernel's
    /// `purlin::wait_shard`). Other collectives and copy-engine plans refuse it.
    #[serde(default)]
    pub landed: bool,
}

/// Greatest common divisor (at least 1).
pub fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a.max(1) } else { gcd(b, a % b) }
}

impl PlanConfig {
    /// Lanes of the throughput regime's phase 0 (writers -> readers).
    pub fn lanes(&self) -> u32 {
        self.lanes.unwrap_or_else(|| gcd(self.blocks_per_role, self.consumer_blocks()))
    }

    /// Blocks of each reading role (Consumer, Head, Tail) in the throughput regime.
    pub fn consumer_blocks(&self) -> u32 {
        self.consumer_blocks_per_role.unwrap_or(self.blocks_per_role)
    }

    /// What `chunk_bytes` must be a multiple of: every role's blocks take 16-byte-aligned
    /// slices of equal size.
    pub fn chunk_granule(&self) -> u64 {
        let (a, b) = (16 * u64::from(self.blocks_per_role), 16 * u64::from(self.consumer_blocks()));
        let gcd = |mut x: u64, mut y: u64| {
            while y != 0 {
                (x, y) = (y, x % y);
            }
            x
        };
        if a == 0 || b == 0 { a.max(b) } else { a / gcd(a, b) * b }
    }
}

impl Default for PlanConfig {
    fn default() -> Self {
        PlanConfig {
            regime: Regime::Throughput,
            staging_side: StagingSide::Peer,
            allreduce: AllReduceAlgo::Auto,
            chunk_bytes: 64 << 10,
            blocks_per_role: 2,
            consumer_blocks_per_role: None,
            lanes: None,
            slots: 8,
            share_piece: 0,
            staging_bytes: 16 << 20,
            window_bytes: 1 << 20,
            flag_words: 4096,
            max_coresident_blocks: 64,
            packet: PacketFormat::B8,
            in_place: false,
            peer_outputs: false,
            peer_inputs: false,
            copy_engine: false,
            landed: false,
        }
    }
}

/// Why a plan could not be derived.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeriveError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("{what} = {value} must be a positive multiple of {multiple}")]
    Misaligned { what: &'static str, value: u64, multiple: u64 },
    #[error("{lanes} lanes do not divide both the writers' {writers} and the readers' {readers} blocks")]
    Lanes { lanes: u32, writers: u32, readers: u32 },
    #[error("{need} blocks exceed the co-residency bound {bound}")]
    TooManyBlocks { need: u64, bound: u32 },
    #[error("staging of {have} bytes holds no slot: {areas} areas of one {chunk}-byte chunk per sense half")]
    StagingTooSmall { have: u64, areas: u64, chunk: u64 },
    #[error("window of {have} bytes is too small: the plan needs {need}")]
    WindowTooSmall { have: u64, need: u64 },
    #[error("the plan needs {need} flag words per rank, the workspace has {have}")]
    FlagsTooFew { need: u64, have: u32 },
    #[error("{0:?} cannot run in place")]
    InPlaceUnsupported(Collective),
    #[error("no shard-landed words: {0}")]
    LandedUnsupported(String),
    #[error("derived an ill-formed plan (a derivation bug): {0}")]
    Internal(#[from] PlanError),
}

/// Derives one plan per rank.
pub fn derive(spec: &CollectiveSpec, cfg: &PlanConfig) -> Result<Vec<Plan>, DeriveError> {
    check_inputs(spec, cfg)?;
    (0..spec.world).map(|r| derive_rank_unchecked(spec, cfg, r)).collect()
}

/// Derives rank `rank`'s plan.
pub fn derive_rank(spec: &CollectiveSpec, cfg: &PlanConfig, rank: u32) -> Result<Plan, DeriveError> {
    check_inputs(spec, cfg)?;
    if rank >= spec.world {
        return Err(SpecError::RankOutOfRange { rank, world: spec.world }.into());
    }
    derive_rank_unchecked(spec, cfg, rank)
}

fn check_inputs(spec: &CollectiveSpec, cfg: &PlanConfig) -> Result<(), DeriveError> {
    spec.validate()?;
    let mis = |what, value, multiple| Err(DeriveError::Misaligned { what, value, multiple });
    if cfg.blocks_per_role == 0 {
        return mis("blocks_per_role", 0, 1);
    }
    if cfg.consumer_blocks_per_role == Some(0) {
        return mis("consumer_blocks_per_role", 0, 1);
    }
    if let Some(lanes) = cfg.lanes {
        let g = gcd(cfg.blocks_per_role, cfg.consumer_blocks());
        if lanes == 0 || g % lanes != 0 {
            return Err(DeriveError::Lanes { lanes, writers: cfg.blocks_per_role, readers: cfg.consumer_blocks() });
        }
    }
    if cfg.window_bytes == 0 || cfg.window_bytes % 32 != 0 {
        return mis("window_bytes", cfg.window_bytes, 32);
    }
    if cfg.regime == Regime::Throughput {
        let m = cfg.chunk_granule();
        if cfg.chunk_bytes == 0 || cfg.chunk_bytes % m != 0 {
            return mis("chunk_bytes", cfg.chunk_bytes, m);
        }
        if cfg.staging_bytes == 0 || cfg.staging_bytes % 32 != 0 {
            return mis("staging_bytes", cfg.staging_bytes, 32);
        }
        if cfg.slots == 0 {
            return mis("slots", 0, 1);
        }
    }
    if cfg.in_place && matches!(spec.collective, Collective::AllToAll | Collective::AllToAllV) {
        return Err(DeriveError::InPlaceUnsupported(spec.collective));
    }
    Ok(())
}

/// Flag words of each writer rank's segment: every throughput plan puts the flags that rank
/// `p` stores into a rank's words in segment `p` (`[p * segment, (p + 1) * segment)`), and the
/// segment depends only on the workspace and the world, so a word has one writer across all
/// plans. A peer already in the next call then stores only into words that its own earlier
/// stores (made before it left this call) precede.
pub fn flag_segment(cfg: &PlanConfig, world: u32) -> u32 {
    cfg.flag_words / world.max(1)
}

/// Words at the end of every segment that only one-copy plans use (entry and done), so
/// that a staged plan never mistakes their signals for its own.
pub(crate) const ONE_COPY_FLAGS: u32 = 2;

/// Which buffers a one-copy plan of `c` shares with the peers, `(inputs, outputs)`: the
/// ones that must be registered for it ([`PlanConfig::peer_inputs`], `peer_outputs`); it
/// ignores the other flag.
pub fn one_copy_roles(c: Collective) -> (bool, bool) {
    match c {
        Collective::AllReduce => (true, true),
        Collective::ReduceScatter | Collective::ReduceScatterV => (true, false),
        Collective::AllGather | Collective::AllGatherV | Collective::AllToAll | Collective::AllToAllV => (false, true),
    }
}

/// Whether a throughput plan of `spec` takes the one-copy path under `cfg`.
pub fn one_copy(spec: &CollectiveSpec, cfg: &PlanConfig) -> bool {
    let (inputs, outputs) = one_copy_roles(spec.collective);
    (!inputs || cfg.peer_inputs) && (!outputs || cfg.peer_outputs)
}

/// Whether a throughput plan of `spec` moves its bytes on the copy engines under `cfg`: a
/// one-copy gather (no reduction), or the gather half of a one-copy AllReduce, with
/// [`PlanConfig::copy_engine`] set. A ReduceScatter has no gather half: it stays on SM blocks.
pub fn copy_engine(spec: &CollectiveSpec, cfg: &PlanConfig) -> bool {
    cfg.copy_engine
        && one_copy(spec, cfg)
        && (spec.collective.consume_op() == crate::types::ConsumeOp::Gather || spec.collective == Collective::AllReduce)
}

/// Whether an AllReduce is planned two-shot/composed under `cfg`.
pub(crate) fn two_shot(spec: &CollectiveSpec, cfg: &PlanConfig) -> bool {
    cfg.allreduce.composed(spec)
}

fn derive_rank_unchecked(spec: &CollectiveSpec, cfg: &PlanConfig, rank: u32) -> Result<Plan, DeriveError> {
    let mut plan = match cfg.regime {
        Regime::Latency => latency::derive(spec, cfg, rank)?,
        Regime::Throughput if one_copy(spec, cfg) && copy_engine(spec, cfg) => one_copy::derive_ce(spec, cfg, rank)?,
        Regime::Throughput if one_copy(spec, cfg) => one_copy::derive(spec, cfg, rank)?,
        Regime::Throughput => throughput::derive(spec, cfg, rank)?,
    };
    if cfg.landed {
        landed::add(&mut plan, cfg)?;
    }
    plan.check()?;
    Ok(plan)
}

/// The alias of an in-place call for `rank`.
pub(crate) fn alias(spec: &CollectiveSpec, cfg: &PlanConfig, rank: u32) -> Option<Alias> {
    if cfg.in_place { in_place_alias(spec, rank) } else { None }
}

/// Where `rank`'s input and output lie in its one buffer when `spec` runs in place (NCCL's
/// convention); `None` for collectives without an in-place form.
pub fn in_place_alias(spec: &CollectiveSpec, rank: u32) -> Option<Alias> {
    match spec.collective {
        Collective::AllReduce => Some(Alias::InputInOutput(0)),
        Collective::AllGather | Collective::AllGatherV => {
            Some(Alias::InputInOutput(spec.partition_offset(rank, rank, false)))
        }
        Collective::ReduceScatter | Collective::ReduceScatterV => {
            Some(Alias::OutputInInput(spec.partition_offset(rank, rank, true)))
        }
        Collective::AllToAll | Collective::AllToAllV => None,
    }
}

/// A plan with no blocks and no advance: what every derivation starts from (and returns
/// as is for an empty non-V call).
pub(crate) fn empty_plan(
    spec: &CollectiveSpec,
    cfg: &PlanConfig,
    rank: u32,
    regime: Regime,
    staging_side: Option<StagingSide>,
) -> Plan {
    Plan {
        spec: spec.clone(),
        rank,
        regime,
        staging_side,
        packet: cfg.packet,
        resources: crate::plan::Resources {
            input_bytes: spec.input_bytes(rank),
            output_bytes: spec.output_bytes(rank),
            alias: alias(spec, cfg, rank),
            staging_bytes: cfg.staging_bytes,
            window_bytes: cfg.window_bytes,
            flag_words: 0,
            counter_words: 0,
            epoch_words: cfg.max_coresident_blocks,
            ce_value_words: 0,
        },
        advance: crate::plan::Advance::Fixed(0),
        max_coresident_blocks: cfg.max_coresident_blocks,
        one_copy: false,
        blocks: vec![],
        engine: None,
        landed: None,
    }
}

/// Whether the call moves no data at all (all ranks know: non-V sizes are uniform), so the
/// plan is empty and advances nothing.
pub(crate) fn empty_non_v(spec: &CollectiveSpec) -> bool {
    !spec.collective.is_v() && (0..spec.world).all(|r| spec.input_bytes(r) == 0 && spec.output_bytes(r) == 0)
}

/// Index of `other` among `me`'s peers (0..world-1), skipping `me`.
pub(crate) fn compact(me: u32, other: u32) -> u32 {
    if other < me { other } else { other - 1 }
}

/// Rounds up to a multiple of 16.
pub(crate) fn up16(x: u64) -> u64 {
    x.div_ceil(16) * 16
}

/// Handshake steps: block 0 sends to every peer at entry; block 0 (or, when the advance is
/// agreed on the device, every block) waits for every peer at exit. The handshake area of a
/// window is `world` 16-byte cells from `base`, one per sender, in each sense half.
pub(crate) fn add_handshake(plan: &mut Plan, base: u64, half: u64, every_block_waits: bool) {
    let (rank, world) = (plan.rank, plan.spec.world);
    let cell = |sender: u32| Offset::fixed(base + 16 * sender as u64).sense(half);
    let val = crate::plan::EpochVal::at(1);
    for (b, block) in plan.blocks.iter_mut().enumerate() {
        if b == 0 {
            let sends: Vec<Step> = (0..world)
                .filter(|&q| q != rank)
                .map(|q| Step::HandshakeSend { peer: q, dst: cell(rank), flag: val })
                .collect();
            block.steps.splice(0..0, sends);
        }
        if b == 0 || every_block_waits {
            for p in (0..world).filter(|&p| p != rank) {
                block.steps.push(Step::HandshakeWait { peer: p, src: cell(p), expect: val });
            }
        }
    }
}
