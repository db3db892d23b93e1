//! Run-time verification: a call's plans are checked by purlin-snac's verifier before they
//! run, once per plan key per process. `CpuComm` always verifies; `Comm` (GPUs) does where
//! [`crate::CommConfig::verify`] asks for it (`PURLIN_VERIFY=1`), because a key's first
//! verification grows with the world and the grid: with the GPU table, as `Comm` fits it, at
//! most 11 ms at world 2, 44 ms at world 4 and 0.2 s at world 8 (AllReduce, AllGather,
//! ReduceScatter, AllToAll, 8 B to 1 GiB; release build, `examples/verify_cost`, 2026-12-06),
//! and V forms make a key per count vector, where CI's property tests and scenario sets cover
//! the table instead.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use purlin_snac::verify::{self, Options};
use purlin_snac::{CollectiveSpec, DataType, DeriveError, Plan, PlanConfig, PlanError, derive};

use crate::error::Error;

/// A verified plan key: the verdict on the plan set of a chunk-capped twin, which covers every
/// call whose twin it is. Shared by every call of the key, so it holds nothing of the call that
/// first asked for it (which of them is the twin itself is the caller's to say: [`Verdict::covers`]).
#[derive(Debug)]
pub struct Verdict {
    /// The verifier's coverage (`exhaustive, N states` or `sampled N schedules, seed S`).
    pub coverage: String,
    /// The verified plan set (of the twin), specs canonicalized by [`canonical_spec`].
    pub plans: Vec<Plan>,
    /// The chunk bytes and slots the twin was cut with (part of the key's configuration).
    twin_cut: (u64, u64),
}

impl Verdict {
    /// Checks that `plan`, derived for a call with the verified configuration, is covered by
    /// this verdict: its spec's twin is the verified one, and where the call is its own twin
    /// (small calls), the plan is the verified plan of its rank. (A larger call's plans differ
    /// from the twin's in their lengths, so there the twin's verdict covers the call by
    /// [`verify::twin_spec`]'s argument instead.) Decided per call: a verdict first asked for
    /// by a larger call of the same twin once refused the twin itself, and the reverse.
    pub fn covers(&self, plan: &Plan) -> Result<(), Error> {
        let spec = canonical_spec(&plan.spec);
        let twin = canonical_spec(&verify::twin_spec(&plan.spec, self.twin_cut.0, self.twin_cut.1));
        let verified = self.plans.get(plan.rank as usize);
        if verified.is_none_or(|v| v.spec != twin) {
            return Err(internal(plan.rank, "the plan's call is not the one verified".into()));
        }
        if spec != twin {
            return Ok(());
        }
        let mut p = plan.clone();
        p.spec = spec;
        if verified == Some(&p) {
            Ok(())
        } else {
            Err(internal(plan.rank, "the plan to run differs from the verified one".into()))
        }
    }

    /// Whether `spec` is its own twin here (the verified plans are its plans).
    pub fn twin_is_spec(&self, spec: &CollectiveSpec) -> bool {
        self.plans.first().is_some_and(|p| p.spec == canonical_spec(spec))
    }
}

/// The verifier's budget per plan key unless configured: exhaustive up to 2 000 states,
/// else 32 randomized schedules, which keeps a new key's first call of a host-sized grid well
/// under a second in release (exploring states is what costs).
pub fn default_budget() -> Options {
    Options { max_states: 2_000, schedules: 32, ..Options::default() }
}

/// `budget` with `PURLIN_VERIFY_STATES` and `PURLIN_VERIFY_SCHEDULES` applied where set.
pub fn budget_from_env(mut budget: Options) -> Result<Options, Error> {
    for (var, field) in
        [("PURLIN_VERIFY_STATES", &mut budget.max_states), ("PURLIN_VERIFY_SCHEDULES", &mut budget.schedules)]
    {
        if let Ok(t) = std::env::var(var) {
            *field = t.trim().parse().map_err(|e| Error::Env { var, problem: format!("{t:?}: {e}") })?;
        }
    }
    if budget.schedules == 0 {
        return Err(Error::Env { var: "PURLIN_VERIFY_SCHEDULES", problem: "must be positive".into() });
    }
    Ok(budget)
}

