//! The model's tables (`Model`: the calls' plans, who each process is, the footprints and
//! flattened programs the reduction reads) and its states (`State`: every process's position,
//! the ranks' synchronization words and memory with their vector clocks, each call's
//! progress), fingerprinted for the exhaustive search's state cache.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::rc::Rc;

use super::mem::{Access, IMap};
use super::reduction::{Pos, StepInstance, SyncAccess};
use super::{max_epoch_offset, senses};
use crate::plan::{EpochVal, Plan};

/// Per-process position and registers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub(super) struct ProcessState {
    /// 0 not launched, 1 running, 2 done.
    pub(super) st: u8,
    pub(super) top: u32,
    pub(super) c: u64,
    pub(super) body: u32,
    pub(super) e: u64,
    pub(super) agreed: u64,
}

/// A handshake word (`(rank, address)` in [`State::hs`]): its value and flag, the vector clock
/// of its last store, and the accesses the race check compares later ones with.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Cell {
    pub(super) value: u64,
    pub(super) flag: u64,
    pub(super) vc: Rc<Vec<u32>>,
    pub(super) writer: Access,
    pub(super) readers: Vec<Access>,
}

/// A vector clock, one entry per process; shared until a join changes it.
pub(super) type VectorClock = Rc<Vec<u32>>;

/// One state of the model: every process's position, the ranks' synchronization words and
/// memory with their vector clocks, and each call's progress.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct State {
    pub(super) ps: Vec<ProcessState>,
    pub(super) vc: Vec<VectorClock>,
    /// `[rank]`, word → the stores in modification order (sparse: plans place their flags in
    /// per-writer segments of a large flag area).
    pub(super) flags: Vec<BTreeMap<u32, Vec<(u64, VectorClock)>>>,
    pub(super) ctrs: Vec<Vec<(u64, VectorClock)>>,
    pub(super) epochs: Vec<Vec<u64>>,
    /// `[rank][space]`: 0 input, 1 output, 2 staging, 3 window.
    pub(super) mem: Vec<[IMap; 4]>,
    pub(super) hs: BTreeMap<(u32, u64), Cell>,
    /// Per rank: the call running (or next to launch).
    pub(super) cur: Vec<u32>,
    /// Per call: the epoch every rank must end at.
    pub(super) adv: Vec<Option<u64>>,
    pub(super) exits: Vec<Option<VectorClock>>,
    /// Which blocked processes cannot have become enabled (not part of the state).
    pub(super) wake: Wake,
}

/// A cache for [`Model::closure`]: a process found blocked stays blocked until the
/// synchronization state of a rank it waits on changes, so the closure re-evaluates only
/// processes whose rank's version moved since. It is derived from the state it travels with
/// and never changes what the closure does, so it is left out of equality and fingerprints.
#[derive(Debug, Clone, Default)]
pub(super) struct Wake {
    /// Per rank: bumped whenever its flags, memory or handshake cells change.
    pub(super) version: Vec<u64>,
    /// Per process: what it was blocked on when last evaluated, if it was.
    pub(super) blocked: Vec<Option<Blocked>>,
}

/// What a blocked process waits on, and that version when it was found blocked.
#[derive(Debug, Clone, Copy)]
pub(super) enum Blocked {
    /// A rank's synchronization state, at the version it had.
    Rank(u32, u64),
    /// Not launched yet, or finished: only a launch changes that.
    Idle,
}

impl Wake {
    fn new(ranks: usize, processes: usize) -> Self {
        Wake { version: vec![0; ranks], blocked: vec![None; processes] }
    }

    pub(super) fn touch(&mut self, rank: usize) {
        self.version[rank] += 1;
    }

    pub(super) fn still_blocked(&self, pid: usize) -> bool {
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
    pub(super) fn fingerprint(&self) -> (u64, u64) {
        let mut h = FingerprintHasher(0x243f_6a88_85a3_08d3, 0x1319_8a2e_0370_7344);
        self.hash(&mut h);
        (h.0, h.1)
    }
}

/// A fast two-lane 128-bit hasher for state fingerprints.
pub(super) struct FingerprintHasher(pub(super) u64, pub(super) u64);

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

pub(super) struct Model<'a> {
    pub(super) calls: &'a [Vec<Plan>],
    /// Per process: every synchronization access it can make, `(object, is_write, last
    /// position at which it can happen)`.
    pub(super) foot: Vec<Vec<(SyncAccess, bool, Pos)>>,
    pub(super) world: usize,
    /// `base[k][r]`: pid of block 0 of call `k` on rank `r`.
    pub(super) base: Vec<Vec<usize>>,
    /// `(call, rank, block)` of each pid.
    pub(super) who: Vec<(usize, usize, usize)>,
    pub(super) nclock: usize,
    pub(super) maxoff: Vec<Vec<i128>>,
    pub(super) sense: Vec<u64>,
    /// Per process: its flattened program, when short enough.
    pub(super) prog: Option<Vec<Vec<StepInstance>>>,
    /// `[call][rank]`: output bytes the semantic check skips (written only in chunks the
    /// twin drops).
    pub(super) skip: Vec<Vec<Vec<(u64, u64)>>>,
}

pub(super) fn join(a: &mut VectorClock, b: &[u32]) {
    if a.iter().zip(b).any(|(x, y)| y > x) {
        let a = Rc::make_mut(a);
        for (x, y) in a.iter_mut().zip(b) {
            *x = (*x).max(*y);
        }
    }
}

pub(super) fn eval(v: &EpochVal, e: u64, c: u64) -> u64 {
    v.eval(e, c).unwrap_or(0)
}

impl<'a> Model<'a> {
    pub(super) fn new(calls: &'a [Vec<Plan>]) -> Self {
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

    pub(super) fn plan(&self, k: usize, r: usize) -> &Plan {
        &self.calls[k][r]
    }

    pub(super) fn init(&self) -> State {
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
}
