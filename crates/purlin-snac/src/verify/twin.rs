//! The chunk cutoff, applied by [`super::verify`] to the plans themselves (the verifier never
//! derives plans, so it cannot re-derive them for a smaller spec).
//!
//! # The twin of a plan set
//!
//! Let `L` be the plan set's lap: the least common multiple of every chunk modulus of its
//! offsets and flag/counter indices (its slot count; 1 when nothing is cyclic), and
//! `T = L + 2`. The *ends* of a call are every chunk index at which one of its loop steps
//! stops: each loop's trips, each step's guard end (`until`) and the end of its non-empty
//! lengths, all clamped by the trips. Sorted, `e_1 < e_2 < ...`, they split the chunk range
//! into stretches `[0, e_1)`, `[e_1, e_2)`, ...; the cut keeps at most `T` chunks of each
//! stretch and drops the rest of its middle, so the twin positions are
//! `e'_1 = min(e_1, T)` and `e'_{i+1} = e'_i + min(e_{i+1} - e_i, T)`. Every step end moves
//! back by the chunks dropped before it, `e_i - e'_i`: a guard's `until`, a length's total
//! (shifted by that many chunks, so the step's last twin chunk moves exactly as many bytes as
//! its original last chunk: a partial chunk stays partial) and a loop's trips. Twin chunk `c`
//! keeps the offsets, indices and epoch values of the original's chunk `c`.
//!
//! The cut is one for the whole call, not per step: every pair of steps keeps the order of
//! its ends and their distance up to `T` chunks, so a producer's tail still meets the chunk
//! its consumer has there, a step that stops early (a guard narrowed by one chunk, a block
//! slice that is empty, a V partition shorter than another) stops early in the twin too, and
//! its last chunks are explored. A loop too short to be cut (at most `T` trips) has its ends
//! in the first stretch, which the cut keeps whole, so a longer loop's chunks meet it as in
//! the original. (Issue 49, class 1: an earlier cut moved tails only when every cut step had
//! one extent, and otherwise kept the first `T` chunks only, which never ran the last chunks;
//! `tests/plans/reject/fuzz-last-chunk-arrival-guarded-off.json` and
//! `fuzz-loop-of-cutoff-trips-against-a-moved-tail.json` are the fuzzer's two finds.) The
//! cost: a call with `k` distinct ends explores up to `k * T` chunks instead of `T`; on the
//! property test's derived plans that is about a sixth more states in all, up to twice as
//! many on V plans.
//!
//! Why the twin covers a chunk-uniform plan: every step's offsets, indices and values are
//! affine in `c` (slot indices modulo the lap), so chunk `c` and chunk `c + L` use the same
//! slot, flag and counter words with values one lap apart, and a step's guard depends only on
//! where the chunk is relative to the start (`from`, at most `L`: "from the second lap on")
//! or to the end of its extent (`until`). The protocol's interactions between chunks reach
//! back exactly one lap (the drain of `c - L` before the write of `c`, a flag word that serves
//! `c` and `c + L`), so the states of a chunk depend on the chunks of the lap before it and on
//! the start/end guards only. Every such pattern is in the twin: first use of each word
//! (`c < L`), the first reuse (`c = L`), a reuse after a reuse (`c = L + 1`), and the last,
//! possibly partial chunk of each step right after a reuse; after a step stops, the steps
//! that go on keep up to `T` chunks of their own (every slot reused once without it). A
//! longer stretch repeats the middle pattern with epochs shifted by a lap, which no property
//! distinguishes (waits compare with `>=` within a lap, the advance is checked on the original
//! plans).
//!
//! The argument speaks of slots, flags and epochs, which cycle with the lap. Bytes that do not
//! cycle (the user's buffers, and staging or window offsets without a modulus) are another
//! matter: twin chunk `c` keeps the original's offsets of chunk `c`, so a step's moved tail
//! runs at the bytes of an earlier chunk, and its original tail's bytes are never touched in
//! the twin. That is sound only where those bytes hold nothing the explored chunks do not
//! show: `regular` checks, over every chunk of the original, that each instance the twin
//! does not explore as it is (a cut step's chunks from its twin's last, possibly partial, one
//! on) touches non-cycling bytes that another instance also touches (one of the two writing)
//! only in a pattern every chunk repeats (the same chunk of two loop steps of one stride, or
//! an instance with itself), and that a step's output writes from its last explored chunk on
//! stay in one segment of the spec, where the data a chunk writes is the explored chunks'
//! pattern continued. (Issue 49, class 1's remainder:
//! `tests/plans/reject/partition-tail-overruns-the-next.json`, a partition copy whose last
//! chunk was one element too long, overwrote the next partition's first bytes; the twin saw
//! that chunk's copy inside the partition, correct, and the overwritten bytes kept the next
//! partition's data.) A call that fails the check is explored whole ([`Twin::irregular`]);
//! no derived plan does (`derived_plans_keep_the_chunk_cutoff`).
//!
//! Plans the argument does not cover are explored whole: a guard starting later than `L` in a
//! loop that would be cut (a step that singles out a middle chunk), loops too long to account
//! for byte by byte, and the irregular byte patterns above.
//!
//! What is checked differently: static checks (structure, co-residency, epoch advance, region
//! bounds at every chunk) run on the original plans; the output semantics skip exactly the
//! bytes the original writes in the chunks the twin drops ([`Twin::skip`]), and check every
//! other byte of the spec, so an output byte no step ever writes is still reported. The
//! skipped bytes are vouched for by `regular`: each is written by a step whose explored
//! chunks wrote its segment correctly, in the same pattern, and by no instance the twin does
//! not pair alike.

