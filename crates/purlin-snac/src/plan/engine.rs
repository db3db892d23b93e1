//! Copy-engine programs ([`EngineProgram`]): the part of a one-copy call that a rank's copy
//! engines run instead of SM blocks (docs/perf/copy-engines.md §3).
//!
//! A plan with an engine program is three kernels and an engine segment on one stream:
//! the **entry kernel** (the blocks of role [`Role::CeEntry`]), the **main kernel** (every
//! other role but the exit's; none in a pure copy-engine plan), the **exit kernel** (role
//! [`Role::CeExit`]), in that order in the block list. The engine program runs after the
//! entry kernel, and either before the main kernel ([`Phase::Sequential`]) or beside it
//! ([`Phase::Forked`]); the exit kernel starts after both. The program has no waits: the
//! entry kernel did the waiting, bounded, so the engine never blocks.
//!
//! [`lower`] gives the meaning of a program in the terms of block steps, which is how the
//! verifier and its reference checker see it: the engine becomes one more block (role
//! [`Role::CopyEngine`]) whose copies are gathers and whose notifies are signals, and
//! stream order becomes signals and waits on words no plan uses.

use serde::{Deserialize, Serialize};

use super::{Advance, BlockProgram, EpochVal, Guard, Index, Len, Notify, NotifyKind, Plan, Region, Role, Space, Step};

/// Where an engine program runs in its rank's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Phase {
    /// After the entry kernel and the main kernel, before the exit kernel (one stream).
    Sequential,
    /// After the entry kernel, beside the main kernel (a side stream forked after the entry
    /// kernel), joined before the exit kernel.
    Forked,
}

/// One step of an engine program.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EngineStep {
    /// Copies `len` bytes from `src` (this rank's input) into `dst` (a peer's output, or this
    /// rank's own). Copies that follow each other with no notify between them form one batch:
    /// they run in no order among themselves and write disjoint bytes.
    Copy { dst: Region, src: Region, len: Len, guard: Guard },
    /// A release store, made after every earlier step of the program has completed ("copy,
    /// then notify"). Its value is the call's epoch plus `value.add` (no chunks here).
    Notify(Notify),
}

/// A rank's copy-engine program for one call.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EngineProgram {
    pub after: Phase,
    pub steps: Vec<EngineStep>,
}

impl EngineProgram {
    /// The notifies, in order.
    pub fn notifies(&self) -> impl Iterator<Item = &Notify> {
        self.steps.iter().filter_map(|s| match s {
            EngineStep::Notify(n) => Some(n),
            EngineStep::Copy { .. } => None,
        })
    }

    /// The batches of copies between notifies, each followed by the notifies after it:
    /// `(copies, notifies)` in program order.
    pub fn segments(&self) -> Vec<(Vec<&EngineStep>, Vec<&Notify>)> {
        let mut out: Vec<(Vec<&EngineStep>, Vec<&Notify>)> = vec![];
        for s in &self.steps {
            match s {
                EngineStep::Copy { .. } => match out.last_mut().filter(|(_, ns)| ns.is_empty()) {
                    Some((cs, _)) => cs.push(s),
                    None => out.push((vec![s], vec![])),
                },
                EngineStep::Notify(n) => match out.last_mut() {
                    Some((_, ns)) => ns.push(n),
                    None => out.push((vec![], vec![n])),
                },
            }
        }
        out
    }
}

/// Which kernel of the stream a block belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kernel {
    Entry,
    Main,
    Exit,
}

impl Kernel {
    /// The kernel of a block of `role` (in a plan with an engine program).
    pub fn of(role: Role) -> Kernel {
        match role {
            Role::CeEntry => Kernel::Entry,
            Role::CeExit => Kernel::Exit,
            _ => Kernel::Main,
        }
    }
}

