//! How a call is planned: regime, staging side, chunk size, blocks per role and slots, per
//! size band (docs/design.md §5 "Tuning"). Every knob can be overridden from the environment
//! (`PURLIN_REGIME=latency|throughput`, `PURLIN_STAGING_SIDE=own|peer`, `PURLIN_CHUNK_BYTES`,
//! `PURLIN_BLOCKS_PER_ROLE`, `PURLIN_CONSUMER_BLOCKS`, `PURLIN_LANES`, `PURLIN_SLOTS`,
//! `PURLIN_SHARE_PIECE`, `PURLIN_SHARE_MIN_CHUNK`, `PURLIN_LATENCY_MAX_BYTES`,
//! `PURLIN_LATENCY_MAX_BYTES_ALLREDUCE`, `PURLIN_LATENCY_BLOCK_BYTES`,
//! `PURLIN_LATENCY_MAX_BLOCKS`, `PURLIN_MIN_CHUNKS`, `PURLIN_MIN_CHUNK_BYTES`,
//! `PURLIN_DEVICE_PARAMS_MAX_BYTES`, `PURLIN_MAX_BLOCKS`, `PURLIN_ONE_COPY_BLOCKS`,
//! `PURLIN_DATAPATH=sm|ce|auto`, `PURLIN_CE_MIN_BYTES`), so the table can be measured before it
//! is trusted. The datapath ([`Datapath`]) decides which engines move a one-copy gather's
//! bytes: under `auto` (the default) the copy engines take it where the caller caps blocks
//! (`PURLIN_MAX_BLOCKS`) and every piece one rank sends another is at least
//! `PURLIN_CE_MIN_BYTES` (8 MiB), on executors that run copy-engine plans
//! (docs/perf/copy-engines.md §3.6). Which executor runs a plan is not tuning: latency plans of catalogued shapes run
//! shaped unless `PURLIN_SHAPED=0` (`gpu::executor`).
//!
//! The defaults come from sweeps on 2×H200 (docs/perf/tuning-defaults.md): push staging (remote stores beat
//! remote loads under two-way load, docs/dev/device.md, and the sweeps agree); 16 writer blocks and 32
//! reader blocks (readers copy twice the bytes an AllGather's writers push, locally); 16 MiB
//! chunks, cut to a quarter of the call down to 4 MiB (each chunk costs every block a few
//! microseconds of waits, arrivals and fences); 2 slots; packets up to 2 MiB per rank (an
//! AllReduce up to 1 MiB) where the window holds the call, one block per 4 KiB of the
//! largest transfer, at most 64.
//! A call whose plan does not fit (staging, parameter block) is re-planned with smaller
//! chunks or fewer blocks.

use purlin_snac::{
    AllReduceAlgo, Collective, CollectiveSpec, ConsumeOp, DeriveError, PacketFormat, Plan, PlanConfig, Regime,
    StagingSide, derive_rank,
};

use crate::error::Error;

/// The tuning knobs that do not come from the communicator's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// `None`: by size (latency up to `latency_max_bytes`, `latency_max_bytes_allreduce`).
    pub regime: Option<Regime>,
    /// Largest per-rank payload planned in the latency regime (where its plan fits the packet
    /// window), AllReduce aside.
    pub latency_max_bytes: u64,
    /// The same for AllReduce (each rank sends its whole buffer to every peer in packets).
    pub latency_max_bytes_allreduce: u64,
    /// The latency regime gives each block at least this many bytes of the largest transfer
    /// (fewer blocks for small calls: every block costs launch and exit time).
    pub latency_block_bytes: u64,
    /// The most blocks of a latency-regime plan (`None`: `blocks_per_role`).
    pub latency_max_blocks: Option<u32>,
    /// Throughput staging side.
    pub staging_side: StagingSide,
    /// Throughput chunk bytes (rounded up to a multiple of `PlanConfig::chunk_granule`).
    pub chunk_bytes: u64,
    /// Blocks per role (the writers' in the throughput regime).
    pub blocks_per_role: u32,
    /// Blocks of the throughput regime's reading roles (`None`: `blocks_per_role`).
    pub consumer_blocks_per_role: Option<u32>,
    /// Lanes of the throughput regime (`None`: gcd of the writers' and readers' blocks;
    /// a count that does not divide both after clamping falls back to that).
    pub lanes: Option<u32>,
    /// Staging slots per stream.
    pub slots: u32,
    /// Throughput writers of a lane stage it together in pieces of this many bytes, taken in
    /// turn from a ticket (`purlin_snac::Share`), in calls whose chunks are at least
    /// `share_min_chunk` bytes; such calls run one lane (`lanes` applies to the others).
    /// 0: each writer block always stages a fixed slice.
    pub share_piece: u64,
    /// The smallest chunk whose stage is shared (see `share_piece`).
    pub share_min_chunk: u64,
    /// Smaller chunks for mid-size calls: a call is cut into at least this many chunks, but
    /// not below `min_chunk_bytes`, so that staging and consuming overlap.
    pub min_chunks: u64,
    /// The floor of that cut.
    pub min_chunk_bytes: u64,
    /// Eager launches of calls whose larger buffer on this rank has at most this many bytes
    /// read the plan's parameter block from device memory (uploaded once per plan) instead of
    /// carrying it by value; larger calls, and every launch captured into a graph, carry it
    /// by value. 0: always by value.
    pub device_params_max_bytes: u64,
    /// The most blocks one call's kernel may use (NCCL's `maxCTAs`; `PURLIN_MAX_BLOCKS`), to
    /// leave SMs to compute that overlaps the collective. `None`: what the table asks (a
    /// staged call at world 2 takes 16 writers and 32 readers). A staged call needs one writer
    /// and one block per reading role (two blocks; three for an AllReduce composed of a
    /// ReduceScatter and an AllGather), and a latency call that gathers a rank's own part
    /// needs two, so a smaller cap is raised to that. Within the cap, staged calls split
    /// their blocks between writers and readers by the traffic each side moves
    /// ([`role_split`]).
    pub max_blocks: Option<u32>,
    /// Blocks of a one-copy call (`PURLIN_ONE_COPY_BLOCKS`), one role, within `max_blocks`: a
    /// call on symmetric buffers ([`crate::SymmetricBuffer`]) that stores straight into the
    /// peers' outputs or reduces straight from their inputs. 0: such calls stay staged.
    pub one_copy_blocks: u32,
    /// Which engines move a one-copy gather's bytes and a one-copy AllReduce's gather half
    /// (`PURLIN_DATAPATH`, [`Datapath`]).
    pub datapath: Datapath,
    /// Under [`Datapath::Auto`], the smallest piece one rank sends another for which a
    /// one-copy gather runs on the copy engines (`PURLIN_CE_MIN_BYTES`).
    pub ce_min_bytes: u64,
}

