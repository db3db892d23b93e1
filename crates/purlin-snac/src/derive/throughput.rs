//! The throughput regime: stage, signal, consume, chunk by chunk (docs/design.md §3.1).
//!
//! Terms: a *transfer* moves a partition from a writer rank `p` to a reader rank `q` in a
//! phase (phase 1 is the tail of the composed AllReduce). Its chunks are `C = chunk_bytes`
//! bytes; block `b` of a role's `B` blocks moves the slice `[b*C/B, (b+1)*C/B)` of every
//! chunk. Writers (Producer) and readers (Consumer, Head, Tail) may have different `B`.
//!
//! *Lanes*: every chunk is cut into `L` lanes of `C/L` bytes (`PlanConfig::lanes`, a divisor
//! of both sides' block counts, by default their greatest common divisor), and
//! each lane is signalled and drained on its own: the writers of lane `l` (blocks
//! `[l*Bw/L, (l+1)*Bw/L)`) arrive on the lane's counter, the last signals the lane's ready
//! word; the readers of lane `l` wait on it, arrive on their lane counter, the last drains.
//! Lanes nest the slices of both sides, so no reader waits for bytes outside its lane. Why:
//! on NVLink some writer blocks push faster than others, and a chunk signalled whole makes
//! every reader wait for the slowest writer and every writer for the slowest reader's drain
//! (a 256 MiB AllGather on 2×H200: producers waited 27–95 µs per call on drains). One lane
//! per writer block removes those waits but lets lanes drift apart, so the slowest lane ends
//! the call; 2 lanes measured best of 1/2/4/16 with fixed slices (results/INDEX.md, rounds
//! 19–21).
//!
//! *Shared stages* (`PlanConfig::share_piece > 0` and more than one writer per lane): the
//! writers of a lane do not take fixed slices; each runs one `Stage` of the lane's whole
//! slice with a [`Share`], taking `share_piece`-byte pieces from a ticket word, so the blocks
//! NVLink serves faster copy more and a lane's writers finish together. Tickets are counter
//! words placed after the arrival counters (one per producer counter word), reset by the
//! lane's `Arrive`.
//!
//! Staging of every rank: two sense halves of `H = staging_bytes / 2`; each half holds `areas`
//! areas of `slots` slots of `C` bytes. Chunk `c` of a transfer lives in slot `c % slots` of
//! its area, in the half selected by the sense. Pull (staging on the writer's side): the writer
//! owns one area per reader, or a single area every reader pulls from when all readers need the
//! same bytes (AllGather, direct AllReduce, the composed AllReduce's published shard). Push
//! (the reader's side): the reader owns one area per writer.
//!
//! Flags of every rank (u64 words) lie in one segment per writer rank ([`super::flag_segment`]
//! words each, whatever the plan): in peer `p`'s segment, `ready[phase][lane][slot]` (`p`
//! wrote the chunk) then `drain[phase][lane][slot]` (`p` read it), lanes counted to the
//! largest phase's; in the rank's own segment, its "staged" words. So a flag word always has
//! the same writer: with a layout that depended on the plan, a peer already in the next call
//! (of other slots or lanes) could store into the word a rank still waits on for another
//! peer, and release the wait before that peer's data (the verifier's
//! `calls_of_different_geometry_keep_their_flags_apart`). A reader waits on its ready word for
//! the writer, the writer on its drain word for the reader. Chunk `c` sets both to `E + c + 1`;
//! a writer about to overwrite slot `c % slots` with chunk `c >= slots` waits for the drain of
//! chunk `c - slots`, i.e. `>= E + c + 1 - slots`. Transfers with `chunks <= slots` are
//! resident (no drains): the sense halves alternate (odd advance) and every call ties every
//! pair of ranks, so no rank gets two calls ahead of a reader (docs/design.md §3.3).
//!
//! Counters (local): `prod[phase][stream][lane][slot]` for the writers' arrivals,
//! `cons[phase][peer][lane][slot]` for the readers' arrivals before a drain. Each lane's blocks
//! (of the arriving role) arrive; the last notifies.

use super::{DeriveError, PlanConfig, add_handshake, compact, empty_non_v, empty_plan, two_shot};
use crate::plan::{
    Advance, BlockProgram, EpochVal, Guard, Index, Len, Notify, NotifyKind, Offset, Plan, Region, Role, Share, Step,
};
use crate::spec::{Collective, CollectiveSpec};
use crate::types::{ConsumeOp, Regime, StagingSide};

