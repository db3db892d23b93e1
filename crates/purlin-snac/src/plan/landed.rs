//! Shard-landed words ([`Landed`]): the plan's claim that a source rank's shard of this rank's
//! output is final once a flag word is set, for code that consumes the output during the call
//! (a fused kernel's `purlin::wait_shard`). Derived by `derive::landed`; checked here for shape
//! and by the verifier for truth, through [`lower`].

use super::{BlockProgram, EpochVal, Guard, Index, Landed, Len, Offset, Plan, Region, Role, Space, Step};

impl Plan {
    /// The structural checks of [`Plan::landed`]: one shard per rank, each the spec's part of
    /// this rank's output from that rank, flags within the plan's flag words and distinct.
    pub(super) fn check_landed(&self) -> Result<(), String> {
        let Some(l) = &self.landed else { return Ok(()) };
        let spec = &self.spec;
        if spec.collective.consume_op() != crate::types::ConsumeOp::Gather {
            return Err(format!("{} has no source shards to land", spec.collective.name()));
        }
        if l.shards.len() != spec.world as usize {
            return Err(format!("{} landed shards in world {}", l.shards.len(), spec.world));
        }
        let mut flags = vec![];
        for (q, s) in l.shards.iter().enumerate() {
            let q = q as u32;
            let want = (spec.partition_offset(self.rank, q, false), spec.pair_bytes(q, self.rank));
            if (s.offset, s.len) != want {
                return Err(format!(
                    "landed shard {q} is [{}, +{}), the spec's is [{}, +{})",
                    s.offset, s.len, want.0, want.1
                ));
            }
            if let Some(f) = s.flag {
                if f >= self.resources.flag_words {
                    return Err(format!(
                        "landed flag {f} of shard {q} outside {} flag words",
                        self.resources.flag_words
                    ));
                }
                if flags.contains(&f) {
                    return Err(format!("landed flag {f} serves two shards"));
                }
                flags.push(f);
            } else if s.len > 0 && !self.own_part_in_place(q) {
                return Err(format!("landed shard {q} has bytes to receive but no flag"));
            }
        }
        if self.blocks.iter().any(|b| b.role == Role::ShardReader) {
            return Err("the shard-reader role is the verifier's, not a block's".into());
        }
        Ok(())
    }

    /// Whether shard `q` is this rank's own part of an in-place call (already in the output).
    fn own_part_in_place(&self, q: u32) -> bool {
        q == self.rank && self.resources.alias.is_some()
    }
}

/// The plan as the verifier sees its [`Landed`] claim: one more block per signalled shard, of
/// role [`Role::ShardReader`], that waits for the shard's flag (`E + 1`) and then reads the
/// shard's bytes of the output into scratch staging past the plan's own. The model then checks
/// the claim: a read not ordered after a write of the shard is a race, a later write not
/// ordered after the read is a reuse violation, so an accepted plan writes every byte of the
/// shard before its flag and none after. Shards there at launch get a reader without a wait.
/// One block per shard, so no shard's wait orders another's read. A plan without landed words
/// is returned unchanged.
pub fn lower(plan: &Plan, scratch_base: u64) -> Plan {
    let Some(l) = &plan.landed else { return plan.clone() };
    let mut p = plan.clone();
    p.landed = None;
    let mut at = scratch_base;
    for s in &l.shards {
        if s.len == 0 {
            continue;
        }
        let mut steps = vec![];
        if let Some(f) = s.flag {
            steps.push(Step::Wait { flag: Index::fixed(f), value: EpochVal::at(1), guard: Guard::ALWAYS });
        }
        steps.push(Step::Gather {
            dst: Region::new(Space::Staging(plan.rank), Offset::fixed(at)),
            src: Region::output(Offset::fixed(s.offset)),
            len: Len::fixed(s.len),
            expect: None,
            guard: Guard::ALWAYS,
        });
        at += s.len;
        p.blocks.push(BlockProgram { role: Role::ShardReader, steps });
    }
    p.resources.staging_bytes = p.resources.staging_bytes.max(at);
    p.resources.epoch_words = p.resources.epoch_words.max(p.blocks.len() as u32);
    p.max_coresident_blocks = p.max_coresident_blocks.max(p.blocks.len() as u32);
    p
}

/// [`lower`] applied to every plan of every call, with one scratch base for all: staging
/// sizes are symmetric, so every rank's scratch starts past the largest plan's staging.
pub fn lower_calls(calls: &[Vec<Plan>]) -> Vec<Vec<Plan>> {
    let base = calls.iter().flatten().map(|p| p.resources.staging_bytes).max().unwrap_or(0);
    let scratch = calls
        .iter()
        .flatten()
        .map(|p| p.landed.as_ref().map_or(0, |l: &Landed| l.shards.iter().map(|s| s.len).sum::<u64>()))
        .max()
        .unwrap_or(0);
    calls
        .iter()
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    let mut q = lower(p, base);
                    q.resources.staging_bytes = base + scratch;
                    q
                })
                .collect()
        })
        .collect()
}
