//! The reference checker: a deliberately simple explorer of plans, the oracle the verifier is
//! fuzzed against (`tests/differential.rs`, `cargo xtask verify --fuzz N`).
//!
//! It reads the plan contract of the crate docs and nothing of the verifier: no partial-order
//! reduction (every enabled step of every block, data steps included, is a branch), no
//! symmetry, no chunk cutoff (loops run every trip), and one byte at a time (no interval
//! maps). What it models, in the order a reader should check it against the contract:
//!
//! - **Memory.** Per rank: the user's input and output buffers (one buffer where the plan
//!   aliases them), staging and the packet window. The workspace (staging, window, flags,
//!   counters, epochs, handshake cells) is **zero** at set-up: a never-written flag holds 0,
//!   a never-written packet has flag 0 and payload 0, so a wait for 0 passes at once, reading
//!   nothing. The user's buffers hold junk until the host writes a call's input at its
//!   launch, and are the user's again when the rank's kernel ends: the host then writes junk
//!   over all of the call's input and output (the user may reuse any byte of them, whatever
//!   the next call uses).
//! - **Happens-before** by vector clocks, one entry per block of every call and one per
//!   rank's host: a flag store releases; a satisfied `Wait` acquires from *one* store whose
//!   value satisfies it, and every such store (the zero store included) is a separate branch;
//!   an `Arrive` is an acq_rel read-modify-write (the contract's), its last arrival's
//!   notifications release what it acquired; a packet read acquires from the put it reads; a
//!   handshake wait from the send; a rank's host orders after its previous kernel's exits and
//!   before its next kernel's blocks (stream order).
//! - **Accesses.** Every data step reads and writes bytes; a read must be ordered after the
//!   byte's write (and for staging and windows, that write must be this call's: else it reads
//!   stale or zero data), a write after the byte's previous write (else a race; co-writers of
//!   one shared stage round excepted) and after every read since (else reuse). The host's
//!   writes at a launch and its accesses when a kernel ends are checked the same way, so an
//!   access to a peer's buffer must be ordered within the peer's call, and the output must be
//!   complete *by happens-before* when the kernel ends, whatever order the blocks ran in. An
//!   out-of-place call's input is read-only.
//! - **End of a rank's call.** Every epoch word of the rank holds one value, the same for
//!   every rank; the rank's end depends on every peer's entry; every output byte holds its
//!   collective's contributions (rank order in deterministic mode).
//! - **Static conditions** no bounded exploration can decide (they speak of every later call):
//!   the plans are well-formed ([`check_set`]), declare the spec's input and output sizes, and
//!   a fixed advance is odd where regions depend on the sense and not below the largest epoch
//!   offset used; an agreed advance is checked against that offset at each exit.
//!
//! Every state reached is kept (by a 128-bit fingerprint) so that a state is expanded once;
//! that prunes nothing a search from it would find. A search that passes `max_states` is
//! inconclusive, never an acceptance.

use std::collections::{BTreeMap, HashSet};
use std::hash::{Hash, Hasher};
use std::rc::Rc;

use crate::plan::{Advance, Alias, EpochVal, Plan, Region, Share, Space, Step, check_set};
use crate::types::{ConsumeOp, ReductionMode};

/// The reference checker's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every interleaving reached the end of every call with every check passed.
    Accept { states: u64 },
    /// Some interleaving (or a static condition) violates the contract.
    Reject(String),
    /// The state budget ran out first.
    Inconclusive { states: u64 },
}

impl Verdict {
    /// `Some(true)` accepted, `Some(false)` rejected, `None` inconclusive.
    pub fn accepted(&self) -> Option<bool> {
        match self {
            Verdict::Accept { .. } => Some(true),
            Verdict::Reject(_) => Some(false),
            Verdict::Inconclusive { .. } => None,
        }
    }
}

/// The most step instances (every block's program with its loops unrolled) a check takes on.
const MAX_INSTANCES: usize = 20_000;

/// Checks back-to-back calls (each a plan per rank), exploring at most `max_states` states.
pub fn check(calls: &[Vec<Plan>], max_states: u64) -> Verdict {
    // Copy-engine programs and landed claims as the plan module defines them, in block steps; the static
    // conditions are the originals'.
    let lowered = super::lowered(calls);
    match Model::new(calls, &lowered) {
        Err(why) => Verdict::Reject(why),
        Ok(None) => Verdict::Inconclusive { states: 0 },
        Ok(Some(m)) => m.explore(max_states),
    }
}

