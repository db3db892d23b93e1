//! The communicator, shaped like `cudarc::nccl::Comm` (docs/design.md §5).
//!
//! Its parts: the collectives (`collectives`), the launch path (`launch`), symmetric buffers
//! (`symmetric`), groups (`group`), set-up (`setup`, `config`) and the diagnostics behind
//! [`Comm::diag`] (`diag`).
//!
//! Two process models, one set-up sequence (`setup`):
//! - **one process, several GPUs**: [`Comm::from_devices`] runs the set-up of every rank on
//!   its own thread, the ranks meeting through an in-process [`HostComm`]; the workspace is
//!   reached through peer access. Teardown happens when the last of the group's `Comm`s is
//!   dropped (cudarc programs drop them one after another from one thread, so no `Comm` may
//!   wait for the others in `Drop`).
//! - **one process per GPU**: [`Comm::from_rank`] with an [`Id`] from rank 0, or
//!   [`Comm::from_env`] under torchrun; the ranks meet on an abstract Unix socket and share
//!   the workspace through CUDA IPC. Dropping a `Comm` synchronises its stream, then meets
//!   the peers before unmapping (see [`crate::workspace`]).
//!
//! Set-up: describe the local GPU → all-gather the descriptions, check one generation,
//! distinct GPUs and peer access → compile the kernels this communicator needs and compute
//! their co-residency bound, minimum across ranks → establish the symmetric workspace
//! (zeroed and synchronised before handles are published) → final barrier. Every step is
//! agreed: a rank that fails tells the others, who fail naming it.

mod collectives;
mod config;
pub(crate) mod diag;
mod engine;
mod fused;
mod group;
mod launch;
mod raw;
mod setup;
mod stream;
mod symmetric;

pub use crate::workspace::TeardownReport;
pub use config::{CommConfig, KernelRequest, LoadedKernel};
pub use fused::{CollectiveArgs, FusedCall, FusedKernel, FusedLaunch, fused_unit};
pub use group::{Group, group_end, group_start};
pub use raw::RawBuffer;
pub use stream::{OnStream, Untracked};
pub use symmetric::SymmetricBuffer;

use collectives::in_place_offsets;
use group::refuse_in_open_group;
use launch::{PeerBuffers, PlanKey, PreparedPlan};
use setup::{Backend, setup};
use symmetric::SymmetricMem;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, sys};
use purlin_topo::{Device, GenerationHint};

use super::executor::DeviceExecutor;
use super::ipc::{IpcBackend, PeerBackend};
use crate::bootstrap::{HostComm, Id, TorchEnv};
use crate::call::tuning::Tuning;
use crate::error::{Error, driver};
use crate::flight::{FlightRecorder, HangReport};
use crate::workspace::{SymmetricAlloc, SymmetricWorkspace, WorkspaceLayout};
use diag::CoResidency;

enum Owner {
    /// One process per GPU: this rank's share, torn down by meeting the peers.
    Ipc(Option<(SymmetricWorkspace<IpcBackend>, IpcBackend)>),
    /// From a single-process set-up, before it was handed to the group.
    Peer(Option<(SymmetricWorkspace<PeerBackend>, PeerBackend)>),
    /// One process, several GPUs: freed when the last `Comm` of the group goes.
    Group(Arc<GroupOwner>),
}

impl std::fmt::Debug for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Owner::Ipc(_) => "Ipc",
            Owner::Peer(_) => "Peer",
            Owner::Group(_) => "Group",
        })
    }
}

/// The workspaces of a single-process group; dropping it synchronises every GPU of the
/// group and frees them all (no kernel of the group can still run), and with them every
/// symmetric buffer the group's communicators allocated.
struct GroupOwner {
    parts: Mutex<Vec<GroupPart>>,
    symmetric: Mutex<Vec<GroupSymmetric>>,
}

/// A symmetric buffer of a single-process group: its allocation, and the memory its handles
/// share (still held at the group's end: kept allocated).
type GroupSymmetric = (SymmetricAlloc<IpcBackend>, IpcBackend, Arc<SymmetricMem>);

