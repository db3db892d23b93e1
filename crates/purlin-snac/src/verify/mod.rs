//! The SNAC verifier: an explicit-state model of plans (docs/design.md §3.5).
//!
//! It checks any plan, however made: it never uses the plan derivation; an invariant test
//! reads this directory's sources to keep it so.
//!
//! # The model
//!
//! Every block of every rank of every call is a process stepping through its program. Memory
//! (input, output, staging, window of every rank) is a set of interval maps whose segments
//! carry a symbolic content ([`mem::Term`]: which input bytes of which rank and call, or a
//! reduction of such, in combination order), the call that wrote it, the last writer and the
//! readers since. A shared stage (`plan::Share`) is modelled as every writer of the round
//! writing all of the lane's bytes: the writers of one round are co-writers, not races; a read
//! must be ordered after each of them, and reading before all of them have staged is a
//! readiness violation (the ticket decides which writer copies which byte, so only the round as
//! a whole is known to be complete). Synchronization is modelled with vector clocks: a flag
//! store (`Signal`, the notifications of the last `Arrive`) is a release, a satisfied `Wait`
//! acquires from the *first* store in the flag's modification order whose value satisfies it
//! (the weakest edge a real execution can get), an `Arrive` is an acq_rel read-modify-write, a
//! packet read (and a handshake wait) synchronizes with the put it reads from, and a kernel
//! synchronizes with the previous kernel of its rank (stream order). Data steps are atomic
//! transitions whose accesses are checked against the clocks: a read not ordered after the last
//! write, a write not ordered after every read since the previous write, or two unordered
//! writes, are races whatever order the exploration happened to pick — so data steps (and
//! satisfied waits, which are stable) are taken eagerly and only the order of the remaining
//! synchronization steps is explored. That is the partial-order reduction; states are also
//! cached by fingerprint (128 bits).
//!
//! Which synchronization steps are taken eagerly as well (persistent sets), why that misses no
//! violation, and why symmetry reduction is not used: `reduction.rs`.
//!
//! Limits, stated: packet reads synchronize with the put they read (the data travels in the
//! packet; plans must not rely on packets to publish *other* data, which the executor's
//! relaxed packet stores would not); when the exhaustive budget is exceeded, [`Mode::Auto`]
//! falls back to sampling and says so.
//!
//! # Properties
//!
//! [`Property`] lists them. Readiness: a read of staging or a window sees data written in this
//! call, ordered before the read. Reuse: no write overtakes an unfinished read. Uniform
//! advance: every epoch word of every rank holds the same value after each call. Epoch
//! advance: a call whose regions depend on the sense advances by an odd amount at least the
//! largest epoch offset it uses. All-pairs: each rank's call ends after every peer's call
//! began. Co-residency: grids within the bound. Deadlock: every process finishes.
//! Semantics: each output byte holds exactly its collective's contributions, in rank order in
//! deterministic mode.
//!
//! # Chunk cutoff
//!
//! [`verify`] explores the *twin* of the plans: each stretch of a chunk loop between two
//! step ends (trips, guard ends, length ends) is cut to at most `slots + 2` chunks, and every
//! step keeps its partial last chunk and its distance to the other steps' ends. The
//! construction and the argument why it covers chunk-uniform plans are in [`twin`]; static
//! checks see the original plans, and [`Report::cutoff`] says when the twin was used.
//! [`twin_spec`] does the same on a spec, for callers that want to derive smaller plans in
//! the first place.
//!
//! # Files
//!
//! - `mod.rs`: the model (above), the public API ([`verify`], [`Options`], [`Report`],
//!   [`Corpus`]) and the static checks made before any exploration.
//! - `state.rs`: the model's tables (`Model`) and its states (`State`: positions,
//!   synchronization words, memory, vector clocks), fingerprinted for the state cache.
//! - `semantics.rs`: the transitions: launches, each step's effect with the race, readiness
//!   and reuse checks, exits, and the end-of-call checks (advance, all-pairs, output).
//! - `reduction.rs`: the partial-order reduction: synchronization footprints, the
//!   persistent-set check (`Model::independent`) and the argument for it.
//! - `explore.rs`: the eager closure, the exhaustive search, deadlock detection and sampled
//!   schedules.
//! - [`mem`]: interval maps of symbolic memory contents with access tags.
//! - [`mutate`]: mutation operators over plans, to prove the verifier can fail.
//! - [`twin`]: the chunk cutoff's twin plans.

