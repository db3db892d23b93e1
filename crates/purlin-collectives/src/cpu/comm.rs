//! [`CpuComm`]: every collective on CPU threads of one process, through the same
//! SNAC plans the GPUs run (docs/design.md §3.4, §5 "Executors").
//!
//! [`CpuComm::threads`] makes one communicator per rank (like `Comm::from_devices`); give each
//! to its own thread and call the same collectives on every rank, as with NCCL. Each call
//! blocks until this rank's plan has completed, so the ranks' calls must run concurrently.
//! This is what Purlin runs on a machine without a GPU, and what CI tests every collective on.
//!
//! What a call does:
//! 1. Validates the arguments against the collective's spec — lengths, V counts (length and
//!    sum), world, element type against the reduce op — and returns a typed [`Error`]
//!    *before touching anything* (no output byte changes, no peer is signalled).
//! 2. Plans the call with [`crate::call::tuning`] (latency regime for small payloads, throughput
//!    otherwise; staging side, chunk and block counts from [`CpuConfig::tuning`]).
//! 3. Verifies the plan set with purlin-snac's verifier, once per plan key per process
//!    (see [`crate::call::verified`]); a plan the verifier rejects never runs.
//! 4. Runs this rank's plan on the host executor ([`crate::cpu::executor`]).
//!
//! Buffers are any [`CpuBuffer`] / [`CpuBufferMut`]: slices, `Vec`s, arrays, or
//! [`CpuSymmetricBuffer`]s from [`CpuComm::alloc_symmetric`]. Where every rank passes
//! symmetric buffers in the same roles, throughput calls take the one-copy plans, as on GPUs
//! (the ranks first meet to check it is the same call on the same allocations:
//! [`crate::cpu::buffer`]).
//!
//! Scheduling: **one OS thread per (rank, block)** of the plan, spawned per call and joined
//! before the call returns. Every block is co-resident by construction (what the device
//! executor gets from a cooperative launch), and waits block on a condition variable instead
//! of spinning, so a two-core CI machine runs world 8 without starving anyone. A scheduler
//! multiplexing blocks on fewer threads would need the plan's waits to be resumable; threads
//! are simpler and fast enough for tests and CPU-only use.
//!
//! If one rank's call fails validation and the others proceed, the others' waits expire after
//! [`CpuConfig::timeout`] ([`Error::Timeout`]) and the world is poisoned (every later call
//! returns [`Error::Poisoned`]) — as with NCCL, every rank must make the same calls.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use purlin_snac::verify::Options;
use purlin_snac::{CollectiveSpec, ConsumeOp, MAX_WORLD, PacketFormat, ReductionMode, Regime, StagingSide};

use super::buffer::region::HostRegion;
use super::buffer::{CpuBuffer, CpuBufferMut, CpuSymmetricBuffer, CpuType, Meetings, SymmetricAlloc};
use super::executor::{CallBuffers, HostMemoryConfig, HostWorld};
use crate::call::tuning::{PlanLimits, Tuning, plan_and_config};
use crate::call::types::{ReduceOp, ReduceType, Status, atom_dtype};
use crate::call::verified::{budget_from_env, default_budget, internal, verified};
use crate::call::{self, Call, Transfer, in_place_layout, paired, point_to_point_spec};
use crate::error::Error;
use crate::flight::{Executor, FlightRecorder, HangReport};
use crate::observe::{CallSpan, warn_once};

/// A host communicator's configuration.
#[derive(Debug, Clone, Copy)]
pub struct CpuConfig {
    /// Bound on every wait for a peer, a skipped call's included (default
    /// [`crate::bootstrap::DEFAULT_TIMEOUT`]): the host executor has no device waits, so this
    /// one knob is both of [`crate::CommConfig`]'s `timeout` and `device_timeout`.
    pub timeout: Duration,
    /// Each rank's staging, packet window, flags, counters and epochs. `epoch_words` is also
    /// the co-residency bound plans are made under (threads are always co-resident).
    pub memory: HostMemoryConfig,
    /// Regime, staging side, chunk and block counts (see [`CpuConfig::host_tuning`]).
    pub tuning: Tuning,
    /// Deterministic (rank-order, bitwise reproducible) or fast reductions.
    pub mode: ReductionMode,
    /// Packet format of the latency regime.
    pub packet: PacketFormat,
    /// The verifier's budget for each plan key: exhaustive up to `max_states`, else
    /// `schedules` randomized schedules ([`crate::call::verified::default_budget`]).
    pub verify: Options,
}

impl CpuConfig {
    /// The host's tuning defaults: the GPU table's regime band, but 32 KiB chunks, 2 blocks
    /// per role for every role and regime (one-copy plans included) and 4 slots — a CPU
    /// thread per block (the GPU's 32 reader and up to 64 packet blocks would be threads
    /// here), and staging that fits world 16 in 4 MiB.
    pub fn host_tuning() -> Tuning {
        Tuning {
            chunk_bytes: 32 << 10,
            blocks_per_role: 2,
            consumer_blocks_per_role: None,
            latency_max_blocks: None,
            slots: 4,
            one_copy_blocks: 2,
            ..Tuning::default()
        }
    }

    /// The defaults with the `PURLIN_*` tuning overrides of [`Tuning::from_env`] applied (a
    /// variable that is set wins over the host default; unset ones keep it) and
    /// `PURLIN_TIMEOUT_S` (seconds), `PURLIN_VERIFY_STATES` and `PURLIN_VERIFY_SCHEDULES` (the
    /// verifier's budget per plan key).
    pub fn from_env() -> Result<Self, Error> {
        let mut c = Self::default();
        let env = Tuning::from_env()?;
        let set = |var: &str| std::env::var_os(var).is_some();
        if set("PURLIN_REGIME") {
            c.tuning.regime = env.regime;
        }
        if set("PURLIN_STAGING_SIDE") {
            c.tuning.staging_side = env.staging_side;
        }
        if set("PURLIN_CHUNK_BYTES") {
            c.tuning.chunk_bytes = env.chunk_bytes;
        }
        if set("PURLIN_BLOCKS_PER_ROLE") {
            c.tuning.blocks_per_role = env.blocks_per_role;
        }
        if set("PURLIN_SLOTS") {
            c.tuning.slots = env.slots;
        }
        if set("PURLIN_LATENCY_MAX_BYTES") {
            c.tuning.latency_max_bytes = env.latency_max_bytes;
        }
        if set("PURLIN_MAX_BLOCKS") {
            c.tuning.max_blocks = env.max_blocks;
        }
        if set("PURLIN_DATAPATH") {
            c.tuning.datapath = env.datapath;
        }
        if set("PURLIN_CE_MIN_BYTES") {
            c.tuning.ce_min_bytes = env.ce_min_bytes;
        }
        c.verify = budget_from_env(c.verify)?;
        if let Ok(t) = std::env::var("PURLIN_TIMEOUT_S") {
            let secs: f64 =
                t.trim().parse().map_err(|e| Error::Env { var: "PURLIN_TIMEOUT_S", problem: format!("{t:?}: {e}") })?;
            if !(secs.is_finite() && secs > 0.0) {
                return Err(Error::Env { var: "PURLIN_TIMEOUT_S", problem: format!("{t:?}: must be > 0") });
            }
            c.timeout = Duration::from_secs_f64(secs);
        }
        Ok(c)
    }

