//! The communicator, shaped like `cudarc::nccl::Comm` (DESIGN.md §5).
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

mod config;
mod group;
mod setup;
mod types;

pub use config::{CommConfig, KernelRequest, LoadedKernel};
pub use group::{Group, group_end, group_start};
pub use types::{DataType, NcclType, ReduceOp, Status};

pub(crate) use group::paired;
use group::refuse_in_open_group;
use setup::{Backend, agree, setup};
use types::{snac_dtype, snac_op};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
    sys,
};
use purlin_topo::{Device, GenerationHint};

use crate::device::{IpcBackend, PeerBackend};
use crate::error::{Error, driver};
use crate::exec_device::{DeviceExecutor, ExecParams, ExecRuntime};
use crate::host::HostComm;
use crate::id::{Id, TorchEnv};
use crate::symmetric::{SymmetricBuffer, SymmetricMem};
use crate::tuning::{PlanLimits, Tuning};
use crate::workspace::{FLAG_SLOTS, SymmetricAlloc, SymmetricWorkspace, TeardownReport, WorkspaceLayout};
use purlin_snac::{CollectiveSpec, Plan};
use std::collections::HashMap;

/// The co-residency bounds this communicator plans under: per kernel, the minimum across
/// ranks of (occupancy blocks per SM × SMs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoResidency {
    /// The flag ping-pong kernel (32 threads, no shared memory).
    pub smoke_pingpong: u32,
    /// The same, on this rank only (before the minimum).
    pub smoke_pingpong_local: u32,
}

