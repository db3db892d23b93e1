//! The differential fuzzer of the verifier (outside `verify/`, which never uses the derivation): small derived plan sets, edited at random, judged by the verifier
//! and by the reference checker ([`crate::verify::reference`]); a plan set on which they disagree is a
//! bug in one of them. `tests/differential.rs` runs a CI budget; `cargo xtask verify --fuzz N`
//! the long run.
//!
//! Cases: worlds 2 and 3, one to three back-to-back calls, every collective, both regimes
//! (world 3: latency only, which the reference's exhaustive search can finish), both staging
//! sides, one-copy plans, in place or not and mixed, chunk loops longer than the verifier's
//! cutoff. Edits (one or two per case): any numeric field of a wait, arrival, signal, guard,
//! offset, length, stride, resource or advance set to a nearby value, to zero (what the zeroed
//! workspace satisfies) or to another field's value; steps swapped, dropped or duplicated;
//! spaces and peers changed.

use crate::derive::{AllReduceAlgo, PlanConfig, derive};
use crate::plan::{Advance, EpochVal, Guard, Index, Len, Offset, Plan, Region, Space, Step};
use crate::spec::{Collective, CollectiveSpec};
use crate::types::{DataType, PacketFormat, ReduceOp, ReductionMode, Regime, StagingSide};

use crate::verify::reference::{self, Verdict};
use crate::verify::{Mode, Options, Property, verify};

/// xorshift64*: the fuzzer's only source of choices, so a seed reproduces a case.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (any value).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

/// One case: the calls, and a readable account of how they were made.
#[derive(Debug, Clone)]
pub struct Case {
    pub calls: Vec<Vec<Plan>>,
    pub what: String,
}

/// A small spec and configuration, small enough for the reference checker's exhaustive
/// search: one block per role, partitions of at most 64 bytes in 16-byte chunks, so that
/// with one slot (the verifier's cutoff: 3 trips) loops run up to 4 trips; world 3 in the
/// latency regime only.
fn small_call(rng: &mut Rng, world: u32) -> Option<(CollectiveSpec, PlanConfig)> {
    let c = rng.pick(&Collective::ALL);
    let w = world as usize;
    let dt = rng.pick(&[DataType::U8, DataType::U8, DataType::F16, DataType::F32]);
    let most = 64 / dt.size();
    let n = 1 + rng.below(most);
    let count = |rng: &mut Rng| if rng.below(3) == 0 { 0 } else { 1 + rng.below(most) };
    let op = rng.pick(&[ReduceOp::Sum, ReduceOp::Max]);
    let mut spec = match c {
        Collective::AllReduce => CollectiveSpec::all_reduce(world, dt, op, n),
        Collective::AllGather => CollectiveSpec::all_gather(world, dt, n),
        Collective::ReduceScatter => CollectiveSpec::reduce_scatter(world, dt, op, n),
        Collective::AllToAll => CollectiveSpec::all_to_all(world, dt, n.div_ceil(world as u64)),
        Collective::AllGatherV => CollectiveSpec::all_gather_v(world, dt, (0..w).map(|_| count(rng)).collect()),
        Collective::ReduceScatterV => {
            CollectiveSpec::reduce_scatter_v(world, dt, op, (0..w).map(|_| count(rng)).collect())
        }
        Collective::AllToAllV => {
            CollectiveSpec::all_to_all_v(world, dt, (0..w).map(|_| (0..w).map(|_| count(rng) / 2).collect()).collect())
        }
    };
    if rng.below(4) == 0 {
        spec = spec.with_mode(ReductionMode::Fast);
    }
    let regime = if world > 2 { Regime::Latency } else { rng.pick(&[Regime::Latency, Regime::Throughput]) };
    let mut cfg = PlanConfig {
        regime,
        staging_side: rng.pick(&[StagingSide::Own, StagingSide::Peer]),
        allreduce: rng.pick(&[AllReduceAlgo::Auto, AllReduceAlgo::OneShot, AllReduceAlgo::TwoShot]),
        chunk_bytes: 16,
        blocks_per_role: 1,
        consumer_blocks_per_role: None,
        lanes: None,
        slots: 1 + rng.below(2) as u32,
        share_piece: 0,
        staging_bytes: 1024,
        window_bytes: 2048,
        flag_words: 256,
        max_coresident_blocks: 16,
        packet: rng.pick(&[PacketFormat::B8, PacketFormat::B16]),
        in_place: false,
        peer_outputs: false,
        peer_inputs: false,
        copy_engine: false,
        landed: false,
    };
    if rng.below(4) == 0 && !matches!(c, Collective::AllToAll | Collective::AllToAllV) {
        cfg.in_place = true;
    }
    if regime == Regime::Throughput && rng.below(4) == 0 {
        cfg.peer_outputs = true;
        cfg.peer_inputs = rng.below(2) == 0 || cfg.in_place;
    }
    spec.validate().ok()?;
    Some((spec, cfg))
}