    /// The plan limits this configuration offers.
    pub fn limits(&self) -> PlanLimits {
        PlanLimits {
            staging_bytes: self.memory.staging_bytes as u64,
            window_bytes: self.memory.window_bytes as u64,
            max_coresident_blocks: self.memory.epoch_words as u32,
            packet: self.packet,
            flag_words: self.memory.flag_words as u32,
            peer_outputs: false,
            peer_inputs: false,
            // The host executor runs engine programs on a `HostCopyEngine` per rank.
            copy_engine: true,
            landed: false,
        }
    }
}

impl Default for CpuConfig {
    fn default() -> Self {
        Self {
            timeout: crate::bootstrap::DEFAULT_TIMEOUT,
            memory: HostMemoryConfig::default(),
            tuning: Self::host_tuning(),
            mode: ReductionMode::Deterministic,
            packet: PacketFormat::B8,
            verify: default_budget(),
        }
    }
}

/// What the last call of a rank ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallInfo {
    /// The call's spec.
    pub spec: CollectiveSpec,
    /// Whether it ran in place.
    pub in_place: bool,
    /// Its regime.
    pub regime: Regime,
    /// Its staging side (throughput only).
    pub staging_side: Option<StagingSide>,
    /// Blocks (threads) of this rank.
    pub grid: usize,
    /// Whether it ran a one-copy plan (symmetric buffers, [`CpuSymmetricBuffer`]).
    pub one_copy: bool,
    /// Whether its bytes moved on the copy engines (the plan's engine program, run by a
    /// `HostCopyEngine`; `PURLIN_DATAPATH`).
    pub copy_engine: bool,
    /// The verifier's coverage of its plan key (`exhaustive, N states` or `sampled ...`).
    pub verified: String,
}

struct Shared {
    world: HostWorld,
    config: CpuConfig,
    /// One per rank: held for the duration of a call (a second concurrent call on the same
    /// rank is refused, not interleaved).
    busy: Vec<Mutex<()>>,
    last: Vec<Mutex<Option<CallInfo>>>,
    /// One per rank: its last calls ([`crate::flight`]); every rank reads every rank's for a
    /// hang report.
    flights: Vec<Mutex<FlightRecorder>>,
    /// This world's identity, which its symmetric allocations carry.
    token: Arc<()>,
    /// Where ranks meet to allocate symmetric buffers.
    allocs: Meetings<usize, AllocOutcome>,
    /// Where ranks meet before a one-copy or point-to-point call, to check it is the same call.
    checked_calls: Meetings<CheckedCall, Vec<CheckedCall>>,
    /// Where ranks meet after a one-copy call, so none returns while a peer may still write.
    symmetric_exits: Meetings<(), ()>,
}

/// What every rank of an allocation meeting returns.
#[derive(Clone)]
enum AllocOutcome {
    Made(Arc<SymmetricAlloc>),
    /// Ranks asked for different sizes (bytes, in rank order).
    Sizes(Vec<usize>),
    /// The process could not allocate the memory.
    Memory(String),
}

/// What a rank's checked call (one-copy or point-to-point) is: every rank's must be equal.
#[derive(Clone, PartialEq, Eq)]
struct CheckedCall {
    spec: CollectiveSpec,
    in_place: bool,
    /// The allocation ([`SymmetricAlloc::id`]) of the input and of the output where the
    /// collective's one-copy plan shares them with peers (`derive::one_copy_roles`).
    input: Option<usize>,
    output: Option<usize>,
}

impl CheckedCall {
    fn describe(&self) -> String {
        let role = |a: Option<usize>| a.map_or("not shared".to_string(), |id| format!("symmetric allocation {id:#x}"));
        let place = if self.in_place { "in place" } else { "out of place" };
        format!("{:?} {place}, input {}, output {}", self.spec, role(self.input), role(self.output))
    }
}

/// A host communicator: one rank of a world of threads in this process.
pub struct CpuComm {
    rank: usize,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for CpuComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuComm").field("rank", &self.rank).field("world", &self.shared.world).finish()
    }
}

/// Every rank's input and output where a call's are symmetric buffers, and their allocations.
struct PeerRegions {
    inputs: Option<[(*mut u8, usize); MAX_WORLD]>,
    outputs: Option<[(*mut u8, usize); MAX_WORLD]>,
    /// The allocations of the input and the output ([`SymmetricAlloc::id`]), where symmetric.
    input_alloc: Option<usize>,
    output_alloc: Option<usize>,
}

/// Every rank's bytes of a symmetric buffer as the host executor addresses them, and the
/// buffer's allocation ([`SymmetricAlloc::id`]).
type Symmetric = ([(*mut u8, usize); MAX_WORLD], usize);

impl PeerRegions {
    fn new(inputs: Option<Symmetric>, outputs: Option<Symmetric>) -> Self {
        PeerRegions {
            inputs: inputs.map(|x| x.0),
            outputs: outputs.map(|x| x.0),
            input_alloc: inputs.map(|x| x.1),
            output_alloc: outputs.map(|x| x.1),
        }
    }
}

/// A call's buffers: the regions of the borrows the call holds until it returns.
enum Bufs<'a> {
    Separate(HostRegion<'a>, HostRegion<'a>),
    InPlace(HostRegion<'a>),
}

/// Whole elements of `T` in a region (a buffer of `T` holds nothing else).
fn elems<T: CpuType>(r: &HostRegion<'_>) -> usize {
    r.bytes / size_of::<T>()
}

