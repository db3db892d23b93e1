//! The one-copy path, where every rank's output (copy collectives: AllGather, AllToAll and
//! their V forms, [`PlanConfig::peer_outputs`]) or input (ReduceScatter and its V form,
//! [`PlanConfig::peer_inputs`]; AllReduce: both) is registered symmetric memory.
//!
//! Staged, every byte crosses two copies: the writer's into the reader's staging (or its own),
//! the reader's out of it into the output. With outputs every rank can address, a writer
//! stores its bytes straight into each destination's output (`Space::PeerOutput`), so each
//! byte is copied once, and no slots, drains or readers are needed: one role, `Producer`,
//! whose `B = blocks_per_role` blocks each take a `chunk_bytes / B` slice of every chunk of
//! every transfer (this rank's own part, out of place, is a local copy like any other).
//! Reductions pull instead: each rank reduces the part of the output it owns straight from
//! every rank's input, and an AllReduce stores its reduced shard into every peer's output.
//!
//! Two notifications per pair of ranks bound every access to a peer's buffers to the call
//! (flags `E + 1`, advance 1):
//! - *entry*: block 0 of every rank signals each peer at entry. A peer's buffers are this
//!   call's only once the peer's stream has reached it (before that, its earlier work may
//!   still read its output, or not yet have written its input), so every block waits for a
//!   peer's entry before its first access there (at chunk 0).
//! - *done*: every block arrives on one counter after its last access; the last arrival
//!   signals each peer. Block 0 waits for every peer's done before it exits, so when this
//!   rank's kernel ends its output is complete and no peer reads its input any more.
//!
//! Flags: the last two words of the signalling rank's segment are `entry` and `done`. The
//! verifier models the first rule as the owner's host writing its input and output at launch
//! (an access not ordered after it is a race or a readiness violation) and the second through
//! the output check at the owner's kernel end and the host's next write.

use super::{PlanConfig, empty_non_v, empty_plan};
use crate::plan::{
    Advance, BlockProgram, EpochVal, Guard, Index, Len, Notify, NotifyKind, Offset, Plan, Region, Role, Step,
};
use crate::spec::{Collective, CollectiveSpec};
use crate::types::{ConsumeOp, Regime};

use super::DeriveError;

/// One rank's bytes bound for one destination: `len` bytes from `src` in this rank's input
/// to `dst` in the destination's output.
struct Transfer {
    to: u32,
    src: u64,
    dst: u64,
    len: u64,
}

/// What `rank` sends: its own part first (a local copy that needs no peer's entry, so it runs
/// while the peers' entry signals are in flight; round 83), then destination by destination
/// from `rank + 1` on (so that at world > 2 ranks start on different links); in place, the
/// own part of an AllGather is already where it belongs.
fn transfers(spec: &CollectiveSpec, cfg: &PlanConfig, rank: u32) -> Vec<Transfer> {
    let world = spec.world;
    let mut out = vec![];
    for step in 0..world {
        let to = (rank + step) % world;
        if to == rank && cfg.in_place {
            continue;
        }
        for seg in spec.segments(to) {
            let (from, src) = seg.sources[0];
            if from == rank && seg.len > 0 {
                out.push(Transfer { to, src, dst: seg.out_offset, len: seg.len });
            }
        }
    }
    out
}

/// The one-copy entry and done flags: the last two words of the signalling rank's segment
/// (`flag_segment`), which staged plans leave free: a rank that runs a staged plan against
/// this one (its buffers were not symmetric) never takes these signals for its own, so the
/// call times out. Copy-engine plans use the same words, so the datapaths can alternate.
#[derive(Clone, Copy)]
struct OneCopyFlags {
    segment: u32,
}

impl OneCopyFlags {
    fn new(cfg: &PlanConfig, world: u32) -> Result<Self, DeriveError> {
        let segment = super::flag_segment(cfg, world);
        if segment < super::ONE_COPY_FLAGS {
            return Err(DeriveError::FlagsTooFew {
                need: super::ONE_COPY_FLAGS as u64 * world as u64,
                have: cfg.flag_words,
            });
        }
        Ok(Self { segment })
    }

    /// Rank `from`'s "my output is free" signal.
    fn entry(self, from: u32) -> Index {
        Index::fixed((from + 1) * self.segment - 2)
    }