/// A random case of one to three calls, each derived, then `edits` random edits.
pub fn case(rng: &mut Rng, edits: u32) -> Option<Case> {
    let world = 2 + u32::from(rng.below(4) == 0);
    let ncalls = 1 + rng.below(2) as usize + usize::from(world == 2 && rng.below(8) == 0);
    let mut calls = vec![];
    let mut what = vec![];
    for _ in 0..ncalls {
        let (spec, cfg) = small_call(rng, world)?;
        let plans = derive(&spec, &cfg).ok()?;
        // Mixed forms: each rank in place or not, as NCCL lets it.
        let mut plans = plans;
        if rng.below(4) == 0 && !matches!(spec.collective, Collective::AllToAll | Collective::AllToAllV) {
            let r = rng.below(world as u64) as u32;
            let flipped = PlanConfig { in_place: !cfg.in_place, ..cfg };
            plans[r as usize] = crate::derive::derive_rank(&spec, &flipped, r).ok()?;
        }
        what.push(format!(
            "{:?} w{world} {:?} {:?} {:?} {:?} chunk {} blocks {}/{:?} slots {} share {} in place {} one-copy {}/{}",
            spec.collective,
            spec.dtype,
            spec.counts,
            spec.mode,
            cfg.regime,
            cfg.chunk_bytes,
            cfg.blocks_per_role,
            cfg.consumer_blocks_per_role,
            cfg.slots,
            cfg.share_piece,
            cfg.in_place,
            cfg.peer_outputs,
            cfg.peer_inputs
        ));
        calls.push(plans);
    }
    for _ in 0..edits {
        what.push(edit(rng, &mut calls)?);
    }
    Some(Case { calls, what: what.join("; ") })
}

/// A value near `x`, zero, or far: what a kernel author's slip or a stale constant gives.
fn nudge(rng: &mut Rng, x: u64) -> u64 {
    match rng.below(6) {
        0 => 0,
        1 => x.saturating_add(1),
        2 => x.saturating_sub(1),
        3 => x.saturating_add(1 + rng.below(64)),
        4 => x / 2,
        _ => rng.below(x.saturating_mul(2).max(4)),
    }
}

fn nudge_i(rng: &mut Rng, x: i64) -> i64 {
    match rng.below(4) {
        0 => 0,
        1 => x + 1,
        2 => x - 1,
        _ => x + rng.below(8) as i64 - 4,
    }
}

/// Every step of a block, loop bodies included, as mutable references.
fn steps_mut(steps: &mut [Step]) -> Vec<&mut Step> {
    let mut out = vec![];
    for s in steps {
        match s {
            Step::ChunkLoop { body, .. } => out.extend(body.iter_mut()),
            s => out.push(s),
        }
    }
    out
}

fn edit_offset(rng: &mut Rng, o: &mut Offset) -> &'static str {
    match rng.below(4) {
        0 => o.base = nudge(rng, o.base),
        1 => o.chunk_stride = nudge(rng, o.chunk_stride),
        2 => o.chunk_modulus = nudge(rng, o.chunk_modulus),
        _ => o.sense_stride = nudge(rng, o.sense_stride),
    }
    "offset"
}

fn edit_len(rng: &mut Rng, l: &mut Len) -> &'static str {
    match rng.below(4) {
        0 => l.max = nudge(rng, l.max),
        1 => l.total = nudge(rng, l.total),
        2 => l.base = nudge(rng, l.base),
        _ => l.chunk_stride = nudge(rng, l.chunk_stride),
    }
    "length"
}

fn edit_guard(rng: &mut Rng, g: &mut Guard) -> &'static str {
    if rng.below(2) == 0 {
        g.from = nudge(rng, g.from);
    } else {
        g.until = nudge(rng, g.until.min(1 << 20));
    }
    "guard"
}

fn edit_val(rng: &mut Rng, v: &mut EpochVal) -> &'static str {
    if rng.below(3) == 0 {
        v.chunk_mul = nudge(rng, v.chunk_mul);
    } else {
        v.add = nudge_i(rng, v.add);
    }
    "epoch value"
}

fn edit_index(rng: &mut Rng, i: &mut Index) -> &'static str {
    if rng.below(3) == 0 {
        i.chunk_modulus = nudge(rng, u64::from(i.chunk_modulus)) as u32;
    } else {
        i.base = nudge(rng, u64::from(i.base)) as u32;
    }
    "index"
}

