//! The SNAC verifier: an explicit-state model of plans (DESIGN.md §3.5).
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
//! A synchronization step is also taken eagerly when `{step}` is a persistent set: it
//! commutes with everything the other processes can do *before* it ([`Reduction::Reach`]; the
//! argument is on `Model::independent`). What they can do is bounded by a reach analysis:
//! each process runs until its first unsatisfied wait, and passes it only if a process that
//! can itself run first may make the store it waits for (an arrival notifies only if the
//! arrivals that can happen complete its counter's round). Blocks of one rank in different
//! calls never run concurrently (stream order), nor blocks two calls apart (the all-pairs
//! property, checked on every path, rules it out). Arrivals of one round on one counter
//! commute when they would issue the same notifications: the model lets every arrival release
//! into the counter and the last one publish the union, without the arrivers acquiring from
//! the counter (weaker than the executor's acq_rel, so it can only report more races, never
//! fewer). The state graph is acyclic (every step advances a program counter or a call), so
//! persistent sets with state caching need no cycle proviso; violations are properties of a
//! step and the state it reads, which commuting independent steps leaves unchanged, so every
//! violating path has an equivalent explored one. `tests/verify.rs` checks the reduction
//! against the unreduced search ([`Reduction::Off`]) on every mutant of small plans.
//!
//! Symmetry reduction over the blocks of a role is not used, because it would not be sound
//! here. Blocks of a role differ in their slices, and permuting two of them is an automorphism
//! of the model only together with a renaming of the bytes they move, applied to every role
//! on every rank at once. That renaming does not exist when the last chunk is partial (slice 0
//! has bytes, slice 1 none), which is the case in most plans. The reduction above removes the
//! interleavings such a symmetry would have merged, and more: on the former CI set (world 2
//! with 1 and 2 blocks, world 3 with 1) it explores 9,264 states against 161,994 for the
//! footprint-only reduction ([`Reduction::Footprint`]), and world 3 with 2 blocks, which did
//! not finish in 300 s, takes milliseconds.
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
//! [`verify`] explores the *twin* of the plans: chunk loops longer than `slots + 2` trips are
//! cut to `slots + 2`, keeping each step's partial last chunk. The construction and the
//! argument why it covers chunk-uniform plans are in [`twin`]; static checks see the original
//! plans, and [`Report::cutoff`] says when the twin was used. [`twin_spec`] does the same on
//! a spec, for callers that want to derive smaller plans in the first place.

pub mod mem;
pub mod mutate;
pub mod twin;

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::rc::Rc;
use std::time::{Duration, Instant};

use mem::{Access, IMap, ShareTag, Term};

use crate::plan::{Advance, Alias, EpochVal, Plan, Region, Space, Step, check_set, fmt_path};
use crate::spec::{Collective, CollectiveSpec, Counts};
use crate::types::{ConsumeOp, ReductionMode};

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
    let tw = twin::twin(calls, &senses(calls));
    let cutoff = tw.cutoff;
    let opts = *opts;
    // Deep interleavings recurse deeply: explore on a thread with a large stack.
    let h = std::thread::Builder::new().stack_size(256 << 20).spawn(move || {
        let mut m = Model::new(&tw.calls);
        m.skip = tw.skip;
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

/// Why an exploration ended early: a violation, or the state or schedule budget spent.
enum Stop {
    Violation(Violation),
    Budget,
}

impl From<Violation> for Stop {
    fn from(v: Violation) -> Self {
        Stop::Violation(v)
    }
}

/// Per-process position and registers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
struct ProcessState {
    /// 0 not launched, 1 running, 2 done.
    st: u8,
    top: u32,
    c: u64,
    body: u32,
    e: u64,
    agreed: u64,
}

/// A handshake word (`(rank, address)` in [`State::hs`]): its value and flag, the vector clock
/// of its last store, and the accesses the race check compares later ones with.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Cell {
    value: u64,
    flag: u64,
    vc: Rc<Vec<u32>>,
    writer: Access,
    readers: Vec<Access>,
}

/// A vector clock, one entry per process; shared until a join changes it.
type VectorClock = Rc<Vec<u32>>;

/// One state of the model: every process's position, the ranks' synchronization words and
/// memory with their vector clocks, and each call's progress.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    ps: Vec<ProcessState>,
    vc: Vec<VectorClock>,
    /// `[rank]`, word → the stores in modification order (sparse: plans place their flags in
    /// per-writer segments of a large flag area).
    flags: Vec<BTreeMap<u32, Vec<(u64, VectorClock)>>>,
    ctrs: Vec<Vec<(u64, VectorClock)>>,
    epochs: Vec<Vec<u64>>,
    /// `[rank][space]`: 0 input, 1 output, 2 staging, 3 window.
    mem: Vec<[IMap; 4]>,
    hs: BTreeMap<(u32, u64), Cell>,
    /// Per rank: the call running (or next to launch).
    cur: Vec<u32>,
    /// Per call: the epoch every rank must end at.
    adv: Vec<Option<u64>>,
    exits: Vec<Option<VectorClock>>,
    /// Which blocked processes cannot have become enabled (not part of the state).
    wake: Wake,
}

/// A cache for [`Model::closure`]: a process found blocked stays blocked until the
/// synchronization state of a rank it waits on changes, so the closure re-evaluates only
/// processes whose rank's version moved since. It is derived from the state it travels with
/// and never changes what the closure does, so it is left out of equality and fingerprints.
#[derive(Debug, Clone, Default)]
struct Wake {
    /// Per rank: bumped whenever its flags, memory or handshake cells change.
    version: Vec<u64>,
    /// Per process: what it was blocked on when last evaluated, if it was.
    blocked: Vec<Option<Blocked>>,
}

/// What a blocked process waits on, and that version when it was found blocked.
#[derive(Debug, Clone, Copy)]
enum Blocked {
    /// A rank's synchronization state, at the version it had.
    Rank(u32, u64),
    /// Not launched yet, or finished: only a launch changes that.
    Idle,
}

impl Wake {
    fn new(ranks: usize, processes: usize) -> Self {
        Wake { version: vec![0; ranks], blocked: vec![None; processes] }
    }

    fn touch(&mut self, rank: usize) {
        self.version[rank] += 1;
    }

    fn still_blocked(&self, pid: usize) -> bool {
        match self.blocked[pid] {
            Some(Blocked::Rank(r, v)) => self.version[r as usize] == v,
            Some(Blocked::Idle) => true,
            None => false,
        }
    }
}

impl PartialEq for Wake {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Wake {}

impl Hash for Wake {
    fn hash<H: Hasher>(&self, _: &mut H) {}
}

impl State {
    fn fingerprint(&self) -> (u64, u64) {
        let mut h = FingerprintHasher(0x243f_6a88_85a3_08d3, 0x1319_8a2e_0370_7344);
        self.hash(&mut h);
        (h.0, h.1)
    }
}

/// A fast two-lane 128-bit hasher for state fingerprints.
struct FingerprintHasher(u64, u64);

impl Hasher for FingerprintHasher {
    fn finish(&self) -> u64 {
        self.0 ^ self.1
    }
    fn write(&mut self, bytes: &[u8]) {
        for ch in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..ch.len()].copy_from_slice(ch);
            self.write_u64(u64::from_le_bytes(w));
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0 ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
        self.1 = (self.1.rotate_left(17) ^ x).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    }
    fn write_u32(&mut self, x: u32) {
        self.write_u64(x as u64)
    }
    fn write_u8(&mut self, x: u8) {
        self.write_u64(x as u64 | 0x100)
    }
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64)
    }
}

/// A transition that must be explored in every order (not taken eagerly).
#[derive(Debug, Clone, Copy)]
struct Transition {
    pid: usize,
}

