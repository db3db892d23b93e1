//! The transition semantics: a call's launch, each step's effect on the state (data reads and
//! writes with their race, readiness and reuse checks; flag stores, waits, arrivals,
//! handshakes), a block's exit, and the checks when a rank's call ends (uniform advance,
//! all-pairs dependency, output semantics).

use std::rc::Rc;

use super::explore::TraceEvent;
use super::mem::{self, Access, IMap, ShareTag, Term};
use super::state::{Blocked, Cell, Model, ProcessState, State, VectorClock, eval, join};
use super::{Property, Violation, twin, viol};
use crate::plan::{Advance, Alias, Region, Space, Step};
use crate::types::{ConsumeOp, ReductionMode};

impl Model<'_> {
    fn host(&self, r: usize) -> usize {
        self.who.len() + r
    }

    /// Launches rank `r`'s call `cur[r]`: the host writes fresh inputs after the previous
    /// kernel, and the blocks start after that.
    pub(super) fn launch(&self, st: &mut State, r: usize) {
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
    pub(super) fn current<'p>(&'p self, st: &mut State, pid: usize) -> Option<(&'p Step, u64)> {
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

    pub(super) fn label(&self, pid: usize, s: &Step, c: u64) -> String {
        let (k, r, b) = self.who[pid];
        format!("call {k} rank {r} block {b} c={c}: {s}")
    }

    /// Resolves a region to `(rank, space index, start, end)`.
    pub(super) fn loc(&self, pid: usize, reg: &Region, len: u64, c: u64, e: u64) -> (usize, usize, u64, u64) {
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

    pub(super) fn who_s(&self, pid: u32) -> String {
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
        self.within_owners_call(st, pid, rank, sp)?;
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
        self.within_owners_call(st, pid, rank, sp)?;
        if sp == 0 && self.plan(k as usize, rank).resources.alias.is_none() {
            return Err(viol(
                Property::ReadOnlyInput,
                format!(
                    "{} writes {}, read-only in an out-of-place call",
                    self.who_s(pid as u32),
                    Self::space_s(rank, sp)
                ),
            ));
        }
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

    /// An access to rank `rank`'s input or output (`sp` 0 or 1) by a process of another rank
    /// after `rank` ended that call: it cannot happen before the owner's exit, whatever the
    /// clocks say (accesses made before the exit are checked against its clock when the
    /// kernel ends, [`Model::kernel_end`]). Both checks together do not depend on which came
    /// first in the exploration.
    fn within_owners_call(&self, st: &State, pid: usize, rank: usize, sp: usize) -> Result<(), Violation> {
        let (k, r, _) = self.who[pid];
        if sp < 2 && r != rank && st.cur[rank] as usize > k {
            return Err(viol(
                Property::Race,
                format!(
                    "{} accesses {} after rank {rank} ended call {k}",
                    self.who_s(pid as u32),
                    Self::space_s(rank, sp)
                ),
            ));
        }
        Ok(())
    }

    /// Whether all packets of a window location carry `flag`.
    pub(super) fn packets_ready(st: &State, l: (usize, usize, u64, u64), flag: u64) -> bool {
        let (rank, sp, a, b) = l;
        // A packet never put holds the zeroed window: flag 0.
        a == b || st.mem[rank][sp].overlapping(a, b).iter().all(|s| s.flag.unwrap_or(0) == flag)
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
    pub(super) fn status(&self, st: &mut State, pid: usize) -> Option<bool> {
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
                // Flags are zero at set-up: a wait for 0 is satisfied by the initial value.
                let v = eval(value, e, c);
                let ok = v == 0 || st.flags[r].get(&flag.at(c)).is_some_and(|h| h.iter().any(|(x, _)| *x >= v));
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
                // A cell never written holds the zeroed window: flag 0.
                let key = (r as u32, src.at(0, e & 1));
                if st.hs.get(&key).map_or(0, |cell| cell.flag) != eval(expect, e, 0) {
                    Err(on_rank(st, r))
                } else {
                    Ok(false)
                }
            }
            _ => Ok(false),
        }
    }

    /// Takes process `pid`'s current step (or its exit).
    pub(super) fn fire(&self, st: &mut State, pid: usize, trace: &mut Vec<TraceEvent>) -> Result<(), Violation> {
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
                // The first store whose value satisfies the wait: the initial zero (no edge)
                // where the wait is for 0.
                let v = eval(value, e, c);
                let h = st.flags[r].get(&flag.at(c)).map_or(&[][..], |h| &h[..]);
                if v == 0 {
                } else if let Some((_, x)) = h.iter().find(|(x, _)| *x >= v) {
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
            Step::HandshakeWait { src, expect, .. } => {
                let key = (r as u32, src.at(0, e & 1));
                let expect = eval(expect, e, 0);
                // A wait for 0 may read the zeroed cell (value 0, no edge) before any send.
                if let Some(cell) = st.hs.get_mut(&key).filter(|cell| expect != 0 || cell.flag == 0) {
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
        let mut end: VectorClock = Rc::new(vec![0; self.nclock]);
        for b in 0..grid {
            if let Some(x) = &st.exits[self.base[k][r] + b] {
                join(&mut end, x);
            }
        }
        // Every access by another rank to this rank's buffers so far (its output complete,
        // its input read) happens before this kernel's end: by the clocks, not by the order
        // the exploration took (later accesses: `within_owners_call`).
        for (sp, m) in st.mem[r][..2].iter().enumerate() {
            for s in &m.segs {
                let accesses = s.writer.iter().chain(&s.cowriters).chain(&s.readers);
                for &(q, t) in accesses {
                    let q = q as usize;
                    if q < self.who.len() && self.who[q].1 != r && t > end[q] {
                        return Err(viol(
                            Property::Race,
                            format!(
                                "{} accesses {} [{}, {}) not ordered before rank {r}'s end of call {k}",
                                self.who_s(q as u32),
                                Self::space_s(r, sp),
                                s.start,
                                s.end
                            ),
                        ));
                    }
                }
            }
        }
        if grid > 0 {
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
}