/// How one side (writers or readers) cuts every chunk: `blocks` slices of `slice` bytes.
#[derive(Clone, Copy)]
struct Cut {
    blocks: u32,
    slice: u64,
}

struct Ctx<'a> {
    spec: &'a CollectiveSpec,
    world: u32,
    /// The writers' cut (Producer blocks).
    wr: Cut,
    /// The readers' cut (Consumer, Head and Tail blocks).
    rd: Cut,
    c: u64,
    half: u64,
    slots: u64,
    phases: u32,
    /// Lanes of each phase (phase 1: the composed AllReduce's Head -> Tail).
    lanes: [u32; 2],
    /// The most lanes of any phase (the flag and counter layout's stride).
    lmax: u32,
    pull: bool,
    composed: bool,
    /// A direct AllReduce in place: readers overwrite the input the rank's own writers
    /// stage, so each lane's writers also signal this rank ("staged") per stream, and its
    /// readers wait for that before they reduce.
    overwrites_input: bool,
    bcast0: bool,
    areas0: u64,
    /// Shared producer stages: piece bytes, and where the ticket words start.
    share: Option<(u64, u32)>,
    /// Flag words per writer rank ([`super::flag_segment`]).
    segment: u32,
}

impl Ctx<'_> {
    fn w1(&self) -> u32 {
        self.world - 1
    }
    fn chunks(&self, n: u64) -> u64 {
        n.div_ceil(self.c)
    }
    fn bcast(&self, phase: u32) -> bool {
        self.pull && (phase == 1 || self.bcast0)
    }
    /// Phase-0 bytes `src` sends `dst` and their offset in `src`'s input.
    fn send(&self, src: u32, dst: u32) -> (u64, u64) {
        let s = self.spec;
        match s.collective {
            Collective::AllReduce if self.composed => s.shard(dst),
            Collective::AllReduce => (0, s.input_bytes(src)),
            Collective::AllGather | Collective::AllGatherV => (0, s.pair_bytes(src, dst)),
            _ => (s.partition_offset(src, dst, true), s.pair_bytes(src, dst)),
        }
    }
    /// Bytes of transfer `(phase, p -> q)`.
    fn bytes(&self, phase: u32, p: u32, q: u32) -> u64 {
        if phase == 0 { self.send(p, q).1 } else { self.spec.shard(p).1 }
    }
    /// Staging slice of block `b` (of a role cut by `cut`) for transfer `(phase, p -> q)`.
    fn staging(&self, phase: u32, p: u32, q: u32, b: u32, cut: Cut) -> Region {
        let (owner, area) = if self.pull {
            let base = if phase == 0 { 0 } else { self.areas0 };
            (p, base + if self.bcast(phase) { 0 } else { compact(p, q) as u64 })
        } else {
            (q, phase as u64 * self.w1() as u64 + compact(q, p) as u64)
        };
        Region::staging(
            owner,
            Offset {
                base: area * self.slots * self.c + b as u64 * cut.slice,
                chunk_stride: self.c,
                chunk_modulus: self.slots,
                sense_stride: self.half,
            },
        )
    }
    fn local(&self, off: u64, b: u32, cut: Cut) -> Offset {
        Offset::fixed(off + b as u64 * cut.slice).chunk(self.c)
    }
    fn len(&self, n: u64, b: u32, cut: Cut) -> Len {
        Len::slice(cut.slice, n, b as u64 * cut.slice, self.c)
    }
    /// Flag or counter word `group` (phase, peer or stream), `lane`, cycling over the slots.
    fn word(&self, group: u32, lane: u32) -> Index {
        let base = (group as u64 * self.lmax as u64 + lane as u64) * self.slots;
        Index::cyclic(base as u32, self.slots as u32)
    }
    /// Flag word `group`, `lane` (cycling over the slots) in the segment of writer rank `by`.
    fn flag(&self, by: u32, group: u32, lane: u32) -> Index {
        let w = self.word(group, lane);
        Index::cyclic(by * self.segment + w.base, w.chunk_modulus)
    }
    /// The ready word on `at` for `writer`: in the writer's segment (`at` is implied).
    fn ready(&self, phase: u32, _at: u32, writer: u32, lane: u32) -> Index {
        self.flag(writer, phase, lane)
    }
    /// The drain word on `at` (the writer) for `reader`: in the reader's segment.
    fn drain(&self, phase: u32, _at: u32, reader: u32, lane: u32) -> Index {
        self.flag(reader, self.phases + phase, lane)
    }
    /// This rank's "chunk staged" word of writer stream `stream` (direct AllReduce in place),
    /// in its own segment (no peer writes there).
    fn staged(&self, at: u32, stream: u32, lane: u32) -> Index {
        self.flag(at, stream, lane)
    }
    /// Writer streams of phase 0: one per peer, or one for all in a pulled broadcast.
    fn streams(&self) -> u32 {
        if self.bcast(0) { 1 } else { self.w1() }
    }
    fn prod(&self, phase: u32, stream: u32, lane: u32) -> Index {
        self.word(phase * self.w1() + stream, lane)
    }
    fn cons(&self, phase: u32, at: u32, writer: u32, lane: u32) -> Index {
        self.word((self.phases + phase) * self.w1() + compact(at, writer), lane)
    }
    /// The lane of block `b` of a side with `blocks` blocks, and how many blocks share it.
    fn lane(&self, phase: u32, blocks: u32, b: u32) -> (u32, u32) {
        let per = blocks / self.lanes[phase as usize];
        (b / per, per)
    }
    fn signal(&self, phase: u32, reader: u32, writer: u32, lane: u32) -> Notify {
        Notify {
            kind: NotifyKind::Ready,
            peer: reader,
            flag: self.ready(phase, reader, writer, lane),
            value: EpochVal::chunk(1),
        }
    }
    fn drain_to(&self, phase: u32, writer: u32, reader: u32, lane: u32) -> Notify {
        Notify {
            kind: NotifyKind::Drain,
            peer: writer,
            flag: self.drain(phase, writer, reader, lane),
            value: EpochVal::chunk(1),
        }
    }
    /// The writer's wait before overwriting a slot: drain of chunk `c - slots`.
    fn drain_wait(&self, phase: u32, writer: u32, reader: u32, lane: u32, ch: u64) -> Step {
        Step::Wait {
            flag: self.drain(phase, writer, reader, lane),
            value: EpochVal::chunk(1 - self.slots as i64),
            guard: Guard::new(self.slots, ch),
        }
    }
    fn ready_wait(&self, phase: u32, reader: u32, writer: u32, lane: u32, ch: u64) -> Step {
        Step::Wait {
            flag: self.ready(phase, reader, writer, lane),
            value: EpochVal::chunk(1),
            guard: Guard::new(0, ch),
        }
    }
    fn peers(&self, me: u32) -> impl Iterator<Item = u32> + use<> {
        (0..self.world).filter(move |&q| q != me)
    }
}

