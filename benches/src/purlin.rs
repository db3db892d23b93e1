//! Purlin's backend: `purlin_collectives::Comm`, the drop-in for `cudarc::nccl::Comm`.
//!
//! One process, one thread per GPU: the communicators come from `Comm::from_devices` (made
//! on the launching thread before the rank threads start, as cudarc programs do, then handed
//! to the rank threads: `Comm` is `Send`). torchrun: `Comm::from_rank` with an `Id` from rank
//! 0, passed through the ranks' shared block.
//!
//! Buffers are `CudaSlice<u8>` on the rank's stream, viewed as the case's element type per
//! call; with `--symmetric` the receive buffer is a `SymmetricBuffer<u8>` (allocated by every
//! rank together), viewed the same way. Collectives the API does not have yet (all-to-all and the V forms) are reported as
//! not implemented; calls that return "not implemented yet" are reported so, never timed.

use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut};
use purlin_collectives::NcclType;
use purlin_collectives::{Comm, CommConfig, Error, Id, ReduceOp, SymmetricBuffer};

use crate::backend::{Backend, BackendKind, CallError};
use crate::case::Case;
use crate::coord::Coord;
use crate::gpu::Gpu;
use crate::run::Config;
use crate::spec::{Collective, Dtype, Op};

/// The communicator's settings: its environment (`PURLIN_*`), with every host-side wait
/// bounded by the benchmark's `--timeout` and, where `--blocks` was given, its blocks per
/// role (`Tuning::blocks_per_role`; it wins over `PURLIN_BLOCKS_PER_ROLE`).
pub fn config(cfg: &Config) -> Result<CommConfig> {
    let mut c = CommConfig::from_env().map_err(|e| anyhow!("purlin configuration: {e}"))?;
    c.timeout = cfg.timeout();
    if let Some(b) = cfg.blocks {
        c.tuning.blocks_per_role = u32::try_from(b).map_err(|_| anyhow!("--blocks {b} is too large"))?;
    }
    Ok(c)
}

/// Makes every rank's communicator in one process (rank `i` on `streams[i]`).
pub fn comms_for_threads(streams: Vec<Arc<CudaStream>>, cfg: &Config) -> Result<Vec<Comm>> {
    Comm::from_devices_with_config(streams, config(cfg)?)
        .map_err(|e| anyhow!("purlin_collectives::Comm::from_devices: {e}"))
}

/// Makes this rank's communicator, one process per GPU (every rank calls it).
pub fn comm_for_process(gpu: &Gpu, coord: &Coord, cfg: &Config) -> Result<Comm> {
    let mine: Vec<u8> = if coord.rank() == 0 {
        match Id::new() {
            Ok(id) => id.internal().iter().map(|c| *c as u8).collect(),
            Err(_) => Vec::new(),
        }
    } else {
        Vec::new()
    };
    let got = coord.broadcast_bytes(&mine)?;
    let mut internal = [0 as std::ffi::c_char; purlin_collectives::internal::ID_BYTES];
    if got.len() != internal.len() {
        bail!("rank 0 could not make a purlin Id");
    }
    for (d, s) in internal.iter_mut().zip(&got) {
        *d = *s as _;
    }
    Comm::from_rank_with_config(gpu.stream.clone(), coord.rank(), coord.world(), Id::uninit(internal), config(cfg)?)
        .map_err(|e| anyhow!("purlin_collectives::Comm::from_rank: {e}"))
}

/// One rank's Purlin backend.
#[derive(Debug)]
pub struct Purlin {
    /// The symmetric send and receive buffers (`--symmetric`), dropped before the communicator.
    symmetric: Option<(SymmetricBuffer<u8>, SymmetricBuffer<u8>)>,
    comm: Comm,
    send: CudaSlice<u8>,
    recv: CudaSlice<u8>,
}

impl Purlin {
    /// Wraps a communicator and allocates the buffers; `symmetric`: the send and receive
    /// buffers are symmetric memory (every rank makes its backend at the same point, so the
    /// collective allocations meet).
    pub fn new(gpu: &Gpu, comm: Comm, send_bytes: usize, recv_bytes: usize, symmetric: bool) -> Result<Purlin> {
        gpu.bind()?;
        let plain = |bytes: usize| if symmetric { 256 } else { bytes.max(256) };
        // SAFETY: u8 has no invalid bit patterns; the runner writes the send buffer before use
        // and poisons the receive buffer before every checked call.
        let send = unsafe { gpu.stream.alloc::<u8>(plain(send_bytes)) }.context("allocate purlin's send buffer")?;
        // SAFETY: as above.
        let recv = unsafe { gpu.stream.alloc::<u8>(plain(recv_bytes)) }.context("allocate purlin's recv buffer")?;
        let alloc =
            |bytes: usize| comm.alloc_symmetric::<u8>(bytes.max(256)).map_err(|e| anyhow!("alloc_symmetric: {e}"));
        let symmetric = if symmetric { Some((alloc(send_bytes)?, alloc(recv_bytes)?)) } else { None };
        gpu.stream.synchronize().context("synchronize after allocating")?;
        Ok(Purlin { symmetric, comm, send, recv })
    }
}