pub mod engine;
mod explore;
pub mod mem;
pub mod mutate;
mod reduction;
pub mod reference;
mod semantics;
mod state;
pub mod twin;

use std::collections::HashSet;
use std::fmt;
use std::time::{Duration, Instant};

use explore::{Explorer, Stop};
use state::Model;

use crate::plan::{Advance, EpochVal, Plan, Region, Step, check_set, fmt_path};
use crate::spec::{Collective, CollectiveSpec, Counts};

/// The properties the verifier checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Property {
    /// The plans are ill-formed (see [`crate::plan::check_set`]).
    Structure,
    /// A grid exceeds the co-residency bound.
    CoResidency,
    /// An advance is even on a call that depends on the sense, or smaller than the epoch
    /// offsets the call uses.
    EpochAdvance,
    /// Ranks or blocks end a call at different epochs.
    UniformAdvance,
    /// A read of staging or packets sees data not written in this call, or not ordered after
    /// its write.
    Readiness,
    /// A write overtakes a read of the previous contents.
    Reuse,
    /// Two writes to the same bytes are unordered.
    Race,
    /// A rank ends a call without depending on a peer's entry into it.
    AllPairs,
    /// Some process can never finish.
    Deadlock,
    /// An output byte does not hold exactly its contributions.
    Semantics,
    /// An out-of-place call writes its input (the API takes it by `&`).
    ReadOnlyInput,
    /// A plan declares input or output sizes other than its spec's.
    Resources,
}

impl fmt::Display for Property {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Property::Structure => "structure",
            Property::CoResidency => "co-residency",
            Property::EpochAdvance => "epoch-advance",
            Property::UniformAdvance => "uniform-advance",
            Property::Readiness => "readiness",
            Property::Reuse => "reuse",
            Property::Race => "race",
            Property::AllPairs => "all-pairs",
            Property::Deadlock => "deadlock",
            Property::Semantics => "semantics",
            Property::ReadOnlyInput => "read-only-input",
            Property::Resources => "resources",
        };
        f.write_str(s)
    }
}

/// The first violated property, with a readable trace of the steps that led to it.
#[derive(Debug, Clone)]
pub struct Violation {
    pub property: Property,
    pub message: String,
    pub trace: Vec<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "violated {}: {}", self.property, self.message)?;
        let skip = self.trace.len().saturating_sub(60);
        if skip > 0 {
            writeln!(f, "  ... {skip} earlier steps")?;
        }
        for t in &self.trace[skip..] {
            writeln!(f, "  {t}")?;
        }
        Ok(())
    }
}

/// How much of the behaviour was covered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coverage {
    /// Every interleaving of synchronization steps (up to the reductions), `states` states.
    Exhaustive { states: u64 },
    /// `schedules` randomized priority schedules from `seed`.
    Sampled { schedules: u64, seed: u64 },
    /// Rejected before exploring (static checks).
    Static,
}

impl fmt::Display for Coverage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Coverage::Exhaustive { states } => write!(f, "exhaustive, {states} states"),
            Coverage::Sampled { schedules, seed } => write!(f, "sampled {schedules} schedules, seed {seed}"),
            Coverage::Static => write!(f, "static checks"),
        }
    }
}

/// Exploration strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Exhaustive until a branch would be explored past `max_states` states, then sampled (a
    /// path already explored is checked to its end, so a run with one path stays exhaustive).
    #[default]
    Auto,
    Exhaustive,
    Sampled,
}

/// Which partial-order reduction the exhaustive search uses for synchronization steps (data
/// steps and satisfied waits are always taken eagerly; see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reduction {
    /// A step is taken without branching when it commutes with everything the other processes
    /// can do before it, bounded by a reach analysis of their blocking waits (the default).
    #[default]
    Reach,
    /// ... when it commutes with everything the other processes may still do at all (their
    /// remaining static footprint). The earlier, weaker reduction; kept to measure against.
    Footprint,
    /// Every order of enabled synchronization steps is explored (the oracle for the others).
    Off,
}

