//! The partial-order reduction: each step's synchronization footprint, the processes'
//! flattened programs, and the persistent-set check [`Model::independent`].
//!
//! Data steps and satisfied waits are always taken eagerly (the model in `mod.rs` says why).
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
//! with 1 and 2 blocks, world 3 with 1) it explores about a tenth of the states of the
//! footprint-only reduction ([`Reduction::Footprint`]; `reductions_compared` in
//! tests/verify.rs prints both counts), and world 3 with 2 blocks, which did not finish in
//! 300 s under that reduction, takes milliseconds.

use std::collections::{BTreeMap, HashSet};
use std::hash::Hash;

use super::Reduction;
use super::state::{FingerprintHasher, Model, State, eval};
use crate::plan::{EpochVal, Region, Space, Step};

/// One access of a synchronization step, for the independence check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SyncAccess {
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
pub(super) type Pos = (u32, u64, u32);

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
pub(super) struct StepInstance {
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

impl Model<'_> {
    /// Process `pid`'s program as step instances in execution order, `None` if too long.
    pub(super) fn flatten(&self, pid: usize) -> Option<Vec<StepInstance>> {
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
    pub(super) fn static_footprint(&self, pid: usize) -> Vec<(SyncAccess, bool, Pos)> {
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
    pub(super) fn independent(&self, st: &mut State, pid: usize, red: Reduction) -> bool {
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
                // Flags are zero at set-up: a wait for 0 passes on the initial value.
                let v = eval(val, e, *c);
                v == 0
                    || st.flags[r].get(idx).is_some_and(|h| h.iter().any(|(x, _)| *x >= v))
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
                st.hs.get(key).map_or(0, |cell| cell.flag) == eval(val, e, 0) || av.hs.contains(key)
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::explore::Rng;

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