/// What a byte holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Val {
    /// The zeroed workspace, never written.
    Zero,
    /// The user's memory, not this call's.
    Junk,
    /// Byte `byte` of rank `rank`'s input of call `call`.
    In { call: u32, rank: u32, byte: u64 },
    /// A reduction of these, combined in list order.
    Red(Vec<Val>),
}

impl Val {
    /// `op(srcs...)`, a left operand that is itself a reduction flattened (`(a+b)+c` is the
    /// left fold `a+b+c`, which the contract's rank order means).
    fn reduce(srcs: Vec<Val>) -> Val {
        let mut out = vec![];
        for (i, v) in srcs.into_iter().enumerate() {
            match v {
                Val::Red(inner) if i == 0 => out.extend(inner),
                v => out.push(v),
            }
        }
        Val::Red(out)
    }

    fn leaves(&self, out: &mut Vec<(u32, u32, u64)>) -> bool {
        match self {
            Val::In { call, rank, byte } => {
                out.push((*call, *rank, *byte));
                true
            }
            Val::Red(v) => v.iter().all(|x| x.leaves(out)),
            Val::Zero | Val::Junk => false,
        }
    }
}

/// `(process, its own clock entry at the access)`.
type Access = (u32, u32);
/// Shared until a join or tick changes it (states are cloned at every branch).
type Clock = Rc<Vec<u32>>;

/// One byte of memory and the accesses the checks compare later ones with.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Byte {
    val: Val,
    /// `call + 1` of the write; 0 for the initial contents.
    wcall: u32,
    writer: Option<Access>,
    /// A shared stage's round `(rank, ticket word, chunk, writers)` and its writers so far.
    round: Option<(u32, u32, u64, u32)>,
    cowriters: Vec<Access>,
    readers: Vec<Access>,
    /// Packet flag (windows) and the put's clock.
    flag: u64,
    put: Option<Clock>,
}

impl Byte {
    fn initial(space: u8) -> Byte {
        let val = if space >= STAGING { Val::Zero } else { Val::Junk };
        Byte { val, wcall: 0, writer: None, round: None, cowriters: vec![], readers: vec![], flag: 0, put: None }
    }
}

/// Memory spaces of a rank.
const INPUT: u8 = 0;
const OUTPUT: u8 = 1;
const STAGING: u8 = 2;
const WINDOW: u8 = 3;

/// A handshake cell: value, flag, the send's clock, its writer and readers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Cell {
    value: u64,
    flag: u64,
    clock: Clock,
    writer: Option<Access>,
    readers: Vec<Access>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    /// Per block process: 0 not launched, 1 running, 2 exited; its next instance; its entry
    /// epoch; its agreed advance so far.
    phase: Vec<u8>,
    pc: Vec<usize>,
    entry: Vec<u64>,
    agreed: Vec<u64>,
    /// Per process, then per rank's host.
    clock: Vec<Clock>,
    exits: Vec<Option<Clock>>,
    /// Per rank: the call it runs (or will launch next), its epoch words.
    cur: Vec<usize>,
    epochs: Vec<Vec<u64>>,
    /// `(rank, word)`: every store but the initial zero, in order.
    flags: BTreeMap<(u32, u32), Vec<(u64, Clock)>>,
    /// `(rank, word)`: the value and the clock its arrivals released.
    counters: BTreeMap<(u32, u32), (u64, Clock)>,
    /// `(rank, space)`, then byte: bytes other than their initial contents.
    mem: BTreeMap<(u32, u8), Rc<BTreeMap<u64, Byte>>>,
    /// `(rank, window offset)`: handshake cells ever written.
    cells: BTreeMap<(u32, u64), Cell>,
    /// Per call: the epoch the first rank to end it ended at.
    ended_at: Vec<Option<u64>>,
}

struct Model<'a> {
    calls: &'a [Vec<Plan>],
    world: usize,
    /// `(call, rank, block)` of each process.
    who: Vec<(usize, usize, usize)>,
    /// `first[call][rank]`: the process of block 0.
    first: Vec<Vec<usize>>,
    /// Each process's program: its steps in order with their chunk, guards applied.
    program: Vec<Vec<(&'a Step, u64)>>,
}

fn join(a: &mut Clock, b: &[u32]) {
    if a.iter().zip(b).any(|(x, y)| y > x) {
        for (x, y) in Rc::make_mut(a).iter_mut().zip(b) {
            *x = (*x).max(*y);
        }
    }
}

fn tick(a: &mut Clock, at: usize) {
    Rc::make_mut(a)[at] += 1;
}

/// Whether access `(q, t)` happens before a process whose clock is `clock`.
fn before((q, t): Access, clock: &[u32]) -> bool {
    clock[q as usize] >= t
}

