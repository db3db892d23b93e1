//! Shard-landed words ([`PlanConfig::landed`], [`crate::plan::Landed`]): after its last step
//! that completes a source rank's shard of this rank's output, each block arrives on that
//! shard's counter; the last arrival sets the shard's flag word (`E + 1`) in this rank's own
//! words. A block completes shard `q` with a step that writes output bytes of it (a staged or
//! packet plan's reads, a one-copy plan's own part), or, in a one-copy plan, with its wait
//! for `q`'s done signal (`q` stores into this output itself). Which step that is follows from
//! the plan's shape; the verifier checks the claim ([`crate::plan::landed::lower`]).

use super::{DeriveError, PlanConfig};
use crate::plan::{EpochVal, Guard, Index, Landed, Notify, NotifyKind, Plan, Shard, Space, Step};
use crate::types::ConsumeOp;

/// Adds the landed words to `plan`: shard flags at `cfg.flag_words + q` (past the words every
/// plan's protocol uses), arrival counters past the plan's own.
pub(super) fn add(plan: &mut Plan, cfg: &PlanConfig) -> Result<(), DeriveError> {
    let spec = plan.spec.clone();
    let (rank, world) = (plan.rank, spec.world);
    if spec.collective.consume_op() != ConsumeOp::Gather {
        return Err(DeriveError::LandedUnsupported(format!(
            "{} reduces: no shard lands whole",
            spec.collective.name()
        )));
    }
    if plan.engine.is_some() {
        return Err(DeriveError::LandedUnsupported("the copy engines write this plan's shards".into()));
    }
    let shards: Vec<(u64, u64)> =
        (0..world).map(|q| (spec.partition_offset(rank, q, false), spec.pair_bytes(q, rank))).collect();
    let done = super::one_copy::done_flags(cfg, world);
    // The last top-level step of each block that completes each shard.
    let mut last: Vec<Vec<Option<usize>>> = vec![vec![None; world as usize]; plan.blocks.len()];
    for (b, block) in plan.blocks.iter().enumerate() {
        for (i, step) in block.steps.iter().enumerate() {
            let (body, trips) = match step {
                Step::ChunkLoop { trips, body } => (body.as_slice(), *trips),
                s => (std::slice::from_ref(s), 1),
            };
            for s in body {
                for q in completes(s, trips, &shards, plan.one_copy.then_some(&done)) {
                    last[b][q] = Some(i);
                }
            }
        }
    }
    let counters = plan.resources.counter_words;
    // Blocks that complete each shard: its counter's arrivals.
    let arrivals: Vec<u32> =
        (0..world as usize).map(|q| last.iter().filter(|l| l[q].is_some()).count() as u32).collect();
    let mut landed = Landed { shards: vec![] };
    for (q, &(offset, len)) in shards.iter().enumerate() {
        // An empty shard is there at launch, whoever signals its rank's done.
        let flag = (arrivals[q] > 0 && len > 0).then(|| cfg.flag_words + q as u32);
        landed.shards.push(Shard { offset, len, flag });
    }
    for (b, block) in plan.blocks.iter_mut().enumerate() {
        let old = std::mem::take(&mut block.steps);
        for (i, step) in old.into_iter().enumerate() {
            block.steps.push(step);
            for q in 0..world as usize {
                if last[b][q] != Some(i) {
                    continue;
                }
                let Some(flag) = landed.shards[q].flag else { continue };
                block.steps.push(Step::Arrive {
                    counter: Index::fixed(counters + q as u32),
                    arrivals: arrivals[q],
                    then: vec![Notify {
                        kind: NotifyKind::Ready,
                        peer: rank,
                        flag: Index::fixed(flag),
                        value: EpochVal::at(1),
                    }],
                    guard: Guard::ALWAYS,
                    reset: None,
                });
            }
        }
    }
    if landed.shards.iter().any(|s| s.flag.is_some()) {
        plan.resources.counter_words = counters + world;
    }
    plan.resources.flag_words = cfg.flag_words + world;
    plan.landed = Some(landed);
    Ok(())
}

/// The shards step `s` of a loop of `trips` chunks completes: output bytes of them written at
/// some chunk, or (one-copy, `done`: every rank's done flag) the wait for a rank's done.
fn completes(s: &Step, trips: u64, shards: &[(u64, u64)], done: Option<&Vec<Index>>) -> Vec<usize> {
    let mut out = vec![];
    match s {
        Step::Gather { dst, len, guard, .. } | Step::Reduce { dst, len, guard, .. } if dst.space == Space::Output => {
            for c in (0..trips).filter(|&c| guard.admits(c)) {
                let n = len.at(c);
                if n == 0 {
                    continue;
                }
                for sense in 0..2 {
                    let a = dst.offset.at(c, sense);
                    for (q, &(o, l)) in shards.iter().enumerate() {
                        if a < o + l && o < a + n && !out.contains(&q) {
                            out.push(q);
                        }
                    }
                }
                if out.len() == shards.len() {
                    break;
                }
            }
        }
        Step::Wait { flag, .. } => {
            if let Some(done) = done {
                out.extend(done.iter().position(|d| d == flag));
            }
        }
        _ => {}
    }
    out
}