/// One access of a synchronization step, for the independence check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SyncAccess {
    /// An arrival on counter `(rank, index)` at chunk `c` ([`WILD`]: any chunk), with a digest
    /// of the notifications it would issue as the last arrival.
    Counter(usize, u32, u64, u64),
    /// A store to flag `(rank, index)`; `Some((rank, index, chunk, digest))` of the counter
    /// when made by the last arrival of that counter's round.
    Flag(usize, u32, Option<(usize, u32, u64, u64)>),
    Window(usize, u64, u64),
    Cell(usize, u64),
}

/// A chunk index standing for "any chunk".
const WILD: u64 = u64::MAX;

impl SyncAccess {
    /// Whether two accesses (one of them a write) do not commute.
    fn overlaps(&self, o: &SyncAccess) -> bool {
        match (self, o) {
            // Arrivals of the same round commute (see the model of `Arrive`).
            (SyncAccess::Counter(a, i, c, x), SyncAccess::Counter(b, j, d, y)) => {
                a == b && i == j && (c != d || *c == WILD || x != y)
            }
            // The last arrival's stores are the same whichever arrival is last.
            (SyncAccess::Flag(a, i, x), SyncAccess::Flag(b, j, y)) => {
                a == b && i == j && !(x.is_some() && x == y && x.is_some_and(|x| x.2 != WILD))
            }
            (SyncAccess::Cell(a, i), SyncAccess::Cell(b, j)) => a == b && i == j,
            (SyncAccess::Window(a, x0, x1), SyncAccess::Window(b, y0, y1)) => a == b && x0 < y1 && y0 < x1,
            _ => false,
        }
    }
}

/// A position in a program, ordered: `(top-level step, chunk, body step)`.
type Pos = (u32, u64, u32);

/// What a step waits for before it can run (for the reach analysis of [`Model::independent`]).
#[derive(Debug, Clone)]
enum WaitsFor {
    Wait { idx: u32, val: EpochVal, c: u64 },
    Packets { locs: Vec<(usize, usize, u64, u64)>, val: EpochVal, c: u64 },
    Handshake { key: (u32, u64), val: EpochVal },
}

/// A store a step makes that can unblock another process.
#[derive(Debug, Clone)]
enum WakingStore {
    Flag {
        rank: usize,
        idx: u32,
        val: EpochVal,
        c: u64,
    },
    /// The notifications happen only if the counter completes a round.
    Arrive {
        rank: usize,
        ctr: u32,
        arrivals: u32,
        then: Vec<(usize, u32, EpochVal)>,
        c: u64,
    },
    Put {
        rank: usize,
        a: u64,
        b: u64,
    },
    Handshake {
        key: (u32, u64),
    },
}

/// One step instance of a flattened program (guards applied, loops unrolled).
#[derive(Debug, Clone)]
struct StepInstance {
    pos: Pos,
    foot: Vec<(SyncAccess, bool)>,
    blk: Option<WaitsFor>,
    sto: Vec<WakingStore>,
}

/// Programs longer than this (in step instances) are not flattened; the independence check
/// then falls back to the static footprints.
const MAX_FLAT: usize = 1 << 14;

/// Arrivals that may happen on one counter: how many, the smallest round size, the
/// notifications they would issue, and whether a round may complete.
type Round = (u64, u32, Vec<(usize, u32, u64)>, bool);

/// What the processes that can run before a given step may store (see [`Model::independent`]).
#[derive(Default)]
struct Avail {
    /// `(rank, flag word)`: the largest value some store may bring (`u64::MAX`: unknown).
    flags: std::collections::HashMap<(usize, u32), u64>,
    /// `(rank, counter)`: arrivals that may happen, the smallest round size, and the
    /// notifications waiting for a completed round.
    ctrs: std::collections::HashMap<(usize, u32), Round>,
    /// Per rank: the window bytes some put may write, as a union of intervals (a linear
    /// list of puts made this check quadratic in wide grids).
    puts: std::collections::HashMap<usize, Spans>,
    hs: HashSet<(u32, u64)>,
}

/// A union of half-open intervals, kept as disjoint ones by start. A range overlaps the
/// union exactly when it overlaps one of the intervals inserted.
#[derive(Default)]
struct Spans(BTreeMap<u64, u64>);

impl Spans {
    fn insert(&mut self, mut a: u64, mut b: u64) {
        if a >= b {
            return;
        }
        // Absorb every interval that overlaps or touches [a, b).
        while let Some((&x, &y)) = self.0.range(..=b).next_back() {
            if y < a {
                break;
            }
            self.0.remove(&x);
            a = a.min(x);
            b = b.max(y);
        }
        self.0.insert(a, b);
    }

    /// Whether the non-empty range `[a, b)` overlaps the union (an empty one never does).
    fn overlaps(&self, a: u64, b: u64) -> bool {
        // The interval starting last before `b` has the largest end of those starting before
        // `b` (they are disjoint), so it alone decides.
        a < b && self.0.range(..b).next_back().is_some_and(|(_, &y)| y > a)
    }
}

impl Avail {
    fn flag(&mut self, rank: usize, idx: u32, v: u64) {
        let x = self.flags.entry((rank, idx)).or_insert(0);
        *x = (*x).max(v);
    }
}

struct Model<'a> {
    calls: &'a [Vec<Plan>],
    /// Per process: every synchronization access it can make, `(object, is_write, last
    /// position at which it can happen)`.
    foot: Vec<Vec<(SyncAccess, bool, Pos)>>,
    world: usize,
    /// `base[k][r]`: pid of block 0 of call `k` on rank `r`.
    base: Vec<Vec<usize>>,
    /// `(call, rank, block)` of each pid.
    who: Vec<(usize, usize, usize)>,
    nclock: usize,
    maxoff: Vec<Vec<i128>>,
    sense: Vec<u64>,
    /// Per process: its flattened program, when short enough.
    prog: Option<Vec<Vec<StepInstance>>>,
    /// `[call][rank]`: output bytes the semantic check skips (written only in chunks the
    /// twin drops).
    skip: Vec<Vec<Vec<(u64, u64)>>>,
}

fn join(a: &mut VectorClock, b: &[u32]) {
    if a.iter().zip(b).any(|(x, y)| y > x) {
        let a = Rc::make_mut(a);
        for (x, y) in a.iter_mut().zip(b) {
            *x = (*x).max(*y);
        }
    }
}

fn eval(v: &EpochVal, e: u64, c: u64) -> u64 {
    v.eval(e, c).unwrap_or(0)
}

impl<'a> Model<'a> {
    fn new(calls: &'a [Vec<Plan>]) -> Self {
        let world = calls.first().map_or(0, |c| c.len());
        let mut base = vec![];
        let mut who = vec![];
        for (k, plans) in calls.iter().enumerate() {
            let mut row = vec![];
            for (r, p) in plans.iter().enumerate() {
                row.push(who.len());
                for b in 0..p.blocks.len() {
                    who.push((k, r, b));
                }
            }
            base.push(row);
        }
        let nclock = who.len() + world;
        let maxoff = calls.iter().map(|ps| ps.iter().map(max_epoch_offset).collect()).collect();
        let sense = senses(calls);
        let skip = calls.iter().map(|ps| vec![vec![]; ps.len()]).collect();
        let mut m = Model { calls, foot: vec![], world, base, who, nclock, maxoff, sense, prog: None, skip };
        m.foot = (0..m.who.len()).map(|pid| m.static_footprint(pid)).collect();
        m.prog = (0..m.who.len()).map(|pid| m.flatten(pid)).collect();
        m
    }