fn eval(v: &EpochVal, e: u64, c: u64) -> Result<u64, String> {
    v.eval(e, c).ok_or_else(|| format!("epoch value {v:?} negative at E={e}, c={c}"))
}

/// The largest `c * chunk_mul + add` of the plan's epoch values over the chunks it runs.
fn max_epoch_offset(p: &Plan) -> i128 {
    let mut m: i128 = 0;
    p.for_each_step(|_, s, (lo, hi)| {
        if lo >= hi {
            return;
        }
        let mut see = |v: &EpochVal| m = m.max((hi - 1) as i128 * v.chunk_mul as i128 + v.add as i128);
        match s {
            Step::Gather { expect: Some(v), .. } | Step::Reduce { expect: Some(v), .. } => see(v),
            Step::PutPackets { flag, .. } | Step::HandshakeSend { flag, .. } => see(flag),
            Step::Signal { notify, .. } => see(&notify.value),
            Step::Wait { value, .. } => see(value),
            Step::Arrive { then, .. } => then.iter().for_each(|n| see(&n.value)),
            Step::HandshakeWait { expect, .. } => see(expect),
            _ => {}
        }
    });
    m
}

fn sense_dependent(p: &Plan) -> bool {
    let mut any = false;
    p.for_each_step(|_, s, _| {
        let r = |x: &Region| x.offset.sense_stride != 0;
        any |= match s {
            Step::Stage { dst, src, .. } | Step::Gather { dst, src, .. } | Step::PutPackets { dst, src, .. } => {
                r(dst) || r(src)
            }
            Step::Reduce { dst, srcs, .. } => r(dst) || srcs.iter().any(r),
            Step::HandshakeSend { dst: o, .. } | Step::HandshakeWait { src: o, .. } => o.sense_stride != 0,
            _ => false,
        };
    });
    any
}

impl<'a> Model<'a> {
    /// The static conditions, then the model's tables; `Ok(None)` when the programs are too
    /// long to unroll.
    fn new(originals: &[Vec<Plan>], calls: &'a [Vec<Plan>]) -> Result<Option<Self>, String> {
        let world = calls.first().map_or(0, |c| c.len());
        if world == 0 {
            return Err("no calls".into());
        }
        for (k, plans) in originals.iter().enumerate() {
            if plans.len() != world {
                return Err(format!("call {k} has another world"));
            }
            check_set(plans).map_err(|e| format!("call {k}: ill-formed: {e}"))?;
            for p in plans {
                let (r, res) = (p.rank, &p.resources);
                if (res.input_bytes, res.output_bytes) != (p.spec.input_bytes(r), p.spec.output_bytes(r)) {
                    return Err(format!(
                        "call {k} rank {r}: declares {} input and {} output bytes, its spec {} and {}",
                        res.input_bytes,
                        res.output_bytes,
                        p.spec.input_bytes(r),
                        p.spec.output_bytes(r)
                    ));
                }
                if let (Advance::Fixed(a), false) = (p.advance, p.blocks.is_empty()) {
                    if sense_dependent(p) && a % 2 == 0 {
                        return Err(format!("call {k} rank {r}: even advance {a} on a sense-dependent plan"));
                    }
                    if (a as i128) < max_epoch_offset(p) {
                        return Err(format!("call {k} rank {r}: advance {a} below the epoch offsets it uses"));
                    }
                }
            }
        }
        let mut who = vec![];
        let mut first = vec![];
        let mut program = vec![];
        let mut instances = 0;
        for (k, plans) in calls.iter().enumerate() {
            let mut row = vec![];
            for (r, p) in plans.iter().enumerate() {
                row.push(who.len());
                for (b, block) in p.blocks.iter().enumerate() {
                    who.push((k, r, b));
                    let mut prog = vec![];
                    for s in &block.steps {
                        match s {
                            Step::ChunkLoop { trips, body } => {
                                instances += (*trips as usize).saturating_mul(body.len());
                                if instances > MAX_INSTANCES {
                                    return Ok(None);
                                }
                                for c in 0..*trips {
                                    prog.extend(body.iter().filter(|t| t.guard().admits(c)).map(|t| (t, c)));
                                }
                            }
                            s if s.guard().admits(0) => prog.push((s, 0)),
                            _ => {}
                        }
                    }
                    instances += prog.len();
                    program.push(prog);
                }
            }
            first.push(row);
        }
        Ok(Some(Model { calls, world, who, first, program }))
    }

