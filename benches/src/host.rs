//! Without a GPU: Purlin's host executor as the benchmark's backend.
//!
//! `purlin_collectives::CpuComm` runs every collective on CPU threads of this process, one
//! communicator per rank (and one OS thread per block of a call), through the same SNAC plans
//! the GPUs run, verified before they run. The sweep is the GPU path's ([`run::run_backends`]):
//! every result is checked against the reference [`purlin_testkit::Case::expected`] computes
//! from the inputs alone (`#wrong`), timed the same way, reported the same way. Host memory
//! stands in for device memory ([`HostDevice`]); graph mode needs a GPU and says so.
//!
//! NCCL needs GPUs, so there are no NCCL columns; the table and files say why.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use purlin_collectives::internal::Call;
use purlin_collectives::snac::{CollectiveSpec, DataType};
use purlin_collectives::{CpuComm, CpuConfig, CpuSymmetricBuffer};

use crate::backend::{Backend, BackendKind, CallError, Status};
use crate::coord::{Coord, Region};
use crate::gpu::HostDevice;
use crate::run::{self, Config, Outcome};
use crate::spec::{Case, Collective, Dtype};

/// The host executor's ranks unless `--world` is given.
pub const DEFAULT_WORLD: usize = 2;

/// The host communicators' settings: `CpuConfig::from_env` (the `PURLIN_*` tuning and
/// verifier variables), every wait bounded by `--timeout`, and `--blocks` as the blocks per
/// role where given (it wins over `PURLIN_BLOCKS_PER_ROLE`).
pub fn cpu_config(cfg: &Config) -> Result<CpuConfig> {
    let mut c = CpuConfig::from_env().map_err(|e| anyhow!("purlin host configuration: {e}"))?;
    c.timeout = cfg.timeout();
    if let Some(b) = cfg.blocks {
        c.tuning.blocks_per_role = u32::try_from(b).map_err(|_| anyhow!("--blocks {b} is too large"))?;
    }
    Ok(c)
}

/// A host buffer handed out by address (the sweep writes and reads it through
/// [`HostDevice`]); 8-byte aligned, so any element type's slice of it is aligned.
struct HostBuffer {
    ptr: *mut u64,
    words: usize,
}

impl HostBuffer {
    fn new(bytes: usize) -> HostBuffer {
        let words = bytes.max(256).div_ceil(8);
        let boxed: Box<[u64]> = vec![0u64; words].into_boxed_slice();
        HostBuffer { ptr: Box::into_raw(boxed).cast::<u64>(), words }
    }

    fn addr(&self) -> u64 {
        self.ptr as u64
    }

    fn len(&self) -> usize {
        self.words * 8
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `words` came from `Box::into_raw` of a `Box<[u64]>` of `words`
        // elements in `new`, and this is the only place it is turned back into a box.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.words)) });
    }
}

/// One rank's host-executor backend (reported as `purlin`).
pub struct HostPurlin {
    comm: CpuComm,
    send: HostBuffer,
    recv: HostBuffer,
    /// With `--symmetric`: the send and receive buffers are symmetric memory instead
    /// (`CpuComm::alloc_symmetric`), so calls that would be staged take the one-copy path.
    symmetric: Option<(CpuSymmetricBuffer<u8>, CpuSymmetricBuffer<u8>)>,
}

impl std::fmt::Debug for HostPurlin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostPurlin").field("comm", &self.comm).finish_non_exhaustive()
    }
}

impl HostPurlin {
    /// Wraps a rank's communicator with buffers for the sweep's largest case; `symmetric`:
    /// symmetric ones (a collective call: every rank makes its backend at the same point).
    pub fn new(comm: CpuComm, send_bytes: usize, recv_bytes: usize, symmetric: bool) -> Result<HostPurlin> {
        let symmetric = if symmetric {
            let alloc = |bytes: usize| {
                comm.alloc_symmetric::<u8>(bytes.max(256)).map_err(|e| anyhow!("CpuComm::alloc_symmetric: {e}"))
            };
            Some((alloc(send_bytes)?, alloc(recv_bytes)?))
        } else {
            None
        };
        // With symmetric buffers the plain ones are never used.
        let plain = |bytes: usize| if symmetric.is_some() { 0 } else { bytes };
        Ok(HostPurlin {
            send: HostBuffer::new(plain(send_bytes)),
            recv: HostBuffer::new(plain(recv_bytes)),
            symmetric,
            comm,
        })
    }

    /// The communicator.
    pub fn comm(&self) -> &CpuComm {
        &self.comm
    }
}