/// Which engines move the bytes of one-copy gathers (AllGather, AllToAll, their V forms,
/// Broadcast) and the gather half of the one-copy AllReduce on symmetric buffers
/// (docs/perf/copy-engines.md §3.6). ReduceScatter, the AllReduce's reduce half, staged and
/// latency calls run on SM blocks whatever it says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Datapath {
    /// SM blocks only (`PURLIN_DATAPATH=sm`).
    Sm,
    /// The copy engines for every eligible call, whatever its size (`ce`; for tests).
    CopyEngine,
    /// The copy engines for gathers where every piece one rank sends another is at least
    /// [`Tuning::ce_min_bytes`] and the caller caps blocks ([`Tuning::max_blocks`]); SM blocks
    /// otherwise, AllReduce included (its copy-engine form reduces, then copies, with no
    /// overlap, and has not been timed against the SM one) (`auto`, the default).
    #[default]
    Auto,
}

impl Datapath {
    /// Whether a one-copy gather of `spec` runs on the copy engines under `tuning`.
    pub fn copy_engine(spec: &CollectiveSpec, tuning: &Tuning) -> bool {
        match tuning.datapath {
            Datapath::Sm => false,
            Datapath::CopyEngine => true,
            Datapath::Auto if spec.collective == Collective::AllReduce => false,
            Datapath::Auto => {
                // The pieces ranks exchange (own parts aside); every rank computes the same.
                let pieces = (0..spec.world)
                    .flat_map(|s| (0..spec.world).filter(move |&d| d != s).map(move |d| spec.pair_bytes(s, d)))
                    .filter(|&b| b > 0);
                let smallest = pieces.min();
                tuning.max_blocks.is_some() && smallest.is_some_and(|b| b >= tuning.ce_min_bytes)
            }
        }
    }
}

impl Default for Tuning {
    fn default() -> Self {
        // Each default's reason and the rounds that measured it; the figures are in
        // docs/perf/tuning-defaults.md.
        Self {
            regime: None,
            // Packets where they beat staging with both regimes forced in one run (round 53).
            latency_max_bytes: 2 << 20,
            latency_max_bytes_allreduce: 1 << 20,
            // 4 KiB per block, up to 64 blocks: fewer, larger blocks were slower (rounds 9, 43).
            latency_block_bytes: 4 << 10,
            latency_max_blocks: Some(64),
            // Push: remote stores beat remote loads under two-way load (docs/dev/device.md).
            staging_side: StagingSide::Peer,
            // 16 MiB chunks, 16 writers and 32 readers; more slots changed nothing (rounds 8-9).
            chunk_bytes: 16 << 20,
            blocks_per_role: 16,
            consumer_blocks_per_role: Some(32),
            // Two lanes sharing stages in 256 KiB pieces, from 16 MiB chunks, where shared
            // stages stop costing (rounds 21, 25-26, 33).
            lanes: Some(2),
            slots: 2,
            share_piece: 256 << 10,
            share_min_chunk: 16 << 20,
            min_chunks: 4,
            min_chunk_bytes: 4 << 20,
            // Parameter blocks of small calls from device memory, larger ones by value: the
            // kernels run slower reading records from device memory once a call outlasts its
            // launch (rounds 55-57, 79; one GPU shared by both ranks).
            device_params_max_bytes: 1 << 20,
            max_blocks: None,
            // Not yet measured on a GPU pair; chosen on one GPU shared by both ranks (rounds
            // 69-70), where 32 blocks beat 16.
            one_copy_blocks: 32,
            // Copy engines only where the caller caps SM blocks and pieces are large: two more
            // launches per call cost microseconds; 8 MiB is NCCL's `NCCL_SYM_CE_THRESHOLD`
            // (docs/perf/copy-engines.md §3.6; not measured here yet).
            datapath: Datapath::Auto,
            ce_min_bytes: 8 << 20,
        }
    }
}