/// Verifier options.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// The runtime's co-residency bound; plans above it (or above their own bound) are rejected.
    pub max_coresident_blocks: Option<u32>,
    /// The state budget of exhaustive exploration: no new branch is explored past it.
    pub max_states: u64,
    pub schedules: u64,
    pub seed: u64,
    pub mode: Mode,
    pub reduction: Reduction,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_coresident_blocks: None,
            max_states: 200_000,
            schedules: 200,
            seed: 1,
            mode: Mode::Auto,
            reduction: Reduction::Reach,
        }
    }
}

/// The verdict.
#[derive(Debug, Clone)]
pub struct Report {
    pub coverage: Coverage,
    pub result: Result<(), Violation>,
    pub elapsed: Duration,
    /// The chunk cutoff `T = slots + 2` when some loop was longer and the twin was explored
    /// (see [`twin`]).
    pub cutoff: Option<u64>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.result.is_ok()
    }
    /// The violated property, if any.
    pub fn property(&self) -> Option<Property> {
        self.result.as_ref().err().map(|v| v.property)
    }
}

/// A serialized scenario: back-to-back calls and what the verifier must say about them.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Corpus {
    pub description: String,
    /// `None`: must verify; `Some(property)`: must be rejected with that property (its
    /// [`Property`] display name).
    pub expect: Option<String>,
    pub calls: Vec<Vec<Plan>>,
}

impl Corpus {
    /// Reads a scenario from bincode (a `Corpus`, a `Vec<Vec<Plan>>` or a `Vec<Plan>`).
    pub fn from_bytes(data: &[u8]) -> Result<Corpus, String> {
        let cfg = bincode::config::standard();
        if let Ok((c, n)) = bincode::serde::decode_from_slice::<Corpus, _>(data, cfg) {
            if n == data.len() {
                return Ok(c);
            }
        }
        if let Ok((calls, n)) = bincode::serde::decode_from_slice::<Vec<Vec<Plan>>, _>(data, cfg) {
            if n == data.len() {
                return Ok(Corpus { description: "plans".into(), expect: None, calls });
            }
        }
        match crate::plan::decode_plans(data) {
            Ok(p) => Ok(Corpus { description: "one call".into(), expect: None, calls: vec![p] }),
            Err(e) => Err(format!("not a serialized corpus, call list or plan set: {e}")),
        }
    }

    /// Serializes with bincode.
    pub fn to_bytes(&self) -> Vec<u8> {
        bincode::serde::encode_to_vec(self, bincode::config::standard()).unwrap_or_default()
    }
}

/// The plans as the model runs them: copy-engine programs and shard-landed claims as blocks.
pub(crate) fn lowered(calls: &[Vec<Plan>]) -> Vec<Vec<Plan>> {
    crate::plan::landed::lower_calls(&crate::plan::engine::lower_calls(calls))
}

/// Verifies one call (a plan per rank).
pub fn verify_call(plans: &[Plan], opts: &Options) -> Report {
    verify(&[plans.to_vec()], opts)
}