/// SNAC's element type of a benchmark dtype.
pub fn data_type(d: Dtype) -> DataType {
    match d {
        Dtype::F32 => DataType::F32,
        Dtype::F16 => DataType::F16,
        Dtype::Bf16 => DataType::Bf16,
        Dtype::F64 => DataType::F64,
        Dtype::I8 => DataType::I8,
        Dtype::U8 => DataType::U8,
        Dtype::I32 => DataType::I32,
        Dtype::U32 => DataType::U32,
        Dtype::I64 => DataType::I64,
        Dtype::U64 => DataType::U64,
        Dtype::F8E4M3 => DataType::F8E4M3,
        Dtype::F8E5M2 => DataType::F8E5M2,
    }
}

/// The collective spec of `case` (the same on every rank): the call `CpuComm`'s typed method
/// would make ([`Call`], the one mapping from a call to a spec), in the communicator's mode.
pub fn spec_of(case: &Case, comm: &CpuComm) -> Result<CollectiveSpec, purlin_collectives::Error> {
    let op = || crate::purlin::op(case.op);
    let u = |v: &[usize]| v.iter().map(|&c| c as u64).collect::<Vec<u64>>();
    let matrix = || case.matrix.iter().map(|r| u(r)).collect();
    // AllGather's contribution, ReduceScatter's partition: count / world.
    let per_rank = case.count / case.world.max(1);
    // Broadcast and Reduce: the root's part is the only nonzero one.
    let root = || case.parts().iter().position(|&n| n > 0).unwrap_or(0);
    let call = match case.collective {
        Collective::AllReduce => Call::AllReduce { len: case.count, op: op() },
        Collective::AllGather => Call::AllGather { len: per_rank },
        Collective::ReduceScatter => Call::ReduceScatter { len: per_rank, op: op() },
        // Every pair moves `count / world` elements (the case's matrix is uniform).
        Collective::AllToAll => Call::AllToAll { len: case.count },
        Collective::AllGatherV => Call::AllGatherV { counts: u(case.parts()) },
        Collective::ReduceScatterV => Call::ReduceScatterV { counts: u(case.parts()), op: op() },
        Collective::AllToAllV => Call::AllToAllV { counts: matrix() },
        Collective::Broadcast => Call::Broadcast { len: case.count, root: root() },
        Collective::Reduce => Call::Reduce { len: case.count, op: op(), root: root() },
        // The ring's AllToAllV; `enqueue` runs `CpuComm::send_recv`, which at world 2 is it.
        Collective::SendRecv => Call::AllToAllV { counts: matrix() },
    };
    Ok(call.spec(case.world, comm.rank(), data_type(case.dtype))?.with_mode(comm.config().mode))
}

impl Backend for HostPurlin {
    fn kind(&self) -> BackendKind {
        BackendKind::Purlin
    }

    fn send_ptr(&self) -> u64 {
        self.symmetric.as_ref().map_or_else(|| self.send.addr(), |(s, _)| s.as_ptr() as u64)
    }

    fn recv_ptr(&self) -> u64 {
        self.symmetric.as_ref().map_or_else(|| self.recv.addr(), |(_, r)| r.as_ptr() as u64)
    }

    /// Every case is tried; what the host executor cannot do (e.g. reductions of f64) comes
    /// back from the call as a typed error, before anything is touched, on every rank alike.
    fn supports(&self, _case: &Case) -> Result<(), CallError> {
        Ok(())
    }

    fn enqueue(&mut self, case: &Case) -> Result<(), CallError> {
        let r = self.comm.rank();
        let es = case.dtype.size();
        let (in_bytes, out_bytes) = (case.in_count(r) * es, case.out_count(r) * es);
        let (send_cap, recv_cap) =
            self.symmetric.as_ref().map_or((self.send.len(), self.recv.len()), |(s, r)| (s.capacity(), r.capacity()));
        if in_bytes > send_cap || out_bytes > recv_cap {
            return Err(CallError::Failed(format!(
                "buffers of {send_cap}/{recv_cap} bytes for a call of {in_bytes}/{out_bytes}"
            )));
        }
        let spec = spec_of(case, &self.comm).map_err(crate::purlin::map_err)?;
        let (to, from) = ((r + 1) % case.world, (r + case.world - 1) % case.world);
        if let Some((send, recv)) = &mut self.symmetric {
            // The sweep fills and reads these through their addresses between calls; the call
            // sees the case's lengths from their start.
            let in_place = case.in_place_layout(r).map(|layout| layout.len * es);
            let len = |b: &mut CpuSymmetricBuffer<u8>, n: usize| b.set_len(n).map_err(crate::purlin::map_err);
            return match in_place {
                Some(bytes) => {
                    len(recv, bytes)?;
                    self.comm.execute_bytes_in_place(&spec, recv).map(drop).map_err(crate::purlin::map_err)
                }
                None => {
                    len(send, in_bytes)?;
                    len(recv, out_bytes)?;
                    if case.collective == Collective::SendRecv {
                        return self
                            .comm
                            .send_recv(send, to as i32, recv, from as i32)
                            .map(drop)
                            .map_err(crate::purlin::map_err);
                    }
                    self.comm.execute_bytes(&spec, send, recv).map(drop).map_err(crate::purlin::map_err)
                }
            };
        }
        if let Some(layout) = case.in_place_layout(r) {
            let bytes = layout.len * es;
            if bytes > self.recv.len() {
                return Err(CallError::Failed(format!("a receive buffer of {} bytes for {bytes}", self.recv.len())));
            }
            // SAFETY: a live allocation of at least `bytes` bytes (checked above), owned by
            // `self`; reached only through `HostDevice` between calls, and `&mut self` keeps
            // this the only access while the call runs.
            let buf = unsafe { std::slice::from_raw_parts_mut(self.recv.ptr.cast::<u8>(), bytes) };
            return self.comm.execute_bytes_in_place(&spec, buf).map(drop).map_err(crate::purlin::map_err);
        }
        // SAFETY: both buffers are live allocations of at least these lengths (checked
        // above), owned by `self` and distinct; the sweep reaches them only through
        // `HostDevice` between calls, never during one (calls complete before they return),
        // and `&mut self` keeps this the only access while the call runs.
        let (send, recv) = unsafe {
            (
                std::slice::from_raw_parts(self.send.ptr.cast::<u8>(), in_bytes),
                std::slice::from_raw_parts_mut(self.recv.ptr.cast::<u8>(), out_bytes),
            )
        };
        if case.collective == Collective::SendRecv {
            return self.comm.send_recv(send, to as i32, recv, from as i32).map(drop).map_err(crate::purlin::map_err);
        }
        self.comm.execute_bytes(&spec, send, recv).map(drop).map_err(crate::purlin::map_err)
    }

