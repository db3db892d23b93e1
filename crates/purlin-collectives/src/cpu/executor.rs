//! The host executor: runs SNAC plans on CPU threads with the host Atom.
//!
//! The same plans the device executor runs (the contract in purlin-snac's crate docs), on
//! memory in this process: one thread per block of a rank's plan, so every block is
//! co-resident by construction. Waits *block* on a condition variable instead of spinning
//! (a CI machine has two cores), and every wait is bounded by the world's timeout.
//!
//! Ordering: flags, counters, epochs and packet words are atomics; a signal is a release
//! store, a wait an acquire load, so staged bytes written before a signal are visible after
//! the matching wait. Staged bytes themselves are plain memory reached through raw pointers:
//! the plan's happens-before edges (proved by the verifier) are what keep them race-free.
//! x86's strong ordering hides executor ordering bugs, so a green host run proves the plan,
//! not the device kernel.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use purlin_atom::host::{HostSrc, reduce_bytes_with};
use purlin_snac::{
    Advance, EpochVal, Len, Notify, NotifyKind, Offset, PacketFormat, Plan, ReduceOp, Region, Space, Step,
};

use crate::call::types::atom_dtype;
use crate::error::{Error, SAME_CALLS};
use crate::workspace::CALL_WORDS;

/// A call in a few words, for errors: `AllReduce of 1000 × F32 (Sum)`.
fn describe(spec: &purlin_snac::CollectiveSpec) -> String {
    let counts = match &spec.counts {
        purlin_snac::Counts::Uniform(n) => format!("{n}"),
        purlin_snac::Counts::PerRank(c) => format!("{c:?}"),
        purlin_snac::Counts::PerPair(c) => format!("{c:?}"),
    };
    let op = spec.op.map(|o| format!(" ({o:?})")).unwrap_or_default();
    format!("{:?} of {counts} × {:?}{op}", spec.collective, spec.dtype)
}

/// Plain bytes that several threads reach through raw pointers (staging).
struct SharedBytes {
    words: Box<[UnsafeCell<u64>]>,
    len: usize,
}

// SAFETY: the bytes are only reached through raw pointers in steps the plan orders by
// flag/counter atomics (release/acquire); the verifier proves those orders race-free.
unsafe impl Sync for SharedBytes {}

impl SharedBytes {
    fn zeroed(len: usize) -> Self {
        Self { words: (0..len.div_ceil(8)).map(|_| UnsafeCell::new(0)).collect(), len }
    }
    fn ptr(&self) -> *mut u8 {
        // UnsafeCell<u64> has the layout of u64; the slice is contiguous.
        self.words.as_ptr() as *mut u8
    }
}

fn atomics(n: usize) -> Box<[AtomicU64]> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

/// Sizes of each rank's host memory (the host twin of the symmetric workspace).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostMemoryConfig {
    /// Staging bytes per rank.
    pub staging_bytes: usize,
    /// Packet-window payload bytes per rank.
    pub window_bytes: usize,
    /// Flag words per rank.
    pub flag_words: usize,
    /// Arrival counters per rank.
    pub counter_words: usize,
    /// Per-block epochs per rank (the most blocks a plan may use).
    pub epoch_words: usize,
}

impl Default for HostMemoryConfig {
    fn default() -> Self {
        Self { staging_bytes: 4 << 20, window_bytes: 1 << 20, flag_words: 4096, counter_words: 1024, epoch_words: 64 }
    }
}

/// One rank's memory.
struct RankMemory {
    staging: SharedBytes,
    /// Packet words: 8-byte packets take one word (data low, flag high), 16-byte packets two
    /// (data, then flag).
    window: Box<[AtomicU64]>,
    flags: Box<[AtomicU64]>,
    counters: Box<[AtomicU64]>,
    epochs: Box<[AtomicU64]>,
    /// The call check's words (the device workspace's `calls`, [`CALL_WORDS`]).
    calls: Box<[AtomicU64]>,
    /// This rank's count of calls (the device's comes from the host, `Runtime::call_number`).
    call_count: AtomicU64,
    /// The number of this rank's last call whose blocks all returned.
    finished: AtomicU64,
}

/// The memory of every rank of a host world, and what its waits block on.
pub struct HostWorld {
    config: HostMemoryConfig,
    ranks: Vec<RankMemory>,
    wake: (Mutex<u64>, Condvar),
    poisoned: AtomicBool,
    /// Why the world was poisoned, when a call check said (a mismatch).
    poison_reason: Mutex<Option<String>>,
    timeout: Duration,
}

impl std::fmt::Debug for HostWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostWorld")
            .field("world", &self.ranks.len())
            .field("config", &self.config)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// The buffers of one call on one rank.
#[derive(Debug, Clone, Copy)]
pub struct CallBuffers {
    /// Input bytes (for in-place calls: inside the output, per the plan's alias).
    pub input: *const u8,
    /// Input length in bytes.
    pub input_len: usize,
    /// Output bytes.
    pub output: *mut u8,
    /// Output length in bytes.
    pub output_len: usize,
    /// Every rank's registered output and its length (one-copy plans' `PeerOutput`), null
    /// where none is registered.
    pub peer_outputs: [(*mut u8, usize); purlin_snac::MAX_WORLD],
    /// Every rank's registered input and its length (`PeerInput`), null where none is.
    pub peer_inputs: [(*mut u8, usize); purlin_snac::MAX_WORLD],
}

impl CallBuffers {
    /// A call's own input and output, with no peer's registered.
    pub fn new(input: *const u8, input_len: usize, output: *mut u8, output_len: usize) -> Self {
        let none = [(std::ptr::null_mut(), 0); purlin_snac::MAX_WORLD];
        CallBuffers { input, input_len, output, output_len, peer_outputs: none, peer_inputs: none }
    }
}

