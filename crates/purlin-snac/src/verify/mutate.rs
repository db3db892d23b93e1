//! Mutation operators over plans, to prove the verifier can fail (docs/design.md §3.5). They work
//! on any plan; every applicable site of a plan set is enumerable.

use crate::plan::{EpochVal, NotifyKind, Plan, Region, Step};

/// A mutation operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// Remove one `Wait`.
    DropWait,
    /// Remove one drain notification (a `Signal` of kind drain, or one in an `Arrive`).
    DropDrain,
    /// Remove one `Arrive`.
    DropArrive,
    /// Remove one handshake send or wait.
    DropHandshake,
    /// Add one to one epoch value (a flag written or expected).
    EpochOffByOne,
    /// Shift one region of a data step by one byte.
    RegionOffByOne,
}

impl Mutation {
    pub const ALL: [Mutation; 6] = [
        Mutation::DropWait,
        Mutation::DropDrain,
        Mutation::DropArrive,
        Mutation::DropHandshake,
        Mutation::EpochOffByOne,
        Mutation::RegionOffByOne,
    ];

    /// Kebab-case name (`drop-wait`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Mutation::DropWait => "drop-wait",
            Mutation::DropDrain => "drop-drain",
            Mutation::DropArrive => "drop-arrive",
            Mutation::DropHandshake => "drop-handshake",
            Mutation::EpochOffByOne => "epoch-off-by-one",
            Mutation::RegionOffByOne => "region-off-by-one",
        }
    }

    pub fn from_name(s: &str) -> Option<Mutation> {
        Mutation::ALL.into_iter().find(|m| m.name() == s)
    }
}

/// Number of sites of `m` in one plan: a step (or a notification, value, region) it applies to.
fn sites_in_step(m: Mutation, s: &Step) -> usize {
    match (m, s) {
        (Mutation::DropWait, Step::Wait { .. }) => 1,
        (Mutation::DropDrain, Step::Signal { notify, .. }) => (notify.kind == NotifyKind::Drain) as usize,
        (Mutation::DropDrain, Step::Arrive { then, .. }) => then.iter().filter(|n| n.kind == NotifyKind::Drain).count(),
        (Mutation::DropArrive, Step::Arrive { .. }) => 1,
        (Mutation::DropHandshake, Step::HandshakeSend { .. } | Step::HandshakeWait { .. }) => 1,
        (Mutation::EpochOffByOne, s) => epoch_vals(s).len(),
        (Mutation::RegionOffByOne, s) => regions(s).len(),
        _ => 0,
    }
}

fn epoch_vals(s: &Step) -> Vec<EpochVal> {
    match s {
        Step::Gather { expect: Some(v), .. } | Step::Reduce { expect: Some(v), .. } => vec![*v],
        Step::PutPackets { flag, .. } => vec![*flag],
        Step::Signal { notify, .. } => vec![notify.value],
        Step::Wait { value, .. } => vec![*value],
        Step::Arrive { then, .. } => then.iter().map(|n| n.value).collect(),
        Step::HandshakeSend { flag, .. } => vec![*flag],
        Step::HandshakeWait { expect, .. } => vec![*expect],
        _ => vec![],
    }
}

fn epoch_vals_mut(s: &mut Step) -> Vec<&mut EpochVal> {
    match s {
        Step::Gather { expect: Some(v), .. } | Step::Reduce { expect: Some(v), .. } => vec![v],
        Step::PutPackets { flag, .. } => vec![flag],
        Step::Signal { notify, .. } => vec![&mut notify.value],
        Step::Wait { value, .. } => vec![value],
        Step::Arrive { then, .. } => then.iter_mut().map(|n| &mut n.value).collect(),
        Step::HandshakeSend { flag, .. } => vec![flag],
        Step::HandshakeWait { expect, .. } => vec![expect],
        _ => vec![],
    }
}

fn regions(s: &Step) -> Vec<Region> {
    match s {
        Step::Stage { dst, src, .. } | Step::Gather { dst, src, .. } | Step::PutPackets { dst, src, .. } => {
            vec![*dst, *src]
        }
        Step::Reduce { dst, srcs, .. } => std::iter::once(*dst).chain(srcs.iter().copied()).collect(),
        _ => vec![],
    }
}

fn regions_mut(s: &mut Step) -> Vec<&mut Region> {
    match s {
        Step::Stage { dst, src, .. } | Step::Gather { dst, src, .. } | Step::PutPackets { dst, src, .. } => {
            vec![dst, src]
        }
        Step::Reduce { dst, srcs, .. } => std::iter::once(dst).chain(srcs.iter_mut()).collect(),
        _ => vec![],
    }
}

/// Applies mutation `m` at site `i` of step `s`; returns whether the step must be removed.
fn apply_in_step(m: Mutation, s: &mut Step, i: usize) -> bool {
    match m {
        Mutation::DropWait | Mutation::DropArrive | Mutation::DropHandshake => true,
        Mutation::DropDrain => match s {
            Step::Signal { .. } => true,
            Step::Arrive { then, .. } => {
                if let Some(j) =
                    then.iter().enumerate().filter(|(_, n)| n.kind == NotifyKind::Drain).map(|(j, _)| j).nth(i)
                {
                    then.remove(j);
                }
                false
            }
            _ => false,
        },
        Mutation::EpochOffByOne => {
            if let Some(v) = epoch_vals_mut(s).into_iter().nth(i) {
                v.add += 1;
            }
            false
        }
        Mutation::RegionOffByOne => {
            if let Some(r) = regions_mut(s).into_iter().nth(i) {
                r.offset.base += 1;
            }
            false
        }
    }
}

/// A site: `(rank, block, top-level step, body step, index within the step)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Site {
    pub rank: usize,
    pub block: usize,
    pub step: usize,
    pub body: Option<usize>,
    pub index: usize,
}

/// Every site of `m` in a call's plans.
pub fn sites(plans: &[Plan], m: Mutation) -> Vec<Site> {
    let mut out = vec![];
    for (rank, p) in plans.iter().enumerate() {
        for (block, b) in p.blocks.iter().enumerate() {
            for (step, s) in b.steps.iter().enumerate() {
                if let Step::ChunkLoop { body, .. } = s {
                    for (j, t) in body.iter().enumerate() {
                        for index in 0..sites_in_step(m, t) {
                            out.push(Site { rank, block, step, body: Some(j), index });
                        }
                    }
                } else {
                    for index in 0..sites_in_step(m, s) {
                        out.push(Site { rank, block, step, body: None, index });
                    }
                }
            }
        }
    }
    out
}

/// The plans with mutation `m` applied at `site`.
pub fn apply(plans: &[Plan], m: Mutation, site: Site) -> Vec<Plan> {
    let mut out = plans.to_vec();
    let steps = &mut out[site.rank].blocks[site.block].steps;
    match site.body {
        Some(j) => {
            if let Some(Step::ChunkLoop { body, .. }) = steps.get_mut(site.step) {
                if apply_in_step(m, &mut body[j], site.index) {
                    body.remove(j);
                }
            }
        }
        None => {
            if apply_in_step(m, &mut steps[site.step], site.index) {
                steps.remove(site.step);
            }
        }
    }
    out
}

impl std::fmt::Display for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {} block {} step {}", self.rank, self.block, self.step)?;
        if let Some(j) = self.body {
            write!(f, ".{j}")?;
        }
        if self.index > 0 {
            write!(f, " #{}", self.index)?;
        }
        Ok(())
    }
}