fn env<T: std::str::FromStr>(var: &'static str) -> Result<Option<T>, Error>
where
    T::Err: std::fmt::Display,
{
    match std::env::var(var) {
        Ok(text) => text.trim().parse().map(Some).map_err(|e| Error::Env { var, problem: format!("{text:?}: {e}") }),
        Err(_) => Ok(None),
    }
}

impl Tuning {
    /// The defaults with the `PURLIN_*` overrides applied.
    pub fn from_env() -> Result<Self, Error> {
        let mut t = Self::default();
        if let Ok(r) = std::env::var("PURLIN_REGIME") {
            t.regime = Some(match r.trim() {
                "latency" => Regime::Latency,
                "throughput" => Regime::Throughput,
                other => {
                    return Err(Error::Env { var: "PURLIN_REGIME", problem: format!("{other:?}: latency|throughput") });
                }
            });
        }
        if let Ok(s) = std::env::var("PURLIN_STAGING_SIDE") {
            t.staging_side = match s.trim() {
                "own" | "pull" => StagingSide::Own,
                "peer" | "push" => StagingSide::Peer,
                other => {
                    return Err(Error::Env { var: "PURLIN_STAGING_SIDE", problem: format!("{other:?}: own|peer") });
                }
            };
        }
        t.chunk_bytes = env("PURLIN_CHUNK_BYTES")?.unwrap_or(t.chunk_bytes);
        t.blocks_per_role = env("PURLIN_BLOCKS_PER_ROLE")?.unwrap_or(t.blocks_per_role);
        t.consumer_blocks_per_role = env("PURLIN_CONSUMER_BLOCKS")?.or(t.consumer_blocks_per_role);
        t.lanes = env("PURLIN_LANES")?.or(t.lanes);
        t.slots = env("PURLIN_SLOTS")?.unwrap_or(t.slots);
        t.share_piece = env("PURLIN_SHARE_PIECE")?.unwrap_or(t.share_piece);
        t.share_min_chunk = env("PURLIN_SHARE_MIN_CHUNK")?.unwrap_or(t.share_min_chunk);
        t.min_chunks = env("PURLIN_MIN_CHUNKS")?.unwrap_or(t.min_chunks);
        t.min_chunk_bytes = env("PURLIN_MIN_CHUNK_BYTES")?.unwrap_or(t.min_chunk_bytes);
        t.latency_max_bytes = env("PURLIN_LATENCY_MAX_BYTES")?.unwrap_or(t.latency_max_bytes);
        t.latency_max_bytes_allreduce =
            env("PURLIN_LATENCY_MAX_BYTES_ALLREDUCE")?.unwrap_or(t.latency_max_bytes_allreduce);
        t.latency_block_bytes = env("PURLIN_LATENCY_BLOCK_BYTES")?.unwrap_or(t.latency_block_bytes);
        t.latency_max_blocks = env("PURLIN_LATENCY_MAX_BLOCKS")?.or(t.latency_max_blocks);
        t.device_params_max_bytes = env("PURLIN_DEVICE_PARAMS_MAX_BYTES")?.unwrap_or(t.device_params_max_bytes);
        t.max_blocks = env("PURLIN_MAX_BLOCKS")?.or(t.max_blocks);
        t.one_copy_blocks = env("PURLIN_ONE_COPY_BLOCKS")?.unwrap_or(t.one_copy_blocks);
        if let Ok(d) = std::env::var("PURLIN_DATAPATH") {
            t.datapath = Datapath::parse(&d)?;
        }
        t.ce_min_bytes = env("PURLIN_CE_MIN_BYTES")?.unwrap_or(t.ce_min_bytes);
        if t.max_blocks == Some(0) {
            return Err(Error::Env { var: "PURLIN_MAX_BLOCKS", problem: "0: a call needs at least one block".into() });
        }
        Ok(t)
    }
}

impl Datapath {
    /// `sm`, `ce` (or `copy-engine`), `auto`; anything else is [`Error::Env`].
    pub fn parse(text: &str) -> Result<Self, Error> {
        match text.trim() {
            "sm" => Ok(Datapath::Sm),
            "ce" | "copy-engine" => Ok(Datapath::CopyEngine),
            "auto" => Ok(Datapath::Auto),
            other => Err(Error::Env { var: "PURLIN_DATAPATH", problem: format!("{other:?}: sm|ce|auto") }),
        }
    }
}

/// The memory a communicator offers plans (its symmetric workspace or host memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanLimits {
    /// Staging bytes per rank.
    pub staging_bytes: u64,
    /// Packet-window payload bytes per rank.
    pub window_bytes: u64,
    /// The co-residency bound (most blocks of one kernel resident at once).
    pub max_coresident_blocks: u32,
    /// Packet format of the latency regime.
    pub packet: PacketFormat,
    /// Flag words per rank.
    pub flag_words: u32,
    /// The call's output is registered symmetric memory on every rank (one-copy calls).
    pub peer_outputs: bool,
    /// The call's input is registered symmetric memory on every rank (one-copy reductions).
    pub peer_inputs: bool,
    /// The executor runs copy-engine plans (`Plan::engine`): the host executor does, the
    /// device executor where every rank's GPU has a copy engine and, until its sequence has
    /// run on a GPU, only for `Datapath::CopyEngine` (set by `Comm`, not by
    /// [`PlanLimits::of_workspace`]; docs/perf/copy-engines.md §3.8).
    pub copy_engine: bool,
    /// Copy collectives add shard-landed words (`PlanConfig::landed`), past `flag_words`
    /// (the workspace holds `LANDED_WORDS` more): fused calls, whose kernels may consume
    /// shards as they land. Set by the fused path, not by [`PlanLimits::of_workspace`].
    pub landed: bool,
}

impl PlanLimits {
    /// The limits of a communicator's symmetric workspace `config` (flag words saturate at
    /// `u32::MAX`).
    pub fn of_workspace(
        config: &crate::workspace::WorkspaceConfig,
        max_coresident_blocks: u32,
        packet: PacketFormat,
        peer_outputs: bool,
        peer_inputs: bool,
    ) -> Self {
        PlanLimits {
            staging_bytes: config.staging_bytes as u64,
            window_bytes: config.window_bytes as u64,
            max_coresident_blocks,
            packet,
            flag_words: u32::try_from(config.flag_words).unwrap_or(u32::MAX),
            peer_outputs,
            peer_inputs,
            copy_engine: false,
            landed: false,
        }
    }
}