    fn async_error(&self) -> Option<String> {
        self.comm.async_error().err().map(|e| e.to_string())
    }
}

/// What the host sweep brings back.
#[derive(Debug)]
pub struct HostRun {
    /// Rank 0's outcome (rows, statuses, the first failure of any rank).
    pub outcome: Outcome,
    /// Ranks.
    pub world: usize,
    /// The host communicators' blocks per role.
    pub blocks_per_role: u32,
    /// Their cap on one call's blocks, if set.
    pub max_blocks: Option<u32>,
}

/// Runs the sweep of `cfg` on the host executor with `world` ranks (threads of this
/// process), reporting progress through `progress` (rank 0's lines).
pub fn run_host(cfg: &Config, world: usize, progress: &(dyn Fn(&str) + Sync)) -> Result<HostRun> {
    if !(2..=crate::coord::MAX_RANKS).contains(&world) {
        bail!("--world {world}: the host executor runs 2..={} ranks", crate::coord::MAX_RANKS);
    }
    let cpu = cpu_config(cfg)?;
    let (blocks_per_role, max_blocks) = (cpu.tuning.blocks_per_role, cpu.tuning.max_blocks);
    let t0 = Instant::now();
    let comms =
        CpuComm::threads_with_config(world, cpu).map_err(|e| anyhow!("purlin_collectives::CpuComm::threads: {e}"))?;
    progress(&format!(
        "purlin (host executor): {world} ranks ready in {:.1} s; blocks per role {blocks_per_role}",
        t0.elapsed().as_secs_f64()
    ));
    let (send_bytes, recv_bytes) = cfg.buffer_bytes(world);
    let region = Region::local(world);
    let timeout = cfg.timeout();
    let config = Arc::new(cfg.clone());
    let outs: Vec<Outcome> = std::thread::scope(|s| -> Result<Vec<Outcome>> {
        let mut handles = Vec::with_capacity(world);
        for (rank, comm) in comms.into_iter().enumerate() {
            let (region, config) = (region.clone(), config.clone());
            let h = std::thread::Builder::new()
                .name(format!("rank-{rank}"))
                .spawn_scoped(s, move || {
                    let coord = Coord::new(region, rank, world, timeout);
                    let backend = match HostPurlin::new(comm, send_bytes, recv_bytes, config.symmetric) {
                        Ok(b) => b,
                        Err(e) => return Outcome { error: Some(format!("rank {rank}: {e:#}")), ..Outcome::default() },
                    };
                    let mut backends: Vec<Box<dyn Backend>> = vec![Box::new(backend)];
                    let quiet = |_: &str| {};
                    let p: &dyn Fn(&str) = if rank == 0 { progress } else { &quiet };
                    let mut out = run::run_backends(&config, &HostDevice, &coord, &mut backends, p);
                    out.backends = vec![(BackendKind::Purlin, Status::Ok)];
                    out
                })
                .context("spawn a rank thread")?;
            handles.push(h);
        }
        Ok(handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Outcome { error: Some("a rank thread panicked".into()), ..Outcome::default() })
            })
            .collect())
    })?;
    let mut outs = outs.into_iter();
    let mut outcome = outs.next().unwrap_or_default();
    if outcome.error.is_none() {
        outcome.error = outs.find_map(|o| o.error);
    }
    Ok(HostRun { outcome, world, blocks_per_role, max_blocks })
}