impl Plan {
    /// The engine program's structural checks (docs/perf/copy-engines.md §3.3): only one-copy
    /// plans with a fixed advance carry one; blocks come as entry, main, exit kernels;
    /// copies read this rank's input and write a peer's output or the own, at fixed offsets;
    /// every notify comes after the last copy into the output of the rank it notifies; the
    /// copies of one batch write disjoint bytes; the value words suffice. Without a program,
    /// no block has a copy-engine role.
    pub(super) fn check_engine(&self) -> Result<(), String> {
        let Some(eng) = &self.engine else {
            return match self.blocks.iter().position(|b| matches!(b.role, Role::CeEntry | Role::CeExit)) {
                Some(b) => Err(format!("block {b} has a copy-engine role but the plan has no engine program")),
                None if self.resources.ce_value_words > 0 => Err("copy-engine value words without a program".into()),
                None => Ok(()),
            };
        };
        if !self.one_copy {
            return Err("only a one-copy plan carries an engine program".into());
        }
        let a = match self.advance {
            Advance::Fixed(a) if a >= 1 => a,
            _ => return Err("a plan with an engine program advances by a fixed amount of at least 1".into()),
        };
        if let Some(b) = self.blocks.iter().position(|b| b.role == Role::CopyEngine) {
            return Err(format!("block {b}: the copy-engine role is the verifier's, not a block's"));
        }
        let kernels: Vec<Kernel> = self.blocks.iter().map(|b| Kernel::of(b.role)).collect();
        if kernels.windows(2).any(|w| w[0] > w[1]) {
            return Err("blocks must come as the entry kernel's, the main kernel's, then the exit kernel's".into());
        }
        let world = self.spec.world;
        let mut notifies = 0u32;
        let mut last_copy_into = vec![None::<usize>; world as usize];
        let mut first_notify_to = vec![None::<usize>; world as usize];
        for (i, s) in eng.steps.iter().enumerate() {
            match s {
                EngineStep::Copy { dst, src, len, guard } => {
                    let fixed = |r: &Region| r.offset.chunk_stride == 0 && r.offset.sense_stride == 0;
                    if !fixed(dst) || !fixed(src) || len.chunk_stride != 0 {
                        return Err(format!("engine step {i}: engine copies have fixed offsets and lengths"));
                    }
                    // The input (a gather's parts), or the own output (an AllReduce's reduced shard).
                    if !matches!(src.space, Space::Input | Space::Output) {
                        return Err(format!("engine step {i}: an engine copy reads this rank's input or output"));
                    }
                    let to = match dst.space {
                        Space::Output => self.rank,
                        Space::PeerOutput(q) if q < world => q,
                        _ => return Err(format!("engine step {i}: an engine copy writes a rank's output")),
                    };
                    let range = (guard.from, guard.until.min(1));
                    self.check_region(dst, len, range)?;
                    self.check_region(src, len, range)?;
                    if range.0 < range.1 && len.at(0) > 0 {
                        last_copy_into[to as usize] = Some(i);
                    }
                }
                EngineStep::Notify(n) => {
                    self.check_notify(n, (0, 1))?;
                    if n.value.chunk_mul != 0 || n.value.add > a as i64 {
                        return Err(format!(
                            "engine step {i}: a notify's value is E + k with k at most the advance {a}"
                        ));
                    }
                    notifies += 1;
                    first_notify_to[n.peer as usize].get_or_insert(i);
                }
            }
        }
        for q in 0..world as usize {
            if let (Some(n), Some(c)) = (first_notify_to[q], last_copy_into[q]) {
                if n < c {
                    return Err(format!(
                        "engine step {n} notifies rank {q} before step {c}, a copy into its output, completes"
                    ));
                }
            }
        }
        // The own output under either name.
        let own = |sp: Space| if sp == Space::PeerOutput(self.rank) { Space::Output } else { sp };
        for (copies, _) in eng.segments() {
            let live = || {
                copies.iter().filter_map(|s| match s {
                    EngineStep::Copy { dst, src, len, guard } if guard.admits(0) && len.at(0) > 0 => {
                        Some((dst, src, len.at(0)))
                    }
                    _ => None,
                })
            };
            let mut spans: Vec<(Space, u64, u64)> =
                live().map(|(d, _, n)| (own(d.space), d.offset.base, d.offset.base + n)).collect();
            spans.sort();
            if spans.windows(2).any(|w| w[0].0 == w[1].0 && w[1].1 < w[0].2) {
                return Err("copies of one engine batch write overlapping bytes".into());
            }
            // A batch's copies run in no order, so none reads what another writes. The own
            // output is the one space a copy may both read and write (the input too, in place).
            let in_output = |src: &Region| match (src.space, self.resources.alias) {
                (Space::Output, _) => Some(src.offset.base),
                (Space::Input, Some(super::Alias::InputInOutput(o))) => Some(o + src.offset.base),
                _ => None,
            };
            let reads_written = live().any(|(_, src, n)| {
                in_output(src)
                    .is_some_and(|at| spans.iter().any(|&(sp, a, z)| sp == Space::Output && a < at + n && at < z))
            });
            if reads_written {
                return Err("a copy of one engine batch reads bytes another copy of it writes".into());
            }
        }
        if self.resources.ce_value_words < notifies {
            return Err(format!(
                "{notifies} engine notifies but {} copy-engine value words",
                self.resources.ce_value_words
            ));
        }
        Ok(())
    }
}