pub(super) fn derive(spec: &CollectiveSpec, cfg: &PlanConfig, rank: u32) -> Result<Plan, DeriveError> {
    let world = spec.world;
    let composed = spec.collective == Collective::AllReduce && two_shot(spec, cfg);
    let pull = cfg.staging_side == StagingSide::Own;
    let bcast0 = pull
        && (matches!(spec.collective, Collective::AllGather | Collective::AllGatherV)
            || (spec.collective == Collective::AllReduce && !composed));
    let phases: u32 = if composed { 2 } else { 1 };
    let w1 = (world - 1) as u64;
    let areas0 = if bcast0 { 1 } else { w1 };
    let areas = if pull { areas0 + if composed { 1 } else { 0 } } else { phases as u64 * w1 };
    let (c, half) = (cfg.chunk_bytes, cfg.staging_bytes / 2);
    let slots = (cfg.slots as u64).min(half / (areas * c));
    let mut plan = empty_plan(spec, cfg, rank, Regime::Throughput, Some(cfg.staging_side));
    if empty_non_v(spec) {
        return Ok(plan);
    }
    if slots == 0 {
        return Err(DeriveError::StagingTooSmall { have: cfg.staging_bytes, areas, chunk: c });
    }
    let (nb, nc) = (cfg.blocks_per_role, cfg.consumer_blocks());
    let roles: &[Role] =
        if composed { &[Role::Producer, Role::Head, Role::Tail] } else { &[Role::Producer, Role::Consumer] };
    let role_blocks = |role: Role| if role == Role::Producer { nb } else { nc };
    let grid: u64 = roles.iter().map(|&role| role_blocks(role) as u64).sum();
    if grid > cfg.max_coresident_blocks as u64 {
        return Err(DeriveError::TooManyBlocks { need: grid, bound: cfg.max_coresident_blocks });
    }
    let wr = Cut { blocks: nb, slice: c / nb as u64 };
    let rd = Cut { blocks: nc, slice: c / nc as u64 };
    // Phase 0: Producer -> readers; phase 1 (composed): Head -> Tail, both cut by `rd`.
    let lanes = [cfg.lanes(), nc];
    let lmax = if composed { lanes[0].max(lanes[1]) } else { lanes[0] };
    // Counter words (local): one group per (phase, stream) and per (phase, peer).
    let words = 2 * phases as u64 * w1 * lmax as u64 * slots;
    // Flag words of each writer's segment: ready then drain groups (or, in the rank's own
    // segment, its "staged" groups: one per stream, at most `w1`).
    let segment_words = 2 * phases as u64 * lmax as u64 * slots;
    // Shared stages' tickets follow the counters, one per producer counter word.
    let shared = cfg.share_piece > 0 && nb / lanes[0] > 1;
    let share = shared.then_some((cfg.share_piece, words as u32));
    let overwrites_input = spec.collective == Collective::AllReduce && !composed && cfg.in_place;
    let x = Ctx {
        spec,
        world,
        wr,
        rd,
        c,
        half,
        slots,
        phases,
        lanes,
        lmax,
        pull,
        composed,
        overwrites_input,
        bcast0,
        areas0,
        share,
        segment: super::flag_segment(cfg, world),
    };
    let own_words = if overwrites_input { x.streams() as u64 * lmax as u64 * slots } else { 0 };
    let segment_words = segment_words.max(own_words);
    if segment_words + super::ONE_COPY_FLAGS as u64 > x.segment as u64 {
        return Err(DeriveError::FlagsTooFew {
            need: (segment_words + super::ONE_COPY_FLAGS as u64) * world as u64,
            have: cfg.flag_words,
        });
    }
    plan.resources.flag_words = (world - 1) * x.segment + segment_words as u32;
    plan.resources.counter_words = if shared { 2 * words } else { words } as u32;

    let pairs = || (0..world).flat_map(|p| (0..world).filter(move |&q| q != p).map(move |q| (p, q)));
    let transfer_bytes =
        || pairs().flat_map(|(p, q)| (0..phases).map(move |ph| (ph, p, q))).map(|(ph, p, q)| x.bytes(ph, p, q));
    let needs_handshake = spec.collective.is_v() || transfer_bytes().any(|n| n == 0);
    let cmax = transfer_bytes().chain((0..world).map(|r| x.send(r, r).1)).map(|n| x.chunks(n)).max().unwrap_or(0);

    for &role in roles {
        for b in 0..role_blocks(role) {
            let body = match role {
                Role::Producer => producer(&x, rank, b),
                Role::Consumer => consumer(&x, cfg, rank, b),
                Role::Head => head(&x, rank, b),
                _ => tail(&x, rank, b),
            };
            let trips = body.iter().map(|s| s.guard().until).filter(|&u| u != u64::MAX).max().unwrap_or(0);
            let steps = if body.is_empty() { vec![] } else { vec![Step::ChunkLoop { trips, body }] };
            plan.blocks.push(BlockProgram { role, steps });
        }
    }
    plan.advance = if spec.collective.is_v() {
        Advance::AgreedMaxChunks { local: plan.max_trips() }
    } else {
        Advance::Fixed(cmax | 1)
    };
    if needs_handshake {
        let need = 2 * 16 * world as u64;
        if cfg.window_bytes < need {
            return Err(DeriveError::WindowTooSmall { have: cfg.window_bytes, need });
        }
        let agreed = matches!(plan.advance, Advance::AgreedMaxChunks { .. });
        add_handshake(&mut plan, 0, cfg.window_bytes / 2, agreed);
    }
    Ok(plan)
}