impl CpuComm {
    /// One communicator per rank of a world of `world` threads, with the default
    /// configuration (like `Comm::from_devices`). Give rank `r`'s to thread `r`.
    ///
    /// ```
    /// use purlin_collectives::CpuComm;
    ///
    /// let comms = CpuComm::threads(3)?;
    /// let gathered = std::thread::scope(|s| {
    ///     let ranks: Vec<_> = comms
    ///         .iter()
    ///         .map(|comm| {
    ///             s.spawn(move || {
    ///                 let mut all = vec![0u32; 2 * comm.world_size()];
    ///                 comm.all_gather(&[comm.rank() as u32; 2], &mut all).map(|_| all)
    ///             })
    ///         })
    ///         .collect();
    ///     ranks.into_iter().map(|r| r.join().expect("a rank panicked")).collect::<Result<Vec<_>, _>>()
    /// })?;
    /// assert!(gathered.iter().all(|all| all == &[0, 0, 1, 1, 2, 2]));
    /// # Ok::<(), purlin_collectives::Error>(())
    /// ```
    pub fn threads(world: usize) -> Result<Vec<CpuComm>, Error> {
        Self::threads_with_config(world, CpuConfig::default())
    }

    /// [`CpuComm::threads`] with a configuration.
    pub fn threads_with_config(world: usize, config: CpuConfig) -> Result<Vec<CpuComm>, Error> {
        if !purlin_snac::WORLD_RANGE.contains(&world) {
            return Err(purlin_snac::SpecError::WorldOutOfRange { world: world.min(u32::MAX as usize) as u32 }.into());
        }
        if config.timeout.is_zero() {
            return Err(Error::InvalidArgument("the timeout must be positive".into()));
        }
        if config.verify.schedules == 0 {
            return Err(Error::InvalidArgument("verify.schedules must be positive (plans run only verified)".into()));
        }
        if config.memory.epoch_words == 0 {
            return Err(Error::InvalidArgument("memory.epoch_words (the block bound) must be positive".into()));
        }
        let shared = Arc::new(Shared {
            world: HostWorld::new(world, config.memory, config.timeout),
            config,
            busy: (0..world).map(|_| Mutex::new(())).collect(),
            last: (0..world).map(|_| Mutex::new(None)).collect(),
            flights: (0..world).map(|_| Mutex::new(FlightRecorder::new())).collect(),
            token: Arc::new(()),
            allocs: Meetings::new(world),
            checked_calls: Meetings::new(world),
            symmetric_exits: Meetings::new(world),
        });
        tracing::info!(
            world,
            timeout_s = config.timeout.as_secs_f64(),
            staging_bytes = config.memory.staging_bytes,
            window_bytes = config.memory.window_bytes,
            max_blocks = config.memory.epoch_words,
            "host world of {world} ranks (the host executor: CPU threads, every plan verified)"
        );
        Ok((0..world).map(|rank| CpuComm { rank, shared: shared.clone() }).collect())
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.shared.world.world()
    }

    /// The configuration.
    pub fn config(&self) -> &CpuConfig {
        &self.shared.config
    }

    /// `Err(Error::Poisoned)` once a wait of any rank expired (like `ncclCommGetAsyncError`).
    pub fn async_error(&self) -> Result<(), Error> {
        if self.shared.world.is_poisoned() {
            let why = self.shared.world.poison_reason();
            Err(Error::Poisoned(why.unwrap_or_else(|| "a host executor wait expired on this world".into())))
        } else {
            Ok(())
        }
    }