/// The first flag word of the stream-order words [`lower`] uses: far above any plan's flags
/// (every plan's flag indices lie below its `flag_words`).
const STREAM_WORDS: u32 = u32::MAX - (1 << 20);

/// The plan with its engine program expressed in block steps, for the verifier and the
/// reference checker: the program becomes one more block, of role [`Role::CopyEngine`], after
/// every other block; its copies are gathers (data accesses) and its notifies signals
/// (releases that cover every earlier copy). The copies of one batch are ordered in the block;
/// [`Plan::check`] makes them write disjoint bytes and read none that another writes, so the
/// order hides no race. Stream order becomes signals and waits on this
/// rank's own words above `STREAM_WORDS`, valued `E + 1`: each block of the entry kernel
/// signals at its end, and the main kernel's blocks wait for them; the engine block waits for
/// the entry kernel (and, sequential, the main kernel) first and signals at its end; the exit
/// kernel's blocks wait for all of those first. A plan advances by at least 1 per call, so
/// a later call's wait is never satisfied by an earlier call's store. A plan without a
/// program is returned unchanged.
pub fn lower(plan: &Plan) -> Plan {
    let Some(eng) = &plan.engine else { return plan.clone() };
    let mut p = plan.clone();
    p.engine = None;
    let rank = p.rank;
    let once = EpochVal::at(1);
    let word = |i: usize| Index::fixed(STREAM_WORDS + i as u32);
    let signal = |i: usize| Step::Signal {
        notify: Notify { kind: NotifyKind::Ready, peer: rank, flag: word(i), value: once },
        guard: Guard::ALWAYS,
    };
    let wait = |i: usize| Step::Wait { flag: word(i), value: once, guard: Guard::ALWAYS };
    let grid = p.blocks.len();
    // Word `b` is block `b`'s end; word `grid` the engine's.
    let of = |k: Kernel| -> Vec<usize> { (0..grid).filter(|&b| Kernel::of(plan.blocks[b].role) == k).collect() };
    let (entry, main) = (of(Kernel::Entry), of(Kernel::Main));
    let mut engine_waits: Vec<usize> = entry.clone();
    if eng.after == Phase::Sequential {
        engine_waits.extend(&main);
    }
    for (b, block) in p.blocks.iter_mut().enumerate() {
        let before: Vec<usize> = match Kernel::of(block.role) {
            Kernel::Entry => vec![],
            Kernel::Main => entry.clone(),
            Kernel::Exit => entry.iter().chain(&main).copied().chain([grid]).collect(),
        };
        block.steps.splice(0..0, before.into_iter().map(wait));
        if Kernel::of(block.role) != Kernel::Exit {
            block.steps.push(signal(b));
        }
    }
    let mut steps: Vec<Step> = engine_waits.into_iter().map(wait).collect();
    for s in &eng.steps {
        steps.push(match s {
            EngineStep::Copy { dst, src, len, guard } => {
                Step::Gather { dst: *dst, src: *src, len: *len, expect: None, guard: *guard }
            }
            EngineStep::Notify(n) => Step::Signal { notify: *n, guard: Guard::ALWAYS },
        });
    }
    steps.push(signal(grid));
    p.blocks.push(BlockProgram { role: Role::CopyEngine, steps });
    // The engine block reads its epoch word at launch like any block (every word holds the
    // call's epoch then) and advances it by the plan's fixed advance like the others.
    p.resources.epoch_words = p.resources.epoch_words.max(p.blocks.len() as u32);
    p.max_coresident_blocks = p.max_coresident_blocks.max(p.blocks.len() as u32);
    p
}

/// [`lower`] applied to every plan of every call.
pub fn lower_calls(calls: &[Vec<Plan>]) -> Vec<Vec<Plan>> {
    calls.iter().map(|ps| ps.iter().map(lower).collect()).collect()
}