/// Phase-0 writer: stage each chunk slice, arrive, the lane's last arriver signals the readers.
fn producer(x: &Ctx, r: u32, b: u32) -> Vec<Step> {
    let mut steps = vec![];
    let (lane, per_lane) = x.lane(0, x.wr.blocks, b);
    let stream = |readers: Vec<u32>, stream: u32, steps: &mut Vec<Step>| {
        let ctr = x.prod(0, stream, lane);
        let (off, n) = x.send(r, readers[0]);
        let ch = x.chunks(n);
        if ch == 0 {
            return;
        }
        let g = Guard::new(0, ch);
        if ch > x.slots {
            steps.extend(readers.iter().map(|&q| x.drain_wait(0, r, q, lane, ch)));
        }
        let mut then: Vec<Notify> = readers.iter().map(|&q| x.signal(0, q, r, lane)).collect();
        if x.overwrites_input {
            then.push(Notify {
                kind: NotifyKind::Ready,
                peer: r,
                flag: x.staged(r, stream, lane),
                value: EpochVal::chunk(1),
            });
        }
        match x.share {
            // The lane's writers copy its whole slice together, taking pieces from a ticket.
            Some((piece, tickets)) => {
                let cut = Cut { blocks: x.lanes[0], slice: x.wr.slice * per_lane as u64 };
                let ticket = Index::cyclic(ctr.base + tickets, ctr.chunk_modulus);
                steps.push(Step::Stage {
                    dst: x.staging(0, r, readers[0], lane, cut),
                    src: Region::input(x.local(off, lane, cut)),
                    len: x.len(n, lane, cut),
                    guard: g,
                    share: Some(Share { ticket, writers: per_lane, piece }),
                });
                steps.push(Step::Arrive { counter: ctr, arrivals: per_lane, then, guard: g, reset: Some(ticket) });
            }
            None => {
                steps.push(Step::Stage {
                    dst: x.staging(0, r, readers[0], b, x.wr),
                    src: Region::input(x.local(off, b, x.wr)),
                    len: x.len(n, b, x.wr),
                    guard: g,
                    share: None,
                });
                steps.push(Step::Arrive { counter: ctr, arrivals: per_lane, then, guard: g, reset: None });
            }
        }
    };
    if x.bcast(0) {
        stream(x.peers(r).collect(), 0, &mut steps);
    } else {
        for q in x.peers(r) {
            stream(vec![q], compact(r, q), &mut steps);
        }
    }
    steps
}