    /// This rank's flight recorder: its last [`crate::FLIGHT_CALLS`] calls.
    pub fn flight_recorder(&self) -> FlightRecorder {
        self.shared.flights[self.rank].lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The call each rank is on, from every rank's flight recorder (the threads of a host
    /// world share one process), with this rank's last calls: what a `Timeout`, `Mismatch`
    /// or `Poisoned` error of this communicator quotes.
    pub fn hang_report(&self) -> HangReport {
        let flights: Vec<FlightRecorder> =
            self.shared.flights.iter().map(|f| f.lock().unwrap_or_else(|e| e.into_inner()).clone()).collect();
        let numbers: Vec<Option<u64>> = flights.iter().map(|f| Some(f.calls())).collect();
        HangReport::new(self.rank, &numbers, &flights[self.rank], |r, n| flights[r].entry(n).cloned())
    }

    /// `error` with the hang report appended where it is about the world's state (a
    /// timeout, a disagreement, a poisoned world), logged at error level where it poisons.
    fn reported(&self, error: Error) -> Error {
        let report = || format!("; flight recorder: {}", self.hang_report().summary());
        let error = match error {
            Error::Timeout { rank, peer, waited, during } => {
                Error::Timeout { rank, peer, waited, during: during + &report() }
            }
            Error::Mismatch { rank, peer, what } => Error::Mismatch { rank, peer, what: what + &report() },
            Error::Poisoned(why) => {
                tracing::debug!(rank = self.rank, error = %why, "call refused: the world is poisoned");
                return Error::Poisoned(why + &report());
            }
            other => return other,
        };
        if self.shared.world.is_poisoned() {
            tracing::error!(rank = self.rank, peer = ?error.peer(), error = %error, "the host world is poisoned");
        }
        error
    }

    /// What this rank's last successful call ran.
    pub fn last_call(&self) -> Option<CallInfo> {
        self.shared.last[self.rank].lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Allocates `len` elements of `T` on every rank at once (a collective call: every rank
    /// calls it, in the same order, with the same `len`), like `Comm::alloc_symmetric` and
    /// NCCL's `ncclMemAlloc` + `ncclCommWindowRegister`. The memory is zeroed. Collectives
    /// that get such buffers in the same roles on every rank take the one-copy path
    /// ([`CpuSymmetricBuffer`]). Every rank returns the same outcome: a buffer, or
    /// [`Error::Mismatch`] when ranks asked for different sizes; a rank that does not arrive
    /// within [`CpuConfig::timeout`] makes the waiting ranks return [`Error::Timeout`].
    pub fn alloc_symmetric<T: CpuType>(&self, len: usize) -> Result<CpuSymmetricBuffer<T>, Error> {
        const DURING: &str = "allocating a symmetric buffer";
        let sh = &*self.shared;
        let (rank, world) = (self.rank, self.world_size());
        let bytes = len.checked_mul(size_of::<T>()).ok_or_else(|| {
            Error::InvalidArgument(format!("a symmetric buffer of {len} elements of {} bytes", size_of::<T>()))
        })?;
        let token = &sh.token;
        let outcome = sh.allocs.meet(rank, bytes, sh.config.timeout, DURING, |sizes| {
            if sizes.iter().any(|&b| b != sizes[0]) {
                return AllocOutcome::Sizes(sizes.to_vec());
            }
            match SymmetricAlloc::zeroed(token.clone(), world, bytes) {
                Ok(alloc) => AllocOutcome::Made(Arc::new(alloc)),
                Err(e) => AllocOutcome::Memory(e.to_string()),
            }
        })?;
        match outcome {
            AllocOutcome::Made(alloc) => Ok(CpuSymmetricBuffer::new(alloc, rank, len)),
            AllocOutcome::Memory(why) => Err(Error::InvalidArgument(why)),
            AllocOutcome::Sizes(sizes) => {
                let peer = sizes.iter().position(|&b| b != bytes).unwrap_or(0);
                Err(Error::Mismatch {
                    rank,
                    peer,
                    what: format!("symmetric buffer size: {bytes} bytes here, {} there", sizes[peer]),
                })
            }
        }
    }

    /// The spec of `call` on elements of `T` at this rank, in this communicator's mode.
    fn spec<T: CpuType>(&self, call: Call) -> Result<CollectiveSpec, Error> {
        Ok(call.spec(self.world_size(), self.rank, T::DATA_TYPE)?.with_mode(self.shared.config.mode))
    }

    /// A call described at run time ([`Call`]) on elements of any [`CpuType`], for the layers
    /// that pick the collective and the type at run time (the hierarchy's host twin): the typed
    /// methods refuse reductions of other types at compile time ([`ReduceType`]).
    pub(crate) fn call_any<S, R, T>(&self, call: Call, send: &S, recv: &mut R) -> Result<Status, Error>
    where
        S: CpuBuffer<T> + ?Sized,
        R: CpuBufferMut<T> + ?Sized,
        T: CpuType,
    {
        let spec = self.spec::<T>(call)?;
        self.run(spec, Bufs::Separate(send.host_region(), recv.host_region_mut()))
    }

    /// [`CpuComm::call_any`] in place.
    pub(crate) fn call_any_in_place<B: CpuBufferMut<T> + ?Sized, T: CpuType>(
        &self,
        call: Call,
        buf: &mut B,
    ) -> Result<Status, Error> {
        let spec = self.spec::<T>(call)?;
        self.run(spec, Bufs::InPlace(buf.host_region_mut()))
    }

    /// AllReduce: `recv[i] = op over ranks of send[i]`; `recv` has `send.len()` elements.
    pub fn all_reduce<S, R, T>(&self, send: &S, recv: &mut R, op: &ReduceOp) -> Result<Status, Error>
    where
        S: CpuBuffer<T> + ?Sized,
        R: CpuBufferMut<T> + ?Sized,
        T: CpuType + ReduceType,
    {
        let send = send.host_region();
        let spec = self.spec::<T>(Call::AllReduce { len: elems::<T>(&send), op: *op })?;
        self.run(spec, Bufs::Separate(send, recv.host_region_mut()))
    }

    /// In-place AllReduce.
    pub fn all_reduce_in_place<B: CpuBufferMut<T> + ?Sized, T: CpuType + ReduceType>(
        &self,
        buf: &mut B,
        op: &ReduceOp,
    ) -> Result<Status, Error> {
        let buf = buf.host_region_mut();
        let spec = self.spec::<T>(Call::AllReduce { len: elems::<T>(&buf), op: *op })?;
        self.run(spec, Bufs::InPlace(buf))
    }

    /// AllGather: `recv` holds `world × send.len()` elements, rank `p`'s `send` at `p × send.len()`.
    pub fn all_gather<S: CpuBuffer<T> + ?Sized, R: CpuBufferMut<T> + ?Sized, T: CpuType>(
        &self,
        send: &S,
        recv: &mut R,
    ) -> Result<Status, Error> {
        let send = send.host_region();
        let spec = self.spec::<T>(Call::AllGather { len: elems::<T>(&send) })?;
        self.run(spec, Bufs::Separate(send, recv.host_region_mut()))
    }

    /// In-place AllGather (NCCL's convention): this rank's contribution is already at
    /// `buf[rank × n .. (rank + 1) × n]`, `n = buf.len() / world`.
    pub fn all_gather_in_place<B: CpuBufferMut<T> + ?Sized, T: CpuType>(&self, buf: &mut B) -> Result<Status, Error> {
        let buf = buf.host_region_mut();
        let spec = self.spec::<T>(Call::AllGatherInPlace { len: elems::<T>(&buf) })?;
        self.run(spec, Bufs::InPlace(buf))
    }

    /// ReduceScatter: `send` holds `world × recv.len()` elements; rank `r` receives the
    /// reduction of every rank's partition `r`.
    pub fn reduce_scatter<S, R, T>(&self, send: &S, recv: &mut R, op: &ReduceOp) -> Result<Status, Error>
    where
        S: CpuBuffer<T> + ?Sized,
        R: CpuBufferMut<T> + ?Sized,
        T: CpuType + ReduceType,
    {
        let recv = recv.host_region_mut();
        let spec = self.spec::<T>(Call::ReduceScatter { len: elems::<T>(&recv), op: *op })?;
        self.run(spec, Bufs::Separate(send.host_region(), recv))
    }

    /// In-place ReduceScatter (NCCL's convention): the result lands in this rank's partition
    /// `buf[rank × n .. (rank + 1) × n]`, `n = buf.len() / world`; the other partitions are
    /// left as they were.
    pub fn reduce_scatter_in_place<B: CpuBufferMut<T> + ?Sized, T: CpuType + ReduceType>(
        &self,
        buf: &mut B,
        op: &ReduceOp,
    ) -> Result<Status, Error> {
        let buf = buf.host_region_mut();
        let spec = self.spec::<T>(Call::ReduceScatterInPlace { len: elems::<T>(&buf), op: *op })?;
        self.run(spec, Bufs::InPlace(buf))
    }

    /// AllToAll: `send` and `recv` hold `world × n` elements; partition `q` of `send` goes to
    /// rank `q`, partition `p` of `recv` comes from rank `p`.
    pub fn all_to_all<S: CpuBuffer<T> + ?Sized, R: CpuBufferMut<T> + ?Sized, T: CpuType>(
        &self,
        send: &S,
        recv: &mut R,
    ) -> Result<Status, Error> {
        let send = send.host_region();
        let spec = self.spec::<T>(Call::AllToAll { len: elems::<T>(&send) })?;
        self.run(spec, Bufs::Separate(send, recv.host_region_mut()))
    }

    /// AllGatherV: rank `p` contributes `counts[p]` elements (`send.len() == counts[rank]`);
    /// `recv` holds their concatenation in rank order. Every rank passes the same `counts`.
    pub fn all_gather_v<S, R, T>(&self, send: &S, recv: &mut R, counts: &[usize]) -> Result<Status, Error>
    where
        S: CpuBuffer<T> + ?Sized,
        R: CpuBufferMut<T> + ?Sized,
        T: CpuType,
    {
        let spec = self.spec::<T>(Call::AllGatherV { counts: call::counts_u64(counts) })?;
        self.run(spec, Bufs::Separate(send.host_region(), recv.host_region_mut()))
    }

    /// ReduceScatterV: rank `p` receives `counts[p]` reduced elements (`recv.len() ==
    /// counts[rank]`); `send` holds every rank's partition, concatenated in rank order (its
    /// length is the sum of `counts`). Every rank passes the same `counts`.
    pub fn reduce_scatter_v<S, R, T>(
        &self,
        send: &S,
        recv: &mut R,
        counts: &[usize],
        op: &ReduceOp,
    ) -> Result<Status, Error>
    where
        S: CpuBuffer<T> + ?Sized,
        R: CpuBufferMut<T> + ?Sized,
        T: CpuType + ReduceType,
    {
        let spec = self.spec::<T>(Call::ReduceScatterV { counts: call::counts_u64(counts), op: *op })?;
        self.run(spec, Bufs::Separate(send.host_region(), recv.host_region_mut()))
    }

    /// AllToAllV with the whole traffic matrix: `counts[src][dst]` elements go from rank `src`
    /// to rank `dst` (`world × world`, every rank passes the same matrix — what an MoE router
    /// has after exchanging its counts). Rank `r`'s `send` is row `r`'s partitions
    /// concatenated in destination order (torch's `input_split_sizes = counts[r]`), its `recv`
    /// column `r`'s in source order (`output_split_sizes = counts[*][r]`). The matrix, not
    /// just this rank's row and column, because the call's plans — and their verification —
    /// are made from the whole call.
    pub fn all_to_all_v<S, R, T, C>(&self, send: &S, recv: &mut R, counts: &[C]) -> Result<Status, Error>
    where
        S: CpuBuffer<T> + ?Sized,
        R: CpuBufferMut<T> + ?Sized,
        T: CpuType,
        C: AsRef<[usize]>,
    {
        let counts = counts.iter().map(|row| call::counts_u64(row.as_ref())).collect();
        let spec = self.spec::<T>(Call::AllToAllV { counts })?;
        self.run(spec, Bufs::Separate(send.host_region(), recv.host_region_mut()))
    }

    /// Broadcast from `root`: every rank's `recv` receives the root's `send` (the same
    /// length); `send` is read on the root only, as NCCL's. The AllGatherV in which only the
    /// root contributes (as `Comm::broadcast`).
    pub fn broadcast<S, R, T>(&self, send: Option<&S>, recv: &mut R, root: i32) -> Result<Status, Error>
    where
        S: CpuBuffer<T> + ?Sized,
        R: CpuBufferMut<T> + ?Sized,
        T: CpuType,
    {
        let root = call::rank_of(root, self.world_size(), "broadcast")?;
        let recv = recv.host_region_mut();
        let spec = self.spec::<T>(Call::Broadcast { len: elems::<T>(&recv), root })?;
        let send = match send {
            Some(send) if root == self.rank => send.host_region(),
            None if root == self.rank => {
                return Err(Error::InvalidArgument("broadcast: the root must pass a send buffer".into()));
            }
            // A peer contributes nothing.
            _ => HostRegion::empty(),
        };
        self.run(spec, Bufs::Separate(send, recv))
    }

    /// In-place broadcast from `root`: the root's `buf` is sent, every other rank's
    /// overwritten.
    pub fn broadcast_in_place<B: CpuBufferMut<T> + ?Sized, T: CpuType>(
        &self,
        buf: &mut B,
        root: i32,
    ) -> Result<Status, Error> {
        let root = call::rank_of(root, self.world_size(), "broadcast_in_place")?;
        let buf = buf.host_region_mut();
        let spec = self.spec::<T>(Call::Broadcast { len: elems::<T>(&buf), root })?;
        self.run(spec, Bufs::InPlace(buf))
    }

    /// Reduce to `root`: the root's `recv` receives the reduction over ranks of `send` (the
    /// same length); `recv` is written on the root only, as NCCL's. The ReduceScatterV in
    /// which only the root receives (as `Comm::reduce`).
    pub fn reduce<S, R, T>(&self, send: &S, recv: Option<&mut R>, op: &ReduceOp, root: i32) -> Result<Status, Error>
    where
        S: CpuBuffer<T> + ?Sized,
        R: CpuBufferMut<T> + ?Sized,
        T: CpuType + ReduceType,
    {
        let root = call::rank_of(root, self.world_size(), "reduce")?;
        let send = send.host_region();
        let spec = self.spec::<T>(Call::Reduce { len: elems::<T>(&send), op: *op, root })?;
        let recv = match recv {
            Some(recv) if root == self.rank => recv.host_region_mut(),
            None if root == self.rank => {
                return Err(Error::InvalidArgument("reduce: the root must pass a receive buffer".into()));
            }
            // A peer receives nothing.
            _ => HostRegion::empty(),
        };
        self.run(spec, Bufs::Separate(send, recv))
    }

    /// In-place Reduce to `root`: the result lands in the root's `buf`; the other ranks' are
    /// read and left as they were.
    pub fn reduce_in_place<B: CpuBufferMut<T> + ?Sized, T: CpuType + ReduceType>(
        &self,
        buf: &mut B,
        op: &ReduceOp,
        root: i32,
    ) -> Result<Status, Error> {
        let root = call::rank_of(root, self.world_size(), "reduce_in_place")?;
        let buf = buf.host_region_mut();
        let spec = self.spec::<T>(Call::Reduce { len: elems::<T>(&buf), op: *op, root })?;
        self.run(spec, Bufs::InPlace(buf))
    }

    /// Sends `send` to `peer`, whose matching [`CpuComm::recv`] receives it (as
    /// [`Comm::send`](crate::Comm::send): at world 2 the pair is the world, and the two calls
    /// are one AllToAllV of bytes; wider worlds answer [`Error::Unsupported`]).
    pub fn send<S: CpuBuffer<T> + ?Sized, T: CpuType>(&self, send: &S, peer: i32) -> Result<(), Error> {
        let send = send.host_region();
        let to = Transfer { peer: call::rank_of(peer, self.world_size(), "send")?, bytes: send.bytes as u64 };
        let spec = point_to_point_spec(self.world_size(), self.rank, Some(to), None)?;
        self.run_checked(spec, Bufs::Separate(send.plain(), HostRegion::empty()), true).map(drop)
    }

    /// Receives `recv` from `peer`, whose matching [`CpuComm::send`] sends as many bytes.
    pub fn recv<R: CpuBufferMut<T> + ?Sized, T: CpuType>(&self, recv: &mut R, peer: i32) -> Result<Status, Error> {
        let recv = recv.host_region_mut();
        let from = Transfer { peer: call::rank_of(peer, self.world_size(), "recv")?, bytes: recv.bytes as u64 };
        let spec = point_to_point_spec(self.world_size(), self.rank, None, Some(from))?;
        self.run_checked(spec, Bufs::Separate(HostRegion::empty(), recv.plain()), true)
    }

    /// Sends `send` to `send_peer` and receives `recv` from `recv_peer` in one call
    /// ([`Comm::send_recv`](crate::Comm::send_recv)).
    pub fn send_recv<S, R, T, U>(&self, send: &S, send_peer: i32, recv: &mut R, recv_peer: i32) -> Result<Status, Error>
    where
        S: CpuBuffer<T> + ?Sized,
        R: CpuBufferMut<U> + ?Sized,
        T: CpuType,
        U: CpuType,
    {
        let (send, recv) = (send.host_region(), recv.host_region_mut());
        let world = self.world_size();
        let to = Transfer { peer: call::rank_of(send_peer, world, "send")?, bytes: send.bytes as u64 };
        let from = Transfer { peer: call::rank_of(recv_peer, world, "recv")?, bytes: recv.bytes as u64 };
        let spec = point_to_point_spec(world, self.rank, Some(to), Some(from))?;
        self.run_checked(spec, Bufs::Separate(send.plain(), recv.plain()), true)
    }

    /// Starts a group of sends and receives ([`Comm::group`](crate::Comm::group)'s host twin):
    /// they are held until [`CpuGroup::end`] (or the group's drop), where the k-th send and
    /// the k-th receive run as one call, as NCCL matches a group's k-th send to a peer with
    /// the peer's k-th receive.
    pub fn group(&self) -> CpuGroup<'_> {
        CpuGroup { comm: self, sends: Vec::new(), recvs: Vec::new() }
    }

    /// Any collective on raw bytes: `spec` says what (its world must be this communicator's;
    /// its mode is used as given). For bindings and benchmarks; the typed methods are sugar
    /// over this. Lengths are checked against the spec (a byte length that is not a whole
    /// number of elements is [`purlin_snac::SpecError::NotElementMultiple`]).
    pub fn execute_bytes<S: CpuBuffer<u8> + ?Sized, R: CpuBufferMut<u8> + ?Sized>(
        &self,
        spec: &CollectiveSpec,
        send: &S,
        recv: &mut R,
    ) -> Result<Status, Error> {
        self.run(spec.clone(), Bufs::Separate(send.host_region(), recv.host_region_mut()))
    }

    /// [`CpuComm::execute_bytes`] in place (AllReduce: the whole buffer; AllGather(V): the
    /// output, this rank's contribution in its partition; ReduceScatter(V): the input, the
    /// result in this rank's partition).
    pub fn execute_bytes_in_place<B: CpuBufferMut<u8> + ?Sized>(
        &self,
        spec: &CollectiveSpec,
        buf: &mut B,
    ) -> Result<Status, Error> {
        self.run(spec.clone(), Bufs::InPlace(buf.host_region_mut()))
    }

    /// Which of a call's buffers are symmetric (the one-copy path), with every rank's as the
    /// host executor addresses it: out of place, the input and the output each; in place, the
    /// one buffer, which holds every rank's input and output at NCCL's offsets. The host twin
    /// of `Comm::peer_buffers`, checking in addition that a buffer is this rank's handle of an
    /// allocation of this world.
    fn peer_buffers(&self, spec: &CollectiveSpec, bufs: &Bufs<'_>) -> Result<PeerRegions, Error> {
        // Every rank's base of `region`'s allocation, each of which must hold `need(rank)`
        // bytes (peers access every rank's), shifted by `shift(rank)`.
        let at = |region: &HostRegion<'_>, need: &dyn Fn(u32) -> u64, shift: &dyn Fn(u32) -> u64, what: &str| {
            let Some((alloc, owner)) = region.symmetric else { return Ok(None) };
            if !alloc.belongs_to(&self.shared.token) {
                return Err(Error::InvalidArgument(format!(
                    "the {what} is a symmetric buffer of another communicator's world"
                )));
            }
            if owner != self.rank {
                return Err(Error::InvalidArgument(format!(
                    "the {what} is rank {owner}'s handle of a symmetric buffer, passed to rank {}",
                    self.rank
                )));
            }
            if let Some(q) = (0..self.world_size() as u32).find(|&q| need(q) > alloc.bytes() as u64) {
                return Err(Error::InvalidArgument(format!(
                    "a symmetric buffer of {} bytes as the {what}: rank {q}'s needs {} bytes, and peers access every \
                     rank's buffer",
                    alloc.bytes(),
                    need(q)
                )));
            }
            let mut bases = [(std::ptr::null_mut(), 0); MAX_WORLD];
            for (q, b) in bases.iter_mut().enumerate().take(self.world_size()) {
                let off = shift(q as u32) as usize;
                // SAFETY: `off` ≤ `need(q)` ≤ the allocation's bytes per rank (checked above),
                // so the pointer stays inside rank `q`'s bytes (or one past their end).
                *b = (unsafe { alloc.base(q).add(off) }, alloc.bytes() - off);
            }
            Ok(Some((bases, alloc.id())))
        };
        match bufs {
            Bufs::Separate(input, output) => {
                let inputs = at(input, &|q| spec.input_bytes(q), &|_| 0, "input")?;
                let outputs = at(output, &|q| spec.output_bytes(q), &|_| 0, "output")?;
                Ok(PeerRegions::new(inputs, outputs))
            }
            Bufs::InPlace(buf) => {
                let layout = |q: u32| in_place_layout(spec, q);
                let inputs = at(buf, &|q| layout(q).2, &|q| layout(q).0, "buffer")?;
                let outputs = at(buf, &|q| layout(q).2, &|q| layout(q).1, "buffer")?;
                Ok(PeerRegions::new(inputs, outputs))
            }
        }
    }

    /// Meets every rank before a checked call and checks they make the same call: a
    /// one-copy call on the same allocations (peers write into this rank's memory only then,
    /// see [`crate::cpu::buffer`]), a point-to-point call with the same sizes (a send here
    /// of as many bytes as the receive there). A rank that does not come poisons the world:
    /// the calls of the ranks that did come are lost, as with an expired executor wait.
    fn meet_checked_call(&self, mine: CheckedCall) -> Result<(), Error> {
        const DURING: &str = "checking that every rank makes the same call";
        let sh = &*self.shared;
        let all = match sh.checked_calls.meet(self.rank, mine.clone(), sh.config.timeout, DURING, <[_]>::to_vec) {
            Ok(all) => all,
            Err(e) => {
                sh.world.poison_because(&e);
                return Err(e);
            }
        };
        match all.iter().position(|c| *c != mine) {
            None => Ok(()),
            Some(peer) => Err(Error::Mismatch {
                rank: self.rank,
                peer,
                what: format!(
                    "a call with symmetric buffers or a send/recv: here {}, there {}",
                    mine.describe(),
                    all[peer].describe()
                ),
            }),
        }
    }

    /// Validates, plans, verifies, runs. Nothing is written before every check has passed.
    fn run(&self, spec: CollectiveSpec, bufs: Bufs<'_>) -> Result<Status, Error> {
        self.run_checked(spec, bufs, false)
    }

    /// [`CpuComm::run`]; `point_to_point`: meet the peer first and compare the calls, so a
    /// send and a receive of different sizes are an [`Error::Mismatch`] on both ranks before
    /// anything moves, not a wait that expires.
    fn run_checked(&self, spec: CollectiveSpec, bufs: Bufs<'_>, point_to_point: bool) -> Result<Status, Error> {
        let rank = self.rank as u32;
        let sh = &*self.shared;
        let span = CallSpan::enter(self.rank, &spec, "host");
        if spec.world as usize != self.world_size() {
            return Err(Error::InvalidArgument(format!(
                "a spec for world {} on a communicator of {}",
                spec.world,
                self.world_size()
            )));
        }
        spec.validate()?;
        if spec.collective.consume_op() == ConsumeOp::Reduce && atom_dtype(spec.dtype).is_none() {
            return Err(Error::Unsupported(format!(
                "{} of {:?}: the Atom reduces f32, f16, bf16, fp8 e4m3/e5m2, i32 and u32",
                spec.collective.name(),
                spec.dtype
            )));
        }
        let es = spec.dtype.size();
        let in_place = matches!(bufs, Bufs::InPlace(_));
        let (in_len, out_len) = match &bufs {
            Bufs::Separate(s, r) => (s.bytes as u64, r.bytes as u64),
            Bufs::InPlace(b) => (b.bytes as u64, b.bytes as u64),
        };
        for len in [in_len, out_len] {
            CollectiveSpec::elements(spec.dtype, len)?;
        }
        if in_place {
            // The one buffer is the larger side; the smaller one lies inside it.
            let (need_in, need_out) = (spec.input_bytes(rank), spec.output_bytes(rank));
            let need = need_in.max(need_out);
            if in_len != need {
                let which = if need_in >= need_out { "input" } else { "output" };
                return Err(purlin_snac::SpecError::BufferLength {
                    rank,
                    which,
                    expected: need / es,
                    got: in_len / es,
                }
                .into());
            }
            if matches!(spec.collective, purlin_snac::Collective::AllToAll | purlin_snac::Collective::AllToAllV) {
                return Err(Error::Unsupported(format!("{} cannot run in place", spec.collective.name())));
            }
        } else {
            spec.check_buffers(rank, in_len / es, out_len / es)?;
        }
        let _busy = sh.busy[self.rank].try_lock().map_err(|_| {
            Error::InvalidArgument(format!("rank {rank}: another call on this communicator is in progress"))
        })?;
        self.async_error().map_err(|e| self.reported(e))?;

        let peers = self.peer_buffers(&spec, &bufs)?;
        let (tuning, mut limits) = (&sh.config.tuning, sh.config.limits());
        (limits.peer_inputs, limits.peer_outputs) = (peers.inputs.is_some(), peers.outputs.is_some());
        // Verified with the configuration the plan was derived with (after any fall-back to
        // the throughput regime or to smaller chunks).
        let (plan, cfg) = plan_and_config(&spec, rank, in_place, tuning, &limits)?;
        let verdict = verified(&spec, &cfg, &sh.config.verify)?;
        verdict.covers(&plan)?;

        let mut buffers = match bufs {
            Bufs::Separate(s, r) => CallBuffers::new(s.ptr, s.bytes, r.ptr, r.bytes),
            Bufs::InPlace(b) => {
                let len = b.bytes;
                let base = b.ptr;
                let (ioff, ilen, ooff, olen) = match plan.resources.alias {
                    Some(purlin_snac::Alias::InputInOutput(o)) => {
                        (o as usize, plan.resources.input_bytes as usize, 0, len)
                    }
                    Some(purlin_snac::Alias::OutputInInput(o)) => {
                        (0, len, o as usize, plan.resources.output_bytes as usize)
                    }
                    None => (0, len, 0, len),
                };
                if ioff + ilen > len || ooff + olen > len {
                    return Err(internal(rank, "in-place alias outside the buffer".into()));
                }
                // SAFETY: both offsets plus lengths were checked to lie inside `b`; both
                // pointers derive from the one unique borrow behind `b`, which outlives the call.
                unsafe { CallBuffers::new(base.add(ioff), ilen, base.add(ooff), olen) }
            }
        };
        if let Some(p) = peers.inputs {
            buffers.peer_inputs = p;
        }
        if let Some(p) = peers.outputs {
            buffers.peer_outputs = p;
        }
        // Peers reach this rank's memory only in one-copy plans, in the roles the collective
        // shares. The decision is the call's, not this rank's plan's: a rank that contributes
        // nothing may write no peer yet have its output written.
        let one_copy = cfg.regime == Regime::Throughput && purlin_snac::derive::one_copy(&spec, &cfg);
        span.planned(&plan, one_copy, in_place, || false);
        self.warn_fallbacks(
            &spec,
            &plan,
            &verdict.coverage,
            (peers.inputs.is_some() || peers.outputs.is_some(), one_copy),
        );
        // Calls that run a plan are numbered (an empty one is empty on every rank).
        let number = (plan.grid() > 0).then(|| {
            let mut flight = sh.flights[self.rank].lock().unwrap_or_else(|e| e.into_inner());
            flight.start(&spec, rank, plan.call_digest(), Executor::Host)
        });
        if let Some(n) = number {
            span.numbered(n);
        }
        let ran = self.run_planned(&spec, &plan, buffers, (one_copy, point_to_point, in_place, &peers));
        if let Some(n) = number {
            sh.flights[self.rank].lock().unwrap_or_else(|e| e.into_inner()).finish(n, ran.is_ok());
        }
        ran.map_err(|e| self.reported(e))?;
        *sh.last[self.rank].lock().unwrap_or_else(|e| e.into_inner()) = Some(CallInfo {
            spec,
            in_place,
            regime: plan.regime,
            staging_side: plan.staging_side,
            grid: plan.grid(),
            one_copy,
            copy_engine: plan.engine.is_some(),
            verified: verdict.coverage.clone(),
        });
        Ok(Status::Success)
    }

    /// Warns of what a call fell back to: a staged plan where symmetric buffers were given
    /// for a throughput call, a plan key the verifier sampled instead of exhausting (each
    /// once per collective and world in a process).
    fn warn_fallbacks(&self, spec: &CollectiveSpec, plan: &purlin_snac::Plan, coverage: &str, symmetric: (bool, bool)) {
        let (given, one_copy) = symmetric;
        if given && !one_copy && plan.regime == Regime::Throughput {
            warn_once(format!("staged {} {}", spec.collective.name(), spec.world), || {
                tracing::warn!(
                    rank = self.rank,
                    collective = spec.collective.name(),
                    "staged instead of one-copy: the call's buffers are not symmetric in every role the one-copy plan shares"
                )
            });
        }
        if coverage.starts_with("sampled") {
            warn_once(format!("sampled {} {}", spec.collective.name(), spec.world), || {
                tracing::warn!(
                    rank = self.rank,
                    collective = spec.collective.name(),
                    coverage,
                    "verification budget reached: the plan key was checked on sampled schedules, not exhaustively"
                )
            });
        }
    }

    /// The checked-call meeting, the plan's run and the one-copy exit of a planned call.
    fn run_planned(
        &self,
        spec: &CollectiveSpec,
        plan: &purlin_snac::Plan,
        buffers: CallBuffers,
        (one_copy, point_to_point, in_place, peers): (bool, bool, bool, &PeerRegions),
    ) -> Result<(), Error> {
        let sh = &*self.shared;
        if one_copy {
            let (shares_inputs, shares_outputs) = purlin_snac::derive::one_copy_roles(spec.collective);
            let input = peers.input_alloc.filter(|_| shares_inputs);
            let output = peers.output_alloc.filter(|_| shares_outputs);
            self.meet_checked_call(CheckedCall { spec: spec.clone(), in_place, input, output })?;
        } else if point_to_point {
            self.meet_checked_call(CheckedCall { spec: spec.clone(), in_place, input: None, output: None })?;
        }
        let ran = sh.world.execute(plan, buffers, false).map(drop);
        if one_copy {
            // A rank whose call failed must not return while a peer's threads may still
            // write its memory: every rank leaves a one-copy call together (each executor
            // wait is bounded, so this meeting is too).
            const DURING: &str = "leaving a one-copy call";
            let left = sh.symmetric_exits.meet(self.rank, (), 2 * sh.config.timeout, DURING, |_| ());
            if let Err(e) = &left {
                sh.world.poison_because(e);
            }
            ran.and(left)
        } else {
            ran
        }
    }
}

/// A group of sends and receives on a [`CpuComm`], made by [`CpuComm::group`]: the host twin
/// of [`Comm::group`](crate::Comm::group)'s `Group`, with the same matching (the k-th send
/// with the k-th receive, one world-2 call each, the longer list's rest alone).
#[derive(Debug)]
pub struct CpuGroup<'g> {
    comm: &'g CpuComm,
    sends: Vec<(Transfer, HostRegion<'g>)>,
    recvs: Vec<(Transfer, HostRegion<'g>)>,
}

impl<'g> CpuGroup<'g> {
    /// Holds a send of `send` to `peer` until the group ends; the group's k-th send meets
    /// the peer's k-th receive from this rank.
    pub fn send<S: CpuBuffer<T> + ?Sized, T: CpuType>(&mut self, send: &'g S, peer: i32) -> Result<(), Error> {
        let region = send.host_region().plain();
        let peer = call::rank_of(peer, self.comm.world_size(), "send")?;
        let transfer = Transfer { peer, bytes: region.bytes as u64 };
        point_to_point_spec(self.comm.world_size(), self.comm.rank, Some(transfer), None)?;
        self.sends.push((transfer, region));
        Ok(())
    }

    /// Holds a receive into `recv` from `peer` until the group ends; the group's k-th
    /// receive meets the peer's k-th send to this rank.
    pub fn recv<R: CpuBufferMut<T> + ?Sized, T: CpuType>(
        &mut self,
        recv: &'g mut R,
        peer: i32,
    ) -> Result<Status, Error> {
        let region = recv.host_region_mut().plain();
        let peer = call::rank_of(peer, self.comm.world_size(), "recv")?;
        let transfer = Transfer { peer, bytes: region.bytes as u64 };
        point_to_point_spec(self.comm.world_size(), self.comm.rank, None, Some(transfer))?;
        self.recvs.push((transfer, region));
        Ok(Status::Success)
    }

    /// Ends the group now, running the held calls in order and returning the first failure
    /// (after which the rest do not run).
    pub fn end(mut self) -> Result<Status, Error> {
        self.run_held()
    }

    fn run_held(&mut self) -> Result<Status, Error> {
        let c = self.comm;
        for (send, recv) in paired(std::mem::take(&mut self.sends), std::mem::take(&mut self.recvs)) {
            let spec = point_to_point_spec(c.world_size(), c.rank, send.map(|s| s.0), recv.map(|r| r.0))?;
            let region = |side: Option<(Transfer, HostRegion<'g>)>| side.map_or_else(HostRegion::empty, |s| s.1);
            c.run_checked(spec, Bufs::Separate(region(send), region(recv)), true)?;
        }
        Ok(Status::Success)
    }
}

impl Drop for CpuGroup<'_> {
    /// Runs the held calls (as `Comm`'s group does). A failure cannot be returned from here
    /// and leaves the peer's half of the call waiting, so it poisons the world: every rank's
    /// [`CpuComm::async_error`] and later calls report it. [`CpuGroup::end`] returns it.
    fn drop(&mut self) {
        if let Err(e) = self.run_held() {
            self.comm.shared.world.poison_because(&e);
        }
    }
}