/// Result of a flag ping-pong through the workspace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PingPong {
    /// Round trips completed.
    pub rounds: u64,
    /// Mean round trip in microseconds (initiator's clock; 0 on the responder).
    pub round_trip_us: f64,
    /// Whether this rank initiated.
    pub initiator: bool,
}

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
    /// Symmetric buffers, in allocation order (the same on every rank).
    symmetric: Mutex<Vec<SymmetricRecord>>,
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

    /// Under torchrun: rank `RANK` of `WORLD_SIZE` on GPU `LOCAL_RANK`, on a new stream.
    /// The ranks meet on a name derived from `MASTER_ADDR`, `MASTER_PORT` and
    /// `TORCHELASTIC_RUN_ID` (never on `MASTER_PORT` itself).
    pub fn from_env() -> Result<Self, Error> {
        let env = TorchEnv::from_process()?;
        if !purlin_topo::driver_present() {
            return Err(purlin_topo::TopoError::NoDriver.into());
        }
        let ordinal = env.device_ordinal(purlin_topo::device_count())?;
        let ctx = CudaContext::new(ordinal).map_err(driver("cuDevicePrimaryCtxRetain"))?;
        let stream = ctx.new_stream().map_err(driver("cuStreamCreate"))?;
        Self::from_env_with_stream(stream, CommConfig::from_env()?)
    }

    /// [`Comm::from_env`] on a given stream and with explicit settings.
    pub fn from_env_with_stream(stream: Arc<CudaStream>, config: CommConfig) -> Result<Self, Error> {
        let env = TorchEnv::from_process()?;
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

    /// The Atom generation every rank's GPU calls for (one kernel key per communicator).
    pub fn generation(&self) -> GenerationHint {
        self.generation
    }

    /// The host communicator of this rank (barriers and small exchanges, bounded waits).
    pub fn host(&self) -> &HostComm {
        &self.host
    }

    /// The workspace layout (identical on every rank).
    pub fn workspace_layout(&self) -> &WorkspaceLayout {
        &self.layout
    }

    /// Every rank's workspace base as a device address usable by this rank's kernels.
    pub fn workspace_addrs(&self) -> &[u64] {
        &self.addrs
    }

    /// The kernels loaded at set-up ([`CommConfig::kernels`]), in request order.
    pub fn kernels(&self) -> &[LoadedKernel] {
        &self.kernels
    }

    /// The loaded kernel whose function is `function`.
    pub fn kernel(&self, function: &str) -> Option<&LoadedKernel> {
        self.kernels.iter().find(|k| k.request.function == function)
    }

    /// Copies `bytes` bytes at `offset` of this rank's own workspace to the host (debugging
    /// and tests; synchronous).
    pub fn read_own_workspace(&self, offset: usize, bytes: usize) -> Result<Vec<u8>, Error> {
        let end = offset.checked_add(bytes).filter(|&e| e <= self.layout.total_bytes);
        if end.is_none() {
            return Err(Error::InvalidArgument(format!(
                "workspace bytes {offset}..+{bytes} outside its {} bytes",
                self.layout.total_bytes
            )));
        }
        let mut out = vec![0u8; bytes];
        self.context().bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        // SAFETY: the source range lies inside this rank's own live workspace (checked
        // above) and the destination is a host buffer of exactly `bytes` bytes.
        unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), self.addrs[self.rank] + offset as u64, bytes) }
            .result()
            .map_err(driver("cuMemcpyDtoH"))?;
        Ok(out)
    }

    /// The co-residency bounds agreed at set-up.
    pub fn coresidency(&self) -> CoResidency {
        self.coresidency
    }

    /// The kernel module loaded at set-up.
    pub fn module(&self) -> &Arc<CudaModule> {
        &self.module
    }

    /// A failure that poisoned this communicator (like `ncclCommGetAsyncError`): a device
    /// wait that expired here, a poison word set in this rank's workspace, or a peer whose
    /// process is gone (its connection closed). Does not wait.
    pub fn async_error(&self) -> Result<(), Error> {
        if let Some(why) = self.poison.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Err(Error::Poisoned(why));
        }
        if let Err(e) = self.host.check_peers() {
            if let Some(peer) = e.peer() {
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
            let who = peer.map_or("an unknown rank".into(), |p| format!("rank {p}"));
            let why = format!("rank {}: a device wait for {who} expired", self.rank);
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

    /// Launches a flag ping-pong with `peer` through the workspace (the lower rank
    /// initiates), every device wait bounded by `timeout`; [`PingPongLaunch::wait`] collects
    /// it. Both ranks must call it, the same number of times per pair (each call takes a
    /// fresh flag slot; at most 16 per pair and communicator). Split in two so one thread
    /// can drive several GPUs ([`Comm::from_devices`]).
    pub fn launch_ping_pong(&self, peer: usize, rounds: u32, timeout: Duration) -> Result<PingPongLaunch<'_>, Error> {
        if peer >= self.world || peer == self.rank {
            return Err(Error::InvalidArgument(format!(
                "ping-pong peer {peer} (rank {}, world {})",
                self.rank, self.world
            )));
        }
        if rounds == 0 {
            return Err(Error::InvalidArgument("ping-pong needs at least one round".into()));
        }
        if let Some(why) = self.poison.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Err(Error::Poisoned(why));
        }
        let slot = {
            let mut slots = self.next_flag_slot.lock().unwrap_or_else(|e| e.into_inner());
            let s = slots[peer];
            if s >= FLAG_SLOTS {
                return Err(Error::Unsupported(format!("more than {FLAG_SLOTS} ping-pongs with one peer")));
            }
            slots[peer] += 1;
            s
        };
        let initiator = self.rank < peer;
        // My flag is written by the peer into my workspace; the peer's flag is in its own.
        let my_flag = self.addrs[self.rank] + self.layout.flag_offset(peer, slot) as u64;
        let peer_flag = self.addrs[peer] + self.layout.flag_offset(self.rank, slot) as u64;
        let mut result = self.stream.alloc_zeros::<u64>(2).map_err(driver("cuMemAllocAsync"))?;
        let timeout_ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        let init = u32::from(initiator);
        let mut launch = self.stream.launch_builder(&self.pingpong);
        launch.arg(&my_flag).arg(&peer_flag).arg(&rounds).arg(&init).arg(&timeout_ns).arg(&mut result);
        let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the kernel's signature is (u64*, u64*, u32, u32, u64, u64*); `my_flag` is in
        // this rank's live workspace, `peer_flag` in the peer's, mapped here (IPC or peer
        // access) until teardown, which synchronises this stream first; the kernel writes the
        // peer's flag only after a successful wait, so once the peer stops answering it stops
        // touching its memory; every wait is bounded by `timeout_ns`; `result` holds 2 words.
        unsafe { launch.launch(one) }.map_err(driver("cuLaunchKernel"))?;
        Ok(PingPongLaunch { comm: self, peer, rounds, timeout, initiator, result, started: Instant::now() })
    }

    /// [`Comm::launch_ping_pong`] and [`PingPongLaunch::wait`].
    pub fn ping_pong(&self, peer: usize, rounds: u32, timeout: Duration) -> Result<PingPong, Error> {
        self.launch_ping_pong(peer, rounds, timeout)?.wait()
    }

    /// Sends `data` to `peer` (cudarc's `send`); the peer's matching [`Comm::recv`] receives
    /// it. At world 2 the pair is the whole world, so a send and its receive are one
    /// collective: the AllToAllV of bytes with one nonzero count (`point_to_point_spec`), one
    /// kernel on each side. Both ranks must make their point-to-point calls in the same order
    /// (a send here meets a receive there); a send and a receive in one [`Group`] are one call.
    /// Between the free [`group_start`] and [`group_end`] it is refused (see there).
    /// Wider worlds answer [`Error::Unsupported`]: a pair of them is not every rank, which is
    /// what a SNAC plan is made for (use [`Comm::all_to_all_v`]).
    pub fn send<S: DevicePtr<T>, T: NcclType>(&self, data: &S, peer: i32) -> Result<(), Error> {
        refuse_in_open_group("send")?;
        let peer = self.check_peer(peer)?;
        let send = Transfer { peer, bytes: byte_len::<T>(data.len()) };
        let spec = point_to_point_spec(self.world, self.rank, Some(send), None)?;
        self.check_device(data)?;
        let (input, _record_in) = data.device_ptr(&self.stream);
        self.point_to_point_at(spec, input, 0).map(drop)
    }

    /// Receives `buff.len()` elements from `peer` (cudarc's `recv`): the peer's matching
    /// [`Comm::send`] must send as many bytes. See [`Comm::send`].
    pub fn recv<R: DevicePtrMut<T>, T: NcclType>(&self, buff: &mut R, peer: i32) -> Result<Status, Error> {
        refuse_in_open_group("recv")?;
        let peer = self.check_peer(peer)?;
        let recv = Transfer { peer, bytes: byte_len::<T>(buff.len()) };
        let spec = point_to_point_spec(self.world, self.rank, None, Some(recv))?;
        self.check_device(buff)?;
        let (output, _record_out) = buff.device_ptr_mut(&self.stream);
        self.point_to_point_at(spec, 0, output)
    }

    /// Sends `sendbuff` to `send_peer` and receives `recvbuff` from `recv_peer` in one call
    /// (MPI's `Sendrecv`; what a [`Group`] runs at its end for its k-th send and k-th receive).
    /// The peers' calls must mirror it: a [`Comm::send_recv`] or a group there, or a lone
    /// receive (send) where this rank only sends (receives), that is a zero-length side.
    pub fn send_recv<S: DevicePtr<T>, R: DevicePtrMut<U>, T: NcclType, U: NcclType>(
        &self,
        sendbuff: &S,
        send_peer: i32,
        recvbuff: &mut R,
        recv_peer: i32,
    ) -> Result<Status, Error> {
        let send = Transfer { peer: self.check_peer(send_peer)?, bytes: byte_len::<T>(sendbuff.len()) };
        let recv = Transfer { peer: self.check_peer(recv_peer)?, bytes: byte_len::<U>(recvbuff.len()) };
        let spec = point_to_point_spec(self.world, self.rank, Some(send), Some(recv))?;
        self.check_device(sendbuff)?;
        self.check_device(recvbuff)?;
        let (input, _record_in) = sendbuff.device_ptr(&self.stream);
        let (output, _record_out) = recvbuff.device_ptr_mut(&self.stream);
        self.point_to_point_at(spec, input, output)
    }

    /// A point-to-point call on device pointers the caller checked and keeps alive (0 for a
    /// side of no bytes). Always the plain (staged or packet) plan: a sender has no output
    /// buffer, so it cannot know whether the receiver's is symmetric, and both ranks must
    /// run plans of one configuration.
    fn point_to_point_at(&self, spec: CollectiveSpec, input: u64, output: u64) -> Result<Status, Error> {
        spec.validate()?;
        let plain = PeerBuffers::default();
        let prepared = self.prepared(spec, false, plain.flags())?;
        self.launch_prepared(&prepared, input, output, &plain)
    }

    fn check_peer(&self, peer: i32) -> Result<usize, Error> {
        usize::try_from(peer)
            .ok()
            .filter(|&p| p < self.world)
            .ok_or_else(|| Error::InvalidArgument(format!("rank {peer} is not in a world of {}", self.world)))
    }

    /// Broadcast from `root` (cudarc's `broadcast`): every rank's `recvbuff` receives the
    /// root's `sendbuff` (the same length). `sendbuff` is read on the root only, as NCCL's.
    /// It runs as the AllGatherV in which only the root contributes (counts 0 elsewhere):
    /// one kernel, every peer's bytes straight from the root (into symmetric outputs with
    /// one copy); at world 2 that is all a broadcast moves, while wider worlds load the
    /// root's links with `world - 1` copies where a ring would forward.
    pub fn broadcast<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        sendbuff: Option<&S>,
        recvbuff: &mut R,
        root: i32,
    ) -> Result<Status, Error> {
        let root = self.check_peer(root)?;
        let counts = broadcast_counts(self.world, root, recvbuff.len());
        let spec = CollectiveSpec::all_gather_v(self.world as u32, snac_dtype::<T>(), counts);
        match sendbuff {
            Some(send) if root == self.rank => self.collective(spec, send, recvbuff),
            None if root == self.rank => {
                Err(Error::InvalidArgument("broadcast: the root must pass a send buffer".into()))
            }
            // A peer contributes nothing: an empty input, never read.
            _ => {
                spec.validate()?;
                spec.check_buffers(self.rank as u32, 0, recvbuff.len() as u64)?;
                self.check_device(recvbuff)?;
                let (output, _record_out) = recvbuff.device_ptr_mut(&self.stream);
                self.collective_at(spec, 0, output)
            }
        }
    }

    /// In-place broadcast from `root`: the root's `recvbuff` is sent, every other rank's
    /// overwritten (the in-place AllGatherV of [`Comm::broadcast`]: the root's contribution
    /// already at offset 0 of its buffer).
    pub fn broadcast_in_place<R: DevicePtrMut<T>, T: NcclType>(
        &self,
        recvbuff: &mut R,
        root: i32,
    ) -> Result<Status, Error> {
        let root = self.check_peer(root)?;
        let counts = broadcast_counts(self.world, root, recvbuff.len());
        let spec = CollectiveSpec::all_gather_v(self.world as u32, snac_dtype::<T>(), counts);
        self.collective_in_place(spec, recvbuff)
    }

    /// AllGather: `recvbuff` holds `world` × `sendbuff.len()` elements, rank `r`'s
    /// contribution at `r × sendbuff.len()`.
    pub fn all_gather<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        sendbuff: &S,
        recvbuff: &mut R,
    ) -> Result<Status, Error> {
        let spec = CollectiveSpec::all_gather(self.world as u32, snac_dtype::<T>(), sendbuff.len() as u64);
        self.collective(spec, sendbuff, recvbuff)
    }

    /// AllReduce: `recvbuff` (same length as `sendbuff`) receives the reduction over ranks.
    pub fn all_reduce<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        sendbuff: &S,
        recvbuff: &mut R,
        reduce_op: &ReduceOp,
    ) -> Result<Status, Error> {
        let spec =
            CollectiveSpec::all_reduce(self.world as u32, snac_dtype::<T>(), snac_op(reduce_op), sendbuff.len() as u64);
        self.collective(spec, sendbuff, recvbuff)
    }

    /// In-place AllReduce.
    pub fn all_reduce_in_place<R: DevicePtrMut<T>, T: NcclType>(
        &self,
        buff: &mut R,
        reduce_op: &ReduceOp,
    ) -> Result<Status, Error> {
        let spec =
            CollectiveSpec::all_reduce(self.world as u32, snac_dtype::<T>(), snac_op(reduce_op), buff.len() as u64);
        self.collective_in_place(spec, buff)
    }

    /// In-place AllGather (NCCL's convention, `sendbuff == recvbuff + rank * count`): `buff`
    /// holds `world` partitions of `buff.len() / world` elements, this rank's contribution
    /// already in partition `rank`; the call fills the others.
    pub fn all_gather_in_place<R: DevicePtrMut<T>, T: NcclType>(&self, buff: &mut R) -> Result<Status, Error> {
        let count = whole_partitions(buff.len(), self.world, "all_gather_in_place")?;
        let spec = CollectiveSpec::all_gather(self.world as u32, snac_dtype::<T>(), count);
        self.collective_in_place(spec, buff)
    }

    /// In-place ReduceScatter (NCCL's convention, `recvbuff == sendbuff + rank * count`):
    /// `buff` holds `world` partitions of `buff.len() / world` elements; partition `rank`
    /// receives the reduction over ranks of their partition `rank`, and the other partitions
    /// are left as they were.
    pub fn reduce_scatter_in_place<R: DevicePtrMut<T>, T: NcclType>(
        &self,
        buff: &mut R,
        reduce_op: &ReduceOp,
    ) -> Result<Status, Error> {
        let count = whole_partitions(buff.len(), self.world, "reduce_scatter_in_place")?;
        let spec = CollectiveSpec::reduce_scatter(self.world as u32, snac_dtype::<T>(), snac_op(reduce_op), count);
        self.collective_in_place(spec, buff)
    }

    /// AllToAll: `sendbuff` holds `world` partitions of `sendbuff.len() / world` elements,
    /// partition `p` for rank `p`; `recvbuff` receives, at partition `p`, what rank `p` sent
    /// to this rank.
    pub fn all_to_all<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        sendbuff: &S,
        recvbuff: &mut R,
    ) -> Result<Status, Error> {
        let per_pair = (sendbuff.len() / self.world) as u64;
        if sendbuff.len() % self.world != 0 {
            return Err(Error::InvalidArgument(format!(
                "all_to_all: {} send elements are not {} equal partitions",
                sendbuff.len(),
                self.world
            )));
        }
        let spec = CollectiveSpec::all_to_all(self.world as u32, snac_dtype::<T>(), per_pair);
        self.collective(spec, sendbuff, recvbuff)
    }

    /// AllGatherV: rank `r` contributes `counts[r]` elements; `recvbuff` holds their
    /// concatenation in rank order.
    pub fn all_gather_v<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        sendbuff: &S,
        recvbuff: &mut R,
        counts: &[usize],
    ) -> Result<Status, Error> {
        let counts = counts.iter().map(|&c| c as u64).collect();
        let spec = CollectiveSpec::all_gather_v(self.world as u32, snac_dtype::<T>(), counts);
        self.collective(spec, sendbuff, recvbuff)
    }

    /// ReduceScatterV: `sendbuff` is cut into partitions of `counts[p]` elements; rank `r`
    /// receives the reduction of partition `r` over ranks.
    pub fn reduce_scatter_v<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        sendbuff: &S,
        recvbuff: &mut R,
        counts: &[usize],
        reduce_op: &ReduceOp,
    ) -> Result<Status, Error> {
        let counts = counts.iter().map(|&c| c as u64).collect();
        let spec = CollectiveSpec::reduce_scatter_v(self.world as u32, snac_dtype::<T>(), snac_op(reduce_op), counts);
        self.collective(spec, sendbuff, recvbuff)
    }

    /// AllToAllV: `counts[s][d]` elements go from rank `s` to rank `d` (every rank passes the
    /// whole matrix); send partitions in destination order, receive partitions in source order.
    pub fn all_to_all_v<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        sendbuff: &S,
        recvbuff: &mut R,
        counts: &[Vec<usize>],
    ) -> Result<Status, Error> {
        let counts = counts.iter().map(|row| row.iter().map(|&c| c as u64).collect()).collect();
        let spec = CollectiveSpec::all_to_all_v(self.world as u32, snac_dtype::<T>(), counts);
        self.collective(spec, sendbuff, recvbuff)
    }

    /// Checks a buffer lives on this communicator's GPU.
    pub(crate) fn check_device<B: cudarc::driver::DeviceSlice<T>, T>(&self, b: &B) -> Result<(), Error> {
        let ordinal = b.stream().context().ordinal();
        if ordinal != self.ordinal() {
            return Err(Error::InvalidArgument(format!(
                "a buffer on GPU {ordinal} passed to rank {} on GPU {}",
                self.rank,
                self.ordinal()
            )));
        }
        Ok(())
    }

    /// An out-of-place collective: checks, then one kernel on this rank's stream.
    fn collective<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        spec: CollectiveSpec,
        sendbuff: &S,
        recvbuff: &mut R,
    ) -> Result<Status, Error> {
        spec.validate()?;
        spec.check_buffers(self.rank as u32, sendbuff.len() as u64, recvbuff.len() as u64)?;
        self.check_device(sendbuff)?;
        self.check_device(recvbuff)?;
        let (input, _record_in) = sendbuff.device_ptr(&self.stream);
        let (output, _record_out) = recvbuff.device_ptr_mut(&self.stream);
        self.collective_at(spec, input, output)
    }

    /// An out-of-place call on device pointers the caller checked against `spec` (0 for a
    /// side of no bytes, which no plan touches and no symmetric buffer matches) and keeps
    /// alive and ordered on this stream until the launch is enqueued.
    fn collective_at(&self, spec: CollectiveSpec, input: u64, output: u64) -> Result<Status, Error> {
        let peers = self.peer_buffers(&spec, false, input, output)?;
        let prepared = self.prepared(spec, false, peers.flags())?;
        self.launch_prepared(&prepared, input, output, &peers)
    }

    /// Which of a call's buffers are symmetric (the one-copy path), with every rank's as
    /// mapped here: out of place, `input` and `output` each; in place, the one buffer at
    /// `output`, which holds every rank's input and output at the offsets of NCCL's convention.
    /// Every call asks, so a communicator without symmetric buffers answers after one lock.
    pub(crate) fn peer_buffers(
        &self,
        spec: &CollectiveSpec,
        in_place: bool,
        input: u64,
        output: u64,
    ) -> Result<PeerBuffers, Error> {
        let records = self.symmetric.lock().unwrap_or_else(|e| e.into_inner());
        if records.is_empty() {
            return Ok(PeerBuffers::default());
        }
        // Every rank's base of the symmetric buffer at `ptr`, each of which must hold
        // `need(rank)` bytes (peers access every rank's), shifted by `shift(rank)`.
        let at = |ptr: u64, need: &dyn Fn(u32) -> u64, shift: &dyn Fn(u32) -> u64, what: &str| {
            let Some(m) = records.iter().map(|r| &r.mem).find(|m| m.addrs[self.rank] == ptr) else { return Ok(None) };
            if let Some(q) = (0..self.world as u32).find(|&q| need(q) > m.bytes as u64) {
                return Err(Error::InvalidArgument(format!(
                    "a symmetric buffer of {} bytes as the {what}: rank {q}'s needs {} bytes, and peers access every \
                     rank's buffer",
                    m.bytes,
                    need(q)
                )));
            }
            let mut bases = [0; crate::exec_device::MAX_WORLD];
            for (q, (b, a)) in bases.iter_mut().zip(&m.addrs).enumerate() {
                *b = a + shift(q as u32);
            }
            Ok(Some(bases))
        };
        if !in_place {
            return Ok(PeerBuffers {
                inputs: at(input, &|q| spec.input_bytes(q), &|_| 0, "input")?,
                outputs: at(output, &|q| spec.output_bytes(q), &|_| 0, "output")?,
            });
        }
        let layout = |q: u32| crate::symmetric::in_place_layout(spec, q);
        Ok(PeerBuffers {
            inputs: at(output, &|q| layout(q).2, &|q| layout(q).0, "buffer")?,
            outputs: at(output, &|q| layout(q).2, &|q| layout(q).1, "buffer")?,
        })
    }

    /// Allocates `len` elements of `T` on every rank at once (a collective call: every rank
    /// calls it, in the same order, with the same `len`) and maps every peer's, like NCCL's
    /// `ncclMemAlloc` + `ncclCommWindowRegister`. Collectives on such buffers take the
    /// one-copy path ([`crate::symmetric`]). The memory is zeroed, and released with the
    /// communicator (unless a buffer is still held then).
    pub fn alloc_symmetric<T: NcclType>(&self, len: usize) -> Result<SymmetricBuffer<T>, Error> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).filter(|&b| b > 0).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "a symmetric buffer of {len} elements of {} bytes",
                std::mem::size_of::<T>()
            ))
        })?;
        let mut backend = IpcBackend::new(self.context().clone());
        let alloc = SymmetricAlloc::establish(&self.host, &mut backend, bytes, "symmetric buffer")?;
        let mem = Arc::new(SymmetricMem { bytes, addrs: alloc.addrs().to_vec(), rank: self.rank });
        let alloc = match &self.owner {
            Owner::Group(group) => {
                group.symmetric.lock().unwrap_or_else(|e| e.into_inner()).push((alloc, backend, mem.clone()));
                None
            }
            _ => Some((alloc, backend)),
        };
        self.symmetric.lock().unwrap_or_else(|e| e.into_inner()).push(SymmetricRecord { mem: mem.clone(), alloc });
        Ok(SymmetricBuffer::new(mem, self.stream.clone(), len))
    }

    /// Frees a symmetric buffer on every rank at once, like NCCL's `ncclCommWindowDeregister`
    /// followed by `ncclMemFree`: a collective call (every rank calls it, in the same order,
    /// with its handle of the same allocation). It waits for this rank's work on the
    /// communicator's stream and meets the peers, so no rank's collective still reads or
    /// writes the memory when it is freed. Work on other streams is the caller's to finish
    /// first, and a CUDA graph that captured calls on the buffer must not be launched again.
    ///
    /// Refused on every rank, freeing nothing, where a rank's buffer is not one of this
    /// communicator's, is not the allocation its peers free, or is still shown by another
    /// handle there ([`SymmetricBuffer::view_as`]); the memory then stays with the
    /// communicator until its teardown, and the other handles keep working.
    pub fn free_symmetric<T: NcclType>(&self, buffer: SymmetricBuffer<T>) -> Result<(), Error> {
        const DURING: &str = "freeing a symmetric buffer";
        let mem = buffer.mem().clone();
        drop(buffer);
        // This rank's records and, in a single-process group, the group's list hold it too.
        let bookkeeping = 2 + usize::from(matches!(self.owner, Owner::Group(_)));
        let index = {
            let records = self.symmetric.lock().unwrap_or_else(|e| e.into_inner());
            records.iter().position(|r| Arc::ptr_eq(&r.mem, &mem))
        };
        let mine = match index {
            None => Err(Error::InvalidArgument("not a symmetric buffer of this communicator".into())),
            Some(_) if Arc::strong_count(&mem) > bookkeeping => Err(Error::InvalidArgument(format!(
                "{} other handles still show this symmetric buffer",
                Arc::strong_count(&mem) - bookkeeping
            ))),
            Some(i) => Ok(i),
        };
        // Allocations are listed in the same order on every rank: the same index is the same
        // allocation.
        let wire = index.map_or(u64::MAX, |i| i as u64).to_le_bytes();
        let indices = self.host.all_gather(&wire, &format!("{DURING}: which one"))?;
        let mine = mine.and_then(|i| match indices.iter().position(|w| *w != wire) {
            Some(peer) => Err(Error::Mismatch {
                rank: self.rank,
                peer,
                what: format!("which symmetric buffer to free (this rank: allocation {i})"),
            }),
            None => Ok(i),
        });
        let index = agree(&self.host, mine, DURING)?;
        let record = self.symmetric.lock().unwrap_or_else(|e| e.into_inner()).remove(index);
        drop(mem);
        // Every rank's kernels on it end before any rank frees it: each waits for its own,
        // then meets the others.
        let synced = self.stream.synchronize().map_err(driver("cuStreamSynchronize"));
        match (&self.owner, record.alloc) {
            (_, Some((alloc, mut backend))) => {
                if let Err(e) = synced {
                    alloc.abandon(&mut backend);
                    return Err(e);
                }
                let (_, error) = alloc.meet_and_free(&self.host, &mut backend, false, DURING);
                error.map_or(Ok(()), Err)
            }
            (Owner::Group(group), None) => {
                // Left in the group's list on failure: the group frees it once every GPU of
                // the group is synchronised.
                synced?;
                self.host.barrier(&format!("{DURING}: device work done"))?;
                let mut list = group.symmetric.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(at) = list.iter().position(|(_, _, m)| Arc::ptr_eq(m, &record.mem)) {
                    let (alloc, mut backend, _) = list.remove(at);
                    drop(list);
                    alloc.discard_now(&mut backend, false);
                }
                Ok(())
            }
            // Only a group's communicators leave the allocation to their owner.
            (_, None) => Ok(()),
        }
    }

    /// [`Comm::free_symmetric`] on every communicator of a single-process group at once (one
    /// thread per rank): `buffers[r]` is rank `r`'s handle.
    pub fn free_symmetric_group<T: NcclType>(comms: &[Comm], buffers: Vec<SymmetricBuffer<T>>) -> Result<(), Error> {
        if buffers.len() != comms.len() {
            return Err(Error::InvalidArgument(format!(
                "{} symmetric buffers for {} communicators",
                buffers.len(),
                comms.len()
            )));
        }
        std::thread::scope(|s| {
            let handles: Vec<_> =
                comms.iter().zip(buffers).map(|(c, b)| s.spawn(move || c.free_symmetric(b))).collect();
            handles.into_iter().try_for_each(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::Protocol { peer: None, what: "symmetric free thread panicked".into() })
                })
            })
        })
    }

    /// [`Comm::alloc_symmetric`] on every communicator of a single-process group at once
    /// (one thread per rank), for the communicators of [`Comm::from_devices`].
    pub fn alloc_symmetric_group<T: NcclType>(comms: &[Comm], len: usize) -> Result<Vec<SymmetricBuffer<T>>, Error> {
        std::thread::scope(|s| {
            let handles: Vec<_> = comms.iter().map(|c| s.spawn(move || c.alloc_symmetric::<T>(len))).collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::Protocol { peer: None, what: "symmetric allocation thread panicked".into() })
                    })
                })
                .collect()
        })
    }

    /// An in-place call on one buffer: the plan's alias says where in it the input or the
    /// output lies (AllReduce: both the whole buffer; AllGather: the input is this rank's
    /// partition; ReduceScatter: the output is).
    fn collective_in_place<R: DevicePtrMut<T>, T: NcclType>(
        &self,
        spec: CollectiveSpec,
        buff: &mut R,
    ) -> Result<Status, Error> {
        spec.validate()?;
        self.check_device(buff)?;
        let bytes = (buff.len() * std::mem::size_of::<T>()) as u64;
        let (ptr, _record) = buff.device_ptr_mut(&self.stream);
        let peers = self.peer_buffers(&spec, true, ptr, ptr)?;
        let prepared = self.prepared(spec, true, peers.flags())?;
        let res = prepared.plan.resources;
        let (input_at, output_at) = match res.alias {
            Some(purlin_snac::Alias::InputInOutput(o)) => (o, 0),
            Some(purlin_snac::Alias::OutputInInput(o)) => (0, o),
            None => (0, 0),
        };
        if input_at + res.input_bytes > bytes || output_at + res.output_bytes > bytes {
            return Err(Error::InvalidArgument(format!(
                "{:?} in place: a {bytes}-byte buffer does not hold the call's input ({} bytes at {input_at}) \
                 and output ({} bytes at {output_at})",
                prepared.plan.spec.collective, res.input_bytes, res.output_bytes
            )));
        }
        self.launch_prepared(&prepared, ptr + input_at, ptr + output_at, &peers)
    }

    /// The plan of a call, derived once per (spec, in place, which buffers are symmetric) and
    /// kept with its parameter block.
    pub(crate) fn prepared(
        &self,
        spec: CollectiveSpec,
        in_place: bool,
        (peer_inputs, peer_outputs): (bool, bool),
    ) -> Result<Arc<PreparedPlan>, Error> {
        let key = (spec, in_place, peer_inputs, peer_outputs);
        if let Some(p) = self.plans.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(p.clone());
        }
        let limits = PlanLimits::of_workspace(
            &self.layout.config,
            self.exec_bound.min(self.layout.config.epoch_words as u32),
            self.exec.packet(),
            peer_outputs,
            peer_inputs,
        );
        let fits = |p: &Plan| purlin_snac::params::encode(p).len() <= crate::kernels::EXEC_PARAM_WORDS;
        let (plan, cfg) = crate::tuning::plan_fitting(&key.0, self.rank as u32, in_place, &self.tuning, &limits, fits)?;
        if let Some(budget) = &self.verify {
            let budget =
                purlin_snac::verify::Options { max_coresident_blocks: Some(limits.max_coresident_blocks), ..*budget };
            crate::verification::verified(&key.0, &cfg, &budget)?.covers(&plan)?;
        }
        self.layout.check_resources(&plan.resources)?;
        self.exec.check_supported(&plan)?;
        let call_bytes = plan.spec.input_bytes(plan.rank).max(plan.spec.output_bytes(plan.rank));
        let params = self.exec.params(&plan, call_bytes <= self.tuning.device_params_max_bytes)?;
        let prepared = Arc::new(PreparedPlan { plan, params });
        self.plans.lock().unwrap_or_else(|e| e.into_inner()).insert(key, prepared.clone());
        Ok(prepared)
    }

    /// The call check's number for the next launch (`Runtime::call_number`): every rank
    /// counts its launches, so ranks that make the same calls number them alike; 0 (no
    /// check block) where the check is off.
    pub(crate) fn next_call_number(&self) -> u32 {
        if !self.call_check {
            return 0;
        }
        // 1..=u32::MAX, cycling: the remainder fits a u32, and the +1 keeps 0 for "off".
        let launched = self.calls_launched.fetch_add(1, Ordering::Relaxed);
        (launched % u64::from(u32::MAX)) as u32 + 1
    }

    /// The pointers of one call.
    pub(crate) fn runtime(&self, input: u64, output: u64) -> ExecRuntime {
        let mut rt = ExecRuntime {
            input,
            output,
            counters: self.addrs[self.rank] + self.layout.counters.offset as u64,
            epochs: self.addrs[self.rank] + self.layout.epochs.offset as u64,
            control: self.addrs[self.rank] + self.layout.control.offset as u64,
            timeout_ns: u64::try_from(self.device_timeout.as_nanos()).unwrap_or(u64::MAX),
            ..ExecRuntime::default()
        };
        for (r, base) in self.addrs.iter().enumerate() {
            rt.staging[r] = base + self.layout.staging.offset as u64;
            rt.window[r] = base + self.layout.window.offset as u64;
            rt.flags[r] = base + self.layout.flags.offset as u64;
        }
        rt
    }

    /// Launches a prepared plan on `input` and `output`, device pointers of this GPU that the
    /// caller checked hold the plan's input and output bytes; `peers`: every rank's
    /// symmetric input and output as mapped here, for one-copy plans.
    fn launch_prepared(
        &self,
        prepared: &PreparedPlan,
        input: u64,
        output: u64,
        peers: &PeerBuffers,
    ) -> Result<Status, Error> {
        if let Some(why) = self.poison.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Err(Error::Poisoned(why));
        }
        let mut rt = self.runtime(input, output);
        peers.fill(&mut rt);
        if prepared.plan.grid() > 0 {
            rt.call_number = self.next_call_number(); // an empty call launches nothing, on every rank
        }
        // SAFETY: `input`/`output` come from cudarc buffers on this GPU whose lengths the spec
        // checked (in place: one buffer that holds the plan's input and output at their alias
        // offsets, checked by `collective_in_place`; 0 for a side of no bytes, which no step
        // touches), kept alive by the caller's borrow until the launch
        // is enqueued and ordered by cudarc's stream events; the workspace addresses are
        // every rank's live workspace, mapped here until teardown, which synchronises first;
        // peer inputs and outputs are symmetric allocations of this communicator, mapped here
        // until teardown, each holding what the spec has every rank read or write there
        // (`peer_buffers`), accessed by the plan only between the peer's entry and exit.
        unsafe { self.exec.launch(&self.stream, &prepared.plan, &prepared.params, &rt) }?;
        Ok(Status::Success)
    }

    /// Reduce to `root` (cudarc's `reduce`): the root's `recvbuff` receives the reduction
    /// over ranks of `sendbuff` (the same length); `recvbuff` is written on the root only, as
    /// NCCL's. It runs as the ReduceScatterV in which only the root receives (counts 0
    /// elsewhere): one kernel (from symmetric inputs with one copy), every
    /// rank's input into the root's links, as [`Comm::broadcast`] out of them.
    pub fn reduce<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        sendbuff: &S,
        recvbuff: Option<&mut R>,
        reduce_op: &ReduceOp,
        root: i32,
    ) -> Result<Status, Error> {
        let root = self.check_peer(root)?;
        let counts = broadcast_counts(self.world, root, sendbuff.len());
        let spec = CollectiveSpec::reduce_scatter_v(self.world as u32, snac_dtype::<T>(), snac_op(reduce_op), counts);
        match recvbuff {
            Some(recv) if root == self.rank => self.collective(spec, sendbuff, recv),
            None if root == self.rank => {
                Err(Error::InvalidArgument("reduce: the root must pass a receive buffer".into()))
            }
            // A peer receives nothing: an empty output, never written.
            _ => {
                spec.validate()?;
                spec.check_buffers(self.rank as u32, sendbuff.len() as u64, 0)?;
                self.check_device(sendbuff)?;
                let (input, _record_in) = sendbuff.device_ptr(&self.stream);
                self.collective_at(spec, input, 0)
            }
        }
    }

    /// In-place Reduce to `root`: the result lands in the root's `recvbuff`; the other ranks'
    /// are read and left as they were (the in-place ReduceScatterV of [`Comm::reduce`]).
    pub fn reduce_in_place<R: DevicePtrMut<T>, T: NcclType>(
        &self,
        recvbuff: &mut R,
        reduce_op: &ReduceOp,
        root: i32,
    ) -> Result<Status, Error> {
        let root = self.check_peer(root)?;
        let counts = broadcast_counts(self.world, root, recvbuff.len());
        let spec = CollectiveSpec::reduce_scatter_v(self.world as u32, snac_dtype::<T>(), snac_op(reduce_op), counts);
        self.collective_in_place(spec, recvbuff)
    }

    /// ReduceScatter: `sendbuff` holds `world` × `recvbuff.len()` elements.
    pub fn reduce_scatter<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        sendbuff: &S,
        recvbuff: &mut R,
        reduce_op: &ReduceOp,
    ) -> Result<Status, Error> {
        let spec = CollectiveSpec::reduce_scatter(
            self.world as u32,
            snac_dtype::<T>(),
            snac_op(reduce_op),
            recvbuff.len() as u64,
        );
        self.collective(spec, sendbuff, recvbuff)
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

/// A plan ready to launch: the plan and its parameter block.
#[derive(Debug)]
pub(crate) struct PreparedPlan {
    pub(crate) plan: Plan,
    params: ExecParams,
}

/// What a prepared plan depends on besides the communicator: the spec, in-place-ness, and
/// whether the input and the output are symmetric buffers.
type PlanKey = (CollectiveSpec, bool, bool, bool);

/// Every rank's input and output as mapped here, where a call's are symmetric buffers.
#[derive(Debug, Default)]
pub(crate) struct PeerBuffers {
    pub(crate) inputs: Option<[u64; crate::exec_device::MAX_WORLD]>,
    pub(crate) outputs: Option<[u64; crate::exec_device::MAX_WORLD]>,
}

impl PeerBuffers {
    /// (inputs symmetric, outputs symmetric).
    pub(crate) fn flags(&self) -> (bool, bool) {
        (self.inputs.is_some(), self.outputs.is_some())
    }

    /// Puts every rank's symmetric input and output, where there are some, into a call's
    /// runtime pointers (one-copy plans read them; other plans never do).
    pub(crate) fn fill(&self, rt: &mut crate::exec_device::ExecRuntime) {
        if let Some(p) = self.outputs {
            rt.peer_output = p;
        }
        if let Some(p) = self.inputs {
            rt.peer_input = p;
        }
    }
}

/// The per-rank counts that make a Broadcast from (or a Reduce to) `root` of `len` elements
/// the AllGatherV (ReduceScatterV) in which only the root contributes (receives): `len` at
/// the root, 0 elsewhere. The root's part is then at offset 0 of every buffer, which is where
/// the in-place forms keep it.
pub(crate) fn broadcast_counts(world: usize, root: usize, len: usize) -> Vec<u64> {
    (0..world).map(|q| if q == root { len as u64 } else { 0 }).collect()
}

/// One side of a point-to-point call: the peer and the bytes that move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Transfer {
    pub(crate) peer: usize,
    pub(crate) bytes: u64,
}

