//! [`Comm`]'s diagnostics, kept off its public surface: [`Comm::diag`] returns a [`Diag`]
//! that reads the workspace, the loaded kernels and the co-residency bounds, and runs the
//! flag ping-pong (the examples, the GPU tests and the benchmark's probes use them).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaModule, CudaSlice, LaunchConfig, PushKernelArg, sys};
use purlin_topo::GenerationHint;

use super::{Comm, LoadedKernel};
use crate::bootstrap::HostComm;
use crate::error::{Error, driver};
use crate::workspace::{FLAG_SLOTS, WorkspaceLayout};

impl Comm {
    /// This communicator's diagnostics (not part of the stable API).
    #[doc(hidden)]
    pub fn diag(&self) -> Diag<'_> {
        Diag { comm: self }
    }
}

/// A communicator's diagnostics: see [`Comm::diag`].
#[derive(Debug, Clone, Copy)]
pub struct Diag<'a> {
    comm: &'a Comm,
}

impl<'a> Diag<'a> {
    /// The Atom generation every rank's GPU calls for (one kernel key per communicator).
    pub fn generation(&self) -> GenerationHint {
        self.comm.generation
    }

    /// The host communicator of this rank (barriers and small exchanges, bounded waits).
    pub fn host(&self) -> &'a HostComm {
        &self.comm.host
    }

    /// The workspace layout (identical on every rank).
    pub fn workspace_layout(&self) -> &'a WorkspaceLayout {
        &self.comm.layout
    }

    /// Every rank's workspace base as a device address usable by this rank's kernels.
    pub fn workspace_addrs(&self) -> &'a [u64] {
        &self.comm.addrs
    }

    /// The kernels loaded at set-up ([`CommConfig::kernels`]), in request order.
    pub fn kernels(&self) -> &'a [LoadedKernel] {
        &self.comm.kernels
    }

    /// The loaded kernel whose function is `function`.
    pub fn kernel(&self, function: &str) -> Option<&'a LoadedKernel> {
        self.comm.kernels.iter().find(|k| k.request.function == function)
    }

    /// Copies `bytes` bytes at `offset` of this rank's own workspace to the host (debugging
    /// and tests; synchronous).
    pub fn read_own_workspace(&self, offset: usize, bytes: usize) -> Result<Vec<u8>, Error> {
        let end = offset.checked_add(bytes).filter(|&e| e <= self.comm.layout.total_bytes);
        if end.is_none() {
            return Err(Error::InvalidArgument(format!(
                "workspace bytes {offset}..+{bytes} outside its {} bytes",
                self.comm.layout.total_bytes
            )));
        }
        let mut out = vec![0u8; bytes];
        self.comm.context().bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        // SAFETY: the source range lies inside this rank's own live workspace (checked
        // above) and the destination is a host buffer of exactly `bytes` bytes.
        unsafe {
            sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), self.comm.addrs[self.comm.rank] + offset as u64, bytes)
        }
        .result()
        .map_err(driver("cuMemcpyDtoH"))?;
        Ok(out)
    }

    /// The co-residency bounds agreed at set-up.
    pub fn coresidency(&self) -> CoResidency {
        self.comm.coresidency
    }

    /// The kernel module loaded at set-up.
    pub fn module(&self) -> &'a Arc<CudaModule> {
        &self.comm.module
    }

    /// Launches a flag ping-pong with `peer` through the workspace (the lower rank
    /// initiates), every device wait bounded by `timeout`; [`PingPongLaunch::wait`] collects
    /// it. Both ranks must call it, the same number of times per pair (each call takes a
    /// fresh flag slot; at most 16 per pair and communicator). Split in two so one thread
    /// can drive several GPUs ([`Comm::from_devices`]).
    pub fn launch_ping_pong(&self, peer: usize, rounds: u32, timeout: Duration) -> Result<PingPongLaunch<'a>, Error> {
        if peer >= self.comm.world || peer == self.comm.rank {
            return Err(Error::InvalidArgument(format!(
                "ping-pong peer {peer} (rank {}, world {})",
                self.comm.rank, self.comm.world
            )));
        }
        if rounds == 0 {
            return Err(Error::InvalidArgument("ping-pong needs at least one round".into()));
        }
        if let Some(why) = self.comm.poison.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Err(Error::Poisoned(why));
        }
        let slot = {
            let mut slots = self.comm.next_flag_slot.lock().unwrap_or_else(|e| e.into_inner());
            let s = slots[peer];
            if s >= FLAG_SLOTS {
                return Err(Error::Unsupported(format!("more than {FLAG_SLOTS} ping-pongs with one peer")));
            }
            slots[peer] += 1;
            s
        };
        let initiator = self.comm.rank < peer;
        // My flag is written by the peer into my workspace; the peer's flag is in its own.
        let my_flag = self.comm.addrs[self.comm.rank] + self.comm.layout.flag_offset(peer, slot) as u64;
        let peer_flag = self.comm.addrs[peer] + self.comm.layout.flag_offset(self.comm.rank, slot) as u64;
        let mut result = self.comm.stream.alloc_zeros::<u64>(2).map_err(driver("cuMemAllocAsync"))?;
        let timeout_ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        let init = u32::from(initiator);
        let mut launch = self.comm.stream.launch_builder(&self.comm.pingpong);
        launch.arg(&my_flag).arg(&peer_flag).arg(&rounds).arg(&init).arg(&timeout_ns).arg(&mut result);
        let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the kernel's signature is (u64*, u64*, u32, u32, u64, u64*); `my_flag` is in
        // this rank's live workspace, `peer_flag` in the peer's, mapped here (IPC or peer
        // access) until teardown, which synchronises this stream first; the kernel writes the
        // peer's flag only after a successful wait, so once the peer stops answering it stops
        // touching its memory; every wait is bounded by `timeout_ns`; `result` holds 2 words.
        unsafe { launch.launch(one) }.map_err(driver("cuLaunchKernel"))?;
        Ok(PingPongLaunch { comm: self.comm, peer, rounds, timeout, initiator, result, started: Instant::now() })
    }

    /// [`Diag::launch_ping_pong`] and [`PingPongLaunch::wait`].
    pub fn ping_pong(&self, peer: usize, rounds: u32, timeout: Duration) -> Result<PingPong, Error> {
        self.launch_ping_pong(peer, rounds, timeout)?.wait()
    }
}

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

/// A launched ping-pong (see [`Diag::launch_ping_pong`]).
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