/// Reader block `b`'s drain of transfer `(phase, p -> r)` after its last read of chunk `c`.
fn drain_arrive(x: &Ctx, phase: u32, r: u32, p: u32, b: u32, ch: u64) -> Option<Step> {
    let (lane, per_lane) = x.lane(phase, x.rd.blocks, b);
    (ch > x.slots).then(|| Step::Arrive {
        counter: x.cons(phase, r, p, lane),
        arrivals: per_lane,
        then: vec![x.drain_to(phase, p, r, lane)],
        guard: Guard::new(0, ch),
        reset: None,
    })
}

fn consumer(x: &Ctx, cfg: &PlanConfig, r: u32, b: u32) -> Vec<Step> {
    let s = x.spec;
    let mut steps = vec![];
    let lane = x.lane(0, x.rd.blocks, b).0;
    match s.collective.consume_op() {
        ConsumeOp::Gather => {
            let (off, n) = x.send(r, r);
            let ch = x.chunks(n);
            if ch > 0 && !cfg.in_place {
                steps.push(Step::Gather {
                    dst: Region::output(x.local(s.partition_offset(r, r, false), b, x.rd)),
                    src: Region::input(x.local(off, b, x.rd)),
                    len: x.len(n, b, x.rd),
                    expect: None,
                    guard: Guard::new(0, ch),
                });
            }
            for p in x.peers(r) {
                let n = x.send(p, r).1;
                let ch = x.chunks(n);
                if ch == 0 {
                    continue;
                }
                steps.push(x.ready_wait(0, r, p, lane, ch));
                steps.push(Step::Gather {
                    dst: Region::output(x.local(s.partition_offset(r, p, false), b, x.rd)),
                    src: x.staging(0, p, r, b, x.rd),
                    len: x.len(n, b, x.rd),
                    expect: None,
                    guard: Guard::new(0, ch),
                });
                steps.extend(drain_arrive(x, 0, r, p, b, ch));
            }
        }
        ConsumeOp::Reduce => {
            let (off, n) = x.send(r, r);
            let ch = x.chunks(n);
            if ch == 0 {
                return steps;
            }
            steps.extend(x.peers(r).map(|p| x.ready_wait(0, r, p, lane, ch)));
            if x.overwrites_input {
                // In place, the reduce overwrites input this rank's writers read: wait until
                // every stream of the lane has staged the chunk.
                steps.extend((0..x.streams()).map(|stream| Step::Wait {
                    flag: x.staged(r, stream, lane),
                    value: EpochVal::chunk(1),
                    guard: Guard::new(0, ch),
                }));
            }
            let srcs = (0..x.world)
                .map(|p| if p == r { Region::input(x.local(off, b, x.rd)) } else { x.staging(0, p, r, b, x.rd) })
                .collect();
            steps.push(Step::Reduce {
                dst: Region::output(x.local(0, b, x.rd)),
                srcs,
                len: x.len(n, b, x.rd),
                expect: None,
                guard: Guard::new(0, ch),
            });
            for p in x.peers(r) {
                steps.extend(drain_arrive(x, 0, r, p, b, ch));
            }
        }
    }
    steps
}

