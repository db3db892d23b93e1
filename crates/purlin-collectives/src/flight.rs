//! The flight recorder: each communicator's last calls, and the hang report made of every
//! rank's when a call times out, disagrees or finds the communicator poisoned.
//!
//! Each [`Comm`](crate::Comm) and [`CpuComm`](crate::CpuComm) keeps its last
//! [`FLIGHT_CALLS`] calls ([`FlightEntry`]: call number, collective, sizes, the call check's
//! digest, start time, executor). Numbers count the calls that ran a plan — an empty call
//! (every count zero) moves nothing on any rank and is not numbered — so on ranks that make
//! the same calls, the same call has the same number, as in the call check.
//!
//! A [`HangReport`] puts the call each rank was on side by side. How a rank learns the
//! others' numbers costs nothing extra: the host executor's ranks share one process, so a
//! rank reads its peers' recorders; on GPUs every launch's call check already stores
//! `number << 32 | digest` into each peer's call words, so after a failure the host reads
//! its own workspace's call words (one 8-byte word per peer). A rank whose number is lower
//! than the others' never made the later calls: it is behind, by the difference.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, SystemTime};

/// How many calls each communicator keeps.
pub const FLIGHT_CALLS: usize = 16;

/// Where a call ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Executor {
    /// The host executor (CPU threads, [`CpuComm`](crate::CpuComm)).
    Host,
    /// The device executor (one launch on the rank's stream, [`Comm`](crate::Comm)).
    Gpu,
}

/// One call of one rank, as its flight recorder keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlightEntry {
    /// This rank's call number (1 for its first call that ran a plan).
    pub number: u64,
    /// The collective's name (`all-reduce`, `all-gather-v`, ...).
    pub collective: &'static str,
    /// The element type.
    pub dtype: purlin_snac::DataType,
    /// This rank's input bytes.
    pub input_bytes: u64,
    /// This rank's output bytes.
    pub output_bytes: u64,
    /// The call check's digest of the call (`Plan::call_digest`: the same on every rank that
    /// makes the same call).
    pub digest: u32,
    /// When the call started.
    pub started: SystemTime,
    /// Host or GPU.
    pub executor: Executor,
    /// Whether it returned `Ok` (`None` while it runs, or for a GPU launch: enqueued).
    pub ok: Option<bool>,
}

impl FlightEntry {
    /// `call 5 all-reduce F32 4096/4096 B digest 0x1234abcd (host, 1.20 s ago, failed)`.
    pub fn describe(&self, now: SystemTime) -> String {
        let ago = now.duration_since(self.started).unwrap_or(Duration::ZERO);
        let executor = match self.executor {
            Executor::Host => "host",
            Executor::Gpu => "GPU",
        };
        let state = match self.ok {
            None if self.executor == Executor::Gpu => "enqueued",
            None => "running",
            Some(true) => "returned",
            Some(false) => "failed",
        };
        format!(
            "call {} {} {:?} {}/{} B digest {:#010x} ({executor}, {:.2} s ago, {state})",
            self.number,
            self.collective,
            self.dtype,
            self.input_bytes,
            self.output_bytes,
            self.digest,
            ago.as_secs_f64()
        )
    }
}

/// A communicator's last [`FLIGHT_CALLS`] calls.
#[derive(Debug, Clone, Default)]
pub struct FlightRecorder {
    entries: VecDeque<FlightEntry>,
    calls: u64,
}

impl FlightRecorder {
    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a call that starts now and returns its number.
    pub(crate) fn start(
        &mut self,
        spec: &purlin_snac::CollectiveSpec,
        rank: u32,
        digest: u32,
        executor: Executor,
    ) -> u64 {
        self.calls += 1;
        if self.entries.len() == FLIGHT_CALLS {
            self.entries.pop_front();
        }
        self.entries.push_back(FlightEntry {
            number: self.calls,
            collective: spec.collective.name(),
            dtype: spec.dtype,
            input_bytes: spec.input_bytes(rank),
            output_bytes: spec.output_bytes(rank),
            digest,
            started: SystemTime::now(),
            executor,
            ok: None,
        });
        self.calls
    }

    /// Marks call `number` returned (`ok`) or failed.
    pub(crate) fn finish(&mut self, number: u64, ok: bool) {
        if let Some(e) = self.entries.iter_mut().rev().find(|e| e.number == number) {
            e.ok = Some(ok);
        }
    }

    /// The number of calls recorded so far (the last one's number).
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// The kept calls, oldest first.
    pub fn entries(&self) -> Vec<FlightEntry> {
        self.entries.iter().cloned().collect()
    }

    /// The kept entry of call `number`, if still kept.
    pub fn entry(&self, number: u64) -> Option<&FlightEntry> {
        self.entries.iter().find(|e| e.number == number)
    }
}

/// One rank's line of a hang report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankCall {
    /// The rank.
    pub rank: usize,
    /// The last call it entered (0: none yet), or `None` where the reporting rank cannot know
    /// (a GPU peer whose call words were not read).
    pub number: Option<u64>,
    /// That call, where known (the rank's own entry, or on GPUs the reporter's entry of the
    /// same number).
    pub call: Option<FlightEntry>,
}

/// The call each rank was on when a rank's call failed: made by the rank that reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HangReport {
    /// The reporting rank.
    pub rank: usize,
    /// One line per rank, in rank order.
    pub ranks: Vec<RankCall>,
    /// The reporting rank's last calls, oldest first.
    pub recent: Vec<FlightEntry>,
    /// When the report was made.
    pub at: SystemTime,
}

