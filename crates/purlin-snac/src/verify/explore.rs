//! Exploration: the closure that takes every eager step, the exhaustive depth-first search
//! over the remaining synchronization steps (states cached by fingerprint), deadlock
//! detection, and randomized priority schedules for sampling.

use std::collections::HashSet;

use super::state::{Model, State};
use super::{Options, Property, Reduction, Violation, viol};
use crate::plan::Step;

/// Why an exploration ended early: a violation, or the state or schedule budget spent.
pub(super) enum Stop {
    Violation(Violation),
    Budget,
}

impl From<Violation> for Stop {
    fn from(v: Violation) -> Self {
        Stop::Violation(v)
    }
}

/// A transition that must be explored in every order (not taken eagerly).
#[derive(Debug, Clone, Copy)]
struct Transition {
    pid: usize,
}

impl Model<'_> {
    /// Takes every eager step until none is left; returns the enabled non-eager ones and the
    /// number of steps taken.
    fn closure(
        &self,
        st: &mut State,
        trace: &mut Vec<TraceEvent>,
        red: Reduction,
    ) -> Result<(Vec<Transition>, u64), Violation> {
        let mut fired = 0;
        loop {
            let mut progressed = false;
            let mut branching = vec![];
            for pid in 0..self.who.len() {
                if st.wake.still_blocked(pid) {
                    continue;
                }
                while let Some(eager) = self.status(st, pid) {
                    if eager || (red != Reduction::Off && self.independent(st, pid, red)) {
                        self.fire(st, pid, trace)?;
                        fired += 1;
                        progressed = true;
                    } else {
                        branching.push(Transition { pid });
                        break;
                    }
                }
            }
            if !progressed {
                return Ok((branching, fired));
            }
        }
    }

    /// Attaches the rendered trace to a violation.
    fn with_trace(&self, mut v: Violation, trace: &[TraceEvent]) -> Violation {
        v.trace = trace
            .iter()
            .map(|ev| match *ev {
                TraceEvent::Step { pid, top, body, c } => {
                    let (k, r, b) = self.who[pid as usize];
                    let steps = &self.plan(k, r).blocks[b].steps;
                    match steps.get(top as usize) {
                        Some(Step::ChunkLoop { body: bs, .. }) => match bs.get(body as usize) {
                            Some(s) => self.label(pid as usize, s, c),
                            None => format!("call {k} rank {r} block {b}: loop"),
                        },
                        Some(s) => self.label(pid as usize, s, c),
                        None => format!("call {k} rank {r} block {b}: ?"),
                    }
                }
                TraceEvent::Exit(pid) => {
                    let (k, r, b) = self.who[pid as usize];
                    format!("call {k} rank {r} block {b}: exit")
                }
                TraceEvent::Notifies(n) => format!("  (last arrival: notifies {n} flags)"),
            })
            .collect();
        v
    }

    fn deadlock(&self, st: &mut State) -> Option<Violation> {
        let running: Vec<usize> = (0..self.who.len()).filter(|&p| st.ps[p].st == 1).collect();
        let stuck: Vec<String> = running
            .into_iter()
            .map(|p| match self.current(st, p) {
                Some((s, c)) => self.label(p, s, c),
                None => format!("{} at exit", self.who_s(p as u32)),
            })
            .collect();
        if stuck.is_empty() && st.cur.iter().all(|&c| c as usize >= self.calls.len()) {
            return None;
        }
        Some(viol(Property::Deadlock, format!("no step can run; blocked: {}", stuck.join(" | "))))
    }

    /// Randomized priority schedules (PCT-style, 3 priority change points per schedule).
    pub(super) fn sample(&self, opts: &Options) -> Result<(), Violation> {
        for i in 0..opts.schedules {
            let mut rng = Rng(opts.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(i) | 1);
            let n = self.who.len();
            let mut prio: Vec<u64> = (0..n).map(|_| rng.next()).collect();
            let changes: Vec<u64> = (0..3).map(|_| rng.next() % 2000).collect();
            let mut st = self.init();
            let mut trace = vec![];
            let mut steps = 0u64;
            loop {
                let (en, _) =
                    self.closure(&mut st, &mut trace, Reduction::Off).map_err(|v| self.with_trace(v, &trace))?;
                let Some(t) = en.iter().max_by_key(|t| prio[t.pid]) else {
                    if let Some(v) = self.deadlock(&mut st) {
                        return Err(self.with_trace(v, &trace));
                    }
                    break;
                };
                if changes.contains(&steps) {
                    prio[t.pid] = rng.next() % 1000;
                }
                self.fire(&mut st, t.pid, &mut trace).map_err(|v| self.with_trace(v, &trace))?;
                steps += 1;
            }
        }
        Ok(())
    }
}

/// One trace entry, rendered only when a violation is reported: formatting every step of an
/// exhaustive search cost more than the search itself.
#[derive(Debug, Clone, Copy)]
pub(super) enum TraceEvent {
    Step { pid: u32, top: u32, body: u32, c: u64 },
    Exit(u32),
    Notifies(u32),
}

pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

pub(super) struct Explorer<'m, 'a> {
    pub(super) m: &'m Model<'a>,
    pub(super) seen: HashSet<(u64, u64)>,
    pub(super) states: u64,
    pub(super) max: u64,
    pub(super) trace: Vec<TraceEvent>,
    pub(super) red: Reduction,
}

impl Explorer<'_, '_> {
    pub(super) fn dfs(&mut self, mut st: State) -> Result<(), Stop> {
        let mark = self.trace.len();
        let en = match self.m.closure(&mut st, &mut self.trace, self.red) {
            Ok((en, fired)) => {
                // Every state the eager steps passed through counts: the budget bounds work.
                self.states += fired;
                en
            }
            Err(v) => {
                // Count the state the violation was found in.
                self.states += 1;
                return Err(self.m.with_trace(v, &self.trace).into());
            }
        };
        if !self.seen.insert(st.fingerprint()) {
            self.trace.truncate(mark);
            return Ok(());
        }
        self.states += 1;
        if std::env::var_os("SNAC_DEBUG").is_some() && self.states < 40 {
            let names: Vec<String> = en
                .iter()
                .map(|t| match self.m.current(&mut st, t.pid) {
                    Some((s, c)) => self.m.label(t.pid, s, c),
                    None => "exit".into(),
                })
                .collect();
            eprintln!("state {}: {} branches: {}", self.states, en.len(), names.join(" || "));
        }
        if en.is_empty() {
            // A path explored to its end is checked even past the budget (its cost is spent):
            // the budget stops branching, so a run whose synchronization steps all commute
            // (one path in all) is exhaustive however long it is.
            if let Some(v) = self.m.deadlock(&mut st) {
                return Err(self.m.with_trace(v, &self.trace).into());
            }
            self.trace.truncate(mark);
            return Ok(());
        }
        for t in en {
            if self.states > self.max {
                return Err(Stop::Budget);
            }
            let mut s2 = st.clone();
            let m2 = self.trace.len();
            if let Err(v) = self.m.fire(&mut s2, t.pid, &mut self.trace) {
                self.states += 1;
                return Err(self.m.with_trace(v, &self.trace).into());
            }
            self.dfs(s2)?;
            self.trace.truncate(m2);
        }
        self.trace.truncate(mark);
        Ok(())
    }
}