/// Verifies back-to-back calls on the same communicator (each a plan per rank), in order.
pub fn verify(calls: &[Vec<Plan>], opts: &Options) -> Report {
    let t0 = Instant::now();
    if let Err(v) = static_checks(calls, opts) {
        return Report { coverage: Coverage::Static, result: Err(v), elapsed: t0.elapsed(), cutoff: None };
    }
    // The chunk cutoff, here rather than in callers: static checks above saw the originals.
    // Copy-engine programs become a block each (`plan::engine::lower`): the agent of the
    // model, after its stream's entry kernel, its copies data accesses, its notifies releases.
    // Shard-landed claims become a reader block per shard (`plan::landed::lower`).
    let tw = twin::twin(&lowered(calls), &senses(calls));
    let cutoff = tw.cutoff;
    let opts = *opts;
    let originals = calls.to_vec();
    // Deep interleavings recurse deeply: explore on a thread with a large stack.
    let h = std::thread::Builder::new().stack_size(256 << 20).spawn(move || {
        let mut m = Model::new(&tw.calls);
        m.skip = tw.skip;
        // An agreed advance must cover the epoch offsets of the whole plans, not the twin's.
        m.maxoff = originals.iter().map(|ps| ps.iter().map(max_epoch_offset).collect()).collect();
        let exhaustive = || {
            let mut x = Explorer {
                m: &m,
                seen: HashSet::new(),
                states: 0,
                max: opts.max_states,
                trace: vec![],
                red: opts.reduction,
            };
            let r = x.dfs(m.init());
            (r, x.states)
        };
        match opts.mode {
            Mode::Exhaustive | Mode::Auto => {
                let (r, states) = exhaustive();
                match r {
                    Err(Stop::Violation(v)) => (Coverage::Exhaustive { states }, Err(v)),
                    Ok(()) => (Coverage::Exhaustive { states }, Ok(())),
                    Err(Stop::Budget) if opts.mode == Mode::Auto => {
                        (Coverage::Sampled { schedules: opts.schedules, seed: opts.seed }, m.sample(&opts))
                    }
                    Err(Stop::Budget) => (
                        Coverage::Exhaustive { states },
                        Err(Violation {
                            property: Property::Structure,
                            message: format!("state budget of {} exhausted", opts.max_states),
                            trace: vec![],
                        }),
                    ),
                }
            }
            Mode::Sampled => (Coverage::Sampled { schedules: opts.schedules, seed: opts.seed }, m.sample(&opts)),
        }
    });
    let (coverage, result) = match h.map(|h| h.join()) {
        Ok(Ok(x)) => x,
        _ => (
            Coverage::Static,
            Err(Violation { property: Property::Structure, message: "verifier thread failed".into(), trace: vec![] }),
        ),
    };
    Report { coverage, result, elapsed: t0.elapsed(), cutoff }
}

/// The sense of each call: epochs start at 0 and each call advances them uniformly (or a
/// uniform-advance violation is reported when the call ends, before the next one starts).
/// Agreed advances are odd.
fn senses(calls: &[Vec<Plan>]) -> Vec<u64> {
    let mut sense = vec![0u64; calls.len()];
    for k in 1..calls.len() {
        let a = match calls[k - 1].first().map(|p| (p.advance, p.blocks.is_empty())) {
            Some((Advance::Fixed(a), _)) => a,
            Some((Advance::AgreedMaxChunks { .. }, false)) => 1,
            _ => 0,
        };
        sense[k] = sense[k - 1] ^ (a & 1);
    }
    sense
}

fn viol(property: Property, message: String) -> Violation {
    Violation { property, message, trace: vec![] }
}

/// Whether a plan's regions depend on the sense.
pub fn uses_sense(p: &Plan) -> bool {
    let mut s = false;
    p.for_each_step(|_, st, _| {
        let r = |x: &Region| x.offset.sense_stride != 0;
        s |= match st {
            Step::Stage { dst, src, .. } | Step::Gather { dst, src, .. } | Step::PutPackets { dst, src, .. } => {
                r(dst) || r(src)
            }
            Step::Reduce { dst, srcs, .. } => r(dst) || srcs.iter().any(r),
            Step::HandshakeSend { dst: o, .. } | Step::HandshakeWait { src: o, .. } => o.sense_stride != 0,
            _ => false,
        };
    });
    s
}

/// The largest `c * chunk_mul + add` of any epoch value the plan uses.
pub fn max_epoch_offset(p: &Plan) -> i128 {
    let mut m: i128 = 0;
    p.for_each_step(|_, st, (lo, hi)| {
        if lo >= hi {
            return;
        }
        let mut see = |v: &EpochVal| m = m.max((hi - 1) as i128 * v.chunk_mul as i128 + v.add as i128);
        match st {
            Step::Gather { expect: Some(v), .. } | Step::Reduce { expect: Some(v), .. } => see(v),
            Step::PutPackets { flag, .. } => see(flag),
            Step::Signal { notify, .. } => see(&notify.value),
            Step::Wait { value, .. } => see(value),
            Step::Arrive { then, .. } => then.iter().for_each(|n| see(&n.value)),
            Step::HandshakeSend { flag, .. } => see(flag),
            Step::HandshakeWait { expect, .. } => see(expect),
            _ => {}
        }
    });
    m
}