/// Composed AllReduce, the seam's head: reduce this rank's shard and publish it.
fn head(x: &Ctx, r: u32, b: u32) -> Vec<Step> {
    let (off, n) = x.spec.shard(r);
    let ch = x.chunks(n);
    let mut steps = vec![];
    if ch == 0 {
        return steps;
    }
    let g = Guard::new(0, ch);
    let lane0 = x.lane(0, x.rd.blocks, b).0;
    let (lane1, per_lane1) = x.lane(1, x.rd.blocks, b);
    steps.extend(x.peers(r).map(|p| x.ready_wait(0, r, p, lane0, ch)));
    let srcs: Vec<Region> = (0..x.world)
        .map(|p| if p == r { Region::input(x.local(off, b, x.rd)) } else { x.staging(0, p, r, b, x.rd) })
        .collect();
    let out = Region::output(x.local(off, b, x.rd));
    let len = x.len(n, b, x.rd);
    if x.pull {
        let publish = x.staging(1, r, r, b, x.rd);
        if ch > x.slots {
            steps.extend(x.peers(r).map(|q| x.drain_wait(1, r, q, lane1, ch)));
        }
        steps.push(Step::Reduce { dst: publish, srcs, len, expect: None, guard: g });
        steps.push(Step::Gather { dst: out, src: publish, len, expect: None, guard: g });
    } else {
        steps.push(Step::Reduce { dst: out, srcs, len, expect: None, guard: g });
        for q in x.peers(r) {
            if ch > x.slots {
                steps.push(x.drain_wait(1, r, q, lane1, ch));
            }
            steps.push(Step::Stage { dst: x.staging(1, r, q, b, x.rd), src: out, len, guard: g, share: None });
        }
    }
    for p in x.peers(r) {
        steps.extend(drain_arrive(x, 0, r, p, b, ch));
    }
    let then = x.peers(r).map(|q| x.signal(1, q, r, lane1)).collect();
    steps.push(Step::Arrive { counter: x.prod(1, 0, lane1), arrivals: per_lane1, then, guard: g, reset: None });
    steps
}

/// Composed AllReduce, the seam's tail: gather the peers' published shards.
fn tail(x: &Ctx, r: u32, b: u32) -> Vec<Step> {
    let mut steps = vec![];
    let lane = x.lane(1, x.rd.blocks, b).0;
    for p in x.peers(r) {
        let (off, n) = x.spec.shard(p);
        let ch = x.chunks(n);
        if ch == 0 {
            continue;
        }
        steps.push(x.ready_wait(1, r, p, lane, ch));
        steps.push(Step::Gather {
            dst: Region::output(x.local(off, b, x.rd)),
            src: x.staging(1, p, r, b, x.rd),
            len: x.len(n, b, x.rd),
            expect: None,
            guard: Guard::new(0, ch),
        });
        steps.extend(drain_arrive(x, 1, r, p, b, ch));
    }
    steps
}

#[cfg(test)]
mod tests {
    use crate::derive::{PlanConfig, derive};
    use crate::spec::{Collective, CollectiveSpec};
    use crate::types::{DataType, ReduceOp, Regime, StagingSide};
    use crate::verify::{Coverage, Mode, Options, twin_spec, verify};
    use crate::{AllReduceAlgo, Plan, Role, Step, derive_rank};

    /// Every collective's throughput plan shape, with both AllReduce algorithms.
    const CASES: [(Collective, AllReduceAlgo); 5] = [
        (Collective::AllGather, AllReduceAlgo::Auto),
        (Collective::ReduceScatter, AllReduceAlgo::Auto),
        (Collective::AllToAll, AllReduceAlgo::Auto),
        (Collective::AllReduce, AllReduceAlgo::OneShot),
        (Collective::AllReduce, AllReduceAlgo::TwoShot),
    ];