/// The largest payload a rank sends or receives in a call of `spec` (the size band).
pub fn band_bytes(spec: &CollectiveSpec) -> u64 {
    (0..spec.world).map(|r| spec.input_bytes(r).max(spec.output_bytes(r))).max().unwrap_or(0)
}

/// How many reading roles a staged plan of `spec` has: two (Head and Tail) for an AllReduce
/// composed of a ReduceScatter and an AllGather (as `AllReduceAlgo::Auto`, which every plan
/// here uses, decides), else one.
fn reading_roles(spec: &CollectiveSpec) -> u32 {
    let composed = spec.collective == Collective::AllReduce && AllReduceAlgo::Auto.composed(spec);
    if composed { 2 } else { 1 }
}

/// Writers and blocks per reading role of a staged call of `spec` on at most `cap` blocks
/// (raised to the least a staged plan needs): the split under which both sides take the same
/// time when every block moves memory at one rate. That is what bounds few-block calls: one
/// SM copies about 48 GB/s locally with every Atom build and pipeline depth (and the bulk-copy
/// engine less), and a writer pushes about 43 over NVLink (`atom_bench --local`, round 61;
/// `atom_bench`, round 22), so a side's time is its traffic, bytes read plus bytes written
/// summed over ranks (a k-source reduce reads k bytes per byte it writes), over its blocks.
/// Ties go to the writers (with 4 writers a 256 MiB AllGather pushed at 27 GB/s per block,
/// against 43 with 8: round 44). A 256 MiB AllGather at world 2 on 16 blocks: 6 writers,
/// 10 readers; an AllReduce: 7 and 9.
///
/// The split is a function of the spec alone, never of this rank's form: NCCL lets each rank
/// call in place or not, and every rank must derive the same block counts (a rank's in-place
/// split once differed from its peers' out-of-place one, so their flags never met). The
/// traffic counted is the out-of-place call's.
pub fn role_split(spec: &CollectiveSpec, cap: u32) -> (u32, u32) {
    let roles = reading_roles(spec);
    let cap = cap.max(1 + roles);
    let world = f64::from(spec.world);
    let (mut writers, mut readers) = (0f64, 0f64);
    for rank in 0..spec.world {
        let (input, output) = (spec.input_bytes(rank) as f64, spec.output_bytes(rank) as f64);
        let (w, r) = match spec.collective {
            // Writers push the rank's part to every peer; readers copy every part out of
            // staging, and the rank's own part from the input (out of place).
            Collective::AllGather | Collective::AllGatherV => (2.0 * (world - 1.0) * input, 2.0 * output),
            Collective::AllToAll | Collective::AllToAllV => (2.0 * input * (world - 1.0) / world, 2.0 * output),
            // Writers push the peers' shards; readers reduce `world` sources into the rank's.
            Collective::ReduceScatter | Collective::ReduceScatterV => {
                (2.0 * (input - output).max(0.0), (world + 1.0) * output)
            }
            // Composed: writers push the peers' shards; the Head reduces `world` sources into
            // the rank's shard and stages it to every peer; the Tail copies the peers' reduced
            // shards out (2(W - 1) shards, less than the Head's). Both reading roles get
            // `readers` blocks, so the Head sets the pace.
            Collective::AllReduce if roles == 2 => {
                let shard = input / world;
                (2.0 * (world - 1.0) * shard, (3.0 * world - 1.0) * shard)
            }
            // Direct (world 2): writers push the whole input, readers reduce two sources.
            Collective::AllReduce => (2.0 * input, 3.0 * output),
        };
        writers += w;
        readers += r;
    }
    let mut best = (1, (cap - 1) / roles, f64::INFINITY);
    for w in 1..=cap - roles {
        let r = (cap - w) / roles;
        let time = (writers / f64::from(w)).max(readers / f64::from(r));
        if time <= best.2 {
            best = (w, r, time);
        }
    }
    (best.0, best.1)
}