/// One rank's share of a single-process group.
type GroupPart = (SymmetricWorkspace<PeerBackend>, PeerBackend, Arc<CudaStream>);

impl Drop for GroupOwner {
    fn drop(&mut self) {
        let parts = std::mem::take(&mut *self.parts.lock().unwrap_or_else(|e| e.into_inner()));
        for (_, _, stream) in &parts {
            let _ = stream.context().synchronize();
        }
        for (ws, mut backend, _) in parts {
            ws.discard_now(&mut backend);
        }
        for (alloc, mut backend, mem) in std::mem::take(&mut *self.symmetric.lock().unwrap_or_else(|e| e.into_inner()))
        {
            // A buffer still held keeps its memory (its peers' mappings are never used again).
            alloc.discard_now(&mut backend, Arc::strong_count(&mem) > 1);
        }
    }
}

/// A communicator: one rank of a group of GPUs that run collectives together.
#[derive(Debug)]
pub struct Comm {
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    host: HostComm,
    device: Device,
    devices: Vec<Device>,
    generation: GenerationHint,
    pub(crate) layout: WorkspaceLayout,
    addrs: Vec<u64>,
    module: Arc<CudaModule>,
    pingpong: CudaFunction,
    coresidency: CoResidency,
    kernels: Vec<LoadedKernel>,
    pub(crate) exec: DeviceExecutor,
    /// The most blocks an executor plan may have: the executor kernels' co-residency bound,
    /// agreed across ranks, less the call check's block (kept with the check off too, so
    /// plans do not depend on it).
    pub(crate) exec_bound: u32,
    tuning: Tuning,
    verify: Option<purlin_snac::verify::Options>,
    device_timeout: Duration,
    plans: Mutex<HashMap<PlanKey, Arc<PreparedPlan>>>,
    pub(crate) poison: Mutex<Option<String>>,
    next_flag_slot: Mutex<Vec<usize>>,
    /// Executor launches so far (the call check's numbers, `next_call_number`).
    calls_launched: AtomicU64,
    /// [`CommConfig::call_check`].
    call_check: bool,
    /// This rank's last launches ([`crate::flight`]).
    flight: Mutex<FlightRecorder>,
    /// Symmetric buffers, in allocation order (the same on every rank).
    symmetric: Mutex<Vec<SymmetricRecord>>,
    /// Where this communicator's kernels were compiled (fused kernels compile there too).
    kernel_cache: purlin_atom::KernelCache,
    /// Ranks of this communicator on this GPU (`CommConfig::shared_gpu`), which split its
    /// co-resident blocks.
    gpu_sharing: u32,
    /// The stream of the last launch ([`Comm::on_stream`]).
    launches: stream::LaunchOrder,
    /// This GPU's copy engine where every rank's GPU has one (64-bit stream memory
    /// operations, agreed at set-up): one-copy gathers may then run on the copy engines.
    copy_engine: Option<purlin_atom::copy_engine::CopyEngine>,
    owner: Owner,
}

/// A symmetric buffer of this communicator: where it lies on every rank, and (one process per
/// GPU) its allocation, released at teardown; in a single-process group the group owns it.
#[derive(Debug)]
struct SymmetricRecord {
    mem: Arc<SymmetricMem>,
    alloc: Option<(SymmetricAlloc<IpcBackend>, IpcBackend)>,
}

/// The error of a call whose ranks' digests differ, from this rank's control words (poison
/// code 2, written by the call check in kernels/snac/exec.cuh: word 1 the peer + 1, words 6
/// and 7 this rank's and the peer's `number << 32 | digest`); `None` for any other state.
fn call_mismatch(rank: usize, control: &[u64; 8]) -> Option<Error> {
    let peer = control[1].checked_sub(1)? as usize;
    (control[0] == 2).then(|| Error::Mismatch {
        rank,
        peer,
        what: format!(
            "their calls differ (call {}: digest {:#010x} here, {:#010x} on rank {peer}); {}",
            control[6] >> 32,
            control[6] as u32,
            control[7] as u32,
            crate::error::SAME_CALLS,
        ),
    })
}