fn edit_space(rng: &mut Rng, r: &mut Region, world: u32) -> &'static str {
    let q = rng.below(u64::from(world)) as u32;
    r.space = match rng.below(6) {
        0 => Space::Input,
        1 => Space::Output,
        2 => Space::Staging(q),
        3 => Space::Window(q),
        4 => Space::PeerOutput(q),
        _ => Space::PeerInput(q),
    };
    "space"
}

fn edit_region(rng: &mut Rng, r: &mut Region, world: u32) -> &'static str {
    if rng.below(4) == 0 { edit_space(rng, r, world) } else { edit_offset(rng, &mut r.offset) }
}

/// One field of one step.
fn edit_step(rng: &mut Rng, s: &mut Step, world: u32) -> &'static str {
    match s {
        Step::ChunkLoop { .. } => "nothing",
        Step::Stage { dst, src, len, guard, .. } | Step::Gather { dst, src, len, guard, .. } => match rng.below(5) {
            0 => edit_region(rng, dst, world),
            1 => edit_region(rng, src, world),
            2 => edit_len(rng, len),
            3 => edit_guard(rng, guard),
            _ => match s {
                Step::Gather { expect: Some(v), .. } => edit_val(rng, v),
                _ => "nothing",
            },
        },
        Step::Reduce { dst, srcs, len, guard, expect } => match rng.below(6) {
            0 => edit_region(rng, dst, world),
            1 => {
                let i = rng.below(srcs.len() as u64) as usize;
                edit_region(rng, &mut srcs[i], world)
            }
            2 => {
                if srcs.len() > 1 {
                    let (i, j) = (rng.below(srcs.len() as u64) as usize, rng.below(srcs.len() as u64) as usize);
                    srcs.swap(i, j);
                }
                "source order"
            }
            3 => edit_len(rng, len),
            4 => edit_guard(rng, guard),
            _ => match expect {
                Some(v) => edit_val(rng, v),
                None => "nothing",
            },
        },
        Step::PutPackets { dst, src, len, flag, guard } => match rng.below(5) {
            0 => edit_region(rng, dst, world),
            1 => edit_region(rng, src, world),
            2 => edit_len(rng, len),
            3 => edit_guard(rng, guard),
            _ => edit_val(rng, flag),
        },
        Step::Signal { notify, guard } => match rng.below(4) {
            0 => {
                notify.peer = rng.below(u64::from(world)) as u32;
                "peer"
            }
            1 => edit_index(rng, &mut notify.flag),
            2 => edit_val(rng, &mut notify.value),
            _ => edit_guard(rng, guard),
        },
        Step::Wait { flag, value, guard } => match rng.below(3) {
            0 => edit_index(rng, flag),
            1 => edit_val(rng, value),
            _ => edit_guard(rng, guard),
        },
        Step::Arrive { counter, arrivals, then, guard, .. } => match rng.below(5) {
            0 => edit_index(rng, counter),
            1 => {
                *arrivals = nudge(rng, u64::from(*arrivals)) as u32;
                "arrivals"
            }
            2 if !then.is_empty() => {
                let i = rng.below(then.len() as u64) as usize;
                match rng.below(3) {
                    0 => {
                        then.remove(i);
                        "notification dropped"
                    }
                    1 => edit_val(rng, &mut then[i].value),
                    _ => edit_index(rng, &mut then[i].flag),
                }
            }
            _ => edit_guard(rng, guard),
        },
        Step::HandshakeSend { peer, dst, flag } => match rng.below(3) {
            0 => {
                *peer = rng.below(u64::from(world)) as u32;
                "peer"
            }
            1 => edit_offset(rng, dst),
            _ => edit_val(rng, flag),
        },
        Step::HandshakeWait { peer, src, expect } => match rng.below(3) {
            0 => {
                *peer = rng.below(u64::from(world)) as u32;
                "peer"
            }
            1 => edit_offset(rng, src),
            _ => edit_val(rng, expect),
        },
    }
}

