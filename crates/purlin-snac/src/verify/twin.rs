//! The chunk cutoff, applied by [`super::verify`] to the plans themselves (the verifier never
//! derives plans, so it cannot re-derive them for a smaller spec).
//!
//! # The twin of a plan set
//!
//! Let `L` be the plan set's lap: the least common multiple of every chunk modulus of its
//! offsets and flag/counter indices (its slot count; 1 when nothing is cyclic), and
//! `T = L + 2` (`min(chunks, slots + 2)`). Every chunk loop of more than `T` trips is cut to
//! `T` trips. Each step of such a loop keeps its offsets, indices, epoch values and guards, so
//! twin chunk `c` uses the slot, flag and counter words of chunk `c`, with the values of
//! chunk `c`: the twin runs the original's first `T` chunks. When every cut step of the call
//! is active on the same chunks `[0, n)` (its guard's `until`, clamped by the chunks its
//! length is non-zero on), the *tail* moves forward too: `until - (n - T)` and lengths
//! shifted by `n - T` chunks, so twin chunk `T - 1` moves exactly as many bytes as the
//! original's last chunk `n - 1` (a partial chunk stays partial). Steps of different extents
//! (block slices of which the last is empty, readers and writers with different block
//! counts, V partitions) are not shifted: shifting them independently could pair a
//! producer's tail with a consumer's full chunk, which no execution of the original does.
//! **Open gap** (issue 49, class 1, found again by the differential fuzzer): such a prefix
//! cut never runs the last chunks, so a wait or drain skipped only there is not explored;
//! nor is a loop of exactly `T` trips that meets a cut loop's moved tail.
//!
//! Why the twin covers a chunk-uniform plan: every step's offsets, indices and values are
//! affine in `c` (slot indices modulo the lap), so chunk `c` and chunk `c + L` use the same
//! slot, flag and counter words with values one lap apart, and a step's guard depends only on
//! where the chunk is relative to the start (`from`, at most `L`: "from the second lap on")
//! or to the end of its extent (`until`). The protocol's interactions between chunks reach
//! back exactly one lap (the drain of `c - L` before the write of `c`, a flag word that serves
//! `c` and `c + L`), so the states of a chunk depend on the chunks of the lap before it and on
//! the start/end guards only. Every such pattern is in the twin: first use of each word
//! (`c < L`), the first reuse (`c = L`), a reuse after a reuse (`c = L + 1`), and, when tails
//! move, the last, possibly partial chunk right after a reuse. A longer loop repeats the middle pattern with
//! epochs shifted by a lap, which no property distinguishes (waits compare with `>=` within a
//! lap, the advance is checked on the original plans).
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
    /// The cutoff `T`, if some loop was cut.
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

/// The extents of the steps of loops longer than `t` (see [`extent`]). Open: a loop of
/// exactly `t` trips (not cut) whose last chunk meets a cut loop's moved tail is not counted
/// (the differential fuzzer's open case, `tests/differential.rs`); counting every such loop
/// made the CI sets explode.
fn cut_extents(p: &Plan, t: u64, out: &mut Vec<u64>) {
    for block in &p.blocks {
        for s in &block.steps {
            if let Step::ChunkLoop { trips, body } = s {
                if *trips > t {
                    out.extend(body.iter().map(|st| extent(st, *trips)));
                }
            }
        }
    }
}

/// The twin of one plan with cutoff `t`, or `None` when the plan is not chunk-uniform in the
/// sense above (then the call is explored whole). `tails`: whether tails move forward (only
/// when every cut step of the call has the same extent).
fn twin_plan(p: &Plan, t: u64, lap: u64, tails: bool) -> Option<(Plan, bool)> {
    let mut out = p.clone();
    let mut cut = false;
    for block in &mut out.blocks {
        for s in &mut block.steps {
            let Step::ChunkLoop { trips, body } = s else { continue };
            if *trips <= t {
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
                let n = extent(st, *trips);
                if n <= t || !tails {
                    continue;
                }
                let shift = n - t;
                if let Some(l) = len_mut(st) {
                    l.total = l.total.saturating_sub(shift.saturating_mul(l.chunk_stride));
                }
                if let Some(g) = st.guard_mut() {
                    if g.until < u64::MAX {
                        g.until -= shift.min(g.until);
                    }
                }
            }
            *trips = t;
            cut = true;
        }
    }
    Some((out, cut))
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
        let mut ext = vec![];
        plans.iter().for_each(|p| cut_extents(p, t, &mut ext));
        ext.sort_unstable();
        ext.dedup();
        // Open (issue 49, class 1): steps of different extents cannot move their tails
        // together, and the prefix cut below never runs their last chunks, so a wait or a
        // drain skipped only there goes unseen. Exploring such calls whole made V plans of
        // long loops (the property tests' sizes) intractable; a per-stream cut is the fix.
        let tails = ext.len() == 1;
        let twins: Option<Vec<(Plan, bool)>> = plans.iter().map(|p| twin_plan(p, t, l, tails)).collect();
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