/// The plan configuration for one call.
pub fn plan_config(spec: &CollectiveSpec, in_place: bool, tuning: &Tuning, limits: &PlanLimits) -> PlanConfig {
    let latency_max = if spec.collective == Collective::AllReduce {
        tuning.latency_max_bytes_allreduce
    } else {
        tuning.latency_max_bytes
    };
    let regime =
        tuning.regime.unwrap_or(if band_bytes(spec) <= latency_max { Regime::Latency } else { Regime::Throughput });
    let cap = (limits.max_coresident_blocks / 4).max(1);
    let mut blocks = tuning.blocks_per_role.clamp(1, cap);
    if regime == Regime::Latency {
        // One role, plus as many blocks again at most for a gather's own part.
        let latency_cap = (limits.max_coresident_blocks / 2).max(1);
        blocks = tuning.latency_max_blocks.unwrap_or(blocks).clamp(1, latency_cap);
        if tuning.latency_block_bytes > 0 {
            let wanted = band_bytes(spec).div_ceil(tuning.latency_block_bytes).max(1);
            blocks = blocks.min(u32::try_from(wanted).unwrap_or(u32::MAX));
        }
    }
    let mut consumer_blocks = tuning.consumer_blocks_per_role.map(|n| n.clamp(1, cap));
    if let Some(max) = tuning.max_blocks {
        if regime == Regime::Latency {
            // A gather may add as many blocks again for the rank's own part.
            let own = if spec.collective.consume_op() == ConsumeOp::Gather { 2 } else { 1 };
            blocks = blocks.min((max / own).max(1));
        } else if blocks + reading_roles(spec) * consumer_blocks.unwrap_or(blocks) > max {
            let (writers, readers) = role_split(spec, max);
            blocks = writers;
            consumer_blocks = Some(readers);
        }
    }
    let mut cfg = PlanConfig {
        regime,
        staging_side: tuning.staging_side,
        allreduce: AllReduceAlgo::Auto,
        chunk_bytes: 0,
        blocks_per_role: blocks,
        consumer_blocks_per_role: consumer_blocks,
        lanes: None,
        slots: tuning.slots,
        share_piece: 0,
        staging_bytes: limits.staging_bytes,
        window_bytes: limits.window_bytes,
        flag_words: limits.flag_words,
        max_coresident_blocks: limits.max_coresident_blocks,
        packet: limits.packet,
        in_place,
        peer_outputs: false,
        peer_inputs: false,
        copy_engine: false,
        landed: limits.landed,
    };
    if regime == Regime::Throughput && tuning.one_copy_blocks > 0 {
        (cfg.peer_outputs, cfg.peer_inputs) = (limits.peer_outputs, limits.peer_inputs);
    }
    cfg.copy_engine = limits.copy_engine && Datapath::copy_engine(spec, tuning);
    let one_copy = purlin_snac::derive::one_copy(spec, &cfg);
    if one_copy {
        // One role of blocks: the staged roles' knobs do not apply. A copy-engine AllReduce's
        // plan also holds the exit kernel's block (`derive_ce`).
        let exit = u32::from(purlin_snac::derive::copy_engine(spec, &cfg) && spec.collective == Collective::AllReduce);
        let max = tuning.max_blocks.unwrap_or(u32::MAX).min(limits.max_coresident_blocks.saturating_sub(exit));
        cfg.blocks_per_role = tuning.one_copy_blocks.clamp(1, max.max(1));
        cfg.consumer_blocks_per_role = None;
    }
    // Lanes must divide both block counts (which the clamps above may have changed).
    cfg.lanes =
        tuning.lanes.filter(|&n| n > 0 && purlin_snac::gcd(cfg.blocks_per_role, cfg.consumer_blocks()) % n == 0);
    let split = if one_copy {
        // No slots to pipeline through: one chunk per transfer (about `band / world` bytes)
        // gives every block a slice; the 4 MiB floor of staged chunks left most blocks idle
        // below ~64 MiB (round 72: a 1 MiB AllGather took 15 µs on 4 of 32 blocks). Chunks stay
        // within `chunk_bytes`, so an AllReduce's reduced slice is still in L2 when pushed.
        band_bytes(spec).div_ceil(u64::from(spec.world))
    } else {
        band_bytes(spec).div_ceil(tuning.min_chunks.max(1)).max(tuning.min_chunk_bytes)
    };
    let wanted = tuning.chunk_bytes.min(split);
    // Rounded down, never up: a chunk a few bytes over the table's size (16 MiB + 224 B with
    // 6 writers and 10 readers) leaves one slot per sense half where two fit, and writers
    // then wait for every drain (round 62: 1.5-2.6x slower). Where the chunk is large enough,
    // to a multiple of 128 bytes per block slice, so that chunks, slots and every slice start
    // on a cache line also when the block counts are not powers of two (round 63: 7 + 9
    // blocks with 64-byte-aligned slices ran an AllReduce 1.16x slower than 8 + 8).
    let granule = cfg.chunk_granule();
    let lined = 8 * granule;
    cfg.chunk_bytes = if wanted >= lined { wanted / lined * lined } else { (wanted / granule).max(1) * granule };
    if tuning.share_piece > 0 && wanted >= tuning.share_min_chunk {
        // Pieces start 16-byte aligned, so every writer copies through the Atom's vector path.
        cfg.share_piece = tuning.share_piece.div_ceil(16) * 16;
        cfg.lanes = Some(1);
    }
    cfg
}

/// Derives rank `rank`'s plan, falling back from the latency to the throughput regime when
/// the packet window is too small for the call (unless the regime was forced).
pub fn plan_for(
    spec: &CollectiveSpec,
    rank: u32,
    in_place: bool,
    tuning: &Tuning,
    limits: &PlanLimits,
) -> Result<Plan, Error> {
    plan_and_config(spec, rank, in_place, tuning, limits).map(|(plan, _)| plan)
}

/// [`plan_for`] and the configuration the plan was derived with, after any fall-back (to the
/// throughput regime, to smaller chunks): what the plan set is verified with.
pub fn plan_and_config(
    spec: &CollectiveSpec,
    rank: u32,
    in_place: bool,
    tuning: &Tuning,
    limits: &PlanLimits,
) -> Result<(Plan, PlanConfig), Error> {
    let mut cfg = plan_config(spec, in_place, tuning, limits);
    loop {
        match derive_rank(spec, &cfg, rank) {
            Err(DeriveError::WindowTooSmall { .. }) if tuning.regime.is_none() && cfg.regime == Regime::Latency => {
                let staged = Tuning { regime: Some(Regime::Throughput), ..*tuning };
                cfg = plan_config(spec, in_place, &staged, limits);
            }
            // Many peers' areas in one sense half: smaller chunks, down to the granule.
            Err(DeriveError::StagingTooSmall { .. }) if cfg.chunk_bytes > cfg.chunk_granule() => {
                let granule = cfg.chunk_granule();
                cfg.chunk_bytes = (cfg.chunk_bytes / 2).div_ceil(granule) * granule;
            }
            r => return r.map(|plan| (plan, cfg)).map_err(Error::from),
        }
    }
}

