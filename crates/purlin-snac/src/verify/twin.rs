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
//! Plans the argument does not cover are explored whole: a guard starting later than `L` in a
//! loop that would be cut (a step that singles out a middle chunk), or loops too long to
//! account for byte by byte.
//!
//! What is checked differently: static checks (structure, co-residency, epoch advance) run on
//! the original plans; the output semantics skip exactly the bytes the original writes in the
//! chunks the twin drops ([`Twin::skip`]), and check every other byte of the spec, so an
//! output byte no step ever writes is still reported.

use crate::plan::{Index, Len, Offset, Plan, Region, Space, Step};

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

/// Applies the cutoff to every call; `sense[k]` is call `k`'s sense (for output offsets that
/// depend on it).
pub fn twin(calls: &[Vec<Plan>], sense: &[u64]) -> Twin {
    let mut tw = Twin { calls: vec![], skip: vec![], cutoff: None };
    for (k, plans) in calls.iter().enumerate() {
        let l = lap(plans);
        let t = l.saturating_add(2);
        let mut ends = vec![];
        plans.iter().for_each(|p| loop_ends(p, &mut ends));
        let cut = Cut::new(ends, t);
        let twins: Option<Vec<(Plan, bool)>> = plans.iter().map(|p| twin_plan(p, &cut, l)).collect();
        match twins {
            Some(ts) if ts.iter().any(|(_, cut)| *cut) => {
                let s = sense.get(k).copied().unwrap_or(0);
                let cut: Vec<Plan> = ts.into_iter().map(|(p, _)| p).collect();
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