/// One random edit of one plan of one call; `None` where the case has nothing to edit.
fn edit(rng: &mut Rng, calls: &mut [Vec<Plan>]) -> Option<String> {
    let k = rng.below(calls.len() as u64) as usize;
    let world = calls[k].len() as u32;
    let r = rng.below(u64::from(world)) as usize;
    let p = &mut calls[k][r];
    let at = format!("call {k} rank {r}");
    let what = match rng.below(10) {
        // Resources.
        0 => {
            let res = &mut p.resources;
            match rng.below(5) {
                0 => res.input_bytes = nudge(rng, res.input_bytes),
                1 => res.output_bytes = nudge(rng, res.output_bytes),
                2 => res.staging_bytes = nudge(rng, res.staging_bytes),
                3 => res.flag_words = nudge(rng, u64::from(res.flag_words)) as u32,
                _ => res.epoch_words = nudge(rng, u64::from(res.epoch_words)) as u32,
            }
            "resources".to_string()
        }
        // The advance.
        1 => {
            p.advance = match p.advance {
                Advance::Fixed(a) => Advance::Fixed(nudge(rng, a)),
                Advance::AgreedMaxChunks { local } => Advance::AgreedMaxChunks { local: nudge(rng, local) },
            };
            "advance".to_string()
        }
        // Loop trips.
        2 => {
            let loops: Vec<&mut u64> = p
                .blocks
                .iter_mut()
                .flat_map(|b| b.steps.iter_mut())
                .filter_map(|s| match s {
                    Step::ChunkLoop { trips, .. } => Some(trips),
                    _ => None,
                })
                .collect();
            let n = loops.len() as u64;
            let t = loops.into_iter().nth(rng.below(n) as usize)?;
            *t = nudge(rng, *t).min(64);
            "loop trips".to_string()
        }
        // Steps dropped, duplicated or swapped within a block (loop bodies included).
        3..=5 => {
            if p.blocks.is_empty() {
                return None;
            }
            let b = rng.below(p.blocks.len() as u64) as usize;
            let steps = &mut p.blocks[b].steps;
            let body: &mut Vec<Step> = {
                let loops: Vec<usize> =
                    (0..steps.len()).filter(|&i| matches!(steps[i], Step::ChunkLoop { .. })).collect();
                if !loops.is_empty() && rng.below(2) == 0 {
                    let i = loops[rng.below(loops.len() as u64) as usize];
                    match &mut steps[i] {
                        Step::ChunkLoop { body, .. } => body,
                        _ => unreachable!(),
                    }
                } else {
                    steps
                }
            };
            if body.is_empty() {
                return None;
            }
            let i = rng.below(body.len() as u64) as usize;
            match rng.below(3) {
                0 => {
                    body.remove(i);
                    format!("block {b}: step {i} dropped")
                }
                1 => {
                    let s = body[i].clone();
                    body.insert(i, s);
                    format!("block {b}: step {i} duplicated")
                }
                _ => {
                    let j = rng.below(body.len() as u64) as usize;
                    body.swap(i, j);
                    format!("block {b}: steps {i} and {j} swapped")
                }
            }
        }
        // One field of one step.
        _ => {
            let mut all: Vec<&mut Step> = p.blocks.iter_mut().flat_map(|b| steps_mut(&mut b.steps)).collect();
            if all.is_empty() {
                return None;
            }
            let i = rng.below(all.len() as u64) as usize;
            let s = &mut *all[i];
            let name = s.name();
            let field = edit_step(rng, s, world);
            format!("{name} #{i}: {field}")
        }
    };
    Some(format!("{at}: {what}"))
}

/// The verifier's options in a comparison: exhaustive (a sampled verdict is no verdict), with
/// the reductions as shipped.
pub fn verifier_options(max_states: u64) -> Options {
    Options { max_states, mode: Mode::Exhaustive, ..Options::default() }
}

/// How one case came out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Both accept or both reject.
    Agree { accepted: bool },
    /// The verifier accepts what the reference rejects: the verifier is unsound here.
    VerifierAcceptsBroken(String),
    /// The verifier rejects what the reference accepts.
    VerifierRejectsGood(String),
    /// One of them ran out of budget.
    Inconclusive,
}

/// Judges `calls` with both.
pub fn compare(calls: &[Vec<Plan>], verifier_states: u64, reference_states: u64) -> Outcome {
    let report = verify(calls, &verifier_options(verifier_states));
    let verifier_budget = report
        .result
        .as_ref()
        .err()
        .is_some_and(|v| v.message.starts_with("state budget of") && v.property == Property::Structure);
    if verifier_budget {
        return Outcome::Inconclusive;
    }
    match (report.result, reference::check(calls, reference_states)) {
        (_, Verdict::Inconclusive { .. }) => Outcome::Inconclusive,
        (Ok(()), Verdict::Accept { .. }) => Outcome::Agree { accepted: true },
        (Err(_), Verdict::Reject(_)) => Outcome::Agree { accepted: false },
        (Ok(()), Verdict::Reject(why)) => Outcome::VerifierAcceptsBroken(why),
        (Err(v), Verdict::Accept { .. }) => Outcome::VerifierRejectsGood(format!("{}: {}", v.property, v.message)),
    }
}