    /// Rank `from`'s "my stores into your output are done" signal.
    fn done(self, from: u32) -> Index {
        Index::fixed((from + 1) * self.segment - 1)
    }
}

/// Every rank's done flag, in rank order (empty where the flag words hold no one-copy flags).
pub(super) fn done_flags(cfg: &PlanConfig, world: u32) -> Vec<Index> {
    OneCopyFlags::new(cfg, world).map(|f| (0..world).map(|q| f.done(q)).collect()).unwrap_or_default()
}

pub(super) fn derive(spec: &CollectiveSpec, cfg: &PlanConfig, rank: u32) -> Result<Plan, DeriveError> {
    let world = spec.world;
    let mut plan = empty_plan(spec, cfg, rank, Regime::Throughput, Some(cfg.staging_side));
    plan.one_copy = true;
    if empty_non_v(spec) {
        return Ok(plan);
    }
    let blocks = cfg.blocks_per_role;
    if blocks > cfg.max_coresident_blocks {
        return Err(DeriveError::TooManyBlocks { need: blocks as u64, bound: cfg.max_coresident_blocks });
    }
    let flags = OneCopyFlags::new(cfg, world)?;
    let (segment, entry, done) = (flags.segment, |from: u32| flags.entry(from), |from: u32| flags.done(from));
    let once = EpochVal::at(1);
    let peers = || (0..world).filter(move |&q| q != rank);
    let wait_entry = |q: u32| Step::Wait { flag: entry(q), value: once, guard: Guard::new(0, 1) };
    let cut = Cut { c: cfg.chunk_bytes, slice: cfg.chunk_bytes / blocks as u64 };

    for b in 0..blocks {
        let mut steps = vec![];
        if b == 0 {
            for q in peers() {
                let notify = Notify { kind: NotifyKind::Ready, peer: q, flag: entry(rank), value: once };
                steps.push(Step::Signal { notify, guard: Guard::ALWAYS });
            }
        }
        let (trips, body) = if spec.collective.consume_op() == ConsumeOp::Reduce {
            reduce_body(spec, rank, b, cut, &wait_entry, true)
        } else {
            gather_body(spec, cfg, rank, b, cut, &wait_entry)
        };
        if trips > 0 {
            steps.push(Step::ChunkLoop { trips, body });
        }
        let then = peers().map(|q| Notify { kind: NotifyKind::Ready, peer: q, flag: done(rank), value: once });
        steps.push(Step::Arrive {
            counter: Index::fixed(0),
            arrivals: blocks,
            then: then.collect(),
            guard: Guard::ALWAYS,
            reset: None,
        });
        if b == 0 {
            for q in peers() {
                steps.push(Step::Wait { flag: done(q), value: once, guard: Guard::ALWAYS });
            }
        }
        plan.blocks.push(BlockProgram { role: Role::Producer, steps });
    }
    plan.resources.flag_words = world * segment;
    plan.resources.counter_words = 1;
    plan.advance = Advance::Fixed(1);
    Ok(plan)
}

/// Chunks of `c` bytes, of which each block takes a `slice`.
#[derive(Clone, Copy)]
struct Cut {
    c: u64,
    slice: u64,
}

impl Cut {
    /// Block `b`'s slice of every chunk of `len` bytes from `base`.
    fn offset(self, base: u64, b: u32) -> Offset {
        Offset::fixed(base + b as u64 * self.slice).chunk(self.c)
    }
    fn len(self, len: u64, b: u32) -> Len {
        Len::slice(self.slice, len, b as u64 * self.slice, self.c)
    }
}

/// A copy collective: every transfer of this rank, chunk by chunk, each destination's entry
/// awaited before the first store there.
fn gather_body(
    spec: &CollectiveSpec,
    cfg: &PlanConfig,
    rank: u32,
    b: u32,
    cut: Cut,
    wait_entry: &dyn Fn(u32) -> Step,
) -> (u64, Vec<Step>) {
    let sends = transfers(spec, cfg, rank);
    let trips = sends.iter().map(|t| t.len.div_ceil(cut.c)).max().unwrap_or(0);
    let mut body = vec![];
    let mut waited = vec![false; spec.world as usize];
    for t in &sends {
        let dst = if t.to == rank {
            Region::output(cut.offset(t.dst, b))
        } else {
            if !std::mem::replace(&mut waited[t.to as usize], true) {
                body.push(wait_entry(t.to));
            }
            Region::peer_output(t.to, cut.offset(t.dst, b))
        };
        let src = Region::input(cut.offset(t.src, b));
        body.push(Step::Gather { dst, src, len: cut.len(t.len, b), expect: None, guard: Guard::ALWAYS });
    }
    (trips, body)
}