    fn plan(&self, k: usize, r: usize) -> &'a Plan {
        &self.calls[k][r]
    }

    fn host(&self, r: usize) -> usize {
        self.who.len() + r
    }

    fn init(&self) -> Result<State, String> {
        let n = self.who.len();
        let words = |r: usize| self.calls.iter().map(|c| c[r].resources.epoch_words as usize).max().unwrap_or(0);
        let mut st = State {
            phase: vec![0; n],
            pc: vec![0; n],
            entry: vec![0; n],
            agreed: vec![0; n],
            clock: (0..n + self.world).map(|_| Rc::new(vec![0; n + self.world])).collect(),
            exits: vec![None; n],
            cur: vec![0; self.world],
            epochs: (0..self.world).map(|r| vec![0; words(r)]).collect(),
            flags: BTreeMap::new(),
            counters: BTreeMap::new(),
            mem: BTreeMap::new(),
            cells: BTreeMap::new(),
            ended_at: vec![None; self.calls.len()],
        };
        for r in 0..self.world {
            self.launch(&mut st, r)?;
        }
        Ok(st)
    }

    /// Where a user's buffer byte of rank `r` in call `k` lies: `(space, offset)`.
    fn user(&self, k: usize, r: usize, space: Space, off: u64) -> (u8, u64) {
        let alias = self.plan(k, r).resources.alias;
        match (space, alias) {
            (Space::Input | Space::PeerInput(_), Some(Alias::InputInOutput(o))) => (OUTPUT, off + o),
            (Space::Input | Space::PeerInput(_), _) => (INPUT, off),
            (Space::Output | Space::PeerOutput(_), Some(Alias::OutputInInput(o))) => (INPUT, off + o),
            _ => (OUTPUT, off),
        }
    }

    /// The bytes of a region: `(rank, space, first byte)`, checked against the owner's size.
    fn locate(&self, pid: usize, reg: &Region, len: u64, c: u64, e: u64) -> Result<(u32, u8, u64), String> {
        let (k, r, _) = self.who[pid];
        let off = reg.offset.at(c, e & 1);
        let (owner, space, start) = match reg.space {
            Space::Staging(q) => (q as usize, STAGING, off),
            Space::Window(q) => (q as usize, WINDOW, off),
            Space::Input | Space::Output => (r, self.user(k, r, reg.space, off).0, self.user(k, r, reg.space, off).1),
            Space::PeerInput(q) | Space::PeerOutput(q) => {
                let (sp, at) = self.user(k, q as usize, reg.space, off);
                (q as usize, sp, at)
            }
        };
        if owner >= self.world {
            return Err(format!("{}: rank {owner} does not exist", self.name(pid)));
        }
        let res = &self.plan(k, owner).resources;
        let size = match space {
            INPUT => res.input_bytes,
            OUTPUT => res.output_bytes,
            STAGING => res.staging_bytes,
            _ => res.window_bytes,
        };
        // A step of no bytes touches nothing, wherever it points.
        if len > 0 && start.checked_add(len).is_none_or(|end| end > size) {
            return Err(format!("{}: [{start}, +{len}) outside rank {owner}'s space {space}", self.name(pid)));
        }
        Ok((owner as u32, space, start))
    }

    fn name(&self, pid: usize) -> String {
        match self.who.get(pid) {
            Some((k, r, b)) => format!("call {k} rank {r} block {b}"),
            None => format!("rank {}'s host", pid - self.who.len()),
        }
    }

    fn byte<'s>(st: &'s State, at: (u32, u8, u64)) -> std::borrow::Cow<'s, Byte> {
        match st.mem.get(&(at.0, at.1)).and_then(|m| m.get(&at.2)) {
            Some(b) => std::borrow::Cow::Borrowed(b),
            None => std::borrow::Cow::Owned(Byte::initial(at.1)),
        }
    }

    /// Process `pid` of call `k` reads `len` bytes at `at`.
    fn read(&self, st: &mut State, pid: usize, k: usize, at: (u32, u8, u64), len: u64) -> Result<Vec<Val>, String> {
        let clock = st.clock[pid].clone();
        let mut vals = vec![];
        for i in 0..len {
            let a = (at.0, at.1, at.2 + i);
            let mut b = Self::byte(st, a).into_owned();
            let what = || format!("{} reads rank {}'s space {} byte {}", self.name(pid), a.0, a.1, a.2);
            if let Some((.., writers)) = b.round {
                if 1 + b.cowriters.len() < writers as usize {
                    return Err(format!("{}, staged by only some writers of its shared stage", what()));
                }
            }
            if let Some(w) = b.writer.iter().chain(&b.cowriters).find(|&&w| !before(w, &clock)) {
                return Err(format!("{}, whose write by {} is not ordered before", what(), self.name(w.0 as usize)));
            }
            if a.1 >= STAGING && b.wcall != k as u32 + 1 {
                return Err(format!("{}: stale or zero data (written in call {})", what(), b.wcall as i64 - 1));
            }
            b.readers.retain(|&(q, _)| q as usize != pid);
            b.readers.push((pid as u32, clock[pid]));
            vals.push(b.val.clone());
            Rc::make_mut(st.mem.entry((a.0, a.1)).or_default()).insert(a.2, b);
        }
        Ok(vals)
    }

    /// Process `pid` of call `k` writes `vals` at `at`; `packet`: a put's flag; `round`: one
    /// writer of a shared stage's round.
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        st: &mut State,
        pid: usize,
        k: usize,
        at: (u32, u8, u64),
        vals: Vec<Val>,
        packet: Option<u64>,
        round: Option<(u32, u32, u64, u32)>,
    ) -> Result<(), String> {
        let clock = st.clock[pid].clone();
        if pid < self.who.len() && at.1 == INPUT && self.plan(k, at.0 as usize).resources.alias.is_none() {
            return Err(format!("{} writes rank {}'s input, read-only out of place", self.name(pid), at.0));
        }
        for (i, val) in vals.into_iter().enumerate() {
            let a = (at.0, at.1, at.2 + i as u64);
            let old = Self::byte(st, a).into_owned();
            let what = || format!("{} writes rank {}'s space {} byte {}", self.name(pid), a.0, a.1, a.2);
            let all: Vec<Access> = old.writer.iter().chain(&old.cowriters).copied().collect();
            let joins = round.is_some()
                && old.round == round
                && old.wcall == k as u32 + 1
                && all.len() < round.map_or(0, |r| r.3 as usize)
                && all.iter().all(|&(q, _)| q as usize != pid);
            if !joins {
                if let Some(w) = all.iter().find(|&&(q, t)| q as usize != pid && !before((q, t), &clock)) {
                    return Err(format!("{}, unordered with the write by {}", what(), self.name(w.0 as usize)));
                }
            }
            if let Some(rd) = old.readers.iter().find(|&&(q, t)| q as usize != pid && !before((q, t), &clock)) {
                return Err(format!("{} before {} finished reading it", what(), self.name(rd.0 as usize)));
            }
            let me = (pid as u32, clock[pid]);
            let (writer, cowriters) = if joins { (Some(me), all) } else { (Some(me), vec![]) };
            let b = Byte {
                val,
                wcall: k as u32 + 1,
                writer,
                round,
                cowriters,
                readers: vec![],
                flag: packet.unwrap_or(old.flag),
                put: packet.map(|_| clock.clone()),
            };
            Rc::make_mut(st.mem.entry((a.0, a.1)).or_default()).insert(a.2, b);
        }
        Ok(())
    }

    /// Launches rank `r`'s next call: the host writes its input (and hands the output to the
    /// call) after its previous kernel, then the blocks start.
    fn launch(&self, st: &mut State, r: usize) -> Result<(), String> {
        let k = st.cur[r];
        let h = self.host(r);
        tick(&mut st.clock[h], h);
        if k > 0 {
            // The previous call's buffers are the user's again: the user may write any byte of
            // them now, whatever the next call uses, so no block may touch them later (a
            // peer's read of this rank's input after its kernel ended races with that write).
            let last = &self.plan(k - 1, r).resources;
            self.write(st, h, k - 1, (r as u32, INPUT, 0), vec![Val::Junk; last.input_bytes as usize], None, None)?;
            let out = vec![Val::Junk; last.output_bytes as usize];
            self.write(st, h, k - 1, (r as u32, OUTPUT, 0), out, None, None)?;
        }
        let Some(plans) = self.calls.get(k) else { return Ok(()) };
        let p = &plans[r];
        let res = &p.resources;
        let input: Vec<Val> =
            (0..res.input_bytes).map(|i| Val::In { call: k as u32, rank: r as u32, byte: i }).collect();
        match res.alias {
            Some(Alias::InputInOutput(o)) => {
                self.write(st, h, k, (r as u32, OUTPUT, 0), vec![Val::Junk; res.output_bytes as usize], None, None)?;
                self.write(st, h, k, (r as u32, OUTPUT, o), input, None, None)?;
            }
            Some(Alias::OutputInInput(_)) => self.write(st, h, k, (r as u32, INPUT, 0), input, None, None)?,
            None => {
                self.write(st, h, k, (r as u32, INPUT, 0), input, None, None)?;
                self.write(st, h, k, (r as u32, OUTPUT, 0), vec![Val::Junk; res.output_bytes as usize], None, None)?;
            }
        }
        tick(&mut st.clock[h], h);
        let local = match p.advance {
            Advance::AgreedMaxChunks { local } => local,
            Advance::Fixed(_) => 0,
        };
        for b in 0..p.blocks.len() {
            let pid = self.first[k][r] + b;
            st.phase[pid] = 1;
            st.entry[pid] = st.epochs[r].get(b).copied().unwrap_or(0);
            st.agreed[pid] = local;
            st.clock[pid] = st.clock[h].clone();
            Rc::make_mut(&mut st.clock[pid])[pid] = 1;
        }
        if p.blocks.is_empty() { self.kernel_end(st, r) } else { Ok(()) }
    }

    /// Every block of rank `r`'s call has exited: the end-of-call checks, by happens-before
    /// (the host's clock joins the exits), then the next launch.
    fn kernel_end(&self, st: &mut State, r: usize) -> Result<(), String> {
        let k = st.cur[r];
        let p = self.plan(k, r);
        let h = self.host(r);
        let grid = p.blocks.len();
        for b in 0..grid {
            if let Some(x) = st.exits[self.first[k][r] + b].clone() {
                join(&mut st.clock[h], &x);
            }
        }
        if let Some(&e0) = st.epochs[r].first() {
            if st.epochs[r].iter().any(|&e| e != e0) {
                return Err(format!("rank {r} ends call {k} with unequal epoch words {:?}", st.epochs[r]));
            }
            match st.ended_at[k] {
                Some(x) if x != e0 => return Err(format!("rank {r} ends call {k} at epoch {e0}, another at {x}")),
                _ => st.ended_at[k] = Some(e0),
            }
        }
        if grid > 0 {
            for y in (0..self.world).filter(|&y| y != r) {
                let g = self.plan(k, y).blocks.len();
                if g > 0 && (0..g).all(|b| st.clock[h][self.first[k][y] + b] == 0) {
                    return Err(format!("rank {r} ends call {k} without depending on rank {y}'s entry"));
                }
            }
        }
        // The host reads the output: complete and right by happens-before.
        let spec = &p.spec;
        for seg in spec.segments(r as u32) {
            let (space, at) = self.user(k, r, Space::Output, seg.out_offset);
            let got = self.read(st, h, k, (r as u32, space, at), seg.len)?;
            for (x, v) in got.into_iter().enumerate() {
                let x = x as u64;
                let want = if spec.collective.consume_op() == ConsumeOp::Gather {
                    let (src, off) = seg.sources[0];
                    Val::In { call: k as u32, rank: src, byte: off + x }
                } else {
                    let leaves = seg.sources.iter().map(|&(s, off)| Val::In { call: k as u32, rank: s, byte: off + x });
                    Val::Red(leaves.collect())
                };
                let ok = match (spec.mode, &v) {
                    (ReductionMode::Fast, Val::Red(_)) => {
                        let (mut a, mut b) = (vec![], vec![]);
                        let full = v.leaves(&mut a) && want.leaves(&mut b);
                        a.sort_unstable();
                        b.sort_unstable();
                        full && a == b
                    }
                    _ => v == want,
                };
                if !ok {
                    return Err(format!(
                        "call {k} rank {r} output byte {} holds {v:?}, not {want:?}",
                        seg.out_offset + x
                    ));
                }
            }
        }
        st.cur[r] += 1;
        self.launch(st, r)
    }

    /// Every way process `pid` can take its next step: `None` blocked, else the branches
    /// (a `Wait` has one per store it may read from; other steps one).
    fn branches(&self, st: &State, pid: usize) -> Result<Vec<Option<Clock>>, String> {
        if st.phase[pid] != 1 {
            return Ok(vec![]);
        }
        let Some(&(step, c)) = self.program[pid].get(st.pc[pid]) else { return Ok(vec![None]) };
        let (_, r, _) = self.who[pid];
        let e = st.entry[pid];
        let window_ready = |reg: &Region, n: u64, v: u64| -> Result<bool, String> {
            let at = self.locate(pid, reg, n, c, e)?;
            Ok((0..n).all(|i| Self::byte(st, (at.0, at.1, at.2 + i)).flag == v))
        };
        match step {
            Step::Wait { flag, value, .. } => {
                let v = eval(value, e, c)?;
                let mut from: Vec<Option<Clock>> = vec![];
                if v == 0 {
                    from.push(Some(Rc::new(vec![0; st.clock.len()])));
                }
                for (x, clock) in st.flags.get(&(r as u32, flag.at(c))).into_iter().flatten() {
                    if *x >= v && !from.contains(&Some(clock.clone())) {
                        from.push(Some(clock.clone()));
                    }
                }
                Ok(from)
            }
            Step::Gather { src, len, expect: Some(x), .. } if matches!(src.space, Space::Window(_)) => {
                Ok(if window_ready(src, len.at(c), eval(x, e, c)?)? { vec![None] } else { vec![] })
            }
            Step::Reduce { srcs, len, expect: Some(x), .. } => {
                let v = eval(x, e, c)?;
                for s in srcs.iter().filter(|s| matches!(s.space, Space::Window(_))) {
                    if !window_ready(s, len.at(c), v)? {
                        return Ok(vec![]);
                    }
                }
                Ok(vec![None])
            }
            Step::HandshakeWait { src, expect, .. } => {
                let flag = st.cells.get(&(r as u32, src.at(0, e & 1))).map_or(0, |cell| cell.flag);
                Ok(if flag == eval(expect, e, 0)? { vec![None] } else { vec![] })
            }
            _ => Ok(vec![None]),
        }
    }

    /// Process `pid` takes its next step (or exits); `from`: the store a `Wait` reads.
    fn fire(&self, st: &mut State, pid: usize, from: Option<Clock>) -> Result<(), String> {
        let (k, r, _) = self.who[pid];
        let Some(&(step, c)) = self.program[pid].get(st.pc[pid]) else { return self.exit(st, pid) };
        let e = st.entry[pid];
        let at = |reg: &Region, n: u64| self.locate(pid, reg, n, c, e);
        let acquire_packets = |st: &mut State, loc: (u32, u8, u64), n: u64| {
            for i in 0..n {
                if let Some(put) = Self::byte(st, (loc.0, loc.1, loc.2 + i)).put.clone() {
                    join(&mut st.clock[pid], &put);
                }
            }
        };
        match step {
            Step::ChunkLoop { .. } => unreachable!("programs are unrolled"),
            Step::Stage { dst, src, len, share, .. } => {
                let n = len.at(c);
                let vals = self.read(st, pid, k, at(src, n)?, n)?;
                let round = share.map(|Share { ticket, writers, .. }| (r as u32, ticket.at(c), c, writers));
                self.write(st, pid, k, at(dst, n)?, vals, None, round)?;
            }
            Step::Gather { dst, src, len, expect, .. } => {
                let n = len.at(c);
                let from_at = at(src, n)?;
                if expect.is_some() {
                    acquire_packets(st, from_at, n);
                }
                let vals = self.read(st, pid, k, from_at, n)?;
                let to = at(dst, n)?;
                if to != from_at {
                    self.write(st, pid, k, to, vals, None, None)?;
                }
            }
            Step::Reduce { dst, srcs, len, expect, .. } => {
                let n = len.at(c);
                let mut cols: Vec<Vec<Val>> = vec![];
                for s in srcs {
                    let loc = at(s, n)?;
                    if expect.is_some() && matches!(s.space, Space::Window(_)) {
                        acquire_packets(st, loc, n);
                    }
                    cols.push(self.read(st, pid, k, loc, n)?);
                }
                let vals = (0..n as usize).map(|i| Val::reduce(cols.iter().map(|col| col[i].clone()).collect()));
                self.write(st, pid, k, at(dst, n)?, vals.collect(), None, None)?;
            }
            Step::PutPackets { dst, src, len, flag, .. } => {
                let n = len.at(c);
                let vals = self.read(st, pid, k, at(src, n)?, n)?;
                self.write(st, pid, k, at(dst, n)?, vals, Some(eval(flag, e, c)?), None)?;
            }
            Step::Signal { notify, .. } => {
                let store = (eval(&notify.value, e, c)?, st.clock[pid].clone());
                st.flags.entry((notify.peer, notify.flag.at(c))).or_default().push(store);
            }
            Step::Wait { .. } => {
                if let Some(clock) = from {
                    join(&mut st.clock[pid], &clock);
                }
            }
            Step::Arrive { counter, arrivals, then, reset, .. } => {
                let zero = Rc::new(vec![0; st.clock.len()]);
                let (value, released) =
                    st.counters.entry((r as u32, counter.at(c))).or_insert_with(|| (0, zero.clone()));
                join(released, &st.clock[pid]);
                let acquired = released.clone();
                *value += 1;
                let last = *value == u64::from(*arrivals);
                if last {
                    // Reset by a plain store: the next round synchronizes through nothing.
                    *value = 0;
                    *released = zero.clone();
                }
                join(&mut st.clock[pid], &acquired);
                if last {
                    if let Some(t) = reset {
                        st.counters.insert((r as u32, t.at(c)), (0, zero));
                    }
                    for n in then {
                        let store = (eval(&n.value, e, c)?, st.clock[pid].clone());
                        st.flags.entry((n.peer, n.flag.at(c))).or_default().push(store);
                    }
                }
            }
            Step::HandshakeSend { peer, dst, flag } => {
                let key = (*peer, dst.at(0, e & 1));
                let clock = st.clock[pid].clone();
                if let Some(old) = st.cells.get(&key) {
                    let earlier = old.writer.iter().chain(&old.readers).find(|&&(q, t)| !before((q, t), &clock));
                    if let Some(&(q, _)) = earlier {
                        return Err(format!(
                            "{} overwrites a handshake cell {} still uses",
                            self.name(pid),
                            self.name(q as usize)
                        ));
                    }
                }
                let value = match self.plan(k, r).advance {
                    Advance::AgreedMaxChunks { local } => local,
                    Advance::Fixed(_) => 0,
                };
                let writer = Some((pid as u32, clock[pid]));
                st.cells.insert(key, Cell { value, flag: eval(flag, e, 0)?, clock, writer, readers: vec![] });
            }
            Step::HandshakeWait { src, .. } => {
                let key = (r as u32, src.at(0, e & 1));
                let t = st.clock[pid][pid];
                let (value, clock) = match st.cells.get_mut(&key) {
                    Some(cell) => {
                        cell.readers.retain(|&(q, _)| q as usize != pid);
                        cell.readers.push((pid as u32, t));
                        (cell.value, cell.clock.clone())
                    }
                    None => (0, Rc::new(vec![0; st.clock.len()])),
                };
                join(&mut st.clock[pid], &clock);
                st.agreed[pid] = st.agreed[pid].max(value);
            }
        }
        tick(&mut st.clock[pid], pid);
        st.pc[pid] += 1;
        Ok(())
    }

    fn exit(&self, st: &mut State, pid: usize) -> Result<(), String> {
        let (k, r, b) = self.who[pid];
        let p = self.plan(k, r);
        let a = match p.advance {
            Advance::Fixed(a) => a,
            Advance::AgreedMaxChunks { .. } => st.agreed[pid] | 1,
        };
        if (a as i128) < max_epoch_offset(p) {
            return Err(format!("{} advances by {a}, below the epoch offsets its plan uses", self.name(pid)));
        }
        let grid = p.blocks.len();
        let e = st.entry[pid] + a;
        for j in (b..st.epochs[r].len()).step_by(grid) {
            st.epochs[r][j] = e;
        }
        st.exits[pid] = Some(st.clock[pid].clone());
        st.phase[pid] = 2;
        let first = self.first[k][r];
        if (first..first + grid).all(|q| st.phase[q] == 2) { self.kernel_end(st, r) } else { Ok(()) }
    }

    fn fingerprint(st: &State) -> (u64, u64) {
        let mut h = Fingerprint(0x243f_6a88_85a3_08d3, 0x1319_8a2e_0370_7344);
        st.hash(&mut h);
        (h.0, h.1)
    }

    /// Depth-first over every branch of every process, each state expanded once.
    fn explore(&self, max_states: u64) -> Verdict {
        let init = match self.init() {
            Ok(s) => s,
            Err(why) => return Verdict::Reject(why),
        };
        let mut seen: HashSet<(u64, u64)> = HashSet::new();
        seen.insert(Self::fingerprint(&init));
        let mut stack = vec![init];
        let mut states = 1u64;
        while let Some(st) = stack.pop() {
            let mut moved = false;
            for pid in 0..self.who.len() {
                let branches = match self.branches(&st, pid) {
                    Ok(b) => b,
                    Err(why) => return Verdict::Reject(why),
                };
                for from in branches {
                    moved = true;
                    let mut next = st.clone();
                    if let Err(why) = self.fire(&mut next, pid, from) {
                        return Verdict::Reject(why);
                    }
                    if seen.insert(Self::fingerprint(&next)) {
                        states += 1;
                        if states > max_states {
                            return Verdict::Inconclusive { states };
                        }
                        stack.push(next);
                    }
                }
            }
            let done = st.cur.iter().all(|&k| k >= self.calls.len());
            if !moved && !done {
                let stuck: Vec<String> =
                    (0..self.who.len()).filter(|&q| st.phase[q] == 1).map(|q| self.name(q)).collect();
                return Verdict::Reject(format!("deadlock: {} cannot go on", stuck.join(", ")));
            }
        }
        Verdict::Accept { states }
    }
}

/// A two-lane 128-bit hasher for state fingerprints (fast; collisions are 2^-128 events).
/// A copy of the verifier's (`state.rs`), on purpose: the reference uses nothing of the verifier.
struct Fingerprint(u64, u64);

impl Hasher for Fingerprint {
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
        self.write_u64(u64::from(x))
    }
    fn write_u8(&mut self, x: u8) {
        self.write_u64(u64::from(x) | 0x100)
    }
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64)
    }
}