/// Bytes of `len` elements of `T`.
pub(crate) fn byte_len<T>(len: usize) -> u64 {
    (len as u64).saturating_mul(std::mem::size_of::<T>() as u64)
}

/// The collective a world-2 send and/or receive of `rank` is: the AllToAllV of bytes whose
/// only nonzero counts are `send.bytes` from `rank` to its peer and `recv.bytes` back. Both
/// ranks derive the same matrix from their own calls when their sizes match (a send of `n`
/// bytes there is a receive of `n` here). Bytes, not elements, so a group may send one type
/// and receive another; a copy's plan does not depend on the element type.
pub(crate) fn point_to_point_spec(
    world: usize,
    rank: usize,
    send: Option<Transfer>,
    recv: Option<Transfer>,
) -> Result<CollectiveSpec, Error> {
    if world != 2 {
        return Err(Error::Unsupported(format!(
            "send/recv in a world of {world}: Purlin runs collectives of every rank, and only at world 2 is a pair \
             of ranks every rank (use all_to_all_v, whose count matrix every rank passes)"
        )));
    }
    let mut counts = vec![vec![0u64; world]; world];
    for (side, sends) in [(send, true), (recv, false)] {
        let Some(Transfer { peer, bytes }) = side else { continue };
        let what = if sends { "send to" } else { "receive from" };
        if peer == rank {
            return Err(Error::InvalidArgument(format!(
                "rank {rank}: a {what} itself (copy the buffer on the stream instead)"
            )));
        }
        if peer >= world {
            return Err(Error::InvalidArgument(format!("rank {peer} is not in a world of {world}")));
        }
        if sends { counts[rank][peer] = bytes } else { counts[peer][rank] = bytes }
    }
    Ok(CollectiveSpec::all_to_all_v(world as u32, purlin_snac::DataType::U8, counts))
}