// SAFETY: the pointers are the caller's buffers, which outlive the call (`execute` joins
// every block thread before returning); blocks write disjoint output ranges per the plan.
unsafe impl Send for CallBuffers {}
// SAFETY: as above.
unsafe impl Sync for CallBuffers {}

/// One (block, step, chunk, epoch) record of an executed step, for trace comparisons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct TraceEntry {
    /// Block index.
    pub block: u32,
    /// Top-level step index.
    pub step: u32,
    /// Index inside the chunk loop's body, if the step is in one.
    pub body: Option<u32>,
    /// Chunk index (0 outside loops).
    pub chunk: u64,
    /// The block's epoch at entry.
    pub epoch: u64,
}

impl HostWorld {
    /// Memory for `world` ranks, every wait bounded by `timeout`.
    pub fn new(world: usize, config: HostMemoryConfig, timeout: Duration) -> Self {
        let packet_words = config.window_bytes.div_ceil(4) * 2; // enough for either packet size
        let ranks = (0..world)
            .map(|_| RankMemory {
                staging: SharedBytes::zeroed(config.staging_bytes),
                window: atomics(packet_words),
                flags: atomics(config.flag_words + crate::workspace::LANDED_WORDS),
                counters: atomics(config.counter_words),
                epochs: atomics(config.epoch_words),
                calls: atomics(CALL_WORDS),
                call_count: AtomicU64::new(0),
                finished: AtomicU64::new(0),
            })
            .collect();
        Self {
            config,
            ranks,
            wake: (Mutex::new(0), Condvar::new()),
            poisoned: AtomicBool::new(false),
            poison_reason: Mutex::new(None),
            timeout,
        }
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.ranks.len()
    }

    /// The memory sizes.
    pub fn config(&self) -> HostMemoryConfig {
        self.config
    }

    /// Whether a wait of some rank expired (every later call fails at once).
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    /// The epoch of `rank`'s block `block` (all equal between calls).
    pub fn epoch(&self, rank: usize, block: usize) -> u64 {
        self.ranks[rank].epochs[block].load(Ordering::Acquire)
    }

    /// Stores `value` into flag word `index` of `rank` (release) and wakes the waiters: what a
    /// copy engine's notify does, for tests that drive a plan's parts by hand.
    #[cfg(test)]
    pub(crate) fn store_flag(&self, rank: usize, index: usize, value: u64) {
        self.ranks[rank].flags[index].store(value, Ordering::Release);
        self.notify_all();
    }

    /// Flag word `index` of `rank` (acquire): a consumer's view of a plan's signals, such as a
    /// shard-landed word (`purlin_snac::Landed`).
    pub fn flag(&self, rank: usize, index: usize) -> u64 {
        self.ranks[rank].flags[index].load(Ordering::Acquire)
    }

    /// Arrival counter `index` of `rank` (0 between calls: every round's last arrival resets it).
    pub fn counter(&self, rank: usize, index: usize) -> u64 {
        self.ranks[rank].counters[index].load(Ordering::Acquire)
    }

    /// Marks the world poisoned (a rank's wait expired) and wakes every waiter, which then
    /// fails with [`Error::Poisoned`].
    pub fn poison(&self) {
        self.poisoned.store(true, Ordering::Release);
        self.notify_all();
    }

    /// The call number of each rank's last call that ran a plan (the call check's numbers).
    pub fn call_numbers(&self) -> Vec<u64> {
        self.ranks.iter().map(|r| r.call_count.load(Ordering::Acquire)).collect()
    }

    /// The rank a timed-out wait of `rank` is blamed on: a rank that has not entered the
    /// call `rank` is on (the one furthest behind, then the lowest), else the waited-for
    /// `peer` where the wait knows it, else the other rank of a world of two, else a rank
    /// that has not finished the call. Never `rank` itself.
    pub(crate) fn blame(&self, rank: usize, peer: Option<usize>) -> usize {
        let numbers = self.call_numbers();
        let others = || (0..self.ranks.len()).filter(move |&p| p != rank);
        let behind = others().filter(|&p| numbers[p] < numbers[rank]).min_by_key(|&p| (numbers[p], p));
        let unfinished = || others().find(|&p| self.ranks[p].finished.load(Ordering::Acquire) < numbers[rank]);
        behind
            .or(peer.filter(|&p| p != rank))
            .or((self.ranks.len() == 2).then(|| 1 - rank))
            .or_else(unfinished)
            .unwrap_or((rank + 1) % self.ranks.len())
    }

