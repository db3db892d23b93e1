//! Mutation operators over plans, to prove the verifier can fail (docs/design.md §3.5). They work
//! on any plan; every applicable site of a plan set is enumerable.

use crate::plan::{EpochVal, NotifyKind, Plan, Region, Space, Step};

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
    /// Subtract one from one epoch value.
    EpochMinusOne,
    /// Add two to one epoch value (a value a lap's worth of signals could reach).
    EpochPlusTwo,
    /// Start one step of a chunk loop a chunk later (`from + 1`).
    GuardFromLater,
    /// End one step of a chunk loop a chunk earlier (its last active chunk skipped).
    GuardUntilEarlier,
    /// Point one region of a data step at the next rank's buffer of the same kind.
    SpaceOtherRank,
    /// Make one data step's partition one byte shorter.
    LenShort,
    /// Declare a rank's input or output one byte shorter than the spec's.
    ResourceShort,
}

impl Mutation {
    pub const ALL: [Mutation; 13] = [
        Mutation::DropWait,
        Mutation::DropDrain,
        Mutation::DropArrive,
        Mutation::DropHandshake,
        Mutation::EpochOffByOne,
        Mutation::RegionOffByOne,
        Mutation::EpochMinusOne,
        Mutation::EpochPlusTwo,
        Mutation::GuardFromLater,
        Mutation::GuardUntilEarlier,
        Mutation::SpaceOtherRank,
        Mutation::LenShort,
        Mutation::ResourceShort,
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
            Mutation::EpochMinusOne => "epoch-minus-one",
            Mutation::EpochPlusTwo => "epoch-plus-two",
            Mutation::GuardFromLater => "guard-from-later",
            Mutation::GuardUntilEarlier => "guard-until-earlier",
            Mutation::SpaceOtherRank => "space-other-rank",
            Mutation::LenShort => "len-short",
            Mutation::ResourceShort => "resource-short",
        }
    }

    pub fn from_name(s: &str) -> Option<Mutation> {
        Mutation::ALL.into_iter().find(|m| m.name() == s)
    }
}

/// Number of sites of `m` in one step: the step, or the notifications, values, regions it
/// applies to. `in_loop`: whether the step is in a chunk loop's body.
fn sites_in_step(m: Mutation, s: &Step, in_loop: bool) -> usize {
    match (m, s) {
        (Mutation::EpochMinusOne | Mutation::EpochPlusTwo, s) => epoch_vals(s).len(),
        (Mutation::GuardFromLater | Mutation::GuardUntilEarlier, s) => usize::from(in_loop && guarded(s)),
        (Mutation::SpaceOtherRank, s) => regions(s).iter().filter(|r| ranked(r.space)).count(),
        (Mutation::LenShort, s) => usize::from(len_total(s).is_some_and(|t| t > 0)),
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

/// Whether a space names a rank.
fn ranked(s: Space) -> bool {
    !matches!(s, Space::Input | Space::Output)
}

fn len_total(s: &Step) -> Option<u64> {
    match s {
        Step::Stage { len, .. }
        | Step::Gather { len, .. }
        | Step::Reduce { len, .. }
        | Step::PutPackets { len, .. } => Some(len.total),
        _ => None,
    }
}

/// Whether the step has a guard.
fn guarded(s: &Step) -> bool {
    !matches!(s, Step::ChunkLoop { .. } | Step::HandshakeSend { .. } | Step::HandshakeWait { .. })
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

/// Applies mutation `m` at site `i` of step `s` (in a loop of `trips` trips, 1 outside one)
/// of a call of `world` ranks; returns whether the step must be removed.
fn apply_in_step(m: Mutation, s: &mut Step, i: usize, trips: u64, world: u32) -> bool {
    match m {
        Mutation::EpochMinusOne | Mutation::EpochPlusTwo => {
            if let Some(v) = epoch_vals_mut(s).into_iter().nth(i) {
                v.add += if m == Mutation::EpochMinusOne { -1 } else { 2 };
            }
            false
        }
        Mutation::GuardFromLater | Mutation::GuardUntilEarlier => {
            if let Some(g) = s.guard_mut() {
                if m == Mutation::GuardFromLater {
                    g.from += 1;
                } else {
                    g.until = g.until.min(trips).saturating_sub(1);
                }
            }
            false
        }
        Mutation::SpaceOtherRank => {
            if let Some(r) = regions_mut(s).into_iter().filter(|r| ranked(r.space)).nth(i) {
                let next = |q: u32| (q + 1) % world.max(1);
                r.space = match r.space {
                    Space::Staging(q) => Space::Staging(next(q)),
                    Space::Window(q) => Space::Window(next(q)),
                    Space::PeerOutput(q) => Space::PeerOutput(next(q)),
                    Space::PeerInput(q) => Space::PeerInput(next(q)),
                    other => other,
                };
            }
            false
        }
        Mutation::LenShort => {
            if let Step::Stage { len, .. }
            | Step::Gather { len, .. }
            | Step::Reduce { len, .. }
            | Step::PutPackets { len, .. } = s
            {
                len.total = len.total.saturating_sub(1);
            }
            false
        }
        Mutation::ResourceShort => false,
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
        if m == Mutation::ResourceShort {
            // Index 0: the input, 1: the output (each where the rank declares any).
            for (index, bytes) in [p.resources.input_bytes, p.resources.output_bytes].into_iter().enumerate() {
                if bytes > 0 {
                    out.push(Site { rank, block: 0, step: 0, body: None, index });
                }
            }
            continue;
        }
        for (block, b) in p.blocks.iter().enumerate() {
            for (step, s) in b.steps.iter().enumerate() {
                if let Step::ChunkLoop { body, .. } = s {
                    for (j, t) in body.iter().enumerate() {
                        for index in 0..sites_in_step(m, t, true) {
                            out.push(Site { rank, block, step, body: Some(j), index });
                        }
                    }
                } else {
                    for index in 0..sites_in_step(m, s, false) {
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
    let world = plans.len() as u32;
    if m == Mutation::ResourceShort {
        let r = &mut out[site.rank].resources;
        let bytes = if site.index == 0 { &mut r.input_bytes } else { &mut r.output_bytes };
        *bytes = bytes.saturating_sub(1);
        return out;
    }
    let steps = &mut out[site.rank].blocks[site.block].steps;
    match site.body {
        Some(j) => {
            if let Some(Step::ChunkLoop { body, trips }) = steps.get_mut(site.step) {
                if apply_in_step(m, &mut body[j], site.index, *trips, world) {
                    body.remove(j);
                }
            }
        }
        None => {
            if apply_in_step(m, &mut steps[site.step], site.index, 1, world) {
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