use crate::plan::{Alias, Index, Len, Offset, Plan, Region, Space, Step};

/// Plans with a loop of more chunks than this are explored whole (the skipped-byte account
/// walks every chunk).
const MAX_ACCOUNTED_CHUNKS: u64 = 1 << 22;

/// The plans to explore and what the semantic check skips.
#[derive(Debug)]
pub struct Twin {
    pub calls: Vec<Vec<Plan>>,
    /// `[call][rank]`: sorted, disjoint output byte ranges (in the plan's output coordinates)
    /// written only in dropped chunks.
    pub skip: Vec<Vec<Vec<(u64, u64)>>>,
    /// The cutoff `T` (the most chunks kept of a stretch between two ends), if some loop was
    /// cut.
    pub cutoff: Option<u64>,
    /// The calls explored whole although a loop was long enough to cut, because a tail the
    /// twin would not explore touches bytes in a way no explored chunk repeats.
    pub irregular: Vec<usize>,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The plan set's lap: the lcm of its chunk moduli (1 if none).
pub fn lap(plans: &[Plan]) -> u64 {
    let mut ms: Vec<u64> = vec![];
    for p in plans {
        p.for_each_step(|_, s, _| {
            let off = |o: &Offset| o.chunk_modulus;
            let idx = |i: &Index| i.chunk_modulus as u64;
            match s {
                Step::Stage { dst, src, .. } | Step::Gather { dst, src, .. } | Step::PutPackets { dst, src, .. } => {
                    ms.extend([off(&dst.offset), off(&src.offset)]);
                }
                Step::Reduce { dst, srcs, .. } => {
                    ms.push(off(&dst.offset));
                    ms.extend(srcs.iter().map(|x| off(&x.offset)));
                }
                Step::Signal { notify, .. } => ms.push(idx(&notify.flag)),
                Step::Wait { flag, .. } => ms.push(idx(flag)),
                Step::Arrive { counter, then, .. } => {
                    ms.push(idx(counter));
                    ms.extend(then.iter().map(|n| idx(&n.flag)));
                }
                Step::HandshakeSend { dst, .. } => ms.push(off(dst)),
                Step::HandshakeWait { src, .. } => ms.push(off(src)),
                Step::ChunkLoop { .. } => {}
            }
        });
    }
    ms.into_iter().filter(|&m| m > 0).fold(1u64, |l, m| (l / gcd(l, m)).saturating_mul(m))
}

fn len_of(s: &Step) -> Option<Len> {
    match s {
        Step::Stage { len, .. }
        | Step::Gather { len, .. }
        | Step::Reduce { len, .. }
        | Step::PutPackets { len, .. } => Some(*len),
        _ => None,
    }
}

fn len_mut(s: &mut Step) -> Option<&mut Len> {
    match s {
        Step::Stage { len, .. }
        | Step::Gather { len, .. }
        | Step::Reduce { len, .. }
        | Step::PutPackets { len, .. } => Some(len),
        _ => None,
    }
}

/// The number of chunks (from 0) a loop step is active on: its guard's end, the loop's trips,
/// and the chunks its length is non-zero on.
fn extent(s: &Step, trips: u64) -> u64 {
    let mut n = s.guard().until.min(trips);
    if let Some(l) = len_of(s) {
        if l.chunk_stride > 0 && l.max > 0 {
            n = n.min(l.total.saturating_sub(l.base).div_ceil(l.chunk_stride));
        }
    }
    n
}

/// Every chunk index at which some loop step of `p` stops: each loop's trips, each step's
/// guard end and the end of its non-empty lengths (each clamped by the trips).
fn loop_ends(p: &Plan, out: &mut Vec<u64>) {
    for block in &p.blocks {
        for s in &block.steps {
            if let Step::ChunkLoop { trips, body } = s {
                out.push(*trips);
                for st in body {
                    out.push(st.guard().until.min(*trips));
                    out.push(extent(st, *trips));
                }
            }
        }
    }
}

/// The cut of one call: the sorted ends `e_1 < e_2 < ...` of its loop steps and, for each, how
/// many chunks are dropped before it. The chunks before `e_1` and each gap between two ends
/// keep at most `t` chunks; the dropped ones are the gap's middle, so every step keeps its
/// distance to the ends around it up to `t`.
#[derive(Debug)]
struct Cut {
    ends: Vec<(u64, u64)>,
}

impl Cut {
    fn new(mut ends: Vec<u64>, t: u64) -> Cut {
        ends.sort_unstable();
        ends.dedup();
        let (mut prev, mut prev_twin) = (0u64, 0u64);
        let ends = ends
            .into_iter()
            .map(|e| {
                let tw = prev_twin + (e - prev).min(t);
                (prev, prev_twin) = (e, tw);
                (e, e - tw)
            })
            .collect();
        Cut { ends }
    }