pub(crate) fn op(o: Option<Op>) -> ReduceOp {
    match o.unwrap_or(Op::Sum) {
        Op::Sum => ReduceOp::Sum,
        Op::Prod => ReduceOp::Prod,
        Op::Min => ReduceOp::Min,
        Op::Max => ReduceOp::Max,
        Op::Avg => ReduceOp::Avg,
    }
}

pub(crate) fn map_err(e: Error) -> CallError {
    match e {
        Error::Unsupported(m) if m.contains("not implemented") => CallError::NotImplemented(m),
        Error::Unsupported(m) => CallError::Unsupported(m),
        other => CallError::Failed(other.to_string()),
    }
}

fn ptr_of(s: &CudaSlice<u8>) -> u64 {
    let stream = s.stream().clone();
    let (p, _sync) = s.device_ptr(&stream);
    p
}

/// Typed views of the byte buffers, `n_send`/`n_recv` elements of `T` (the symmetric ones
/// where there are).
fn call_typed<T: Reduces>(
    comm: &Comm,
    send: &CudaSlice<u8>,
    recv: &mut CudaSlice<u8>,
    symmetric: Option<&(SymmetricBuffer<u8>, SymmetricBuffer<u8>)>,
    case: &Case,
) -> Result<(), CallError> {
    let r = comm.rank();
    let (n_send, n_recv) = (case.in_count(r), case.in_place_layout(r).map_or(case.out_count(r), |l| l.len));
    let too_small = |which: &str| CallError::Failed(format!("{which} buffer too small"));
    if let Some((send, recv)) = symmetric {
        let s: SymmetricBuffer<T> = send.view_as::<T>(n_send).map_err(|_| too_small("send"))?;
        let mut d: SymmetricBuffer<T> = recv.view_as::<T>(n_recv).map_err(|_| too_small("receive"))?;
        return call_into(comm, &s, &mut d, case);
    }
    // SAFETY: the buffers were sized for the sweep's largest case in bytes (in place: its
    // largest in-place buffer, Config::buffer_bytes); T is a plain element type for which
    // every bit pattern is a value.
    let s: CudaView<'_, T> = unsafe { send.transmute::<T>(n_send) }.ok_or_else(|| too_small("send"))?;
    // SAFETY: as above.
    let mut d: CudaViewMut<'_, T> = unsafe { recv.transmute_mut::<T>(n_recv) }.ok_or_else(|| too_small("receive"))?;
    call_into(comm, &s, &mut d, case)
}

/// The root of the rooted collectives (nccl-tests' default).
const ROOT: i32 = 0;

/// The reductions of [`call_into`] where `T` is a `ReduceType`; for other types Purlin's
/// typed reductions do not compile, and the sweep reports them Unsupported.
trait Reduces: NcclType + cudarc::driver::DeviceRepr + Sized {
    fn reduce<S: DevicePtr<Self>, R: DevicePtrMut<Self>>(
        comm: &Comm,
        s: &S,
        d: &mut R,
        case: &Case,
    ) -> Result<purlin_collectives::Status, CallError>;
}

macro_rules! reduces {
    ($($t:ty),*) => {$(
        impl Reduces for $t {
            fn reduce<S: DevicePtr<Self>, R: DevicePtrMut<Self>>(
                comm: &Comm,
                s: &S,
                d: &mut R,
                case: &Case,
            ) -> Result<purlin_collectives::Status, CallError> {
                let o = op(case.op);
                let in_place = case.in_place_layout(comm.rank()).is_some();
                match (case.collective, in_place) {
                    (Collective::AllReduce, true) => comm.all_reduce_in_place(d, &o),
                    (Collective::ReduceScatter, true) => comm.reduce_scatter_in_place(d, &o),
                    (Collective::Reduce, true) => comm.reduce_in_place(d, &o, ROOT),
                    (Collective::AllReduce, false) => comm.all_reduce(s, d, &o),
                    (Collective::ReduceScatter, false) => comm.reduce_scatter(s, d, &o),
                    (Collective::ReduceScatterV, false) => comm.reduce_scatter_v(s, d, &case.matrix[0], &o),
                    // A peer's receive view is empty and ignored.
                    (Collective::Reduce, false) => comm.reduce(s, Some(d), &o, ROOT),
                    (other, true) => return Err(CallError::Unsupported(format!("{other} has no in-place form"))),
                    (other, false) => unreachable!("{other} is not a reduction"),
                }
                .map_err(map_err)
            }
        }
    )*};
}
reduces!(f32, half::f16, half::bf16, i32, u32, purlin_atom::F8E4M3, purlin_atom::F8E5M2);