    /// A small throughput configuration: 64-byte chunks, two slots, room for 16 blocks.
    fn small_cfg(side: StagingSide, algo: AllReduceAlgo) -> PlanConfig {
        PlanConfig {
            regime: Regime::Throughput,
            staging_side: side,
            allreduce: algo,
            chunk_bytes: 64,
            slots: 2,
            staging_bytes: 4096,
            window_bytes: 4096,
            max_coresident_blocks: 16,
            ..PlanConfig::default()
        }
    }

    /// `c` of `n` u8 elements at `world` (sum for the reductions).
    fn u8_spec(c: Collective, world: u32, n: u64) -> CollectiveSpec {
        match c {
            Collective::AllGather => CollectiveSpec::all_gather(world, DataType::U8, n),
            Collective::ReduceScatter => CollectiveSpec::reduce_scatter(world, DataType::U8, ReduceOp::Sum, n),
            Collective::AllToAll => CollectiveSpec::all_to_all(world, DataType::U8, n),
            _ => CollectiveSpec::all_reduce(world, DataType::U8, ReduceOp::Sum, n),
        }
    }

    /// Lanes of every count the blocks allow (1 = whole chunks, 2 = one per writer block)
    /// give plans the verifier proves safe, exhaustively over three back-to-back calls at
    /// world 2 (2 writers, 2 readers), for every collective, staging side and AllReduce
    /// algorithm; a lane count that divides no block count is a typed error.
    #[test]
    fn every_lane_count_verifies() {
        for lanes in [Some(1), Some(2), None] {
            for side in [StagingSide::Own, StagingSide::Peer] {
                for (c, algo) in CASES {
                    let cfg = PlanConfig { blocks_per_role: 2, lanes, ..small_cfg(side, algo) };
                    let spec = twin_spec(&u8_spec(c, 2, 192), cfg.chunk_bytes, cfg.slots as u64);
                    let plans = derive(&spec, &cfg).unwrap_or_else(|e| panic!("{c:?} {cfg:?}: {e}"));
                    let r = verify(
                        &[plans.clone(), plans.clone(), plans],
                        &Options { max_states: 2_000_000, mode: Mode::Exhaustive, ..Options::default() },
                    );
                    let what = format!("{c:?} {algo:?} lanes {lanes:?} {side:?}");
                    match (&r.result, r.coverage) {
                        (Ok(()), Coverage::Exhaustive { .. }) => {}
                        (Err(v), cov) => panic!("{what}: {cov}: {v}"),
                        (Ok(()), cov) => panic!("{what}: unexpected coverage {cov}"),
                    }
                }
            }
        }
        let cfg = PlanConfig { lanes: Some(3), blocks_per_role: 2, ..PlanConfig::default() };
        let spec = CollectiveSpec::all_gather(2, DataType::U8, 4096);
        assert!(matches!(derive(&spec, &cfg), Err(crate::DeriveError::Lanes { lanes: 3, .. })));
    }