    /// The chunks dropped before end `e` (one of [`Cut::ends`]).
    fn shift(&self, e: u64) -> u64 {
        self.ends.iter().find(|&&(x, _)| x == e).map_or(0, |&(_, s)| s)
    }
}

/// The twin of one plan under `cut`, or `None` when the plan is not chunk-uniform in the
/// sense above (then the call is explored whole). Each step's ends move back by the chunks
/// the cut drops before them: its guard's `until`, its length's total (so its last chunk
/// stays as partial as the original's), and its loop's trips.
fn twin_plan(p: &Plan, cut: &Cut, lap: u64) -> Option<(Plan, bool)> {
    let mut out = p.clone();
    let mut any = false;
    for block in &mut out.blocks {
        for s in &mut block.steps {
            let Step::ChunkLoop { trips, body } = s else { continue };
            let loop_shift = cut.shift(*trips);
            if loop_shift == 0 {
                continue;
            }
            if *trips > MAX_ACCOUNTED_CHUNKS {
                return None;
            }
            for st in body.iter_mut() {
                let g = st.guard();
                if g.from > lap && g.from < extent(st, *trips) {
                    return None;
                }
                let len_shift = cut.shift(extent(st, *trips));
                if let Some(l) = len_mut(st) {
                    l.total = l.total.saturating_sub(len_shift.saturating_mul(l.chunk_stride));
                }
                let until_shift = cut.shift(g.until.min(*trips));
                if let Some(g) = st.guard_mut() {
                    if g.until < u64::MAX {
                        g.until -= until_shift.min(g.until);
                    }
                }
            }
            *trips -= loop_shift;
            any = true;
        }
    }
    Some((out, any))
}

/// Byte ranges of rank `owner`'s output that a plan's steps write (its own `Output` when the
/// plan is `owner`'s, else `PeerOutput(owner)`), over the chunks each step runs at.
fn output_writes(p: &Plan, owner: u32, sense: u64) -> Vec<(u64, u64)> {
    let mut v = vec![];
    let mut add = |dst: &Region, len: &Len, c: u64| {
        let mine = match dst.space {
            Space::Output => p.rank == owner,
            Space::PeerOutput(q) => q == owner,
            _ => false,
        };
        if mine {
            let a = dst.offset.at(c, sense);
            let n = len.at(c);
            if n > 0 {
                v.push((a, a + n));
            }
        }
    };
    for block in &p.blocks {
        for s in &block.steps {
            let (trips, body): (u64, &[Step]) = match s {
                Step::ChunkLoop { trips, body } => (*trips, body),
                s => (1, std::slice::from_ref(s)),
            };
            for st in body {
                let (dst, len) = match st {
                    Step::Gather { dst, len, .. } | Step::Reduce { dst, len, .. } => (dst, len),
                    _ => continue,
                };
                let g = st.guard();
                for c in g.from..g.until.min(trips) {
                    add(dst, len, c);
                }
            }
        }
    }
    normalize(v)
}

fn normalize(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = vec![];
    for (a, b) in v {
        match out.last_mut() {
            Some(l) if a <= l.1 => l.1 = l.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// `a \ b` for sorted, disjoint interval lists.
pub fn minus(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = vec![];
    for &(mut x, y) in a {
        for &(p, q) in b {
            if q <= x || p >= y {
                continue;
            }
            if p > x {
                out.push((x, p));
            }
            x = x.max(q);
            if x >= y {
                break;
            }
        }
        if x < y {
            out.push((x, y));
        }
    }
    out
}

/// The accesses of one loop step (or one step outside loops) to one region that does not
/// cycle with the chunk (user buffers, and staging or window offsets without a modulus), in
/// its owner's buffer (the output where an input is placed in it, the input where the output
/// is): at chunk `c`, bytes `[base + c * stride, + len.at(c))`.
#[derive(Debug, Clone, Copy)]
struct Group {
    owner: u32,
    buf: u8,
    base: u64,
    stride: u64,
    len: Len,
    write: bool,
    /// Whether the step is in a loop.
    looped: bool,
    /// The chunks it accesses, and those of them the twin does not explore as they are (a cut
    /// step's chunks from its twin's last, possibly partial, one on).
    all: (u64, u64),
    unexplored: (u64, u64),
}

impl Group {
    fn at(&self, c: u64) -> (u64, u64) {
        let a = self.base + c * self.stride;
        (a, a + self.len.at(c))
    }

    /// The least range holding every access of chunks `[c0, c1)`. Offsets grow with the
    /// chunk; a length is its maximum up to some chunk and then shrinks linearly, so the
    /// furthest end is at the last full chunk, the first partial one or a range end.
    fn hull(&self, (c0, c1): (u64, u64)) -> Option<(u64, u64)> {
        if c0 >= c1 {
            return None;
        }
        let l = &self.len;
        let last_full = match l.chunk_stride {
            0 => c1 - 1,
            ls => l.total.saturating_sub(l.base.saturating_add(l.max)) / ls,
        };
        let end = [c0, c1 - 1, last_full.clamp(c0, c1 - 1), last_full.saturating_add(1).clamp(c0, c1 - 1)]
            .into_iter()
            .map(|c| self.at(c).1)
            .max()?;
        Some((self.at(c0).0, end))
    }
}

/// `(owner, buffer, shift)`: where `space` of rank `me` of `plans` lies, `None` for a region
/// the lap covers (a cyclic offset).
fn locate(plans: &[Plan], me: u32, r: &Region) -> Option<(u32, u8, u64)> {
    if r.offset.chunk_modulus != 0 {
        return None;
    }
    let alias = |q: u32| plans.get(q as usize).and_then(|p| p.resources.alias);
    let user = |q: u32, input: bool| match (alias(q), input) {
        (Some(Alias::InputInOutput(o)), true) => (q, 1, o),
        (Some(Alias::OutputInInput(o)), false) => (q, 0, o),
        (_, true) => (q, 0, 0),
        (_, false) => (q, 1, 0),
    };
    Some(match r.space {
        Space::Input => user(me, true),
        Space::Output => user(me, false),
        Space::PeerInput(q) => user(q, true),
        Space::PeerOutput(q) => user(q, false),
        Space::Staging(q) => (q, 2, 0),
        Space::Window(q) => (q, 3, 0),
    })
}

/// The regions a data step writes and reads.
fn accesses_of(s: &Step) -> Vec<(&Region, bool)> {
    match s {
        Step::Stage { dst, src, .. } | Step::Gather { dst, src, .. } | Step::PutPackets { dst, src, .. } => {
            vec![(dst, true), (src, false)]
        }
        Step::Reduce { dst, srcs, .. } => std::iter::once((dst, true)).chain(srcs.iter().map(|x| (x, false))).collect(),
        _ => vec![],
    }
}

/// Whether the cut keeps every interaction of bytes that do not cycle with the chunk, so that
/// the output bytes it skips ([`Twin::skip`]) hold what the explored chunks show. The twin's
/// chunk `c` keeps the original's offsets, so a step's tail runs at other bytes than the
/// original's: where a tail chunk the twin does not explore touches bytes another instance
/// touches (one of them writing) in a way no explored pair repeats, or leaves the spec
/// segment the step was writing, the twin would judge bytes the original never has (issue 49,
/// class 1: a partition's last chunk one element too long overwrote the next partition, and
/// the twin saw a correct copy). Repeated pairs: the same chunk of two loop steps of one
/// chunk stride (a reduce into the output and the stage that reads it back; an instance with
/// itself, a reduce in place). Anything else falls back to exploring the call whole. The
/// check works on each step's chunk range at once (its accesses are affine in the chunk), so
/// its cost does not grow with the chunk count.
fn regular(plans: &[Plan], cut: &[Plan], sense: u64) -> bool {
    let segments: Vec<Vec<crate::spec::Segment>> = plans.iter().map(|p| p.spec.segments(p.rank)).collect();
    let mut groups: Vec<Group> = vec![];
    for (p, q) in plans.iter().zip(cut) {
        for (block, tblock) in p.blocks.iter().zip(&q.blocks) {
            for (s, ts) in block.steps.iter().zip(&tblock.steps) {
                let (looped, trips, twin_trips, body, tbody): (bool, u64, u64, &[Step], &[Step]) = match (s, ts) {
                    (Step::ChunkLoop { trips, body }, Step::ChunkLoop { trips: tt, body: tb }) => {
                        (true, *trips, *tt, body, tb)
                    }
                    _ => (false, 1, 1, std::slice::from_ref(s), std::slice::from_ref(ts)),
                };
                for (st, tst) in body.iter().zip(tbody) {
                    let Some(len) = len_of(st) else { continue };
                    let from = st.guard().from;
                    let (e, te) = (extent(st, trips), extent(tst, twin_trips));
                    if from >= e || (len.chunk_stride == 0 && len.at(from) == 0) {
                        continue;
                    }
                    let first_unexplored = if te < e { te.saturating_sub(1).max(from) } else { e };
                    for (r, write) in accesses_of(st) {
                        let g = |owner, buf, shift: u64| Group {
                            owner,
                            buf,
                            base: shift + r.offset.at(0, sense),
                            stride: r.offset.chunk_stride,
                            len,
                            write,
                            looped,
                            all: (from, e),
                            unexplored: (first_unexplored, e),
                        };
                        // Output writes from the last explored chunk on stay in one segment.
                        let owner = match r.space {
                            Space::Output => Some(p.rank),
                            Space::PeerOutput(q) => Some(q),
                            _ => None,
                        };
                        if let (true, Some(o), true) = (write, owner, first_unexplored < e) {
                            let out = Group { base: r.offset.at(0, sense), ..g(o, 1, 0) };
                            let Some((x, y)) = out.hull((first_unexplored.saturating_sub(1).max(from), e)) else {
                                continue;
                            };
                            let segs = segments.get(o as usize).map_or(&[][..], |v| &v[..]);
                            if !segs.iter().any(|s| s.out_offset <= x && y <= s.out_offset + s.len) {
                                return false;
                            }
                        }
                        if let Some((owner, buf, shift)) = locate(plans, p.rank, r) {
                            groups.push(g(owner, buf, shift));
                        }
                    }
                }
            }
        }
    }
    let overlap = |a: (u64, u64), b: (u64, u64)| a.0 < b.1 && b.0 < a.1;
    for u in groups.iter().filter(|u| u.unexplored.0 < u.unexplored.1) {
        let Some(uh) = u.hull(u.unexplored) else { continue };
        for g in &groups {
            if (g.owner, g.buf) != (u.owner, u.buf) || !(u.write || g.write) {
                continue;
            }
            if !g.hull(g.all).is_some_and(|gh| overlap(uh, gh)) {
                continue;
            }
            if !(u.looped && g.looped && u.stride == g.stride && u.stride > 0) {
                return false;
            }
            // Chunk `c` of `u` and `c - d` of `g` can overlap only for `d` with
            // `-lu < delta + d * s < lg`; `d = 0` repeats at every chunk.
            let (s, delta) = (u.stride as i128, u.base as i128 - g.base as i128);
            let (lu, lg) = (u.len.max as i128, g.len.max as i128);
            // Such a `d` pairs chunks that exist: `c` unexplored, `c - d` one of `g`'s.
            let ((c0, c1), (g0, g1)) = (u.unexplored, g.all);
            let lo = ((-lu - delta).div_euclid(s) + 1).max(c0 as i128 - g1 as i128 + 1);
            let hi = (lg - delta - 1).div_euclid(s).min(c1 as i128 - g0 as i128 - 1);
            if lo <= hi && (lo != 0 || hi != 0) {
                return false;
            }
        }
    }
    true
}

/// Applies the cutoff to every call; `sense[k]` is call `k`'s sense (for output offsets that
/// depend on it).
pub fn twin(calls: &[Vec<Plan>], sense: &[u64]) -> Twin {
    let mut tw = Twin { calls: vec![], skip: vec![], cutoff: None, irregular: vec![] };
    for (k, plans) in calls.iter().enumerate() {
        let l = lap(plans);
        let t = l.saturating_add(2);
        let mut ends = vec![];
        plans.iter().for_each(|p| loop_ends(p, &mut ends));
        let cut = Cut::new(ends, t);
        let twins: Option<Vec<(Plan, bool)>> = plans.iter().map(|p| twin_plan(p, &cut, l)).collect();
        let s = sense.get(k).copied().unwrap_or(0);
        let twins: Option<Vec<Plan>> =
            twins.filter(|ts| ts.iter().any(|(_, cut)| *cut)).map(|ts| ts.into_iter().map(|(p, _)| p).collect());
        if twins.as_ref().is_some_and(|cut| !regular(plans, cut, s)) {
            tw.irregular.push(k);
        }
        match twins.filter(|_| tw.irregular.last() != Some(&k)) {
            Some(cut) => {
                // Output coordinates: an in-place alias shifts both plans alike. Every rank's
                // plan may write rank `r`'s output (one-copy plans store into peers').
                let writes =
                    |set: &[Plan], r: u32| normalize(set.iter().flat_map(|p| output_writes(p, r, s)).collect());
                tw.skip.push((0..plans.len() as u32).map(|r| minus(&writes(plans, r), &writes(&cut, r))).collect());
                tw.calls.push(cut);
                tw.cutoff = Some(tw.cutoff.map_or(t, |x: u64| x.max(t)));
            }
            _ => {
                tw.skip.push(vec![vec![]; plans.len()]);
                tw.calls.push(plans.clone());
            }
        }
    }
    tw
}