fn static_checks(calls: &[Vec<Plan>], opts: &Options) -> Result<(), Violation> {
    for (k, plans) in calls.iter().enumerate() {
        for p in plans {
            let bound = opts.max_coresident_blocks.unwrap_or(u32::MAX).min(p.max_coresident_blocks);
            if p.blocks.len() > bound as usize {
                return Err(viol(
                    Property::CoResidency,
                    format!(
                        "call {k} rank {}: grid of {} blocks above the co-residency bound {bound}",
                        p.rank,
                        p.blocks.len()
                    ),
                ));
            }
        }
        if calls.first().is_some_and(|c| c.len() != plans.len()) {
            return Err(viol(Property::Structure, format!("call {k} has a different world")));
        }
        check_set(plans).map_err(|e| viol(Property::Structure, format!("call {k}: {e}")))?;
        for p in plans {
            // The buffers a call gets are the spec's: a smaller declaration leaves output
            // bytes no check sees, a larger one lets steps run past the user's buffers.
            let (r, res) = (p.rank, &p.resources);
            if (res.input_bytes, res.output_bytes) != (p.spec.input_bytes(r), p.spec.output_bytes(r)) {
                return Err(viol(
                    Property::Resources,
                    format!(
                        "call {k} rank {r}: declares {} input and {} output bytes, its spec {} and {}",
                        res.input_bytes,
                        res.output_bytes,
                        p.spec.input_bytes(r),
                        p.spec.output_bytes(r)
                    ),
                ));
            }
        }
        for p in plans {
            if p.blocks.is_empty() {
                continue;
            }
            if let Advance::Fixed(a) = p.advance {
                if uses_sense(p) && a % 2 == 0 {
                    return Err(viol(
                        Property::EpochAdvance,
                        format!("call {k} rank {}: even advance {a} on a call that selects staging by sense", p.rank),
                    ));
                }
                let m = max_epoch_offset(p);
                if (a as i128) < m {
                    return Err(viol(
                        Property::EpochAdvance,
                        format!("call {k} rank {}: advance {a} below the largest epoch offset E+{m} it uses", p.rank),
                    ));
                }
            }
        }
        let kinds: HashSet<std::mem::Discriminant<Advance>> =
            plans.iter().filter(|p| !p.blocks.is_empty()).map(|p| std::mem::discriminant(&p.advance)).collect();
        let fixed: HashSet<u64> = plans
            .iter()
            .filter_map(|p| match p.advance {
                Advance::Fixed(a) => Some(a),
                _ => None,
            })
            .collect();
        if kinds.len() > 1 || fixed.len() > 1 {
            return Err(viol(Property::UniformAdvance, format!("call {k}: ranks disagree on the advance")));
        }
    }
    Ok(())
}
/// The twin of a spec for the chunk cutoff: every partition capped at `(slots + 2)` chunks of
/// `chunk_bytes` (see the module docs for why that covers chunk-uniform plans).
pub fn twin_spec(spec: &CollectiveSpec, chunk_bytes: u64, slots: u64) -> CollectiveSpec {
    let es = spec.dtype.size();
    let cap_bytes = (slots + 2).saturating_mul(chunk_bytes);
    // Keep a partial last chunk when the original has one: cap at (slots + 1) chunks plus the
    // original's remainder.
    let cap = |n: u64| -> u64 {
        let b = n * es;
        if b <= cap_bytes {
            return n;
        }
        let rem = b % chunk_bytes;
        let capped = if rem == 0 { cap_bytes } else { (slots + 1) * chunk_bytes + rem };
        capped / es
    };
    let mut t = spec.clone();
    t.counts = match &spec.counts {
        Counts::Uniform(n) => {
            // AllReduce shards split the buffer across ranks: cap the shard.
            if spec.collective == Collective::AllReduce {
                let w = spec.world as u64;
                let per = n.div_ceil(w);
                Counts::Uniform(cap(per).saturating_mul(w).min(*n))
            } else {
                Counts::Uniform(cap(*n))
            }
        }
        Counts::PerRank(v) => Counts::PerRank(v.iter().map(|&n| cap(n)).collect()),
        Counts::PerPair(m) => Counts::PerPair(m.iter().map(|r| r.iter().map(|&n| cap(n)).collect()).collect()),
    };
    t
}

/// Where a step sits, for messages: `block b step i[.j]`.
pub fn step_name(path: crate::plan::StepPath) -> String {
    format!("block {} step {}", path.0, fmt_path(path))
}