    /// Shared stages (one lane of two writer blocks taking 16-byte pieces from a ticket) give
    /// plans the verifier proves safe, exhaustively over three calls at world 2 for every
    /// collective, staging side and AllReduce algorithm; and `Plan::check` rejects a shared
    /// stage without its ticket reset or with a wrong writer count.
    #[test]
    fn shared_stages_verify_and_keep_their_shape() {
        for side in [StagingSide::Own, StagingSide::Peer] {
            for (c, algo) in CASES {
                let cfg = PlanConfig { blocks_per_role: 2, lanes: Some(1), share_piece: 16, ..small_cfg(side, algo) };
                let spec = twin_spec(&u8_spec(c, 2, 192), cfg.chunk_bytes, cfg.slots as u64);
                let plans = derive(&spec, &cfg).unwrap_or_else(|e| panic!("{c:?} {cfg:?}: {e}"));
                let shared = plans[0].blocks.iter().flat_map(|b| &b.steps).any(|s| match s {
                    Step::ChunkLoop { body, .. } => {
                        body.iter().any(|t| matches!(t, Step::Stage { share: Some(_), .. }))
                    }
                    _ => false,
                });
                assert!(shared, "{c:?} {side:?}: no shared stage");
                for p in &plans {
                    // The parameter block carries shares and ticket resets both ways.
                    let (_, blocks) = crate::params::decode(&crate::params::encode(p)).expect("decode");
                    assert_eq!(blocks, p.blocks, "{c:?} {side:?}: parameter round trip");
                }
                let r = verify(
                    &[plans.clone(), plans.clone(), plans],
                    &Options { max_states: 2_000_000, mode: Mode::Exhaustive, ..Options::default() },
                );
                match (&r.result, r.coverage) {
                    (Ok(()), Coverage::Exhaustive { .. }) => {}
                    (Err(v), cov) => panic!("{c:?} {algo:?} {side:?}: {cov}: {v}"),
                    (Ok(()), cov) => panic!("{c:?} {algo:?} {side:?}: unexpected coverage {cov}"),
                }
            }
        }
        let cfg = PlanConfig {
            blocks_per_role: 2,
            lanes: Some(1),
            share_piece: 16,
            ..small_cfg(StagingSide::Peer, AllReduceAlgo::Auto)
        };
        let plan = derive_rank(&u8_spec(Collective::AllGather, 2, 192), &cfg, 0).expect("derive");
        assert!(plan.check().is_ok());
        let body = |p: &mut Plan, b: usize| match &mut p.blocks[b].steps[0] {
            Step::ChunkLoop { body, .. } => body.clone(),
            _ => unreachable!("a producer's program is one chunk loop"),
        };
        let producer = plan.blocks.iter().position(|b| b.role == Role::Producer).expect("a producer");
        let at = body(&mut plan.clone(), producer)
            .iter()
            .position(|s| matches!(s, Step::Stage { share: Some(_), .. }))
            .expect("a shared stage");
        let mut no_reset = plan.clone();
        if let Step::ChunkLoop { body, .. } = &mut no_reset.blocks[producer].steps[0] {
            if let Step::Arrive { reset, .. } = &mut body[at + 1] {
                *reset = None;
            }
        }
        assert!(no_reset.check().is_err(), "a shared stage whose arrival does not reset its ticket");
        let mut wrong_count = plan;
        for b in &mut wrong_count.blocks {
            if let Some(Step::ChunkLoop { body, .. }) = b.steps.first_mut() {
                for s in body.iter_mut() {
                    if let Step::Stage { share: Some(sh), .. } = s {
                        sh.writers = 3;
                    }
                    if let Step::Arrive { arrivals, reset: Some(_), .. } = s {
                        *arrivals = 3;
                    }
                }
            }
        }
        assert!(wrong_count.check().is_err(), "two blocks sharing a stage declared for three");
    }

    /// Writers and readers cutting chunks differently (1 producer block and 2 reader blocks,
    /// and the reverse) still give plans the verifier proves safe: exhaustively over three
    /// back-to-back calls at world 2, by 300 sampled schedules at world 3 (its exhaustive
    /// space is beyond a unit test's budget); and the grid counts each role's own blocks.
    #[test]
    fn readers_and_writers_may_use_different_block_counts() {
        for (world, (nb, nc)) in [(2u32, (1u32, 2u32)), (2, (2, 1)), (3, (1, 2))] {
            for side in [StagingSide::Own, StagingSide::Peer] {
                for (c, algo) in CASES {
                    let cfg =
                        PlanConfig { blocks_per_role: nb, consumer_blocks_per_role: Some(nc), ..small_cfg(side, algo) };
                    let n = 96 * world as u64; // three 32-byte chunks' worth per peer
                    let spec = twin_spec(&u8_spec(c, world, n), cfg.chunk_bytes, cfg.slots as u64);
                    let plans = derive(&spec, &cfg).unwrap_or_else(|e| panic!("{c:?} {cfg:?}: {e}"));
                    for p in &plans {
                        let readers = p.blocks.iter().filter(|b| b.role != Role::Producer).count();
                        let writers = p.blocks.len() - readers;
                        assert_eq!(writers, nb as usize, "{c:?}");
                        assert_eq!(readers % nc as usize, 0, "{c:?}");
                    }
                    let mode = if world == 2 { Mode::Exhaustive } else { Mode::Sampled };
                    let r = verify(
                        &[plans.clone(), plans.clone(), plans],
                        &Options { max_states: 2_000_000, mode, schedules: 300, ..Options::default() },
                    );
                    let what = format!("{c:?} {algo:?} world {world} writers {nb} readers {nc} {side:?}");
                    match (&r.result, r.coverage) {
                        (Ok(()), Coverage::Exhaustive { .. }) if world == 2 => {}
                        (Ok(()), Coverage::Sampled { schedules: 300, .. }) if world == 3 => {}
                        (Err(v), cov) => panic!("{what}: {cov}: {v}"),
                        (Ok(()), cov) => panic!("{what}: unexpected coverage {cov}"),
                    }
                }
            }
        }
    }
}
