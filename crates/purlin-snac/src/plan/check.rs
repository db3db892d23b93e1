//! The structural (well-formedness) checks of one plan ([`Plan::check`]) and of a call's plan
//! set ([`check_set`]).

use std::collections::BTreeSet;

use super::{Alias, EpochVal, Guard, Index, Len, Notify, Plan, PlanError, Region, Share, Space, Step, fmt_path};
use crate::spec::SpecError;
use crate::types::ReduceOp;

impl Plan {
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
        self.check_engine().map_err(|what| PlanError::Other { rank, what })?;
        self.check_landed().map_err(|what| PlanError::Other { rank, what })?;
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

    pub(super) fn check_region(&self, r: &Region, len: &Len, (lo, hi): (u64, u64)) -> Result<(), String> {
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

    pub(super) fn check_notify(&self, n: &Notify, range: (u64, u64)) -> Result<(), String> {
        self.check_peer(n.peer)?;
        self.check_index(&n.flag, self.resources.flag_words, range, "flag")?;
        self.check_val(&n.value, range)
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
        for n in p.engine.iter().flat_map(|e| e.notifies()) {
            flags[n.peer as usize].insert(n.flag.at(0));
        }
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