pub(crate) fn internal(rank: u32, what: String) -> Error {
    Error::Plan(DeriveError::Internal(PlanError::Other { rank, what }))
}

type Key = (CollectiveSpec, PlanConfig, (u64, u64, u64, Option<u32>, u8));
type Cell = Arc<OnceLock<Result<Arc<Verdict>, String>>>;

fn cache() -> &'static Mutex<HashMap<Key, Cell>> {
    static CACHE: OnceLock<Mutex<HashMap<Key, Cell>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The canonical spec of a verification key: plans whose specs differ only in the element
/// type's *name* (same size) or in the reduce operator have the same steps, regions, flags
/// and advance — the verifier models bytes and combination order, not arithmetic — so one
/// verdict covers them (a test checks that derivation agrees).
pub fn canonical_spec(spec: &CollectiveSpec) -> CollectiveSpec {
    let mut s = spec.clone();
    s.dtype = match spec.dtype.size() {
        1 => DataType::U8,
        2 => DataType::F16,
        4 => DataType::F32,
        _ => DataType::F64,
    };
    s.op = spec.op.map(|_| purlin_snac::ReduceOp::Sum);
    s
}

/// Verifies the plan set of `(spec, cfg)` with the verifier's `opts`, once per process per
/// key: the chunk-capped twin of the spec ([`verify::twin_spec`], which covers chunk-uniform
/// plans of any length), canonicalized by [`canonical_spec`], and the plan configuration.
/// Concurrent callers of one key wait for the first one's verdict. A rejection is an
/// [`Error::Plan`] naming the violated property; such a plan never runs.
pub fn verified(spec: &CollectiveSpec, cfg: &PlanConfig, opts: &Options) -> Result<Arc<Verdict>, Error> {
    let twin = verify::twin_spec(spec, cfg.chunk_bytes, cfg.slots as u64);
    let mode = opts.mode as u8;
    let key: Key =
        (canonical_spec(&twin), *cfg, (opts.max_states, opts.schedules, opts.seed, opts.max_coresident_blocks, mode));
    let cell = cache().lock().unwrap_or_else(|e| e.into_inner()).entry(key).or_default().clone();
    let result = cell.get_or_init(|| {
        let mut plans = derive(&twin, cfg).map_err(|e| format!("deriving the verification twin: {e}"))?;
        let report = verify::verify_call(&plans, opts);
        match report.result {
            Ok(()) => {
                for p in &mut plans {
                    p.spec = canonical_spec(&p.spec);
                }
                let twin_cut = (cfg.chunk_bytes, cfg.slots as u64);
                Ok(Arc::new(Verdict { coverage: report.coverage.to_string(), plans, twin_cut }))
            }
            Err(v) => Err(format!("the verifier rejected the plans ({}): {v}", report.coverage)),
        }
    });
    result.clone().map_err(|e| internal(0, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::tuning::{PlanLimits, Tuning, plan_fitting};
    use purlin_snac::{PacketFormat, ReduceOp};

    /// What `Comm` verifies under `PURLIN_VERIFY=1`: world 2 with the GPU table, the
    /// workspace's default sizes and 264 co-resident blocks, every collective from packets to
    /// 16 MiB chunks,
    /// staged and one-copy; every plan set passes and each rank's plan is the verified one.
    #[test]
    fn the_gpu_table_at_world_2_verifies() {
        let words = |p: &Plan| purlin_snac::params::encode(p).len() <= crate::gpu::kernels::EXEC_PARAM_WORDS;
        let mut checked = 0;
        for (peer_outputs, peer_inputs) in [(false, false), (true, false), (true, true)] {
            let workspace = crate::workspace::WorkspaceConfig::default();
            let limits = PlanLimits::of_workspace(&workspace, 264, PacketFormat::B16, peer_outputs, peer_inputs);
            let budget = Options { max_coresident_blocks: Some(limits.max_coresident_blocks), ..default_budget() };
            for bytes in [64u64, 64 << 10, 1 << 20, 64 << 20] {
                let n = bytes / 2;
                for spec in [
                    CollectiveSpec::all_reduce(2, DataType::Bf16, ReduceOp::Sum, n),
                    CollectiveSpec::all_gather(2, DataType::Bf16, n / 2),
                    CollectiveSpec::reduce_scatter(2, DataType::Bf16, ReduceOp::Avg, n / 2),
                    CollectiveSpec::all_to_all(2, DataType::Bf16, n),
                ] {
                    for rank in 0..2 {
                        let (plan, cfg) = plan_fitting(&spec, rank, false, &Tuning::default(), &limits, words)
                            .unwrap_or_else(|e| panic!("{spec:?}: {e}"));
                        let verdict = verified(&spec, &cfg, &budget).unwrap_or_else(|e| panic!("{spec:?}: {e}"));
                        verdict.covers(&plan).unwrap_or_else(|e| panic!("{spec:?} rank {rank}: {e}"));
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 3 * 4 * 4 * 2);
    }

    /// What a fused copy collective runs (`Comm::prepare`): the GPU table's AllGather and
    /// AllToAll at world 2 with shard-landed words, staged and one-copy, packets to 16 MiB
    /// chunks; every plan set passes (the landed claims included) and each rank's plan is the
    /// verified one.
    #[test]
    fn the_gpu_tables_fused_copy_collectives_verify_with_their_landed_words() {
        let words = |p: &Plan| purlin_snac::params::encode(p).len() <= crate::gpu::kernels::EXEC_PARAM_WORDS;
        let mut checked = 0;
        for peer_outputs in [false, true] {
            let workspace = crate::workspace::WorkspaceConfig::default();
            let limits = PlanLimits {
                landed: true,
                ..PlanLimits::of_workspace(&workspace, 264, PacketFormat::B16, peer_outputs, false)
            };
            let budget = Options { max_coresident_blocks: Some(limits.max_coresident_blocks), ..default_budget() };
            for bytes in [64u64, 64 << 10, 1 << 20, 64 << 20] {
                let n = bytes / 2;
                for spec in [
                    CollectiveSpec::all_gather(2, DataType::Bf16, n / 2),
                    CollectiveSpec::all_to_all(2, DataType::Bf16, n),
                ] {
                    for rank in 0..2 {
                        let (plan, cfg) = plan_fitting(&spec, rank, false, &Tuning::default(), &limits, words)
                            .unwrap_or_else(|e| panic!("{spec:?}: {e}"));
                        assert!(plan.landed.is_some(), "{spec:?}: no landed words");
                        let verdict = verified(&spec, &cfg, &budget).unwrap_or_else(|e| panic!("{spec:?}: {e}"));
                        verdict.covers(&plan).unwrap_or_else(|e| panic!("{spec:?} rank {rank}: {e}"));
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 2 * 4 * 2 * 2);
    }

    /// A plan that is not the verified one is refused, where the verified spec is the call's.
    #[test]
    fn a_plan_other_than_the_verified_one_is_refused() {
        let spec = CollectiveSpec::all_gather(2, DataType::F32, 64);
        let limits = PlanLimits {
            staging_bytes: 1 << 20,
            window_bytes: 1 << 20,
            max_coresident_blocks: 64,
            packet: PacketFormat::B16,
            flag_words: 4096,
            peer_outputs: false,
            peer_inputs: false,
            copy_engine: false,
            landed: false,
        };
        let (plan, cfg) =
            crate::call::tuning::plan_and_config(&spec, 0, false, &Tuning::default(), &limits).expect("plan");
        let verdict = verified(&spec, &cfg, &default_budget()).expect("verified");
        assert!(verdict.twin_is_spec(&spec));
        verdict.covers(&plan).expect("the derived plan");
        let mut other = plan.clone();
        other.rank = 1;
        assert!(matches!(verdict.covers(&other), Err(Error::Plan(_))), "rank 0's plan passed as rank 1's");
    }
}