/// [`plan_and_config`] with fewer blocks per role while `fits` rejects a plan (e.g. a
/// parameter block larger than the executor's), halving down to one block.
///
/// Whether to halve is decided on every rank's plan in both forms (in place or not, where the
/// collective has an in-place form), never on this rank's alone: every rank must take the same
/// block counts, and a rank cannot know which form its peers chose.
pub fn plan_fitting(
    spec: &CollectiveSpec,
    rank: u32,
    in_place: bool,
    tuning: &Tuning,
    limits: &PlanLimits,
    fits: impl Fn(&Plan) -> bool,
) -> Result<(Plan, PlanConfig), Error> {
    let mut t = *tuning;
    loop {
        let (plan, cfg) = plan_and_config(spec, rank, in_place, &t, limits)?;
        let smallest = t.blocks_per_role <= 1
            && t.consumer_blocks_per_role.is_none_or(|n| n <= 1)
            && t.latency_max_blocks.is_some_and(|n| n <= 1)
            && t.one_copy_blocks <= 1;
        if smallest || every_form_fits(spec, &plan, &cfg, &fits) {
            return Ok((plan, cfg));
        }
        let half = |n: u32| (n / 2).max(1);
        t.blocks_per_role = half(t.blocks_per_role);
        t.consumer_blocks_per_role = t.consumer_blocks_per_role.map(half);
        if t.one_copy_blocks > 0 {
            t.one_copy_blocks = half(t.one_copy_blocks);
        }
        t.latency_max_blocks = Some(half(t.latency_max_blocks.unwrap_or(t.blocks_per_role).min(plan.grid() as u32)));
    }
}