/// A reduction that pulls (ReduceScatter, its V form, and the AllReduce two-shot like
/// PyTorch's symmetric-memory `two_shot_all_reduce_`): rank `r` reduces each segment of its
/// output it owns (a ReduceScatter: all of it; an AllReduce: shard `r`) straight from every
/// rank's input, in rank order, after that rank's entry (its input then holds this call's
/// data); an AllReduce then stores the reduced shard into every peer's output where `push` is
/// set (not where the copy engines do that, `derive_ce`). Only rank `r` reads or writes its
/// part of any buffer, so parts never race.
fn reduce_body(
    spec: &CollectiveSpec,
    rank: u32,
    b: u32,
    cut: Cut,
    wait_entry: &dyn Fn(u32) -> Step,
    push: bool,
) -> (u64, Vec<Step>) {
    let all_reduce = spec.collective == Collective::AllReduce;
    let (lo, hi) = if all_reduce {
        let (off, len) = spec.shard(rank);
        (off, off + len)
    } else {
        (0, u64::MAX)
    };
    let mut body: Vec<Step> = (0..spec.world).filter(|&q| q != rank).map(wait_entry).collect();
    let mut trips = 0;
    for seg in spec.segments(rank) {
        let (a, z) = (seg.out_offset.max(lo), (seg.out_offset + seg.len).min(hi));
        if a >= z {
            continue;
        }
        let (len, skip) = (z - a, a - seg.out_offset);
        trips = trips.max(len.div_ceil(cut.c));
        let at = cut.offset(a, b);
        let srcs = seg.sources.iter().map(|&(q, off)| {
            let o = cut.offset(off + skip, b);
            if q == rank { Region::input(o) } else { Region::peer_input(q, o) }
        });
        let len = cut.len(len, b);
        body.push(Step::Reduce {
            dst: Region::output(at),
            srcs: srcs.collect(),
            len,
            expect: None,
            guard: Guard::ALWAYS,
        });
        if all_reduce && push {
            for step in 1..spec.world {
                let dst = Region::peer_output((rank + step) % spec.world, at);
                body.push(Step::Gather { dst, src: Region::output(at), len, expect: None, guard: Guard::ALWAYS });
            }
        }
    }
    (trips, body)
}

