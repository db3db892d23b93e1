//! Mutation operators at the copy-engine sites of a plan set (docs/perf/copy-engines.md §3.4):
//! each makes a plan the verifier must reject, to show that its copy-engine agent can fail.
//! Apart from [`super::mutate`]'s operators, which edit block steps only.

use crate::plan::{BlockProgram, EngineStep, Phase, Plan, Role, Space, Step};

/// Every copy-engine mutant of one call's plan set: `(description, plans)`, one rank's plan
/// edited in each. Empty for plans without engine programs.
pub fn engine_mutants(plans: &[Plan]) -> Vec<(String, Vec<Plan>)> {
    let mut out = vec![];
    for (r, p) in plans.iter().enumerate() {
        let Some(eng) = &p.engine else { continue };
        let mut push = |what: String, edited: Plan| {
            let mut set = plans.to_vec();
            set[r] = edited;
            out.push((format!("rank {r}: {what}"), set));
        };
        // Drop an engine notify.
        for (i, s) in eng.steps.iter().enumerate() {
            if let EngineStep::Notify(n) = s {
                let mut q = p.clone();
                q.engine.as_mut().map(|e| e.steps.remove(i));
                push(format!("engine notify {i} (to rank {}) dropped", n.peer), q);
            }
        }
        // Move a notify before the last copy it covers (that copy then follows it).
        for (i, s) in eng.steps.iter().enumerate() {
            let EngineStep::Notify(n) = s else { continue };
            let last = eng.steps[..i].iter().rposition(|c| match c {
                EngineStep::Copy { dst, len, .. } if len.at(0) > 0 => match dst.space {
                    Space::PeerOutput(q) => q == n.peer,
                    Space::Output => n.peer == p.rank,
                    _ => false,
                },
                _ => false,
            });
            if let Some(c) = last {
                let mut q = p.clone();
                if let Some(e) = q.engine.as_mut() {
                    let moved = e.steps.remove(i);
                    e.steps.insert(c, moved);
                }
                push(format!("engine notify {i} moved before copy {c}"), q);
            }
        }
        // Shift each copy's destination, then its source, by one byte.
        for (i, s) in eng.steps.iter().enumerate() {
            let EngineStep::Copy { len, .. } = s else { continue };
            if len.at(0) == 0 {
                continue;
            }
            for (what, dst) in [("destination", true), ("source", false)] {
                let mut q = p.clone();
                if let Some(EngineStep::Copy { dst: d, src, .. }) = q.engine.as_mut().map(|e| &mut e.steps[i]) {
                    let reg = if dst { d } else { src };
                    reg.offset.base = reg.offset.base.wrapping_add(1);
                }
                push(format!("engine copy {i}'s {what} shifted by one"), q);
            }
        }
        let entry: Vec<usize> = (0..p.blocks.len()).filter(|&b| p.blocks[b].role == Role::CeEntry).collect();
        // Drop the entry kernel's waits, one at a time (top level, or in a chunk loop's body).
        for &b in &entry {
            for (i, s) in p.blocks[b].steps.iter().enumerate() {
                let inner: Vec<Option<usize>> = match s {
                    Step::Wait { .. } => vec![None],
                    Step::ChunkLoop { body, .. } => {
                        (0..body.len()).filter(|&k| matches!(body[k], Step::Wait { .. })).map(Some).collect()
                    }
                    _ => vec![],
                };
                for k in inner {
                    let mut q = p.clone();
                    match (k, &mut q.blocks[b].steps[i]) {
                        (None, _) => {
                            q.blocks[b].steps.remove(i);
                        }
                        (Some(k), Step::ChunkLoop { body, .. }) => {
                            body.remove(k);
                        }
                        _ => continue,
                    }
                    let at = k.map_or(String::new(), |k| format!(" (loop body step {k})"));
                    push(format!("entry kernel block {b}'s wait {i}{at} dropped"), q);
                }
            }
        }
        if eng.after != Phase::Sequential {
            continue;
        }
        let reduces = |b: &BlockProgram| {
            b.steps.iter().any(|s| match s {
                Step::Reduce { .. } => true,
                Step::ChunkLoop { body, .. } => body.iter().any(|s| matches!(s, Step::Reduce { .. })),
                _ => false,
            })
        };
        let top_waits = |b: &BlockProgram| b.steps.iter().any(|s| matches!(s, Step::Wait { .. }));
        if entry.iter().any(|&b| reduces(&p.blocks[b])) {
            // Copy before the reduce finished: the reducing blocks become a main kernel that the
            // engine runs beside, and a new entry block keeps every entry wait (so the peers'
            // outputs stay ordered and only the reduce is not).
            let mut q = p.clone();
            let mut waits: Vec<Step> = vec![];
            for &b in &entry {
                let mut seen = |s: &Step| {
                    if let Step::Wait { flag, value, .. } = s {
                        let w = Step::Wait { flag: *flag, value: *value, guard: crate::plan::Guard::ALWAYS };
                        if !waits.contains(&w) {
                            waits.push(w);
                        }
                    }
                };
                for s in &p.blocks[b].steps {
                    match s {
                        Step::ChunkLoop { body, .. } => body.iter().for_each(&mut seen),
                        s => seen(s),
                    }
                }
                if reduces(&p.blocks[b]) {
                    q.blocks[b].role = Role::Producer;
                }
            }
            // Entry kernel, then main, then exit: the new entry block goes first.
            q.blocks.insert(0, BlockProgram { role: Role::CeEntry, steps: waits });
            let (head, rest): (Vec<_>, Vec<_>) = q.blocks.drain(..).partition(|b| b.role == Role::CeEntry);
            q.blocks = head.into_iter().chain(rest).collect();
            if let Some(e) = q.engine.as_mut() {
                e.after = Phase::Forked;
            }
            push("engine forked beside the reduce (copies before the shard is reduced)".into(), q);
        } else if let Some(&b) = entry.iter().find(|&&b| top_waits(&p.blocks[b])) {
            // Fork the engine before the entry wait: the waits move to a main-kernel block that
            // the engine runs beside.
            let mut q = p.clone();
            let moved: Vec<Step> =
                q.blocks[b].steps.iter().filter(|s| matches!(s, Step::Wait { .. })).cloned().collect();
            q.blocks[b].steps.retain(|s| !matches!(s, Step::Wait { .. }));
            q.blocks.insert(b + 1, BlockProgram { role: Role::Producer, steps: moved });
            if let Some(e) = q.engine.as_mut() {
                e.after = Phase::Forked;
            }
            push("engine forked before the entry kernel's wait".into(), q);
        }
    }
    out
}