impl HangReport {
    /// The report of `rank` from each rank's last call number (`None`: unknown) and the
    /// reporting rank's recorder; `describe(rank, number)` finds a rank's call where known.
    pub fn new(
        rank: usize,
        numbers: &[Option<u64>],
        own: &FlightRecorder,
        describe: impl Fn(usize, u64) -> Option<FlightEntry>,
    ) -> Self {
        let ranks = numbers
            .iter()
            .enumerate()
            .map(|(r, &number)| RankCall { rank: r, number, call: number.and_then(|n| describe(r, n)) })
            .collect();
        HangReport { rank, ranks, recent: own.entries(), at: SystemTime::now() }
    }

    /// The highest call number any rank reached.
    pub fn furthest(&self) -> Option<u64> {
        self.ranks.iter().filter_map(|r| r.number).max()
    }

    /// The ranks behind the furthest one, each with how many calls it is behind, most
    /// behind first (ties in rank order).
    pub fn behind(&self) -> Vec<(usize, u64)> {
        let Some(top) = self.furthest() else { return vec![] };
        let mut behind: Vec<(usize, u64)> =
            self.ranks.iter().filter_map(|r| r.number.filter(|&n| n < top).map(|n| (r.rank, top - n))).collect();
        behind.sort_by_key(|&(rank, by)| (std::cmp::Reverse(by), rank));
        behind
    }

    /// The rank most behind, if any rank is.
    pub fn most_behind(&self) -> Option<usize> {
        self.behind().first().map(|&(r, _)| r)
    }

    /// One line: each rank's call and who is behind (`rank 0 on call 5 (all-reduce F32
    /// 1024/1024 B), rank 1 on call 5 (...), rank 2 on call 4 (...): rank 2 is 1 call behind`).
    pub fn summary(&self) -> String {
        let on: Vec<String> = self
            .ranks
            .iter()
            .map(|r| match (r.number, &r.call) {
                (Some(n), Some(c)) => format!(
                    "rank {} on call {n} ({} {:?} {}/{} B)",
                    r.rank, c.collective, c.dtype, c.input_bytes, c.output_bytes
                ),
                (Some(0), None) => format!("rank {} before its first call", r.rank),
                (Some(n), None) => format!("rank {} on call {n}", r.rank),
                (None, _) => format!("rank {} on an unknown call", r.rank),
            })
            .collect();
        let behind: Vec<String> = self
            .behind()
            .iter()
            .map(|&(r, by)| format!("rank {r} is {by} call{} behind", if by == 1 { "" } else { "s" }))
            .collect();
        let verdict = if behind.is_empty() {
            "no rank is behind (every rank entered the same call)".to_string()
        } else {
            behind.join(", ")
        };
        format!("{}: {verdict}", on.join(", "))
    }
}

impl fmt::Display for HangReport {
    /// The summary, each rank's call where known, then the reporter's last calls.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "flight recorder of rank {}: {}", self.rank, self.summary())?;
        for r in &self.ranks {
            if let Some(c) = &r.call {
                writeln!(f, "  rank {}: {}", r.rank, c.describe(self.at))?;
            }
        }
        writeln!(f, "  rank {}'s last {} calls:", self.rank, self.recent.len())?;
        for e in &self.recent {
            writeln!(f, "    {}", e.describe(self.at))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use purlin_snac::{Collective, CollectiveSpec, Counts, DataType, ReduceOp, ReductionMode};

    fn spec() -> CollectiveSpec {
        CollectiveSpec {
            collective: Collective::AllReduce,
            world: 3,
            dtype: DataType::F32,
            op: Some(ReduceOp::Sum),
            mode: ReductionMode::Deterministic,
            counts: Counts::Uniform(256),
        }
    }

    #[test]
    fn the_recorder_keeps_the_last_calls_and_their_outcomes() {
        let mut r = FlightRecorder::new();
        for _ in 0..FLIGHT_CALLS + 3 {
            let n = r.start(&spec(), 0, 0xabcd, Executor::Host);
            r.finish(n, n % 2 == 0);
        }
        let e = r.entries();
        assert_eq!(e.len(), FLIGHT_CALLS);
        assert_eq!(e[0].number, 4);
        assert_eq!(e.last().map(|e| (e.number, e.ok)), Some((FLIGHT_CALLS as u64 + 3, Some(false))));
        assert_eq!((e[0].collective, e[0].input_bytes, e[0].output_bytes), ("all-reduce", 1024, 1024));
    }

    #[test]
    fn the_report_names_the_rank_behind_and_by_how_much() {
        let own = FlightRecorder::new();
        let report = HangReport::new(0, &[Some(5), Some(5), Some(3), None], &own, |_, _| None);
        assert_eq!(report.behind(), vec![(2, 2)]);
        assert_eq!(report.most_behind(), Some(2));
        let s = report.summary();
        assert!(s.contains("rank 2 on call 3") && s.contains("rank 2 is 2 calls behind"), "{s}");
        assert!(s.contains("rank 3 on an unknown call"), "{s}");
        let even = HangReport::new(1, &[Some(4), Some(4)], &own, |_, _| None);
        assert!(even.behind().is_empty() && even.summary().contains("no rank is behind"));
    }
}