/// How many communicators this process has made from the torchrun environment: the n-th
/// one of every rank meets on the n-th name.
static ENV_COMMS: AtomicU64 = AtomicU64::new(0);

impl Comm {
    /// One communicator per stream, each on its own GPU (unless [`CommConfig::shared_gpu`]),
    /// in one process (rank `i` drives `streams[i]`). Like cudarc's, it returns once all
    /// ranks are set up.
    ///
    /// A thread that drives several ranks must enqueue every rank's call before anything
    /// that waits for one of their streams (a synchronize, a read-back, a pageable copy of
    /// more than the driver buffers): rank 0's kernel waits for rank 1's, so a wait on rank
    /// 0's stream before rank 1's launch ends only at the device timeout, as with NCCL.
    ///
    /// ```no_run
    /// use cudarc::driver::CudaContext;
    /// use purlin_collectives::{Comm, ReduceOp};
    ///
    /// let n = purlin_collectives::device_count();
    /// let streams = (0..n).map(|i| CudaContext::new(i)?.new_stream()).collect::<Result<Vec<_>, _>>()?;
    /// let comms = Comm::from_devices(streams)?;
    /// // Every rank's call is enqueued before anything waits on a stream.
    /// let mut bufs = Vec::new();
    /// for comm in &comms {
    ///     let mut buf = comm.stream().clone_htod(&vec![1.0f32; 1 << 20])?;
    ///     comm.all_reduce_in_place(&mut buf, &ReduceOp::Sum)?;
    ///     bufs.push(buf);
    /// }
    /// for (comm, buf) in comms.iter().zip(&bufs) {
    ///     let sum = comm.stream().clone_dtoh(buf)?;
    ///     assert!(sum.iter().all(|&x| x == n as f32));
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_devices(streams: Vec<Arc<CudaStream>>) -> Result<Vec<Self>, Error> {
        Self::from_devices_with_config(streams, CommConfig::from_env()?)
    }