/// A one-copy call on the copy engines (docs/perf/copy-engines.md §3.2). A copy collective:
/// the entry kernel (one block, `CeEntry`) signals every peer's entry flag and waits, bounded,
/// for the entry of every peer it copies to; the engine program then copies every transfer of
/// this rank in one batch and notifies each peer's done flag; the exit kernel (one block,
/// `CeExit`) waits for every peer's done. An AllReduce: see [`ce_all_reduce`]. The flags and
/// values are the SM one-copy plan's (`entry`, `done`, `E + 1`, advance 1), so calls of either
/// datapath follow each other on the same words.
pub(super) fn derive_ce(spec: &CollectiveSpec, cfg: &PlanConfig, rank: u32) -> Result<Plan, DeriveError> {
    use crate::plan::{EngineProgram, EngineStep, Phase};
    let world = spec.world;
    let mut plan = empty_plan(spec, cfg, rank, Regime::Throughput, Some(cfg.staging_side));
    plan.one_copy = true;
    if empty_non_v(spec) {
        return Ok(plan);
    }
    let all_reduce = spec.collective == Collective::AllReduce;
    // The entry kernel's blocks and the exit kernel's one.
    let need = if all_reduce { cfg.blocks_per_role + 1 } else { 2 };
    if cfg.max_coresident_blocks < need {
        return Err(DeriveError::TooManyBlocks { need: need as u64, bound: cfg.max_coresident_blocks });
    }
    let flags = OneCopyFlags::new(cfg, world)?;
    let (segment, entry, done) = (flags.segment, |from: u32| flags.entry(from), |from: u32| flags.done(from));
    let once = EpochVal::at(1);
    let peers = || (0..world).filter(move |&q| q != rank);
    let signals: Vec<Step> = peers()
        .map(|q| Step::Signal {
            notify: Notify { kind: NotifyKind::Ready, peer: q, flag: entry(rank), value: once },
            guard: Guard::ALWAYS,
        })
        .collect();
    let (heads, mut steps) = if all_reduce {
        ce_all_reduce(spec, cfg, rank, signals, &|q| Step::Wait {
            flag: entry(q),
            value: once,
            guard: Guard::new(0, 1),
        })
    } else {
        let mut head = signals;
        let sends = transfers(spec, cfg, rank);
        // A peer's output is this call's once the peer has entered it: wait for each peer that
        // this rank's copies write to (the done flags order everything else).
        let mut to: Vec<u32> = sends.iter().filter(|t| t.to != rank).map(|t| t.to).collect();
        to.dedup();
        head.extend(to.into_iter().map(|q| Step::Wait { flag: entry(q), value: once, guard: Guard::ALWAYS }));
        let copies = sends
            .into_iter()
            .map(|t| EngineStep::Copy {
                dst: if t.to == rank {
                    Region::output(Offset::fixed(t.dst))
                } else {
                    Region::peer_output(t.to, Offset::fixed(t.dst))
                },
                src: Region::input(Offset::fixed(t.src)),
                len: Len::fixed(t.len),
                guard: Guard::ALWAYS,
            })
            .collect();
        (vec![head], copies)
    };
    let tail: Vec<Step> = peers().map(|q| Step::Wait { flag: done(q), value: once, guard: Guard::ALWAYS }).collect();
    steps.extend(
        peers().map(|q| EngineStep::Notify(Notify { kind: NotifyKind::Ready, peer: q, flag: done(rank), value: once })),
    );
    plan.blocks.extend(heads.into_iter().map(|steps| BlockProgram { role: Role::CeEntry, steps }));
    plan.blocks.push(BlockProgram { role: Role::CeExit, steps: tail });
    plan.engine = Some(EngineProgram { after: Phase::Sequential, steps });
    plan.resources.flag_words = world * segment;
    plan.resources.ce_value_words = world - 1;
    plan.advance = Advance::Fixed(1);
    Ok(plan)
}

/// The composed AllReduce with its gather half on the copy engines: the entry kernel is the
/// SM one-copy AllReduce's reduce half, `B = blocks_per_role` blocks (block 0 signals every
/// peer's entry first, `signals`), each waiting for every peer's entry before it reads that
/// peer's input and reducing its slice of this rank's shard into this rank's output
/// ([`reduce_body`] without the push). The engine program then copies the reduced shard from
/// this rank's output into every peer's output, one batch, from `rank + 1` on. It runs after
/// the whole entry kernel (sequential), so it never reads a byte of the shard before the
/// reduce wrote it, and a peer's done (after its copies) also comes after its reads of this
/// rank's input. Returns the entry kernel's block programs and the engine's copies.
fn ce_all_reduce(
    spec: &CollectiveSpec,
    cfg: &PlanConfig,
    rank: u32,
    signals: Vec<Step>,
    wait_entry: &dyn Fn(u32) -> Step,
) -> (Vec<Vec<Step>>, Vec<crate::plan::EngineStep>) {
    let blocks = cfg.blocks_per_role.max(1);
    let cut = Cut { c: cfg.chunk_bytes, slice: cfg.chunk_bytes / blocks as u64 };
    let mut signals = Some(signals);
    let heads = (0..blocks)
        .map(|b| {
            let mut steps = if b == 0 { signals.take().unwrap_or_default() } else { vec![] };
            let (trips, body) = reduce_body(spec, rank, b, cut, wait_entry, false);
            if trips > 0 {
                steps.push(Step::ChunkLoop { trips, body });
            }
            steps
        })
        .collect();
    let (off, len) = spec.shard(rank);
    let copies = if len == 0 {
        vec![]
    } else {
        (1..spec.world)
            .map(|step| crate::plan::EngineStep::Copy {
                dst: Region::peer_output((rank + step) % spec.world, Offset::fixed(off)),
                src: Region::output(Offset::fixed(off)),
                len: Len::fixed(len),
                guard: Guard::ALWAYS,
            })
            .collect()
    };
    (heads, copies)
}