/// Elements per partition of a `len`-element buffer split among `world` ranks, or an
/// `InvalidArgument` naming `what`.
pub(crate) fn whole_partitions(len: usize, world: usize, what: &str) -> Result<u64, Error> {
    if len % world != 0 {
        return Err(Error::InvalidArgument(format!("{what}: {len} elements do not split into {world} partitions")));
    }
    Ok((len / world) as u64)
}

/// A launched ping-pong (see [`Comm::launch_ping_pong`]).
#[derive(Debug)]
pub struct PingPongLaunch<'a> {
    comm: &'a Comm,
    peer: usize,
    rounds: u32,
    timeout: Duration,
    initiator: bool,
    result: CudaSlice<u64>,
    started: Instant,
}

impl PingPongLaunch<'_> {
    /// Waits for the kernel (bounded by its device timeout) and checks that every round
    /// completed; otherwise poisons the communicator and returns [`Error::DeviceTimeout`]
    /// naming the peer.
    pub fn wait(self) -> Result<PingPong, Error> {
        let c = self.comm;
        let r = c.stream.clone_dtoh(&self.result).map_err(driver("cuMemcpyDtoH"))?;
        let (done, ns) = (r.first().copied().unwrap_or(0), r.get(1).copied().unwrap_or(0));
        if done < u64::from(self.rounds) {
            let during =
                format!("flag ping-pong: {done} of {} rounds, after {:?}", self.rounds, self.started.elapsed());
            c.poison_with(self.peer, format!("rank {}: device wait for rank {} expired ({during})", c.rank, self.peer));
            return Err(Error::DeviceTimeout { rank: c.rank, peer: self.peer, waited: self.timeout, during });
        }
        let round_trip_us = if self.initiator && done > 0 { ns as f64 / done as f64 / 1e3 } else { 0.0 };
        Ok(PingPong { rounds: done, round_trip_us, initiator: self.initiator })
    }
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

    #[test]
    fn a_pair_is_one_all_to_all_v_of_bytes_and_a_wider_world_is_refused() {
        let t = |peer, bytes| Some(Transfer { peer, bytes });
        let spec = point_to_point_spec(2, 0, t(1, 12), t(1, 5)).unwrap();
        let sender = point_to_point_spec(2, 1, t(0, 5), None).unwrap();
        let receiver = point_to_point_spec(2, 1, None, t(0, 12)).unwrap();
        // Rank 0's exchange: 12 bytes to rank 1, 5 back; each side of it seen from rank 1.
        assert_eq!(spec, CollectiveSpec::all_to_all_v(2, purlin_snac::DataType::U8, vec![vec![0, 12], vec![5, 0]]));
        assert_eq!(sender, CollectiveSpec::all_to_all_v(2, purlin_snac::DataType::U8, vec![vec![0, 0], vec![5, 0]]));
        assert_eq!(receiver, CollectiveSpec::all_to_all_v(2, purlin_snac::DataType::U8, vec![vec![0, 12], vec![0, 0]]));
        assert!(matches!(point_to_point_spec(3, 0, t(1, 4), None), Err(Error::Unsupported(_))));
        assert!(matches!(point_to_point_spec(2, 1, t(1, 4), None), Err(Error::InvalidArgument(_))));
        assert!(matches!(point_to_point_spec(2, 0, None, t(2, 4)), Err(Error::InvalidArgument(_))));
    }
}