/// Whether `fits` accepts the plan of every rank in both forms under `cfg` (the one `plan`
/// was derived with), `plan` itself included. A form a collective does not have (in place for
/// the AllToAll forms) does not derive and is skipped.
fn every_form_fits(spec: &CollectiveSpec, plan: &Plan, cfg: &PlanConfig, fits: &impl Fn(&Plan) -> bool) -> bool {
    if !fits(plan) {
        return false;
    }
    (0..spec.world).all(|rank| {
        [false, true].into_iter().all(|in_place| {
            let cfg = PlanConfig { in_place, ..*cfg };
            match derive_rank(spec, &cfg, rank) {
                Ok(p) => fits(&p),
                Err(_) => true,
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use purlin_snac::{DataType, ReduceOp};

    fn limits() -> PlanLimits {
        PlanLimits {
            staging_bytes: 16 << 20,
            window_bytes: 1 << 20,
            max_coresident_blocks: 264,
            packet: PacketFormat::B16,
            flag_words: 4096,
            peer_outputs: false,
            peer_inputs: false,
            copy_engine: false,
            landed: false,
        }
    }

    /// Large calls (16 MiB chunks) share their stages in one lane; mid-size calls (4 MiB
    /// chunks) keep fixed slices in two lanes.
    #[test]
    fn only_large_chunks_share_their_stages() {
        let limits = PlanLimits { staging_bytes: 64 << 20, ..limits() };
        let large =
            plan_config(&CollectiveSpec::all_gather(2, DataType::F32, 32 << 20), false, &Tuning::default(), &limits);
        assert_eq!((large.chunk_bytes, large.share_piece, large.lanes), (16 << 20, 256 << 10, Some(1)));
        let mid =
            plan_config(&CollectiveSpec::all_gather(2, DataType::F32, 1 << 20), false, &Tuning::default(), &limits);
        assert_eq!((mid.share_piece, mid.lanes), (0, Some(2)));
        assert!(mid.chunk_bytes < 16 << 20);
    }

    #[test]
    fn every_collective_gets_a_plan_that_fits_at_every_world() {
        let words = |p: &Plan| purlin_snac::params::encode(p).len() <= crate::gpu::kernels::EXEC_PARAM_WORDS;
        for world in [2u32, 3, 4, 8, 16] {
            for bytes in [8u64, 4096, 1 << 20, 256 << 20] {
                let n = (bytes / 4 / u64::from(world)).max(1);
                for spec in [
                    CollectiveSpec::all_reduce(world, DataType::F32, ReduceOp::Sum, n * u64::from(world)),
                    CollectiveSpec::all_gather(world, DataType::F32, n),
                    CollectiveSpec::reduce_scatter(world, DataType::Bf16, ReduceOp::Max, n),
                    CollectiveSpec::all_to_all(world, DataType::U8, n),
                ] {
                    for rank in [0, world - 1] {
                        let (plan, _) = plan_fitting(&spec, rank, false, &Tuning::default(), &limits(), words)
                            .unwrap_or_else(|e| panic!("{spec:?} rank {rank}: {e}"));
                        assert!(words(&plan), "{spec:?}: {} words", purlin_snac::params::encode(&plan).len());
                        assert!(plan.grid() <= 264);
                    }
                }
            }
        }
    }

    /// The latency regime has one role (plus a gather's own-part blocks), so it may use half
    /// the co-resident blocks; the quarter the throughput regime's roles share held a 1 MiB
    /// AllReduce on H200 (132 co-resident blocks) to 33 blocks.
    #[test]
    fn latency_calls_may_use_half_the_coresident_blocks() {
        let limits = PlanLimits { max_coresident_blocks: 132, ..limits() };
        let spec = CollectiveSpec::all_reduce(2, DataType::Bf16, ReduceOp::Sum, 512 << 10);
        let cfg = plan_config(&spec, false, &Tuning::default(), &limits);
        assert_eq!((cfg.regime, cfg.blocks_per_role), (Regime::Latency, 64));
        let many = Tuning { latency_max_blocks: Some(1000), ..Tuning::default() };
        assert_eq!(plan_config(&spec, false, &many, &limits).blocks_per_role, 66);
        let staged = Tuning { regime: Some(Regime::Throughput), blocks_per_role: 1000, ..Tuning::default() };
        assert_eq!(plan_config(&spec, false, &staged, &limits).blocks_per_role, 33);
    }

    #[test]
    fn small_calls_take_the_latency_regime_and_large_ones_stage() {
        let small = CollectiveSpec::all_reduce(2, DataType::F32, ReduceOp::Sum, 1024);
        let large = CollectiveSpec::all_reduce(2, DataType::F32, ReduceOp::Sum, 16 << 20);
        let t = Tuning::default();
        assert_eq!(plan_for(&small, 0, false, &t, &limits()).unwrap().regime, Regime::Latency);
        assert_eq!(plan_for(&large, 0, false, &t, &limits()).unwrap().regime, Regime::Throughput);
    }

    /// The split of a capped staged call evens out both sides' traffic per block.
    #[test]
    fn a_block_cap_splits_writers_and_readers_by_their_traffic() {
        let gather = CollectiveSpec::all_gather(2, DataType::Bf16, 64 << 20);
        let reduce = CollectiveSpec::all_reduce(2, DataType::Bf16, ReduceOp::Sum, 128 << 20);
        // Readers copy twice what writers push (the peer's part and the rank's own).
        assert_eq!(role_split(&gather, 16), (6, 10));
        // Writers push the input, readers read two sources and write one.
        assert_eq!(role_split(&reduce, 16), (7, 9));
        // Composed (world 4): writers push three shards, the Head reads four and writes
        // seven (its output and three peers' staging), the Tail copies three; Head and Tail
        // get as many blocks each.
        let reduce4 = CollectiveSpec::all_reduce(4, DataType::Bf16, ReduceOp::Sum, 128 << 20);
        assert_eq!(role_split(&reduce4, 16), (4, 6));
        // A cap below what a staged plan needs is raised to it.
        assert_eq!(role_split(&gather, 1), (1, 1));
        assert_eq!(role_split(&CollectiveSpec::all_reduce(4, DataType::F32, ReduceOp::Sum, 1 << 20), 1), (1, 1));
    }

    /// Under `max_blocks`, every collective at every world, size, side and in/out of place
    /// gets plans of at most that many blocks (or the least its regime needs) that pass the
    /// verifier together.
    #[test]
    fn capped_plans_stay_under_the_cap_and_verify() {
        let words = |p: &Plan| purlin_snac::params::encode(p).len() <= crate::gpu::kernels::EXEC_PARAM_WORDS;
        let opts = purlin_snac::verify::Options { max_states: 2_000, schedules: 4, ..Default::default() };
        for world in [2u32, 3, 4] {
            let w = u64::from(world);
            for bytes in [8u64, 64 << 10, 4 << 20] {
                let n = (bytes / 4 / w).max(1);
                let skew: Vec<u64> = (0..w).map(|r| n * (r + 1) / 2).collect();
                let specs = [
                    CollectiveSpec::all_reduce(world, DataType::F32, ReduceOp::Sum, n * w),
                    CollectiveSpec::all_gather(world, DataType::F32, n),
                    CollectiveSpec::reduce_scatter(world, DataType::F32, ReduceOp::Sum, n),
                    CollectiveSpec::all_to_all(world, DataType::F32, n),
                    CollectiveSpec::all_gather_v(world, DataType::F32, skew.clone()),
                    CollectiveSpec::reduce_scatter_v(world, DataType::F32, ReduceOp::Max, skew.clone()),
                    CollectiveSpec::all_to_all_v(world, DataType::F32, vec![skew.clone(); world as usize]),
                ];
                for spec in specs {
                    let a2a = matches!(spec.collective, Collective::AllToAll | Collective::AllToAllV);
                    for (cap, in_place) in [(1, false), (3, false), (5, true), (16, false), (16, true)] {
                        if in_place && a2a {
                            continue;
                        }
                        let t = Tuning { max_blocks: Some(cap), ..Tuning::default() };
                        let plans: Vec<Plan> = (0..world)
                            .map(|rank| plan_fitting(&spec, rank, in_place, &t, &limits(), words).map(|(p, _)| p))
                            .collect::<Result<_, _>>()
                            .unwrap_or_else(|e| panic!("{spec:?} cap {cap}: {e}"));
                        for p in &plans {
                            assert!(p.grid() as u32 <= cap.max(3), "{spec:?} cap {cap}: grid {}", p.grid());
                        }
                        let report = purlin_snac::verify::verify_call(&plans, &opts);
                        assert!(report.ok(), "{spec:?} cap {cap} in place {in_place}: {:?}", report.result);
                    }
                }
            }
        }
    }

    /// Ranks choose their form (in place or not) independently, as NCCL lets them: for random
    /// specs, tunings and block caps, every mix of forms derives plans of the same block counts
    /// that the verifier accepts together.
    #[test]
    fn every_mix_of_forms_makes_one_verified_plan_set() {
        let mut rng = purlin_testkit::Rng::new(purlin_testkit::fresh_seed());
        let opts = purlin_snac::verify::Options { max_states: 1_500, schedules: 3, ..Default::default() };
        let limits = PlanLimits { staging_bytes: 1 << 20, window_bytes: 64 << 10, ..limits() };
        let mut checked = 0;
        while checked < 120 {
            let world = 2 + rng.below(2) as u32;
            let w = u64::from(world);
            let n = 1 + rng.below(3000);
            let skew: Vec<u64> = (0..w).map(|r| (n * (r + 1) / 2) * rng.below(2)).collect();
            let spec = match rng.below(6) {
                0 => CollectiveSpec::all_reduce(world, DataType::F32, ReduceOp::Sum, n * w),
                1 => CollectiveSpec::all_gather(world, DataType::F32, n),
                2 => CollectiveSpec::reduce_scatter(world, DataType::F32, ReduceOp::Sum, n),
                3 => CollectiveSpec::all_gather_v(world, DataType::F32, skew),
                4 => CollectiveSpec::reduce_scatter_v(world, DataType::F32, ReduceOp::Max, skew),
                _ => CollectiveSpec::all_gather_v(
                    world,
                    DataType::F32,
                    (0..w).map(|r| if r == 0 { n } else { 0 }).collect(),
                ),
            };
            if spec.validate().is_err() {
                continue;
            }
            let t = Tuning {
                regime: Some([Regime::Latency, Regime::Throughput][rng.below(2) as usize]),
                staging_side: [StagingSide::Own, StagingSide::Peer][rng.below(2) as usize],
                chunk_bytes: 256 << rng.below(4),
                blocks_per_role: 1 + rng.below(8) as u32,
                consumer_blocks_per_role: Some(1 + rng.below(8) as u32),
                max_blocks: [None, Some(2), Some(5), Some(12)][rng.below(4) as usize],
                slots: 1 + rng.below(3) as u32,
                min_chunk_bytes: 0,
                ..Tuning::default()
            };
            let forms: Vec<bool> = (0..world).map(|_| rng.below(2) == 0).collect();
            let plans: Result<Vec<(Plan, PlanConfig)>, _> =
                (0..world).map(|r| plan_and_config(&spec, r, forms[r as usize], &t, &limits)).collect();
            let Ok(plans) = plans else { continue };
            let blocks = |c: &PlanConfig| (c.regime, c.blocks_per_role, c.consumer_blocks(), c.chunk_bytes, c.lanes);
            for (p, c) in &plans {
                assert_eq!(blocks(c), blocks(&plans[0].1), "{spec:?} {t:?} forms {forms:?}: rank {}", p.rank);
            }
            let plans: Vec<Plan> = plans.into_iter().map(|(p, _)| p).collect();
            let report = purlin_snac::verify::verify_call(&plans, &opts);
            assert!(report.ok(), "{spec:?} {t:?} forms {forms:?}: {:?}", report.result);
            checked += 1;
        }
    }

    /// The chunk slots a stage writes into: the modulus of its staging offset.
    fn stage_slots(plan: &Plan) -> Option<u64> {
        plan.blocks.iter().flat_map(|b| &b.steps).find_map(|step| match step {
            purlin_snac::Step::ChunkLoop { body, .. } => body.iter().find_map(|s| match s {
                purlin_snac::Step::Stage { dst, .. } => Some(dst.offset.chunk_modulus),
                _ => None,
            }),
            _ => None,
        })
    }

    /// Block counts whose granule does not divide the table's chunk (6 + 10, 7 + 9) round the
    /// chunk down, so it keeps the default's slots and shared stages. Rounded up, 16 MiB +
    /// 224 B chunks left one slot per sense half of 64 MiB staging (round 62).
    #[test]
    fn odd_block_splits_keep_the_chunk_slots() {
        let limits = PlanLimits { staging_bytes: 64 << 20, window_bytes: 4 << 20, ..limits() };
        let gather = CollectiveSpec::all_gather(2, DataType::F32, 32 << 20);
        let reduce = CollectiveSpec::all_reduce(2, DataType::F32, ReduceOp::Sum, 64 << 20);
        for spec in [gather, reduce] {
            let default = plan_for(&spec, 0, false, &Tuning::default(), &limits).unwrap();
            let capped = Tuning { max_blocks: Some(16), ..Tuning::default() };
            let cfg = plan_config(&spec, false, &capped, &limits);
            assert_ne!(Tuning::default().chunk_bytes % cfg.chunk_granule(), 0, "the case this test is about");
            assert!(
                cfg.chunk_bytes <= Tuning::default().chunk_bytes,
                "{:?}: chunk {}",
                spec.collective,
                cfg.chunk_bytes
            );
            assert!(cfg.share_piece > 0, "{:?}: the stages stay shared", spec.collective);
            for blocks in [cfg.blocks_per_role, cfg.consumer_blocks()] {
                assert_eq!(
                    cfg.chunk_bytes % (128 * u64::from(blocks)),
                    0,
                    "{:?}: slices on cache lines",
                    spec.collective
                );
            }
            let plan = plan_for(&spec, 0, false, &capped, &limits).unwrap();
            assert_eq!(stage_slots(&plan), stage_slots(&default), "{:?}", spec.collective);
            assert_eq!(stage_slots(&plan), Some(2), "{:?}", spec.collective);
        }
    }

    /// A one-copy call cuts each transfer into one chunk per block slice (no staged 4 MiB
    /// floor), up to `chunk_bytes`: every writer block gets bytes.
    #[test]
    fn one_copy_chunks_give_every_block_a_slice() {
        let limits = PlanLimits { peer_outputs: true, peer_inputs: true, ..limits() };
        let forced = Tuning { regime: Some(Regime::Throughput), ..Tuning::default() };
        for (spec, per_transfer) in [
            (CollectiveSpec::all_gather(2, DataType::F32, 128 << 10), 512u64 << 10),
            (CollectiveSpec::all_reduce(2, DataType::F32, ReduceOp::Sum, 1 << 20), 2 << 20),
            (CollectiveSpec::all_gather(2, DataType::F32, 64 << 20), 256 << 20),
        ] {
            let cfg = plan_config(&spec, false, &forced, &limits);
            assert!(purlin_snac::derive::one_copy(&spec, &cfg), "{spec:?}");
            let slice = cfg.chunk_bytes / u64::from(cfg.blocks_per_role);
            assert!(cfg.chunk_bytes <= Tuning::default().chunk_bytes, "{spec:?}: chunk {}", cfg.chunk_bytes);
            let last_block_starts_at = (u64::from(cfg.blocks_per_role) - 1) * slice;
            assert!(last_block_starts_at < per_transfer, "{spec:?}: the last block gets no bytes ({cfg:?})");
        }
    }
}
