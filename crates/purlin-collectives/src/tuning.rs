//! How a call is planned: regime, staging side, chunk size, blocks per role and slots, per
//! size band (DESIGN.md §5 "Tuning"). Every knob can be overridden from the environment
//! (`PURLIN_REGIME=latency|throughput`, `PURLIN_STAGING_SIDE=own|peer`, `PURLIN_CHUNK_BYTES`,
//! `PURLIN_BLOCKS_PER_ROLE`, `PURLIN_SLOTS`, `PURLIN_LATENCY_MAX_BYTES`), so the table can be
//! measured before it is trusted.
//!
//! The defaults are first choices, not yet fitted to measurements (PERFORMANCE.md records
//! what was measured): push staging, because remote stores beat remote loads under two-way
//! load on 2×H200 (DEVICE.md); 8 blocks per role with 64 KiB per block per chunk, about the
//! bandwidth-delay product of an H200 NVLink (~1 MiB in flight per GPU); packets up to
//! 64 KiB per rank.

use purlin_snac::{
    AllReduceAlgo, CollectiveSpec, DeriveError, PacketFormat, Plan, PlanConfig, Regime, StagingSide, derive_rank,
};

use crate::error::Error;

/// The tuning knobs that do not come from the communicator's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// `None`: by size (latency up to `latency_max_bytes`).
    pub regime: Option<Regime>,
    /// Largest per-rank payload planned in the latency regime.
    pub latency_max_bytes: u64,
    /// Throughput staging side.
    pub staging_side: StagingSide,
    /// Throughput chunk bytes (a multiple of 16 × blocks_per_role).
    pub chunk_bytes: u64,
    /// Blocks per role.
    pub blocks_per_role: u32,
    /// Staging slots per stream.
    pub slots: u32,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            regime: None,
            latency_max_bytes: 64 << 10,
            staging_side: StagingSide::Peer,
            chunk_bytes: 512 << 10,
            blocks_per_role: 8,
            slots: 4,
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
        t.slots = env("PURLIN_SLOTS")?.unwrap_or(t.slots);
        t.latency_max_bytes = env("PURLIN_LATENCY_MAX_BYTES")?.unwrap_or(t.latency_max_bytes);
        Ok(t)
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
}

/// The largest payload a rank sends or receives in a call of `spec` (the size band).
pub fn band_bytes(spec: &CollectiveSpec) -> u64 {
    (0..spec.world).map(|r| spec.input_bytes(r).max(spec.output_bytes(r))).max().unwrap_or(0)
}

/// The plan configuration for one call.
pub fn plan_config(spec: &CollectiveSpec, in_place: bool, tuning: &Tuning, limits: &PlanLimits) -> PlanConfig {
    let regime = tuning.regime.unwrap_or(if band_bytes(spec) <= tuning.latency_max_bytes {
        Regime::Latency
    } else {
        Regime::Throughput
    });
    let blocks = tuning.blocks_per_role.clamp(1, (limits.max_coresident_blocks / 4).max(1));
    let granule = 16 * u64::from(blocks);
    let chunk_bytes = tuning.chunk_bytes.max(granule).div_ceil(granule) * granule;
    PlanConfig {
        regime,
        staging_side: tuning.staging_side,
        allreduce: AllReduceAlgo::Auto,
        chunk_bytes,
        blocks_per_role: blocks,
        slots: tuning.slots,
        staging_bytes: limits.staging_bytes,
        window_bytes: limits.window_bytes,
        max_coresident_blocks: limits.max_coresident_blocks,
        packet: limits.packet,
        in_place,
    }
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
    let cfg = plan_config(spec, in_place, tuning, limits);
    match derive_rank(spec, &cfg, rank) {
        Err(DeriveError::WindowTooSmall { .. }) if tuning.regime.is_none() && cfg.regime == Regime::Latency => {
            let cfg = PlanConfig { regime: Regime::Throughput, ..cfg };
            derive_rank(spec, &cfg, rank).map_err(Error::from)
        }
        r => r.map_err(Error::from),
    }
}