macro_rules! never_reduces {
    ($($t:ty),*) => {$(
        impl Reduces for $t {
            fn reduce<S: DevicePtr<Self>, R: DevicePtrMut<Self>>(
                _: &Comm,
                _: &S,
                _: &mut R,
                case: &Case,
            ) -> Result<purlin_collectives::Status, CallError> {
                Err(CallError::Unsupported(format!("{} of {}: no Atom reduces it", case.collective, stringify!($t))))
            }
        }
    )*};
}
never_reduces!(f64, i8, u8, i64, u64);

/// One call of `case` on `s` into `d` (in place: on `d` alone).
fn call_into<T: Reduces, S: DevicePtr<T>, R: DevicePtrMut<T>>(
    comm: &Comm,
    s: &S,
    d: &mut R,
    case: &Case,
) -> Result<(), CallError> {
    if matches!(
        case.collective,
        Collective::AllReduce | Collective::ReduceScatter | Collective::ReduceScatterV | Collective::Reduce
    ) {
        return T::reduce(comm, s, d, case).map(drop);
    }
    if case.in_place_layout(comm.rank()).is_some() {
        let res = match case.collective {
            Collective::AllGather => comm.all_gather_in_place(d),
            Collective::Broadcast => comm.broadcast_in_place(d, ROOT),
            other => return Err(CallError::Unsupported(format!("{other} has no in-place form"))),
        };
        return res.map(drop).map_err(map_err);
    }
    let res = match case.collective {
        Collective::AllGather => comm.all_gather(s, d),
        Collective::AllToAll => comm.all_to_all(s, d),
        // The V forms' matrix: m[0][p] = partition p (AG-V / RS-V), m[p][q] = pair p→q (A2A-V).
        Collective::AllGatherV => comm.all_gather_v(s, d, &case.matrix[0]),
        Collective::AllToAllV => comm.all_to_all_v(s, d, &case.matrix),
        // A peer's send (broadcast) view is empty and ignored.
        Collective::Broadcast => comm.broadcast(Some(s), d, ROOT),
        // To rank + 1, from rank − 1: both the peer at world 2 (wider worlds: Unsupported).
        Collective::SendRecv => {
            let (r, n) = (comm.rank(), comm.world_size());
            comm.send_recv(s, ((r + 1) % n) as i32, d, ((r + n - 1) % n) as i32)
        }
        Collective::AllReduce | Collective::ReduceScatter | Collective::ReduceScatterV | Collective::Reduce => {
            unreachable!("reductions go through Reduces::reduce")
        }
    };
    res.map(drop).map_err(map_err)
}

impl Backend for Purlin {
    fn kind(&self) -> BackendKind {
        BackendKind::Purlin
    }

    fn send_ptr(&self) -> u64 {
        self.symmetric.as_ref().map_or_else(|| ptr_of(&self.send), |(s, _)| s.device_address())
    }

    fn recv_ptr(&self) -> u64 {
        self.symmetric.as_ref().map_or_else(|| ptr_of(&self.recv), |(_, r)| r.device_address())
    }

    /// Every collective and dtype is accepted here; what the GPU cannot do (e.g. reductions
    /// of f64) comes back from the call as a typed error.
    fn supports(&self, _case: &Case) -> Result<(), CallError> {
        Ok(())
    }

    fn enqueue(&mut self, case: &Case) -> Result<(), CallError> {
        let (c, s, d, m) = (&self.comm, &self.send, &mut self.recv, self.symmetric.as_ref());
        match case.dtype {
            Dtype::F32 => call_typed::<f32>(c, s, d, m, case),
            Dtype::F16 => call_typed::<half::f16>(c, s, d, m, case),
            Dtype::Bf16 => call_typed::<half::bf16>(c, s, d, m, case),
            Dtype::F64 => call_typed::<f64>(c, s, d, m, case),
            Dtype::I8 => call_typed::<i8>(c, s, d, m, case),
            Dtype::U8 => call_typed::<u8>(c, s, d, m, case),
            Dtype::I32 => call_typed::<i32>(c, s, d, m, case),
            Dtype::U32 => call_typed::<u32>(c, s, d, m, case),
            Dtype::I64 => call_typed::<i64>(c, s, d, m, case),
            Dtype::U64 => call_typed::<u64>(c, s, d, m, case),
            Dtype::F8E4M3 => call_typed::<purlin_atom::F8E4M3>(c, s, d, m, case),
            Dtype::F8E5M2 => call_typed::<purlin_atom::F8E5M2>(c, s, d, m, case),
        }
    }

    fn async_error(&self) -> Option<String> {
        self.comm.async_error().err().map(|e| e.to_string())
    }
}