    /// Why the world is poisoned, where a call check recorded it (else `None`).
    pub fn poison_reason(&self) -> Option<String> {
        self.poison_reason.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Poisons the world because of `error`, which later calls quote.
    pub(crate) fn poison_because(&self, error: &Error) {
        self.poison_reason.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(|| error.to_string());
        self.poison();
    }

    fn notify_all(&self) {
        let mut generation = self.wake.0.lock().unwrap_or_else(|e| e.into_inner());
        *generation = generation.wrapping_add(1);
        self.wake.1.notify_all();
    }

    /// Blocks until `ready()` holds, or the deadline passes, or the world is poisoned.
    fn wait_until(&self, deadline: Instant, mut ready: impl FnMut() -> bool) -> Result<(), WaitFailure> {
        if ready() {
            return Ok(());
        }
        let mut guard = self.wake.0.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if ready() {
                return Ok(());
            }
            if self.is_poisoned() {
                return Err(WaitFailure::Poisoned);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(WaitFailure::Timeout);
            }
            guard = self.wake.1.wait_timeout(guard, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Runs `plan` (one rank's) with `buffers`: one thread per block. Returns the trace
    /// when `trace` is set.
    pub fn execute(&self, plan: &Plan, buffers: CallBuffers, trace: bool) -> Result<Vec<TraceEntry>, Error> {
        let rank = plan.rank as usize;
        if self.is_poisoned() {
            return Err(Error::Poisoned(self.poison_reason().unwrap_or_else(|| "an earlier host wait expired".into())));
        }
        self.check_fits(plan, &buffers)?;
        if plan.engine.is_some() {
            // The stream of kernels and the engine on a thread of its own, the call check
            // beside it, as a device launch's extra block runs beside the grid.
            let (check, results) = std::thread::scope(|scope| {
                let stream = scope.spawn(move || self.run_stream(plan, buffers, trace));
                let check = self.check_call(plan);
                let results = stream
                    .join()
                    .unwrap_or_else(|_| vec![Err(Error::Poisoned("a host executor thread panicked".into()))]);
                (check, results)
            });
            let outcome = call_outcome(check, results);
            if outcome.is_ok() {
                let number = self.ranks[rank].call_count.load(Ordering::Acquire);
                self.ranks[rank].finished.store(number, Ordering::Release);
            }
            return outcome;
        }
        // An empty plan (a call of no bytes) spawns no block but still meets the call check:
        // a rank whose call is empty while its peers' is not gets `Mismatch` like them.
        let (check, results) = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..plan.blocks.len())
                .map(|b| scope.spawn(move || BlockRun { world: self, plan, rank, block: b, buffers, trace }.run()))
                .collect();
            // The device launch's extra block, here on the calling thread.
            let check = self.check_call(plan);
            let results: Vec<Result<Vec<TraceEntry>, Error>> = handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(Error::Poisoned("a host executor thread panicked".into()))))
                .collect();
            (check, results)
        });
        let outcome = call_outcome(check, results);
        if outcome.is_ok() {
            let number = self.ranks[rank].call_count.load(Ordering::Acquire);
            self.ranks[rank].finished.store(number, Ordering::Release);
        }
        outcome
    }

    /// Runs blocks `blocks` of `plan` (one kernel), one thread each, and returns their results.
    fn run_kernel(
        &self,
        plan: &Plan,
        blocks: &[usize],
        buffers: CallBuffers,
        trace: bool,
    ) -> Vec<Result<Vec<TraceEntry>, Error>> {
        let rank = plan.rank as usize;
        std::thread::scope(|scope| {
            let handles: Vec<_> = blocks
                .iter()
                .map(|&b| scope.spawn(move || BlockRun { world: self, plan, rank, block: b, buffers, trace }.run()))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(Error::Poisoned("a host executor thread panicked".into()))))
                .collect()
        })
    }

    /// A plan with an engine program (docs/perf/copy-engines.md §3.5): the entry kernel, then
    /// the engine program on this rank's `HostCopyEngine` (before the main kernel, or beside
    /// it where the program is forked), then the exit kernel, each after the previous one as
    /// on one stream. A kernel that fails ends the stream there (the world is poisoned, so the
    /// peers fail too).
    fn run_stream(&self, plan: &Plan, buffers: CallBuffers, trace: bool) -> Vec<Result<Vec<TraceEntry>, Error>> {
        use purlin_snac::plan::engine::Kernel;
        let Some(eng) = &plan.engine else { return self.run_kernel(plan, &[], buffers, trace) };
        let of = |k: Kernel| -> Vec<usize> {
            (0..plan.blocks.len()).filter(|&b| Kernel::of(plan.blocks[b].role) == k).collect()
        };
        let (entry, main, exit) = (of(Kernel::Entry), of(Kernel::Main), of(Kernel::Exit));
        // Every epoch word holds the call's epoch until a block of this call advances its own:
        // the engine's notify values are taken from it before the entry kernel runs.
        let epoch = self.ranks[plan.rank as usize].epochs.first().map_or(0, |e| e.load(Ordering::Acquire));
        let mut results = self.run_kernel(plan, &entry, buffers, trace);
        let failed = |r: &[Result<Vec<TraceEntry>, Error>]| r.iter().any(Result::is_err);
        if failed(&results) {
            return results;
        }
        match eng.after {
            purlin_snac::Phase::Sequential => {
                results.extend(self.run_kernel(plan, &main, buffers, trace));
                if failed(&results) {
                    return results;
                }
                results.push(self.run_engine(plan, buffers, epoch).map(|()| Vec::new()));
                if let Some(Err(e)) = results.last() {
                    // The peers wait for this engine's notifies: fail them now, not at the timeout.
                    self.poison_because(e);
                }
            }
            purlin_snac::Phase::Forked => {
                let (side, main_results) = std::thread::scope(|scope| {
                    let side = scope.spawn(move || self.run_engine(plan, buffers, epoch));
                    let main_results = self.run_kernel(plan, &main, buffers, trace);
                    let side = side
                        .join()
                        .unwrap_or_else(|_| Err(Error::Poisoned("a host copy-engine thread panicked".into())));
                    (side, main_results)
                });
                if let Err(e) = &side {
                    self.poison_because(e);
                }
                results.extend(main_results);
                results.push(side.map(|()| Vec::new()));
            }
        }
        if failed(&results) {
            return results;
        }
        results.extend(self.run_kernel(plan, &exit, buffers, trace));
        results
    }

    /// Runs `plan`'s engine program on a `HostCopyEngine` of this call: each batch of copies
    /// with `copy_batch`, and each notify once every earlier copy has completed
    /// (`synchronize`, then a release store, "copy, then notify"). The program has no waits, so
    /// the engine cannot hang; a copy the engine refuses is a malformed plan.
    fn run_engine(&self, plan: &Plan, buffers: CallBuffers, epoch: u64) -> Result<(), Error> {
        use purlin_atom::host_copy_engine::{HostCopyEngine, HostCopyOp};
        use purlin_snac::EngineStep;
        let Some(eng) = &plan.engine else { return Ok(()) };
        let rank = plan.rank as usize;
        // Regions resolve as a block's do (no block of this index runs).
        let run = BlockRun { world: self, plan, rank, block: usize::MAX, buffers, trace: false };
        let at = At { step: 0, body: None, chunk: 0 };
        let malformed = |what: String| Error::InvalidArgument(format!("rank {rank} copy engine: {what}"));
        let engine = HostCopyEngine::with_timeout(self.timeout);
        for (copies, notifies) in eng.segments() {
            let mut ops = Vec::with_capacity(copies.len());
            for c in copies {
                let EngineStep::Copy { dst, src, len, guard } = c else { continue };
                let n = len.at(0);
                if !guard.admits(0) || n == 0 {
                    continue;
                }
                let d = run.ptr(dst, 0, epoch & 1, n).map_err(&malformed)?;
                let s = run.ptr(src, 0, epoch & 1, n).map_err(&malformed)?;
                ops.push(HostCopyOp { dst: d, src: s, bytes: n as usize });
            }
            // SAFETY: every address was bounds-checked against its buffer (`ptr`), which
            // outlives the call (`execute` joins the stream before returning) and which the
            // verified plan gives this rank's engine alone until its notifies; the copies of one
            // batch write disjoint bytes (`Plan::check`). `synchronize` below waits for them.
            unsafe { engine.copy_batch(&ops) }.map_err(|e| malformed(e.to_string()))?;
            if !notifies.is_empty() {
                engine.synchronize().map_err(|e| malformed(e.to_string()))?;
                for n in notifies {
                    run.notify(n, epoch, 0, at)?;
                }
                self.notify_all();
            }
        }
        engine.synchronize().map_err(|e| malformed(e.to_string()))
    }

    /// The call check (kernels/snac/exec.cuh `run_call_check`, the same words and rules):
    /// numbers this rank's call, gives every peer `number << 32 | digest` and compares each
    /// peer's word of the same number with its own. A peer past this number finished the
    /// call, so it compared the digests already.
    fn check_call(&self, plan: &Plan) -> Result<(), Error> {
        let rank = plan.rank as usize;
        let mine = &self.ranks[rank].calls;
        let number = (self.ranks[rank].call_count.fetch_add(1, Ordering::Relaxed) + 1) & 0xffff_ffff;
        let digest = plan.call_digest();
        let word = number << 32 | u64::from(digest);
        let peers = || (0..self.ranks.len()).filter(move |&p| p != rank);
        for p in peers() {
            self.ranks[p].calls[rank].store(word, Ordering::Release);
        }
        self.notify_all();
        let deadline = Instant::now() + self.timeout;
        let ahead = |theirs: u64| ((theirs >> 32) as u32).wrapping_sub(number as u32) as i32;
        // A peer's word of this call number that differs from this rank's.
        let differs = |p: usize| {
            let theirs = mine[p].load(Ordering::Acquire);
            (ahead(theirs) == 0 && theirs as u32 != digest).then(|| Error::Mismatch {
                rank,
                peer: p,
                what: format!(
                    "their calls differ (call {number}: this rank's {} has digest {digest:#010x}, rank {p}'s call \
                     {:#010x}); {SAME_CALLS}",
                    describe(&plan.spec),
                    theirs as u32
                ),
            })
        };
        for p in peers() {
            match self.wait_until(deadline, || ahead(mine[p].load(Ordering::Acquire)) >= 0) {
                Ok(()) => {
                    if let Some(mismatch) = differs(p) {
                        self.poison_because(&mismatch);
                        return Err(mismatch);
                    }
                }
                // Another pair's mismatch poisoned the world while this rank waited for a
                // peer: a peer that already stored its word may differ from this rank too.
                Err(WaitFailure::Poisoned) => {
                    return Err(peers().find_map(differs).unwrap_or_else(|| {
                        let why = self.poison_reason().unwrap_or_else(|| "another rank's wait expired".into());
                        Error::Poisoned(format!("rank {rank}: {why}"))
                    }));
                }
                Err(WaitFailure::Timeout) => {
                    let error = Error::Timeout {
                        rank,
                        peer: p,
                        waited: self.timeout,
                        during: format!("host executor, call check: rank {p} never made call {number}"),
                    };
                    self.poison_because(&error);
                    return Err(error);
                }
            }
        }
        Ok(())
    }

    fn check_fits(&self, plan: &Plan, b: &CallBuffers) -> Result<(), Error> {
        let r = &plan.resources;
        let c = &self.config;
        let too_big = |what: &str, need: u64, have: usize| {
            Error::InvalidArgument(format!("plan needs {need} {what}, the host world has {have}"))
        };
        if plan.rank as usize >= self.ranks.len() || plan.spec.world as usize != self.ranks.len() {
            return Err(Error::InvalidArgument(format!(
                "plan for rank {} of world {} on a host world of {}",
                plan.rank,
                plan.spec.world,
                self.ranks.len()
            )));
        }
        if r.staging_bytes > c.staging_bytes as u64 {
            return Err(too_big("staging bytes", r.staging_bytes, c.staging_bytes));
        }
        if r.window_bytes > c.window_bytes as u64 {
            return Err(too_big("window bytes", r.window_bytes, c.window_bytes));
        }
        if r.flag_words as usize > c.flag_words + crate::workspace::LANDED_WORDS {
            return Err(too_big("flag words", r.flag_words as u64, c.flag_words + crate::workspace::LANDED_WORDS));
        }
        if r.counter_words as usize > c.counter_words {
            return Err(too_big("counters", r.counter_words as u64, c.counter_words));
        }
        if r.epoch_words as usize > c.epoch_words || plan.blocks.len() > c.epoch_words {
            return Err(too_big("epoch words", r.epoch_words.max(plan.blocks.len() as u32) as u64, c.epoch_words));
        }
        // A reduce the Atom cannot do must fail here, before any block has written or
        // signalled anything (failing inside a block would leave the peers waiting).
        let mut reduces = false;
        plan.for_each_step(|_, s, _| reduces |= matches!(s, Step::Reduce { .. }));
        if reduces && (plan.spec.op.is_none() || atom_dtype(plan.spec.dtype).is_none()) {
            return Err(Error::Unsupported(format!(
                "reductions of {:?} with {:?} (the Atom reduces f32, f16, bf16, fp8, i32, u32)",
                plan.spec.dtype, plan.spec.op
            )));
        }
        if (b.input_len as u64) < r.input_bytes || (b.output_len as u64) < r.output_bytes {
            return Err(Error::InvalidArgument(format!(
                "buffers of {} / {} bytes for a plan of {} / {}",
                b.input_len, b.output_len, r.input_bytes, r.output_bytes
            )));
        }
        Ok(())
    }
}

