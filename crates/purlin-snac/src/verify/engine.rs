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
        let waits = |b: &BlockProgram| b.steps.iter().any(|s| matches!(s, Step::Wait { .. }));
        let Some(entry) = p.blocks.iter().position(|b| b.role == Role::CeEntry && waits(b)) else { continue };
        // Drop the entry kernel's waits, one at a time.
        let wait_at: Vec<usize> = p.blocks[entry]
            .steps
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(s, Step::Wait { .. }))
            .map(|(i, _)| i)
            .collect();
        for &i in &wait_at {
            let mut q = p.clone();
            q.blocks[entry].steps.remove(i);
            push(format!("entry kernel's wait {i} dropped"), q);
        }
        // Fork the engine before the entry wait: the waits move to a main-kernel block that the
        // engine runs beside.
        if eng.after == Phase::Sequential {
            let mut q = p.clone();
            let moved: Vec<Step> =
                q.blocks[entry].steps.iter().filter(|s| matches!(s, Step::Wait { .. })).cloned().collect();
            q.blocks[entry].steps.retain(|s| !matches!(s, Step::Wait { .. }));
            q.blocks.insert(entry + 1, BlockProgram { role: Role::Producer, steps: moved });
            if let Some(e) = q.engine.as_mut() {
                e.after = Phase::Forked;
            }
            push("engine forked before the entry kernel's wait".into(), q);
        }
    }
    out
}