    /// Process `pid`'s program as step instances in execution order, `None` if too long.
    fn flatten(&self, pid: usize) -> Option<Vec<StepInstance>> {
        let (k, r, b) = self.who[pid];
        let e = self.sense[k];
        let mut out = vec![];
        for (i, s) in self.plan(k, r).blocks[b].steps.iter().enumerate() {
            match s {
                Step::ChunkLoop { trips, body } => {
                    if trips.saturating_mul(body.len() as u64) > MAX_FLAT as u64 {
                        return None;
                    }
                    for c in 0..*trips {
                        for (j, t) in body.iter().enumerate() {
                            if t.guard().admits(c) {
                                out.push(self.inst(pid, (i as u32, c, j as u32), t, e));
                            }
                        }
                    }
                }
                s if s.guard().admits(0) => out.push(self.inst(pid, (i as u32, 0, 0), s, e)),
                _ => {}
            }
            if out.len() > MAX_FLAT {
                return None;
            }
        }
        Some(out)
    }

    fn inst(&self, pid: usize, pos: Pos, s: &Step, e: u64) -> StepInstance {
        let c = pos.1;
        let r = self.who[pid].1;
        let wins = |srcs: &[&Region], n: u64| -> Vec<(usize, usize, u64, u64)> {
            srcs.iter().filter(|x| matches!(x.space, Space::Window(_))).map(|x| self.loc(pid, x, n, c, e)).collect()
        };
        let blk = match s {
            Step::Wait { flag, value, .. } => Some(WaitsFor::Wait { idx: flag.at(c), val: *value, c }),
            Step::Gather { src, len, expect: Some(v), .. } => {
                Some(WaitsFor::Packets { locs: wins(&[src], len.at(c)), val: *v, c })
            }
            Step::Reduce { srcs, len, expect: Some(v), .. } => {
                let refs: Vec<&Region> = srcs.iter().collect();
                Some(WaitsFor::Packets { locs: wins(&refs, len.at(c)), val: *v, c })
            }
            Step::HandshakeWait { src, expect, .. } => {
                Some(WaitsFor::Handshake { key: (r as u32, src.at(0, e & 1)), val: *expect })
            }
            _ => None,
        };
        let sto = match s {
            Step::Signal { notify: n, .. } => {
                vec![WakingStore::Flag { rank: n.peer as usize, idx: n.flag.at(c), val: n.value, c }]
            }
            Step::Arrive { counter, arrivals, then, .. } => vec![WakingStore::Arrive {
                rank: r,
                ctr: counter.at(c),
                arrivals: *arrivals,
                then: then.iter().map(|n| (n.peer as usize, n.flag.at(c), n.value)).collect(),
                c,
            }],
            Step::PutPackets { dst, len, .. } => {
                let (q, _, a, b) = self.loc(pid, dst, len.at(c), c, e);
                if a < b { vec![WakingStore::Put { rank: q, a, b }] } else { vec![] }
            }
            Step::HandshakeSend { peer, dst, .. } => vec![WakingStore::Handshake { key: (*peer, dst.at(0, e & 1)) }],
            _ => vec![],
        };
        StepInstance { pos, foot: self.footprint_at(pid, s, c, e), blk, sto }
    }

    /// Every synchronization access process `pid` can make, over all chunks and both senses,
    /// with the last position it can happen at.
    fn static_footprint(&self, pid: usize) -> Vec<(SyncAccess, bool, Pos)> {
        let (k, r, b) = self.who[pid];
        let p = self.plan(k, r);
        let mut out: Vec<(SyncAccess, bool, Pos)> = vec![];
        let block = &p.blocks[b];
        let mut visit = |s: &Step, lo: u64, hi: u64, last: Pos| {
            if lo >= hi {
                return;
            }
            {
                let e = self.sense[k];
                // Every chunk of short loops; beyond 256 chunks, the first 256 with the chunk
                // index of counters and arrival stores made a wildcard.
                let wild = hi - lo > 256;
                let mut cs: Vec<u64> = (lo..hi.min(lo + 256)).collect();
                cs.push(hi - 1);
                for c in cs {
                    for (mut o, w) in self.footprint_at(pid, s, c, e) {
                        if wild {
                            match &mut o {
                                SyncAccess::Counter(_, _, c, _) => *c = WILD,
                                SyncAccess::Flag(_, _, Some(x)) => x.2 = WILD,
                                _ => {}
                            }
                        }
                        match out.iter_mut().find(|(x, xw, _)| *x == o && *xw == w) {
                            Some(item) => item.2 = item.2.max(last),
                            None => out.push((o, w, last)),
                        }
                    }
                }
            }
        };
        for (i, s) in block.steps.iter().enumerate() {
            match s {
                Step::ChunkLoop { trips, body } => {
                    for (j, t) in body.iter().enumerate() {
                        let g = t.guard();
                        let hi = g.until.min(*trips);
                        visit(t, g.from, hi, (i as u32, hi.saturating_sub(1), j as u32));
                    }
                }
                s => {
                    let g = s.guard();
                    visit(s, g.from, g.until.min(1), (i as u32, 0, 0));
                }
            }
        }
        out
    }

    /// The synchronization accesses of step `s` of process `pid` at chunk `c`, epoch `e`.
    fn footprint_at(&self, pid: usize, s: &Step, c: u64, e: u64) -> Vec<(SyncAccess, bool)> {
        let r = self.who[pid].1;
        let win = |reg: &Region, n: u64| {
            let (q, _, a, b) = self.loc(pid, reg, n, c, e);
            SyncAccess::Window(q, a, b.max(a + 1))
        };
        match s {
            Step::Arrive { counter, then, .. } => {
                // Arrivals of one round commute only when they would issue the same stores.
                let mut h = FingerprintHasher(1, 2);
                for n in then {
                    // Blocks of one rank share the epoch (else a uniform-advance violation has
                    // already been reported), so the value is compared without it.
                    (n.kind, n.peer, n.flag.at(c), n.value.chunk_mul, n.value.add, c).hash(&mut h);
                }
                let ctr = (r, counter.at(c), c, h.0);
                let mut v = vec![(SyncAccess::Counter(r, counter.at(c), c, h.0), true)];
                v.extend(then.iter().map(|n| (SyncAccess::Flag(n.peer as usize, n.flag.at(c), Some(ctr)), true)));
                v
            }
            Step::Signal { notify, .. } => {
                vec![(SyncAccess::Flag(notify.peer as usize, notify.flag.at(c), None), true)]
            }
            Step::PutPackets { dst, len, .. } => vec![(win(dst, len.at(c)), true)],
            Step::Gather { src, len, expect: Some(_), .. } => vec![(win(src, len.at(c)), false)],
            Step::Reduce { srcs, len, expect: Some(_), .. } => srcs
                .iter()
                .filter(|x| matches!(x.space, Space::Window(_)))
                .map(|x| (win(x, len.at(c)), false))
                .collect(),
            Step::HandshakeSend { peer, dst, .. } => vec![(SyncAccess::Cell(*peer as usize, dst.at(0, e & 1)), true)],
            Step::HandshakeWait { src, .. } => vec![(SyncAccess::Cell(r, src.at(0, e & 1)), false)],
            _ => vec![],
        }
    }