    /// [`Comm::from_devices`] with explicit settings.
    pub fn from_devices_with_config(streams: Vec<Arc<CudaStream>>, config: CommConfig) -> Result<Vec<Self>, Error> {
        let world = streams.len();
        if world == 0 || world > purlin_topo::MAX_WORLD {
            return Err(purlin_topo::TopoError::WorldSize { world }.into());
        }
        let contexts: Vec<Arc<CudaContext>> = streams.iter().map(|s| s.context().clone()).collect();
        for (i, c) in contexts.iter().enumerate() {
            if !config.shared_gpu && contexts[..i].iter().any(|o| o.ordinal() == c.ordinal()) {
                return Err(purlin_topo::TopoError::DuplicateDevice { ordinal: c.ordinal() }.into());
            }
        }
        let hosts = HostComm::threads(world, config.timeout);
        let results: Vec<Result<Comm, Error>> = std::thread::scope(|s| {
            let handles: Vec<_> = streams
                .into_iter()
                .zip(hosts)
                .map(|(stream, host)| {
                    let backend = PeerBackend::new(stream.context().clone(), contexts.clone());
                    let config = &config;
                    s.spawn(move || setup(stream, host, config, Backend::Peer(backend)))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Protocol { peer: None, what: "set-up thread panicked".into() }))
                })
                .collect()
        });
        // Report the root cause: a rank's own failure rather than another's view of it.
        if results.iter().any(Result::is_err) {
            let mut errors: Vec<Error> = results.into_iter().filter_map(Result::err).collect();
            let root = errors
                .iter()
                .position(|e| !matches!(e, Error::PeerFailed { .. } | Error::PeerLost { .. } | Error::Timeout { .. }))
                .unwrap_or(0);
            return Err(errors.swap_remove(root));
        }
        let mut comms: Vec<Comm> = results.into_iter().filter_map(Result::ok).collect();
        let mut parts = Vec::with_capacity(world);
        for c in &mut comms {
            if let Owner::Peer(Some((ws, b))) = std::mem::replace(&mut c.owner, Owner::Peer(None)) {
                parts.push((ws, b, c.stream.clone()));
            }
        }
        let group = Arc::new(GroupOwner { parts: Mutex::new(parts), symmetric: Mutex::new(vec![]) });
        for c in &mut comms {
            c.owner = Owner::Group(group.clone());
        }
        Ok(comms)
    }

    /// Rank `rank` of `world_size`, one process (or thread) per GPU; every rank passes the
    /// [`Id`] that rank 0 made with [`Id::new`]. Returns once all ranks are set up.
    pub fn from_rank(stream: Arc<CudaStream>, rank: usize, world_size: usize, id: Id) -> Result<Self, Error> {
        Self::from_rank_with_config(stream, rank, world_size, id, CommConfig::from_env()?)
    }

    /// [`Comm::from_rank`] with explicit settings.
    pub fn from_rank_with_config(
        stream: Arc<CudaStream>,
        rank: usize,
        world_size: usize,
        id: Id,
        config: CommConfig,
    ) -> Result<Self, Error> {
        id.check()?;
        let host = HostComm::connect(&id, rank, world_size, config.timeout)?;
        let backend = IpcBackend::new(stream.context().clone());
        setup(stream, host, &config, Backend::Ipc(backend))
    }

    /// Under torchrun: rank `RANK` of `WORLD_SIZE` on GPU `LOCAL_RANK`, on a new stream. A world
    /// that spans nodes is refused ([`Error::Unsupported`]): [`crate::HierComm::from_env`]
    /// composes nodes. The ranks meet on a name derived from `MASTER_ADDR`, `MASTER_PORT` and
    /// `TORCHELASTIC_RUN_ID` (never on `MASTER_PORT` itself).
    pub fn from_env() -> Result<Self, Error> {
        Self::from_env_with_stream(torchrun_stream()?, CommConfig::from_env()?)
    }

    /// [`Comm::from_env`] on a given stream and with explicit settings.
    pub fn from_env_with_stream(stream: Arc<CudaStream>, config: CommConfig) -> Result<Self, Error> {
        let env = TorchEnv::from_process()?;
        env.check_one_node()?;
        let seq = ENV_COMMS.fetch_add(1, Ordering::Relaxed);
        Self::from_rank_with_config(stream, env.rank, env.world_size, env.id(seq), config)
    }

    /// The stream this rank's collectives run on.
    pub fn stream(&self) -> Arc<CudaStream> {
        self.stream.clone()
    }

    /// The CUDA context of this rank's GPU.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.stream.context()
    }

    /// This rank's GPU ordinal.
    pub fn ordinal(&self) -> usize {
        self.stream.context().ordinal()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// This rank's GPU as purlin-topo describes it.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Every rank's GPU, in rank order.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// A failure that poisoned this communicator (like `ncclCommGetAsyncError`): a device
    /// wait that expired here, a poison word set in this rank's workspace, or a peer whose
    /// process is gone (its connection closed). Does not wait.
    pub fn async_error(&self) -> Result<(), Error> {
        self.async_error_unreported().map_err(|e| self.reported(e))
    }

    /// This rank's flight recorder: its last [`crate::FLIGHT_CALLS`] launches.
    pub fn flight_recorder(&self) -> FlightRecorder {
        self.flight.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The call each rank last entered, from this rank's workspace: every launch's call
    /// check stores `number << 32 | digest` into each peer's call words, so word `p` is peer
    /// `p`'s last call (0: none; unknown for every peer where the call check is off or the
    /// words cannot be read). With this rank's last launches.
    pub fn hang_report(&self) -> HangReport {
        let own = self.flight_recorder();
        let mut words = vec![0u64; self.world];
        let read = self.call_check
            && self.context().bind_to_thread().is_ok()
            // SAFETY: reads `world` 8-byte call words (CALL_WORDS >= MAX_WORLD, checked by the
            // layout's tests) from this rank's own live workspace into a buffer of as many.
            && unsafe {
                sys::cuMemcpyDtoH_v2(
                    words.as_mut_ptr().cast(),
                    self.addrs[self.rank] + self.layout.calls.offset as u64,
                    8 * self.world,
                )
            }
            .result()
            .is_ok();
        let numbers: Vec<Option<u64>> = (0..self.world)
            .map(|p| match p == self.rank {
                true => Some(own.calls()),
                false => read.then_some(words[p] >> 32),
            })
            .collect();
        // A peer's call is described by this rank's entry of the same number where the
        // digests agree (the same call), and by its digest alone otherwise.
        let describe = |p: usize, n: u64| {
            let mine = own.entry(n)?;
            (p == self.rank || mine.digest == words[p] as u32).then(|| mine.clone())
        };
        HangReport::new(self.rank, &numbers, &own, describe)
    }

    /// `error` with the hang report appended where it is about the ranks' state (a
    /// disagreement, a poisoned communicator).
    fn reported(&self, error: Error) -> Error {
        let report = || format!("; flight recorder: {}", self.hang_report().summary());
        match error {
            Error::Mismatch { rank, peer, what } => Error::Mismatch { rank, peer, what: what + &report() },
            Error::Poisoned(why) => Error::Poisoned(why + &report()),
            Error::DeviceTimeout { rank, peer, waited, during } => {
                Error::DeviceTimeout { rank, peer, waited, during: during + &report() }
            }
            other => other,
        }
    }

    fn async_error_unreported(&self) -> Result<(), Error> {
        if let Some(why) = self.poison.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Err(Error::Poisoned(why));
        }
        if let Err(e) = self.host.check_peers() {
            if let Some(peer) = e.peer() {
                tracing::error!(rank = self.rank, peer, error = %e, "communicator poisoned");
                self.poison_with(peer, e.to_string());
            }
            return Err(e);
        }
        let mut words = [0u64; 8];
        self.context().bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        // SAFETY: reads 64 bytes from the start of this rank's own live workspace (the
        // control region, 256 bytes) into a 64-byte host buffer.
        unsafe { sys::cuMemcpyDtoH_v2(words.as_mut_ptr().cast(), self.addrs[self.rank], 64) }
            .result()
            .map_err(driver("cuMemcpyDtoH"))?;
        if let Some(mismatch) = call_mismatch(self.rank, &words) {
            // Later calls fail at once, naming it.
            tracing::error!(rank = self.rank, peer = mismatch.peer(), error = %mismatch, "communicator poisoned");
            self.poison.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(mismatch.to_string());
            return Err(mismatch);
        }
        if words[0] != 0 {
            // The kernel names the peer where its wait knows it (handshakes); in a world of
            // two the other rank is the only one a wait can be for.
            let peer = match words[1].checked_sub(1) {
                Some(p) => Some(p as usize),
                None if self.world == 2 => Some(1 - self.rank),
                None => None,
            };
            // Where the wait does not know its peer, the rank furthest behind in the call
            // words is the one that did not come.
            let peer = peer.or_else(|| self.hang_report().most_behind());
            let who = peer.map_or("an unknown rank".into(), |p| format!("rank {p}"));
            let why = format!("rank {}: a device wait for {who} expired", self.rank);
            tracing::error!(rank = self.rank, peer, error = %why, "communicator poisoned");
            // Later calls fail at once with this reason (the device word alone would only make
            // their kernels exit at entry).
            self.poison.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(why.clone());
            return Err(Error::Poisoned(why));
        }
        Ok(())
    }

    fn poison_with(&self, peer: usize, why: String) {
        self.poison.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(why);
        let words = [1u64, peer as u64 + 1];
        if self.context().bind_to_thread().is_ok() {
            // SAFETY: writes 16 bytes at the start of this rank's own live workspace (the
            // control region: poison word and peer), never a peer's memory.
            let _ = unsafe { sys::cuMemcpyHtoD_v2(self.addrs[self.rank], words.as_ptr().cast(), 16) };
        }
    }

    /// Starts a group (cudarc's `Comm::group`); calls on the group take views whose
    /// lifetimes must cover the group's. Collectives run as they are called; a send and a
    /// receive wait for the group's end ([`Group::end`] or dropping it), where they run as
    /// one [`Comm::send_recv`].
    pub fn group(&self) -> Group<'_> {
        Group::new(self)
    }

    /// Tears down now and says how it went (dropping does the same, silently).
    pub fn close(mut self) -> TeardownReport {
        self.teardown()
    }

    fn teardown(&mut self) -> TeardownReport {
        // Every device wait is bounded, so this returns.
        let _ = self.join_launches();
        let _ = self.stream.synchronize();
        let symmetric = std::mem::take(&mut *self.symmetric.lock().unwrap_or_else(|e| e.into_inner()));
        match std::mem::replace(&mut self.owner, Owner::Peer(None)) {
            Owner::Ipc(Some((ws, mut backend))) => {
                // Symmetric buffers first, in allocation order (the same on every rank); after a
                // failed meeting the rest are left allocated without meeting again (each
                // meeting would wait out the timeout).
                let (mut leaked, mut met) = (0, true);
                for r in symmetric {
                    let Some((alloc, mut b)) = r.alloc else { continue };
                    if !met {
                        leaked += alloc.abandon(&mut b);
                        continue;
                    }
                    // A buffer still held keeps its memory (reported as leaked).
                    let report = alloc.release(&self.host, &mut b, Arc::strong_count(&r.mem) > 1);
                    (leaked, met) = (leaked + report.leaked_bytes, report.met_peers);
                }
                let mut report = ws.release(&self.host, &mut backend);
                report.leaked_bytes += leaked;
                report
            }
            Owner::Peer(Some((ws, mut backend))) => {
                let _ = self.context().synchronize();
                ws.discard_now(&mut backend);
                TeardownReport { met_peers: false, ..TeardownReport::default() }
            }
            Owner::Group(group) => {
                // This rank's records first: a buffer counts as held only by its handles.
                drop(symmetric);
                drop(group);
                TeardownReport { met_peers: true, ..TeardownReport::default() }
            }
            Owner::Ipc(None) | Owner::Peer(None) => TeardownReport::default(),
        }
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        let report = self.teardown();
        if report.leaked_bytes > 0 {
            eprintln!(
                "purlin: rank {} left its {} workspace bytes allocated at teardown ({})",
                self.rank,
                report.leaked_bytes,
                report.error.as_deref().unwrap_or("peer did not meet")
            );
        }
    }
}