enum WaitFailure {
    Timeout,
    Poisoned,
}

/// One block of one rank running its program.
struct BlockRun<'a> {
    world: &'a HostWorld,
    plan: &'a Plan,
    rank: usize,
    block: usize,
    buffers: CallBuffers,
    trace: bool,
}

/// Where a step runs: for error messages.
#[derive(Clone, Copy)]
struct At {
    step: usize,
    body: Option<usize>,
    chunk: u64,
}

impl BlockRun<'_> {
    fn me(&self) -> &RankMemory {
        &self.world.ranks[self.rank]
    }

    fn run(self) -> Result<Vec<TraceEntry>, Error> {
        let epoch = self.me().epochs[self.block].load(Ordering::Acquire);
        let sense = epoch & 1;
        let mut agreed = 0u64;
        let mut trace = Vec::new();
        let steps = &self.plan.blocks[self.block].steps;
        for (i, step) in steps.iter().enumerate() {
            match step {
                Step::ChunkLoop { trips, body } => {
                    for c in 0..*trips {
                        for (j, s) in body.iter().enumerate() {
                            let at = At { step: i, body: Some(j), chunk: c };
                            self.record(&mut trace, at, epoch);
                            self.step(s, at, epoch, sense, &mut agreed)?;
                        }
                    }
                }
                s => {
                    let at = At { step: i, body: None, chunk: 0 };
                    self.record(&mut trace, at, epoch);
                    self.step(s, at, epoch, sense, &mut agreed)?;
                }
            }
        }
        let advance = match self.plan.advance {
            Advance::Fixed(a) => a,
            Advance::AgreedMaxChunks { local } => local.max(agreed) | 1,
        };
        let grid = self.plan.blocks.len();
        let epochs = &self.me().epochs;
        for j in (self.block..self.plan.resources.epoch_words as usize).step_by(grid) {
            epochs[j].store(epoch + advance, Ordering::Release);
        }
        Ok(trace)
    }

    fn record(&self, trace: &mut Vec<TraceEntry>, at: At, epoch: u64) {
        if self.trace {
            trace.push(TraceEntry {
                block: self.block as u32,
                step: at.step as u32,
                body: at.body.map(|b| b as u32),
                chunk: at.chunk,
                epoch,
            });
        }
    }

    fn malformed(&self, at: At, what: String) -> Error {
        Error::InvalidArgument(format!(
            "rank {} block {} step {}{} chunk {}: {what}",
            self.rank,
            self.block,
            at.step,
            at.body.map(|b| format!(".{b}")).unwrap_or_default(),
            at.chunk
        ))
    }

    fn wait_failed(&self, f: WaitFailure, at: At, peer: Option<usize>, what: &str) -> Error {
        match f {
            WaitFailure::Poisoned => {
                let why = self.world.poison_reason().unwrap_or_else(|| "another rank's wait expired".into());
                Error::Poisoned(format!("rank {}: {why}", self.rank))
            }
            WaitFailure::Timeout => {
                let during = format!(
                    "host executor, block {} step {}{} chunk {}: {what}",
                    self.block,
                    at.step,
                    at.body.map(|b| format!(".{b}")).unwrap_or_default(),
                    at.chunk
                );
                // A plan for one rank does not say who writes the flag a wait polls, so the
                // wait is blamed on the rank that did not enter this call, where one did not
                // (a rank that died or stopped), else on the peer the wait knows.
                let blamed = self.world.blame(self.rank, peer);
                let during = match peer {
                    Some(p) if p != blamed => format!("{during}, waiting for rank {p}"),
                    _ => during,
                };
                let error = Error::Timeout { rank: self.rank, peer: blamed, waited: self.world.timeout, during };
                self.world.poison_because(&error);
                error
            }
        }
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.world.timeout
    }

    fn value(v: &EpochVal, epoch: u64, c: u64) -> Result<u64, String> {
        v.eval(epoch, c).ok_or_else(|| format!("epoch value {v:?} is negative at epoch {epoch} chunk {c}"))
    }

    /// A data region's address (never a window) with `len` bytes checked in bounds.
    fn ptr(&self, r: &Region, c: u64, sense: u64, len: u64) -> Result<*mut u8, String> {
        let off = r.offset.at(c, sense);
        let (base, size): (*mut u8, u64) = match r.space {
            Space::Input => (self.buffers.input as *mut u8, self.buffers.input_len as u64),
            Space::Output => (self.buffers.output, self.buffers.output_len as u64),
            Space::Staging(p) => {
                let m = self.world.ranks.get(p as usize).ok_or(format!("no rank {p}"))?;
                (m.staging.ptr(), m.staging.len as u64)
            }
            Space::Window(_) => return Err("a window is not a data region".into()),
            Space::PeerOutput(p) => match self.buffers.peer_outputs.get(p as usize) {
                Some(&(base, size)) if !base.is_null() => (base, size as u64),
                _ => return Err(format!("rank {p}'s output is not registered")),
            },
            Space::PeerInput(p) => match self.buffers.peer_inputs.get(p as usize) {
                Some(&(base, size)) if !base.is_null() => (base, size as u64),
                _ => return Err(format!("rank {p}'s input is not registered")),
            },
        };
        if off.checked_add(len).is_none_or(|end| end > size) {
            return Err(format!("{:?} bytes {off}..{} out of bounds ({size})", r.space, off + len));
        }
        // SAFETY: off + len <= size, the length of the allocation `base` points to.
        Ok(unsafe { base.add(off as usize) })
    }

    fn payload(&self) -> u64 {
        self.plan.packet.payload()
    }

    /// The first packet index of a window region at chunk c, bounds-checked for `len` bytes.
    fn packets(&self, rank: u32, off: &Offset, c: u64, sense: u64, len: u64) -> Result<(usize, usize), String> {
        let p = self.payload();
        let payload_off = off.at(c, sense);
        if payload_off % p != 0 {
            return Err(format!("window offset {payload_off} is not a multiple of the {p}-byte payload"));
        }
        let first = (payload_off / p) as usize;
        let count = len.div_ceil(p) as usize;
        let words_per = if self.plan.packet == PacketFormat::B8 { 1 } else { 2 };
        let m = self.world.ranks.get(rank as usize).ok_or(format!("no rank {rank}"))?;
        if (first + count) * words_per > m.window.len() {
            return Err(format!("window packets {first}..{} of rank {rank} out of bounds", first + count));
        }
        Ok((first, count))
    }

    fn put_packet(&self, rank: u32, index: usize, data: u64, flag: u64) {
        let w = &self.world.ranks[rank as usize].window;
        match self.plan.packet {
            PacketFormat::B8 => w[index].store((data & 0xffff_ffff) | (flag & 0xffff_ffff) << 32, Ordering::Release),
            PacketFormat::B16 => {
                w[2 * index].store(data, Ordering::Relaxed);
                w[2 * index + 1].store(flag, Ordering::Release);
            }
        }
    }

    /// The packet's data if its flag equals `expect`.
    fn read_packet(&self, index: usize, expect: u64) -> Option<u64> {
        let w = &self.me().window;
        match self.plan.packet {
            PacketFormat::B8 => {
                let v = w[index].load(Ordering::Acquire);
                (v >> 32 == expect & 0xffff_ffff).then_some(v & 0xffff_ffff)
            }
            PacketFormat::B16 => {
                (w[2 * index + 1].load(Ordering::Acquire) == expect).then(|| w[2 * index].load(Ordering::Relaxed))
            }
        }
    }

    /// Waits for `count` packets from `first` flagged `expect` and returns their payloads as
    /// `len` bytes.
    fn collect_packets(&self, first: usize, len: u64, expect: u64, at: At) -> Result<Vec<u8>, Error> {
        let p = self.payload() as usize;
        let mut out = vec![0u8; len.div_ceil(p as u64) as usize * p];
        let deadline = self.deadline();
        for (i, chunk) in out.chunks_exact_mut(p).enumerate() {
            let mut data = 0;
            self.world
                .wait_until(deadline, || self.read_packet(first + i, expect).map(|d| data = d).is_some())
                .map_err(|f| self.wait_failed(f, at, None, "packets"))?;
            chunk.copy_from_slice(&data.to_le_bytes()[..p]);
        }
        out.truncate(len as usize);
        Ok(out)
    }

    fn notify(&self, n: &Notify, epoch: u64, c: u64, at: At) -> Result<(), Error> {
        let v = Self::value(&n.value, epoch, c).map_err(|e| self.malformed(at, e))?;
        let flags =
            &self.world.ranks.get(n.peer as usize).ok_or_else(|| self.malformed(at, "no such peer".into()))?.flags;
        let idx = n.flag.at(c) as usize;
        let flag = flags.get(idx).ok_or_else(|| self.malformed(at, format!("flag {idx} out of bounds")))?;
        flag.store(v, Ordering::Release);
        let _ = NotifyKind::Ready; // ready and drain notifications behave alike
        Ok(())
    }

    fn step(&self, s: &Step, at: At, epoch: u64, sense: u64, agreed: &mut u64) -> Result<(), Error> {
        let c = at.chunk;
        if !s.guard().admits(c) {
            return Ok(());
        }
        let bad = |e: String| self.malformed(at, e);
        match s {
            Step::ChunkLoop { .. } => return Err(bad("nested chunk loop".into())),
            Step::Stage { dst, src, len, share: Some(sh), .. } => {
                let n = len.at(c);
                if n == 0 {
                    return Ok(());
                }
                let d = self.ptr(dst, c, sense, n).map_err(bad)?;
                let s = self.ptr(src, c, sense, n).map_err(bad)?;
                let idx = sh.ticket.at(c) as usize;
                let ticket = self.me().counters.get(idx).ok_or_else(|| bad(format!("ticket {idx} out of bounds")))?;
                // Pieces in turn from the ticket until none is left; the writers' arrival that
                // follows orders every piece before the signal, and its last one zeroes the ticket.
                loop {
                    let start = ticket.fetch_add(1, Ordering::Relaxed).saturating_mul(sh.piece);
                    if start >= n {
                        break;
                    }
                    let take = sh.piece.min(n - start) as usize;
                    // SAFETY: start + take <= n bytes of both ranges, in bounds (checked); the
                    // ticket gives each piece to exactly one writer, so no two copies overlap.
                    unsafe { std::ptr::copy(s.add(start as usize), d.add(start as usize), take) };
                }
            }
            Step::Stage { dst, src, len, .. } | Step::Gather { dst, src, len, expect: None, .. } => {
                let n = len.at(c);
                if n == 0 {
                    return Ok(());
                }
                let d = self.ptr(dst, c, sense, n).map_err(bad)?;
                let s = self.ptr(src, c, sense, n).map_err(bad)?;
                // SAFETY: both ranges are in bounds (checked); the plan orders this copy after
                // the writes it reads and before any overwrite (verified); `copy` allows
                // overlap, which only a malformed plan would create.
                unsafe { std::ptr::copy(s, d, n as usize) };
            }
            Step::Gather { dst, src, len, expect: Some(v), .. } => {
                let n = len.at(c);
                if n == 0 {
                    return Ok(());
                }
                let Space::Window(w) = src.space else { return Err(bad("packet gather from a non-window".into())) };
                if w != self.plan.rank {
                    return Err(bad("packets are read from this rank's own window".into()));
                }
                let (first, _) = self.packets(w, &src.offset, c, sense, n).map_err(bad)?;
                let bytes = self.collect_packets(first, n, Self::value(v, epoch, c).map_err(bad)?, at)?;
                let d = self.ptr(dst, c, sense, n).map_err(bad)?;
                // SAFETY: `d` has n bytes in bounds; `bytes` is a separate buffer of n bytes.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), d, n as usize) };
            }
            Step::Reduce { dst, srcs, len, expect, .. } => {
                self.reduce(dst, srcs, len, expect.as_ref(), at, epoch, sense)?
            }
            Step::PutPackets { dst, src, len, flag, .. } => {
                let n = len.at(c);
                if n == 0 {
                    return Ok(());
                }
                let Space::Window(peer) = dst.space else { return Err(bad("packets go to a window".into())) };
                let (first, count) = self.packets(peer, &dst.offset, c, sense, n).map_err(bad)?;
                let s = self.ptr(src, c, sense, n).map_err(bad)?;
                let f = Self::value(flag, epoch, c).map_err(bad)?;
                let p = self.payload() as usize;
                for i in 0..count {
                    let mut word = [0u8; 8];
                    let take = p.min(n as usize - i * p);
                    // SAFETY: i * p + take <= n bytes of `s`, in bounds.
                    unsafe { std::ptr::copy_nonoverlapping(s.add(i * p), word.as_mut_ptr(), take) };
                    self.put_packet(peer, first + i, u64::from_le_bytes(word), f);
                }
                self.world.notify_all();
            }
            Step::Signal { notify, .. } => {
                self.notify(notify, epoch, c, at)?;
                self.world.notify_all();
            }
            Step::Wait { flag, value, .. } => {
                let v = Self::value(value, epoch, c).map_err(bad)?;
                let idx = flag.at(c) as usize;
                let word = self.me().flags.get(idx).ok_or_else(|| bad(format!("flag {idx} out of bounds")))?;
                self.world
                    .wait_until(self.deadline(), || word.load(Ordering::Acquire) >= v)
                    .map_err(|f| self.wait_failed(f, at, None, &format!("flag {idx} >= {v}")))?;
            }
            Step::Arrive { counter, arrivals, then, reset, .. } => {
                let idx = counter.at(c) as usize;
                let word = self.me().counters.get(idx).ok_or_else(|| bad(format!("counter {idx} out of bounds")))?;
                let ticket = match reset {
                    Some(t) => {
                        let i = t.at(c) as usize;
                        Some(self.me().counters.get(i).ok_or_else(|| bad(format!("ticket {i} out of bounds")))?)
                    }
                    None => None,
                };
                let before = word.fetch_add(1, Ordering::AcqRel);
                // The arrival reaching `arrivals` is its round's last: it resets the counter (the
                // plan contract), so the next round or call starts from zero.
                if before + 1 == u64::from(*arrivals) {
                    word.store(0, Ordering::Relaxed);
                    if let Some(t) = ticket {
                        t.store(0, Ordering::Relaxed);
                    }
                    for n in then {
                        self.notify(n, epoch, c, at)?;
                    }
                    self.world.notify_all();
                }
            }
            Step::HandshakeSend { peer, dst, flag } => {
                let local = match self.plan.advance {
                    Advance::AgreedMaxChunks { local } => local,
                    Advance::Fixed(_) => 0,
                };
                let (first, _) = self.packets(*peer, dst, 0, sense, 1).map_err(bad)?;
                self.put_packet(*peer, first, local, Self::value(flag, epoch, 0).map_err(bad)?);
                self.world.notify_all();
            }
            Step::HandshakeWait { peer, src, expect } => {
                let (first, _) = self.packets(self.plan.rank, src, 0, sense, 1).map_err(bad)?;
                let e = Self::value(expect, epoch, 0).map_err(bad)?;
                let mut data = 0;
                self.world
                    .wait_until(self.deadline(), || self.read_packet(first, e).map(|d| data = d).is_some())
                    .map_err(|f| self.wait_failed(f, at, Some(*peer as usize), "entry/exit handshake"))?;
                *agreed = (*agreed).max(data);
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        dst: &Region,
        srcs: &[Region],
        len: &Len,
        expect: Option<&EpochVal>,
        at: At,
        epoch: u64,
        sense: u64,
    ) -> Result<(), Error> {
        let c = at.chunk;
        let bad = |e: String| self.malformed(at, e);
        let n = len.at(c);
        if n == 0 {
            return Ok(());
        }
        let spec = &self.plan.spec;
        let op = spec.op.ok_or_else(|| bad("reduce step in a plan without a reduce op".into()))?;
        let dtype = atom_dtype(spec.dtype).ok_or_else(|| {
            Error::Unsupported(format!(
                "reductions of {:?} (the Atom reduces f32, f16, bf16, fp8, i32, u32)",
                spec.dtype
            ))
        })?;
        let d = self.ptr(dst, c, sense, n).map_err(bad)?;
        // Window sources are collected first (they are separate buffers); a source equal to
        // the destination is the destination itself (in place, element-wise).
        let mut owned: Vec<Option<Vec<u8>>> = Vec::with_capacity(srcs.len());
        let mut ptrs: Vec<Option<*const u8>> = Vec::with_capacity(srcs.len());
        for r in srcs {
            if let Space::Window(w) = r.space {
                let e = expect.ok_or_else(|| bad("window source without an expected flag".into()))?;
                let (first, _) = self.packets(w, &r.offset, c, sense, n).map_err(bad)?;
                owned.push(Some(self.collect_packets(first, n, Self::value(e, epoch, c).map_err(bad)?, at)?));
                ptrs.push(None);
            } else {
                owned.push(None);
                ptrs.push(Some(self.ptr(r, c, sense, n).map_err(bad)?));
            }
        }
        let sources: Vec<HostSrc<'_>> = owned
            .iter()
            .zip(&ptrs)
            .map(|(o, p)| match (o, p) {
                (Some(bytes), _) => HostSrc::Slice(bytes),
                (None, Some(p)) if std::ptr::eq(*p, d) => HostSrc::Dst,
                // SAFETY: `p` has n bytes in bounds (checked by `ptr`), and the plan orders
                // this read after their writes and before any overwrite (verified).
                (None, Some(p)) => HostSrc::Slice(unsafe { std::slice::from_raw_parts(*p, n as usize) }),
                (None, None) => HostSrc::Dst, // unreachable: every source is one of the above
            })
            .collect();
        // SAFETY: `d` has n bytes in bounds; separate sources never overlap it partially
        // (the plan contract), and an exactly-equal one is passed as HostSrc::Dst.
        let dst_bytes = unsafe { std::slice::from_raw_parts_mut(d, n as usize) };
        // Avg is the Atom's Mean, as on the device: summed and divided by the source count,
        // which `Plan::check` makes the world, then rounded once.
        let atom_op = match op {
            ReduceOp::Sum => purlin_atom::ReduceOp::Sum,
            ReduceOp::Avg => purlin_atom::ReduceOp::Mean,
            ReduceOp::Prod => purlin_atom::ReduceOp::Prod,
            ReduceOp::Min => purlin_atom::ReduceOp::Min,
            ReduceOp::Max => purlin_atom::ReduceOp::Max,
        };
        reduce_bytes_with(dtype, atom_op, dst_bytes, &sources).map_err(|e| bad(e.to_string()))?;
        Ok(())
    }
}

/// One call's outcome on one rank from its call check's and its blocks' results: the cause
/// wins over its echoes. The check's mismatch (or timeout) comes first, then any block's own
/// failure; `Poisoned` only when nothing on this rank says more, since a block's timeout may
/// poison the world before the check's wait notices it (and the other way round).
fn call_outcome(
    check: Result<(), Error>,
    blocks: Vec<Result<Vec<TraceEntry>, Error>>,
) -> Result<Vec<TraceEntry>, Error> {
    let mut echo = None;
    let mut entries = Vec::new();
    for r in std::iter::once(check.map(|()| Vec::new())).chain(blocks) {
        match r {
            Ok(e) => entries.extend(e),
            Err(e @ Error::Poisoned(_)) => {
                echo.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    echo.map_or(Ok(entries), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout() -> Error {
        Error::Timeout { rank: 0, peer: 1, waited: Duration::from_millis(500), during: "a block's wait".into() }
    }

    fn mismatch() -> Error {
        Error::Mismatch { rank: 0, peer: 1, what: "their calls differ".into() }
    }

    fn echo() -> Error {
        Error::Poisoned("rank 0: another rank's wait expired".into())
    }

    fn entry(block: u32) -> TraceEntry {
        TraceEntry { block, step: 0, body: None, chunk: 0, epoch: 0 }
    }

    // The race CI met on stop 44's code: a block's wait expired and poisoned the world before
    // the check's wait on the calling thread saw it, so the check reported the echo.
    #[test]
    fn a_blocks_timeout_wins_over_the_checks_poisoned_echo() {
        let got = call_outcome(Err(echo()), vec![Ok(vec![]), Err(timeout())]);
        assert!(matches!(got, Err(Error::Timeout { rank: 0, peer: 1, .. })), "{got:?}");
        let got = call_outcome(Ok(()), vec![Err(echo()), Err(timeout())]);
        assert!(matches!(got, Err(Error::Timeout { .. })), "{got:?}");
    }

    #[test]
    fn the_checks_own_failure_wins_over_the_blocks() {
        let got = call_outcome(Err(mismatch()), vec![Err(echo()), Err(timeout())]);
        assert!(matches!(got, Err(Error::Mismatch { peer: 1, .. })), "{got:?}");
        let got = call_outcome(Err(timeout()), vec![Err(echo())]);
        assert!(matches!(got, Err(Error::Timeout { .. })), "{got:?}");
    }

    #[test]
    fn poisoned_only_when_nothing_says_more_and_ok_keeps_every_blocks_trace() {
        let got = call_outcome(Ok(()), vec![Ok(vec![entry(0)]), Err(echo())]);
        assert!(matches!(&got, Err(Error::Poisoned(why)) if why.contains("wait expired")), "{got:?}");
        let got = call_outcome(Ok(()), vec![Ok(vec![entry(0), entry(0)]), Ok(vec![entry(1)])]).expect("no error");
        assert_eq!(got.iter().map(|e| e.block).collect::<Vec<_>>(), [0, 0, 1]);
    }
}