    /// Whether process `pid`'s enabled synchronization step `A` commutes with everything the
    /// other processes can do before `A` runs, so `{A}` is a persistent set and `A` may be
    /// taken without branching.
    ///
    /// What others can do before `A` is over-approximated by a reach analysis (a stubborn-set
    /// construction over blocked processes): each other process runs from its position until
    /// its first step that waits (a `Wait`, a packet read, a handshake wait) and is not
    /// satisfied in this state; it gets past that step only if some process that can itself
    /// run before `A` may make the store it waits for (a signal to that flag word, an arrival
    /// that can complete its counter's round given the arrivals that can happen, a put
    /// overlapping the packets, a handshake send to the cell). `pid` itself makes no store
    /// before `A`. A call starts on a rank only when every block of the previous call there
    /// can reach its exit. Values are compared where the storer's epoch is known, else any
    /// store counts; processes not yet launched are assumed to pass every wait. Iterated to a
    /// fixpoint, this bounds every sequence of steps that can run from this state without `A`
    /// (by induction on the sequence: a step past a blocking wait needs a store made earlier
    /// in it). `A` is independent when no step in those ranges touches what `A` touches
    /// (counter, flag words, window bytes, handshake cells; one of them a write). Blocks of
    /// one rank in different calls never run concurrently (stream order), nor blocks two calls
    /// apart (every call ties every pair of ranks, which the all-pairs check verifies on every
    /// explored path).
    fn independent(&self, st: &mut State, pid: usize, red: Reduction) -> bool {
        let Some((s, c)) = self.current(st, pid) else { return true };
        let e = st.ps[pid].e;
        let mine = self.footprint_at(pid, s, c, e);
        if mine.is_empty() {
            return true;
        }
        let (k, r, _) = self.who[pid];
        let n = self.who.len();
        let conc = |q: usize| {
            let (kq, rq, _) = self.who[q];
            q != pid && !((rq == r && kq != k) || kq.abs_diff(k) >= 2)
        };
        let clash = |foot: &[(SyncAccess, bool)]| {
            mine.iter().any(|(o, w)| foot.iter().any(|(x, xw)| (*w || *xw) && o.overlaps(x)))
        };
        let prog = match (&self.prog, red) {
            (Some(p), Reduction::Reach) => p,
            _ => {
                // Static footprints: everything a process may still do.
                return (0..n).filter(|&q| conc(q) && st.ps[q].st != 2).all(|q| {
                    let ps = &st.ps[q];
                    let pos = (ps.top, ps.c, ps.body);
                    !mine.iter().any(|(o, w)| {
                        self.foot[q].iter().any(|(x, xw, last)| *last >= pos && (*w || *xw) && o.overlaps(x))
                    })
                });
            }
        };
        const NO: usize = usize::MAX;
        let mut cur = vec![NO; n];
        let mut reach = vec![0usize; n];
        for q in 0..n {
            if !conc(q) || st.ps[q].st != 1 {
                continue;
            }
            let i = match self.current(st, q) {
                None => prog[q].len(),
                Some(_) => {
                    let ps = &st.ps[q];
                    let pos = (ps.top, ps.c, ps.body);
                    prog[q].partition_point(|x| x.pos < pos)
                }
            };
            cur[q] = i;
            reach[q] = i;
        }
        let mut av = Avail::default();
        loop {
            let mut changed = false;
            for q in 0..n {
                if cur[q] == NO {
                    continue;
                }
                let launched = st.ps[q].st == 1;
                let eq = st.ps[q].e;
                while let Some(inst) = prog[q].get(reach[q]) {
                    if launched && !self.passable(st, q, eq, inst, &av) {
                        break;
                    }
                    for x in &inst.sto {
                        self.add_store(st, &mut av, x, launched.then_some(eq));
                    }
                    reach[q] += 1;
                    changed = true;
                }
            }
            // Calls that can start: every block of the rank's previous call can exit.
            for q in 0..n {
                if cur[q] != NO || st.ps[q].st != 0 || !conc(q) {
                    continue;
                }
                let (kq, rq, _) = self.who[q];
                let Some(kp) = kq.checked_sub(1) else { continue };
                let b0 = self.base[kp][rq];
                let g = self.plan(kp, rq).blocks.len();
                if (b0..b0 + g).all(|x| x != pid && (st.ps[x].st == 2 || (cur[x] != NO && reach[x] == prog[x].len()))) {
                    cur[q] = 0;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        !(0..n).any(|q| cur[q] != NO && prog[q][cur[q]..reach[q]].iter().any(|i| clash(&i.foot)))
    }

    /// Whether a launched process `q` (epoch `e`) may get past step `inst`: it does not wait, or
    /// what it waits for holds now or may be stored by the processes of `av`.
    fn passable(&self, st: &State, q: usize, e: u64, inst: &StepInstance, av: &Avail) -> bool {
        let r = self.who[q].1;
        match &inst.blk {
            None => true,
            Some(WaitsFor::Wait { idx, val, c }) => {
                let v = eval(val, e, *c);
                st.flags[r].get(idx).is_some_and(|h| h.iter().any(|(x, _)| *x >= v))
                    || av.flags.get(&(r, *idx)).is_some_and(|&x| x >= v)
            }
            Some(WaitsFor::Packets { locs, val, c }) => {
                let v = eval(val, e, *c);
                locs.iter().all(|&l| {
                    Self::packets_ready(st, l, v)
                        || (l.1 == 3 && av.puts.get(&l.0).is_some_and(|s| s.overlaps(l.2, l.3)))
                })
            }
            Some(WaitsFor::Handshake { key, val }) => {
                st.hs.get(key).is_some_and(|cell| cell.flag == eval(val, e, 0)) || av.hs.contains(key)
            }
        }
    }

    /// Records a store that may happen before the step under test (`e`: the storer's epoch,
    /// `None` when not yet known).
    fn add_store(&self, st: &State, av: &mut Avail, x: &WakingStore, e: Option<u64>) {
        let val = |v: &EpochVal, c: u64| e.map_or(u64::MAX, |e| eval(v, e, c));
        match x {
            WakingStore::Flag { rank, idx, val: v, c } => av.flag(*rank, *idx, val(v, *c)),
            WakingStore::Arrive { rank, ctr, arrivals, then, c } => {
                let (rank, key) = (*rank, (*rank, *ctr));
                let now = st.ctrs.get(rank).and_then(|v| v.get(key.1 as usize)).map_or(0, |x| x.0);
                let ent = av.ctrs.entry(key).or_insert((0, u32::MAX, vec![], false));
                ent.0 += 1;
                ent.1 = ent.1.min(*arrivals);
                for (p, f, v) in then {
                    ent.2.push((*p, *f, val(v, *c)));
                }
                if now + ent.0 >= ent.1 as u64 {
                    ent.3 = true;
                }
                if ent.3 {
                    let out = std::mem::take(&mut ent.2);
                    for (p, f, v) in out {
                        av.flag(p, f, v);
                    }
                }
            }
            WakingStore::Put { rank, a, b } => av.puts.entry(*rank).or_default().insert(*a, *b),
            WakingStore::Handshake { key } => {
                av.hs.insert(*key);
            }
        }
    }

    fn plan(&self, k: usize, r: usize) -> &Plan {
        &self.calls[k][r]
    }

    fn init(&self) -> State {
        let w = self.world;
        let maxw = |f: &dyn Fn(&Plan) -> u64| {
            (0..w).map(|r| self.calls.iter().map(|c| f(&c[r])).max().unwrap_or(0)).collect::<Vec<_>>()
        };
        let ctrs = maxw(&|p| p.resources.counter_words as u64);
        let eps = maxw(&|p| p.resources.epoch_words as u64);
        let stg = maxw(&|p| p.resources.staging_bytes);
        let win = maxw(&|p| p.resources.window_bytes);
        let zero: VectorClock = Rc::new(vec![0; self.nclock]);
        let mut st = State {
            ps: vec![ProcessState::default(); self.who.len()],
            vc: vec![zero.clone(); self.nclock],
            flags: vec![BTreeMap::new(); w],
            ctrs: (0..w).map(|r| vec![(0, zero.clone()); ctrs[r] as usize]).collect(),
            epochs: (0..w).map(|r| vec![0; eps[r] as usize]).collect(),
            mem: (0..w).map(|r| [IMap::new(0), IMap::new(0), IMap::new(stg[r]), IMap::new(win[r])]).collect(),
            hs: BTreeMap::new(),
            cur: vec![0; w],
            adv: vec![None; self.calls.len()],
            exits: vec![None; self.who.len()],
            wake: Wake::new(w, self.who.len()),
        };
        for r in 0..w {
            self.launch(&mut st, r);
        }
        st
    }

    fn host(&self, r: usize) -> usize {
        self.who.len() + r
    }

    /// Launches rank `r`'s call `cur[r]`: the host writes fresh inputs after the previous
    /// kernel, and the blocks start after that.
    fn launch(&self, st: &mut State, r: usize) {
        let k = st.cur[r] as usize;
        if k >= self.calls.len() {
            return;
        }
        let h = self.host(r);
        if k > 0 {
            let p = self.plan(k - 1, r);
            for b in 0..p.blocks.len() {
                if let Some(x) = st.exits[self.base[k - 1][r] + b].clone() {
                    join(&mut st.vc[h], &x);
                }
            }
        }
        Rc::make_mut(&mut st.vc[h])[h] += 1;
        let t = st.vc[h][h];
        let p = self.plan(k, r);
        let res = &p.resources;
        let mut input = IMap::new(res.input_bytes);
        let mut output = IMap::new(res.output_bytes);
        let term = Term::In { call: k as u32, rank: r as u32, base: 0 };
        let tag = |_: ()| (k as u32 + 1, (h as u32, t), None, None);
        // The output is the host's until this launch (it may have read the previous call's
        // result): a peer's store into it not ordered after the launch is a race.
        if res.output_bytes > 0 {
            output.write(0, res.output_bytes, vec![(0, res.output_bytes, Term::Uninit)], tag(()), None);
        }
        match res.alias {
            Some(Alias::InputInOutput(o)) => {
                output.write(o, o + res.input_bytes, vec![(0, res.input_bytes, term)], tag(()), None);
            }
            Some(Alias::OutputInInput(_)) | None => {
                input.write(0, res.input_bytes, vec![(0, res.input_bytes, term)], tag(()), None);
            }
        }
        st.mem[r][0] = input;
        st.mem[r][1] = output;
        st.wake.touch(r);
        for b in 0..p.blocks.len() {
            let pid = self.base[k][r] + b;
            st.wake.blocked[pid] = None;
            let mut vc = st.vc[h].clone();
            Rc::make_mut(&mut vc)[pid] = 1;
            st.vc[pid] = vc;
            let e = st.epochs[r].get(b).copied().unwrap_or(0);
            let local = match p.advance {
                Advance::AgreedMaxChunks { local } => local,
                Advance::Fixed(_) => 0,
            };
            st.ps[pid] = ProcessState { st: 1, top: 0, c: 0, body: 0, e, agreed: local };
        }
        if p.blocks.is_empty() {
            // An empty call ends at once (after its checks).
            let _ = self.kernel_end(st, r);
        }
    }

    /// The step process `pid` is at (skipping steps its guard excludes), or `None` at exit.
    fn current<'p>(&'p self, st: &mut State, pid: usize) -> Option<(&'p Step, u64)> {
        let (k, r, b) = self.who[pid];
        let steps = &self.plan(k, r).blocks[b].steps;
        let ps = &mut st.ps[pid];
        loop {
            let s = steps.get(ps.top as usize)?;
            match s {
                Step::ChunkLoop { trips, body } => {
                    if ps.c >= *trips || body.is_empty() {
                        ps.top += 1;
                        ps.c = 0;
                        ps.body = 0;
                        continue;
                    }
                    match body.get(ps.body as usize) {
                        None => {
                            ps.c += 1;
                            ps.body = 0;
                        }
                        Some(t) if !t.guard().admits(ps.c) => ps.body += 1,
                        Some(t) => return Some((t, ps.c)),
                    }
                }
                s if !s.guard().admits(0) => ps.top += 1,
                s => return Some((s, 0)),
            }
        }
    }

    fn next_pos(&self, st: &mut State, pid: usize) {
        let (k, r, b) = self.who[pid];
        let steps = &self.plan(k, r).blocks[b].steps;
        let ps = &mut st.ps[pid];
        match steps.get(ps.top as usize) {
            Some(Step::ChunkLoop { .. }) => ps.body += 1,
            _ => ps.top += 1,
        }
    }

    fn label(&self, pid: usize, s: &Step, c: u64) -> String {
        let (k, r, b) = self.who[pid];
        format!("call {k} rank {r} block {b} c={c}: {s}")
    }

    /// Resolves a region to `(rank, space index, start, end)`.
    fn loc(&self, pid: usize, reg: &Region, len: u64, c: u64, e: u64) -> (usize, usize, u64, u64) {
        let (k, r, _) = self.who[pid];
        let p = self.plan(k, r);
        let off = reg.offset.at(c, e & 1);
        // A peer's output lies where that peer's own plan puts its `Output`.
        let (owner, alias) = match reg.space {
            Space::PeerOutput(q) | Space::PeerInput(q) => (q as usize, self.plan(k, q as usize).resources.alias),
            _ => (r, p.resources.alias),
        };
        let (rank, sp, off) = match (reg.space, alias) {
            (Space::Input | Space::PeerInput(_), Some(Alias::InputInOutput(o))) => (owner, 1, off + o),
            (Space::Input | Space::PeerInput(_), _) => (owner, 0, off),
            (Space::Output | Space::PeerOutput(_), Some(Alias::OutputInInput(o))) => (owner, 0, off + o),
            (Space::Output | Space::PeerOutput(_), _) => (owner, 1, off),
            (Space::Staging(q), _) => (q as usize, 2, off),
            (Space::Window(q), _) => (q as usize, 3, off),
        };
        (rank, sp, off, off + len)
    }

    fn who_s(&self, pid: u32) -> String {
        let pid = pid as usize;
        if pid >= self.who.len() {
            return format!("the host of rank {}", pid - self.who.len());
        }
        let (k, r, b) = self.who[pid];
        format!("call {k} rank {r} block {b}")
    }

    fn space_s(rank: usize, sp: usize) -> String {
        let n = ["input", "output", "staging", "window"][sp];
        format!("rank {rank}'s {n}")
    }

    /// A data read by `pid`: races and staleness are checked, the reader recorded.
    fn read(
        &self,
        st: &mut State,
        pid: usize,
        l: (usize, usize, u64, u64),
    ) -> Result<Vec<(u64, u64, Term)>, Violation> {
        let (rank, sp, a, b) = l;
        if a == b {
            return Ok(vec![]);
        }
        let k = self.who[pid].0 as u32;
        let vc = st.vc[pid].clone();
        let t = vc[pid];
        let m = &mut st.mem[rank][sp];
        let range = m.range(a, b);
        let unready = |s: &mem::Seg, why: String| {
            let who = self.who_s(pid as u32);
            viol(Property::Readiness, format!("{who} reads {} [{}, {}){why}", Self::space_s(rank, sp), s.start, s.end))
        };
        for s in &mut m.segs[range] {
            if let Some((_, _, _, writers)) = s.share {
                let staged = 1 + s.cowriters.len() as u32;
                if staged < writers {
                    return Err(unready(
                        s,
                        format!(" which {staged} of the {writers} writers of its shared stage have staged"),
                    ));
                }
            }
            for &(q, tq) in s.writer.iter().chain(&s.cowriters) {
                if q as usize != pid && tq > vc[q as usize] {
                    return Err(unready(
                        s,
                        format!(" while the write by {} is not ordered before the read", self.who_s(q)),
                    ));
                }
            }
            if sp >= 2 && s.wcall != k + 1 {
                let when =
                    if s.wcall == 0 { "never written".to_string() } else { format!("written in call {}", s.wcall - 1) };
                return Err(unready(s, format!(": stale data ({when})")));
            }
            s.readers.retain(|(q, _)| *q as usize != pid);
            s.readers.push((pid as u32, t));
        }
        Ok(st.mem[rank][sp].read_terms(a, b))
    }

    /// A data write by `pid`; `share`: as one writer of a shared stage's round, whose other
    /// writers' copies of the same bytes are not races (the ticket hands each byte to one).
    fn write(
        &self,
        st: &mut State,
        pid: usize,
        l: (usize, usize, u64, u64),
        pieces: Vec<(u64, u64, Term)>,
        packet: Option<u64>,
        share: Option<ShareTag>,
    ) -> Result<(), Violation> {
        let (rank, sp, a, b) = l;
        if a == b {
            return Ok(());
        }
        let k = self.who[pid].0 as u32;
        let vc = st.vc[pid].clone();
        let t = vc[pid];
        let m = &mut st.mem[rank][sp];
        let range = m.range(a, b);
        let mut earlier: Vec<(u64, u64, Vec<Access>)> = vec![];
        for s in &m.segs[range] {
            let round = s.share.filter(|_| s.share == share && s.wcall == k + 1);
            if let Some((.., writers)) = round {
                let all: Vec<Access> = s.writer.iter().chain(&s.cowriters).copied().collect();
                if all.len() < writers as usize && all.iter().all(|(q, _)| *q as usize != pid) {
                    earlier.push((s.start, s.end, all));
                    continue;
                }
            }
            for &(q, tq) in s.writer.iter().chain(&s.cowriters) {
                if q as usize != pid && tq > vc[q as usize] {
                    return Err(viol(
                        Property::Race,
                        format!(
                            "{} writes {} [{}, {}) unordered with the write by {}",
                            self.who_s(pid as u32),
                            Self::space_s(rank, sp),
                            s.start,
                            s.end,
                            self.who_s(q)
                        ),
                    ));
                }
            }
            if let Some(&(q, _)) = s.readers.iter().find(|(q, tq)| *q as usize != pid && *tq > vc[*q as usize]) {
                return Err(viol(
                    Property::Reuse,
                    format!(
                        "{} overwrites {} [{}, {}) before {} finished reading it",
                        self.who_s(pid as u32),
                        Self::space_s(rank, sp),
                        s.start,
                        s.end,
                        self.who_s(q)
                    ),
                ));
            }
        }
        let wvc = packet.map(|_| vc.clone());
        st.wake.touch(rank);
        let m = &mut st.mem[rank][sp];
        m.write(a, b, pieces, (k + 1, (pid as u32, t), wvc, packet), share);
        for (x, y, all) in earlier {
            m.add_cowriters(x, y, &all);
        }
        Ok(())
    }

    /// Whether all packets of a window location carry `flag`.
    fn packets_ready(st: &State, l: (usize, usize, u64, u64), flag: u64) -> bool {
        let (rank, sp, a, b) = l;
        a == b || st.mem[rank][sp].overlapping(a, b).iter().all(|s| s.flag == Some(flag))
    }

    /// Joins the put clocks of the packets at a window location into `pid`'s clock.
    fn acquire_packets(st: &mut State, pid: usize, l: (usize, usize, u64, u64)) {
        let (rank, sp, a, b) = l;
        let vcs: Vec<VectorClock> = st.mem[rank][sp].overlapping(a, b).iter().filter_map(|s| s.wvc.clone()).collect();
        for v in vcs {
            join(&mut st.vc[pid], &v);
        }
    }

    /// Whether process `pid`'s current step is enabled, and whether it may be taken eagerly;
    /// a process found blocked is recorded in `st.wake` with what it waits on.
    fn status(&self, st: &mut State, pid: usize) -> Option<bool> {
        let blocked = self.blocked_on(st, pid);
        st.wake.blocked[pid] = blocked.err();
        blocked.ok()
    }

    fn blocked_on(&self, st: &mut State, pid: usize) -> Result<bool, Blocked> {
        if st.ps[pid].st != 1 {
            return Err(Blocked::Idle);
        }
        let Some((s, c)) = self.current(st, pid) else { return Ok(true) };
        let e = st.ps[pid].e;
        let r = self.who[pid].1;
        let on_rank = |st: &State, rank: usize| Blocked::Rank(rank as u32, st.wake.version[rank]);
        match s {
            Step::Stage { .. } | Step::ChunkLoop { .. } => Ok(true),
            Step::Gather { expect: None, .. } | Step::Reduce { expect: None, .. } => Ok(true),
            Step::Wait { flag, value, .. } => {
                let v = eval(value, e, c);
                let ok = st.flags[r].get(&flag.at(c)).is_some_and(|h| h.iter().any(|(x, _)| *x >= v));
                if ok { Ok(true) } else { Err(on_rank(st, r)) }
            }
            Step::Gather { src, len, expect: Some(x), .. } => {
                let l = self.loc(pid, src, len.at(c), c, e);
                if Self::packets_ready(st, l, eval(x, e, c)) { Ok(false) } else { Err(on_rank(st, l.0)) }
            }
            Step::Reduce { srcs, len, expect: Some(x), .. } => {
                // Blocked while any one source is not ready: waiting on the first one's rank
                // is enough.
                let unready = srcs
                    .iter()
                    .filter(|s| matches!(s.space, Space::Window(_)))
                    .map(|s| self.loc(pid, s, len.at(c), c, e))
                    .find(|&l| !Self::packets_ready(st, l, eval(x, e, c)));
                match unready {
                    None => Ok(false),
                    Some(l) => Err(on_rank(st, l.0)),
                }
            }
            Step::HandshakeWait { src, expect, .. } => {
                let key = (r as u32, src.at(0, e & 1));
                if st.hs.get(&key).is_none_or(|cell| cell.flag != eval(expect, e, 0)) {
                    Err(on_rank(st, r))
                } else {
                    Ok(false)
                }
            }
            _ => Ok(false),
        }
    }

    /// Takes process `pid`'s current step (or its exit).
    fn fire(&self, st: &mut State, pid: usize, trace: &mut Vec<TraceEvent>) -> Result<(), Violation> {
        let (k, r, _) = self.who[pid];
        let Some((s, c)) = self.current(st, pid) else {
            trace.push(TraceEvent::Exit(pid as u32));
            return self.exit(st, pid);
        };
        let ps = &st.ps[pid];
        trace.push(TraceEvent::Step { pid: pid as u32, top: ps.top, body: ps.body, c });
        let e = st.ps[pid].e;
        match s {
            Step::ChunkLoop { .. } => {}
            Step::Stage { dst, src, len, share: Some(sh), .. } => {
                let n = len.at(c);
                let pieces = self.read(st, pid, self.loc(pid, src, n, c, e))?;
                let tag = (r as u32, sh.ticket.at(c), c, sh.writers);
                self.write(st, pid, self.loc(pid, dst, n, c, e), pieces, None, Some(tag))?;
            }
            Step::Stage { dst, src, len, .. } | Step::Gather { dst, src, len, .. } => {
                let n = len.at(c);
                let ls = self.loc(pid, src, n, c, e);
                if matches!(s, Step::Gather { expect: Some(_), .. }) {
                    Self::acquire_packets(st, pid, ls);
                }
                let pieces = self.read(st, pid, ls)?;
                let ld = self.loc(pid, dst, n, c, e);
                if ls != ld {
                    self.write(st, pid, ld, pieces, None, None)?;
                }
            }
            Step::Reduce { dst, srcs, len, expect, .. } => {
                let n = len.at(c);
                let mut all = vec![];
                for x in srcs {
                    let l = self.loc(pid, x, n, c, e);
                    if expect.is_some() && matches!(x.space, Space::Window(_)) {
                        Self::acquire_packets(st, pid, l);
                    }
                    all.push(self.read(st, pid, l)?);
                }
                let mut cuts: Vec<u64> = all.iter().flatten().flat_map(|(a, b, _)| [*a, *b]).collect();
                cuts.sort_unstable();
                cuts.dedup();
                let pieces = cuts
                    .windows(2)
                    .map(|w| {
                        let terms = all
                            .iter()
                            .map(|ps| {
                                ps.iter()
                                    .find(|(a, b, _)| *a <= w[0] && w[0] < *b)
                                    .map_or(Term::Uninit, |(a, _, t)| t.shift(w[0] - a))
                            })
                            .collect();
                        (w[0], w[1], Term::reduce(terms))
                    })
                    .collect();
                let ld = self.loc(pid, dst, n, c, e);
                self.write(st, pid, ld, pieces, None, None)?;
            }
            Step::PutPackets { dst, src, len, flag, .. } => {
                let n = len.at(c);
                let pieces = self.read(st, pid, self.loc(pid, src, n, c, e))?;
                let ld = self.loc(pid, dst, n, c, e);
                self.write(st, pid, ld, pieces, Some(eval(flag, e, c)), None)?;
            }
            Step::Signal { notify, .. } => {
                let snap = st.vc[pid].clone();
                st.wake.touch(notify.peer as usize);
                st.flags[notify.peer as usize]
                    .entry(notify.flag.at(c))
                    .or_default()
                    .push((eval(&notify.value, e, c), snap));
            }
            Step::Wait { flag, value, .. } => {
                let v = eval(value, e, c);
                let h = st.flags[r].get(&flag.at(c)).map_or(&[][..], |h| &h[..]);
                if let Some((_, x)) = h.iter().find(|(x, _)| *x >= v) {
                    let x = x.clone();
                    join(&mut st.vc[pid], &x);
                }
            }
            Step::Arrive { counter, arrivals, then, .. } => {
                // The counter accumulates the arrivers' clocks (each arrival releases); the
                // notifications of the last arrival carry them all. Arrivers acquire nothing
                // from the counter: that is weaker than the executor's acq_rel (so never hides
                // a race) and makes arrivals of one round commute.
                let i = counter.at(c) as usize;
                let mine = st.vc[pid].clone();
                let ctr = &mut st.ctrs[r][i];
                join(&mut ctr.1, &mine);
                ctr.0 += 1;
                if ctr.0 == *arrivals as u64 {
                    let snap = std::mem::replace(&mut ctr.1, Rc::new(vec![0; self.nclock]));
                    ctr.0 = 0;
                    for n in then {
                        st.wake.touch(n.peer as usize);
                        st.flags[n.peer as usize]
                            .entry(n.flag.at(c))
                            .or_default()
                            .push((eval(&n.value, e, c), snap.clone()));
                    }
                    trace.push(TraceEvent::Notifies(then.len() as u32));
                }
            }
            Step::HandshakeSend { peer, dst, flag } => {
                let key = (*peer, dst.at(0, e & 1));
                let vc = st.vc[pid].clone();
                if let Some(old) = st.hs.get(&key) {
                    if let Some(&(q, _)) = old.readers.iter().find(|(q, tq)| *tq > vc[*q as usize]) {
                        return Err(viol(
                            Property::Reuse,
                            format!(
                                "{} overwrites a handshake packet before {} read it",
                                self.who_s(pid as u32),
                                self.who_s(q)
                            ),
                        ));
                    }
                }
                let value = match self.plan(k, r).advance {
                    Advance::AgreedMaxChunks { local } => local,
                    Advance::Fixed(_) => 0,
                };
                let t = vc[pid];
                st.wake.touch(*peer as usize);
                st.hs.insert(key, Cell { value, flag: eval(flag, e, 0), vc, writer: (pid as u32, t), readers: vec![] });
            }
            Step::HandshakeWait { src, .. } => {
                let key = (r as u32, src.at(0, e & 1));
                if let Some(cell) = st.hs.get_mut(&key) {
                    let t = st.vc[pid][pid];
                    cell.readers.retain(|(q, _)| *q as usize != pid);
                    cell.readers.push((pid as u32, t));
                    let (v, x) = (cell.value, cell.vc.clone());
                    join(&mut st.vc[pid], &x);
                    st.ps[pid].agreed = st.ps[pid].agreed.max(v);
                }
            }
        }
        Rc::make_mut(&mut st.vc[pid])[pid] += 1;
        self.next_pos(st, pid);
        Ok(())
    }

    fn exit(&self, st: &mut State, pid: usize) -> Result<(), Violation> {
        let (k, r, b) = self.who[pid];
        let p = self.plan(k, r);
        let ps = &st.ps[pid];
        let a = match p.advance {
            Advance::Fixed(a) => a,
            Advance::AgreedMaxChunks { .. } => ps.agreed | 1,
        };
        if (a as i128) < self.maxoff[k][r] {
            return Err(viol(
                Property::EpochAdvance,
                format!("call {k} rank {r} block {b} advances by {a}, below the epoch offsets it used"),
            ));
        }
        let e = ps.e + a;
        let grid = p.blocks.len();
        let words = st.epochs[r].len();
        for j in (b..words).step_by(grid.max(1)) {
            st.epochs[r][j] = e;
        }
        st.exits[pid] = Some(st.vc[pid].clone());
        st.ps[pid].st = 2;
        let first = self.base[k][r];
        if (first..first + grid).all(|q| st.ps[q].st == 2) {
            self.kernel_end(st, r)?;
        }
        Ok(())
    }

    /// Rank `r`'s call ended: uniform advance, all-pairs dependency, output semantics; then
    /// the next call is launched.
    fn kernel_end(&self, st: &mut State, r: usize) -> Result<(), Violation> {
        let k = st.cur[r] as usize;
        let p = self.plan(k, r);
        let grid = p.blocks.len();
        let eps = &st.epochs[r];
        if let Some(&e0) = eps.first() {
            if let Some(j) = eps.iter().position(|&x| x != e0) {
                return Err(viol(
                    Property::UniformAdvance,
                    format!("after call {k}, rank {r}'s epoch word {j} is {} but word 0 is {e0}", eps[j]),
                ));
            }
            match st.adv[k] {
                None => st.adv[k] = Some(e0),
                Some(x) if x != e0 => {
                    return Err(viol(
                        Property::UniformAdvance,
                        format!("rank {r} ends call {k} at epoch {e0}, another rank at {x}"),
                    ));
                }
                _ => {}
            }
        }
        if grid > 0 {
            let mut end: VectorClock = Rc::new(vec![0; self.nclock]);
            for b in 0..grid {
                if let Some(x) = &st.exits[self.base[k][r] + b] {
                    join(&mut end, x);
                }
            }
            for y in (0..self.world).filter(|&y| y != r) {
                let g = self.plan(k, y).blocks.len();
                if g > 0 && !(0..g).any(|b| end[self.base[k][y] + b] >= 1) {
                    return Err(viol(
                        Property::AllPairs,
                        format!("rank {r} finished call {k} without depending on rank {y}'s entry into it"),
                    ));
                }
            }
        }
        self.check_output(st, k, r)?;
        st.cur[r] += 1;
        self.launch(st, r);
        Ok(())
    }

    fn check_output(&self, st: &State, k: usize, r: usize) -> Result<(), Violation> {
        let p = self.plan(k, r);
        let spec = &p.spec;
        let (sp, shift) = match p.resources.alias {
            Some(Alias::OutputInInput(o)) => (0, o),
            _ => (1, 0),
        };
        let m = &st.mem[r][sp];
        let skip = &self.skip[k][r];
        for seg in spec.segments(r as u32) {
            let keep = twin::minus(&[(seg.out_offset, seg.out_offset + seg.len)], skip);
            let pieces = keep.iter().flat_map(|&(a, b)| {
                m.read_terms(a + shift, b + shift)
                    .into_iter()
                    .map(move |(x, y, t)| (a - seg.out_offset + x, a - seg.out_offset + y, t))
            });
            for (x, y, t) in pieces {
                let want: Term = if spec.collective.consume_op() == ConsumeOp::Gather {
                    let (src, off) = seg.sources[0];
                    Term::In { call: k as u32, rank: src, base: off + x }
                } else {
                    Term::Red(Rc::new(
                        seg.sources
                            .iter()
                            .map(|&(s, off)| Term::In { call: k as u32, rank: s, base: off + x })
                            .collect(),
                    ))
                };
                let ok = match (spec.mode, &t) {
                    (ReductionMode::Fast, Term::Red(_)) => {
                        let (mut a, mut b) = (vec![], vec![]);
                        let full = t.leaves(&mut a) && want.leaves(&mut b);
                        a.sort_unstable();
                        b.sort_unstable();
                        full && a == b
                    }
                    _ => t == want,
                };
                if !ok {
                    return Err(viol(
                        Property::Semantics,
                        format!(
                            "call {k} rank {r} output [{}, {}) holds {} but must hold {}",
                            seg.out_offset + x,
                            seg.out_offset + y,
                            t.describe(),
                            want.describe()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Takes every eager step until none is left; returns the enabled non-eager ones and the
    /// number of steps taken.
    fn closure(
        &self,
        st: &mut State,
        trace: &mut Vec<TraceEvent>,
        red: Reduction,
    ) -> Result<(Vec<Transition>, u64), Violation> {
        let mut fired = 0;
        loop {
            let mut progressed = false;
            let mut branching = vec![];
            for pid in 0..self.who.len() {
                if st.wake.still_blocked(pid) {
                    continue;
                }
                while let Some(eager) = self.status(st, pid) {
                    if eager || (red != Reduction::Off && self.independent(st, pid, red)) {
                        self.fire(st, pid, trace)?;
                        fired += 1;
                        progressed = true;
                    } else {
                        branching.push(Transition { pid });
                        break;
                    }
                }
            }
            if !progressed {
                return Ok((branching, fired));
            }
        }
    }

    /// Attaches the rendered trace to a violation.
    fn with_trace(&self, mut v: Violation, trace: &[TraceEvent]) -> Violation {
        v.trace = trace
            .iter()
            .map(|ev| match *ev {
                TraceEvent::Step { pid, top, body, c } => {
                    let (k, r, b) = self.who[pid as usize];
                    let steps = &self.plan(k, r).blocks[b].steps;
                    match steps.get(top as usize) {
                        Some(Step::ChunkLoop { body: bs, .. }) => match bs.get(body as usize) {
                            Some(s) => self.label(pid as usize, s, c),
                            None => format!("call {k} rank {r} block {b}: loop"),
                        },
                        Some(s) => self.label(pid as usize, s, c),
                        None => format!("call {k} rank {r} block {b}: ?"),
                    }
                }
                TraceEvent::Exit(pid) => {
                    let (k, r, b) = self.who[pid as usize];
                    format!("call {k} rank {r} block {b}: exit")
                }
                TraceEvent::Notifies(n) => format!("  (last arrival: notifies {n} flags)"),
            })
            .collect();
        v
    }

    fn deadlock(&self, st: &mut State) -> Option<Violation> {
        let running: Vec<usize> = (0..self.who.len()).filter(|&p| st.ps[p].st == 1).collect();
        let stuck: Vec<String> = running
            .into_iter()
            .map(|p| match self.current(st, p) {
                Some((s, c)) => self.label(p, s, c),
                None => format!("{} at exit", self.who_s(p as u32)),
            })
            .collect();
        if stuck.is_empty() && st.cur.iter().all(|&c| c as usize >= self.calls.len()) {
            return None;
        }
        Some(viol(Property::Deadlock, format!("no step can run; blocked: {}", stuck.join(" | "))))
    }

    /// Randomized priority schedules (PCT-style, 3 priority change points per schedule).
    fn sample(&self, opts: &Options) -> Result<(), Violation> {
        for i in 0..opts.schedules {
            let mut rng = Rng(opts.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(i) | 1);
            let n = self.who.len();
            let mut prio: Vec<u64> = (0..n).map(|_| rng.next()).collect();
            let changes: Vec<u64> = (0..3).map(|_| rng.next() % 2000).collect();
            let mut st = self.init();
            let mut trace = vec![];
            let mut steps = 0u64;
            loop {
                let (en, _) =
                    self.closure(&mut st, &mut trace, Reduction::Off).map_err(|v| self.with_trace(v, &trace))?;
                let Some(t) = en.iter().max_by_key(|t| prio[t.pid]) else {
                    if let Some(v) = self.deadlock(&mut st) {
                        return Err(self.with_trace(v, &trace));
                    }
                    break;
                };
                if changes.contains(&steps) {
                    prio[t.pid] = rng.next() % 1000;
                }
                self.fire(&mut st, t.pid, &mut trace).map_err(|v| self.with_trace(v, &trace))?;
                steps += 1;
            }
        }
        Ok(())
    }
}

/// One trace entry, rendered only when a violation is reported: formatting every step of an
/// exhaustive search cost more than the search itself.
#[derive(Debug, Clone, Copy)]
enum TraceEvent {
    Step { pid: u32, top: u32, body: u32, c: u64 },
    Exit(u32),
    Notifies(u32),
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

struct Explorer<'m, 'a> {
    m: &'m Model<'a>,
    seen: HashSet<(u64, u64)>,
    states: u64,
    max: u64,
    trace: Vec<TraceEvent>,
    red: Reduction,
}

impl Explorer<'_, '_> {
    fn dfs(&mut self, mut st: State) -> Result<(), Stop> {
        let mark = self.trace.len();
        let en = match self.m.closure(&mut st, &mut self.trace, self.red) {
            Ok((en, fired)) => {
                // Every state the eager steps passed through counts: the budget bounds work.
                self.states += fired;
                en
            }
            Err(v) => {
                // Count the state the violation was found in.
                self.states += 1;
                return Err(self.m.with_trace(v, &self.trace).into());
            }
        };
        if !self.seen.insert(st.fingerprint()) {
            self.trace.truncate(mark);
            return Ok(());
        }
        self.states += 1;
        if std::env::var_os("SNAC_DEBUG").is_some() && self.states < 40 {
            let names: Vec<String> = en
                .iter()
                .map(|t| match self.m.current(&mut st, t.pid) {
                    Some((s, c)) => self.m.label(t.pid, s, c),
                    None => "exit".into(),
                })
                .collect();
            eprintln!("state {}: {} branches: {}", self.states, en.len(), names.join(" || "));
        }
        if en.is_empty() {
            // A path explored to its end is checked even past the budget (its cost is spent):
            // the budget stops branching, so a run whose synchronization steps all commute
            // (one path in all) is exhaustive however long it is.
            if let Some(v) = self.m.deadlock(&mut st) {
                return Err(self.m.with_trace(v, &self.trace).into());
            }
            self.trace.truncate(mark);
            return Ok(());
        }
        for t in en {
            if self.states > self.max {
                return Err(Stop::Budget);
            }
            let mut s2 = st.clone();
            let m2 = self.trace.len();
            if let Err(v) = self.m.fire(&mut s2, t.pid, &mut self.trace) {
                self.states += 1;
                return Err(self.m.with_trace(v, &self.trace).into());
            }
            self.dfs(s2)?;
            self.trace.truncate(m2);
        }
        self.trace.truncate(mark);
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `Spans` answers overlap queries of non-empty ranges as the list of inserted intervals
    /// does.
    #[test]
    fn spans_overlap_as_the_intervals_inserted() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for _ in 0..200 {
            let (mut spans, mut list) = (Spans::default(), vec![]);
            for _ in 0..12 {
                let a = rng.next() % 100;
                let b = a + 1 + rng.next() % 12;
                spans.insert(a, b);
                list.push((a, b));
                for x in 0..120 {
                    for y in x + 1..x + 14 {
                        let want = list.iter().any(|&(a, b)| a < y && x < b);
                        assert_eq!(spans.overlaps(x, y), want, "[{x}, {y}) against {list:?}");
                    }
                }
            }
        }
    }
}