/// A new stream on torchrun's GPU for this process (`LOCAL_RANK`, or GPU 0 for every rank
/// with `PURLIN_SHARED_GPU=1`).
pub(crate) fn torchrun_stream() -> Result<Arc<CudaStream>, Error> {
    let env = TorchEnv::from_process()?;
    if !purlin_topo::driver_present() {
        return Err(purlin_topo::TopoError::NoDriver.into());
    }
    let ordinal = env.device_ordinal(purlin_topo::device_count())?;
    let ctx = CudaContext::new(ordinal).map_err(driver("cuDevicePrimaryCtxRetain"))?;
    ctx.new_stream().map_err(driver("cuStreamCreate"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_nest_per_thread_and_an_unopened_end_is_refused() {
        assert!(matches!(group_end(), Err(Error::InvalidArgument(_))));
        assert!(refuse_in_open_group("send").is_ok());
        group_start().unwrap();
        group_start().unwrap();
        assert!(matches!(refuse_in_open_group("send"), Err(Error::Unsupported(m)) if m.contains("comm.group()")));
        // Another thread has no group open.
        std::thread::spawn(|| assert!(refuse_in_open_group("recv").is_ok())).join().unwrap();
        group_end().unwrap();
        assert!(refuse_in_open_group("send").is_err(), "one level is still open");
        group_end().unwrap();
        assert!(refuse_in_open_group("send").is_ok());
        assert!(matches!(group_end(), Err(Error::InvalidArgument(_))));
    }
}
