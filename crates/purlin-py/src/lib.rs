//! `purlin_rs._purlin`: the extension module under the `purlin_rs` Python package
//! (docs/python.md).
//!
//! Two communicators, over raw addresses that the Python layer takes from its tensors and
//! arrays (`tensor.data_ptr()`, numpy's array interface) after checking them (device, dtype,
//! contiguity, writability): `Comm` over [`purlin_collectives::Comm`], each call on the
//! CUDA stream the caller names (PyTorch's current stream, [`Comm::on_stream`]), and
//! `CpuComm` over [`purlin_collectives::CpuComm`], ranks as threads of one process. Every
//! call releases the GIL while Rust works or waits. Errors become the exception classes of
//! [`errors`], carrying the rank and the peer.
//!
//! The module is private (`_purlin`): it trusts the addresses it is given, as the `unsafe`
//! constructors it calls require, and `purlin_rs` is what checks them.
#![deny(unsafe_op_in_unsafe_fn)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaStream, sys};
use purlin_atom::{F8E4M3, F8E5M2};
use purlin_collectives::{
    Comm, CommConfig, CpuComm, CpuConfig, Error, Id, NcclType, RawBuffer, ReduceOp, ReduceType, SymmetricBuffer,
};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

pub mod errors;

use errors::to_py;

/// The element types, by PyTorch's and numpy's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dtype {
    F32,
    F64,
    F16,
    Bf16,
    F8E4M3,
    F8E5M2,
    I8,
    U8,
    I32,
    U32,
    I64,
    U64,
}

impl Dtype {
    fn parse(name: &str) -> Result<Self, Error> {
        let name = name.strip_prefix("torch.").unwrap_or(name);
        Ok(match name {
            "float32" | "float" | "f32" => Dtype::F32,
            "float64" | "double" | "f64" => Dtype::F64,
            "float16" | "half" | "f16" => Dtype::F16,
            "bfloat16" | "bf16" => Dtype::Bf16,
            "float8_e4m3fn" | "f8e4m3" => Dtype::F8E4M3,
            "float8_e5m2" | "f8e5m2" => Dtype::F8E5M2,
            "int8" | "i8" => Dtype::I8,
            "uint8" | "u8" => Dtype::U8,
            "int32" | "int" | "i32" => Dtype::I32,
            "uint32" | "u32" => Dtype::U32,
            "int64" | "long" | "i64" => Dtype::I64,
            "uint64" | "u64" => Dtype::U64,
            _ => return Err(Error::Unsupported(format!("element type {name}"))),
        })
    }
}

/// Runs `$body` with `$t` the Rust element type of `$dtype`, for the listed dtypes; any other
/// dtype gives `$other`.
macro_rules! dispatch_dtype {
    ($dtype:expr, $t:ident => $body:expr, [$($variant:ident: $ty:ty),*], $rest:ident => $other:expr) => {
        match $dtype {
            $(Dtype::$variant => {
                type $t = $ty;
                $body
            })*
            #[allow(unreachable_patterns)]
            $rest => $other,
        }
    };
}

/// Runs `$body` with `$t` the Rust element type of `$dtype`.
macro_rules! with_dtype {
    ($dtype:expr, $t:ident => $body:expr) => {
        dispatch_dtype!($dtype, $t => $body, [
            F32: f32, F64: f64, F16: half::f16, Bf16: half::bf16, F8E4M3: F8E4M3, F8E5M2: F8E5M2,
            I8: i8, U8: u8, I32: i32, U32: u32, I64: i64, U64: u64
        ], other => unreachable!("every dtype is listed: {other:?}"))
    };
}

/// Runs `$body` with `$t` the Rust element type of `$dtype` where the Atom reduces it
/// ([`purlin_collectives::ReduceType`]); any other type is `Unsupported` for a reduction.
macro_rules! with_reduce_dtype {
    ($dtype:expr, $t:ident => $body:expr) => {
        dispatch_dtype!($dtype, $t => $body, [
            F32: f32, F16: half::f16, Bf16: half::bf16, F8E4M3: F8E4M3, F8E5M2: F8E5M2, I32: i32, U32: u32
        ], other => Err(Error::Unsupported(format!(
            "reductions of {other:?} (the Atom reduces float32, float16, bfloat16, fp8, int32, uint32)"
        ))))
    };
}

fn parse_op(name: &str) -> Result<ReduceOp, Error> {
    Ok(match name.to_ascii_lowercase().as_str() {
        "sum" => ReduceOp::Sum,
        "prod" | "product" => ReduceOp::Prod,
        "max" => ReduceOp::Max,
        "min" => ReduceOp::Min,
        "avg" | "mean" => ReduceOp::Avg,
        _ => return Err(Error::Unsupported(format!("reduce operation {name}"))),
    })
}

/// The collectives, by the Python layer's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    AllReduce,
    AllReduceInPlace,
    AllGather,
    AllGatherInPlace,
    ReduceScatter,
    ReduceScatterInPlace,
    AllToAll,
    AllGatherV,
    ReduceScatterV,
    AllToAllV,
    Broadcast,
    BroadcastInPlace,
    Reduce,
    ReduceInPlace,
    Send,
    Recv,
    SendRecv,
}

impl Kind {
    /// Whether the call reduces (its element type must be one the Atom reduces).
    fn reduces(self) -> bool {
        matches!(
            self,
            Kind::AllReduce
                | Kind::AllReduceInPlace
                | Kind::ReduceScatter
                | Kind::ReduceScatterInPlace
                | Kind::ReduceScatterV
                | Kind::Reduce
                | Kind::ReduceInPlace
        )
    }

    fn parse(name: &str) -> Result<Self, Error> {
        Ok(match name {
            "all_reduce" => Kind::AllReduce,
            "all_reduce_in_place" => Kind::AllReduceInPlace,
            "all_gather" => Kind::AllGather,
            "all_gather_in_place" => Kind::AllGatherInPlace,
            "reduce_scatter" => Kind::ReduceScatter,
            "reduce_scatter_in_place" => Kind::ReduceScatterInPlace,
            "all_to_all" => Kind::AllToAll,
            "all_gather_v" => Kind::AllGatherV,
            "reduce_scatter_v" => Kind::ReduceScatterV,
            "all_to_all_v" => Kind::AllToAllV,
            "broadcast" => Kind::Broadcast,
            "broadcast_in_place" => Kind::BroadcastInPlace,
            "reduce" => Kind::Reduce,
            "reduce_in_place" => Kind::ReduceInPlace,
            "send" => Kind::Send,
            "recv" => Kind::Recv,
            "send_recv" => Kind::SendRecv,
            _ => return Err(Error::InvalidArgument(format!("no collective named {name}"))),
        })
    }
}

/// One call as the Python layer describes it: buffers as (address, elements); the in-place
/// forms use `recv` as their one buffer; `root` is the root or, for point-to-point, the peer
/// (`send_recv`: the send peer, `recv_peer` the receive peer).
#[derive(Debug, Clone)]
struct CallArgs {
    kind: Kind,
    dtype: Dtype,
    send: (u64, usize),
    recv: (u64, usize),
    op: ReduceOp,
    root: i32,
    recv_peer: i32,
    counts: Vec<usize>,
    matrix: Vec<Vec<usize>>,
}

impl CallArgs {
    #[allow(clippy::too_many_arguments)]
    fn parse(
        kind: &str,
        dtype: &str,
        send: (u64, usize),
        recv: (u64, usize),
        op: &str,
        root: i32,
        recv_peer: i32,
        counts: Option<Vec<usize>>,
        matrix: Option<Vec<Vec<usize>>>,
    ) -> Result<Self, Error> {
        let kind = Kind::parse(kind)?;
        let counts = counts.unwrap_or_default();
        let matrix = matrix.unwrap_or_default();
        let (needs_counts, needs_matrix) =
            (matches!(kind, Kind::AllGatherV | Kind::ReduceScatterV), kind == Kind::AllToAllV);
        if needs_counts && counts.is_empty() {
            return Err(Error::InvalidArgument("the V forms need their counts".into()));
        }
        if needs_matrix && matrix.is_empty() {
            return Err(Error::InvalidArgument("all_to_all_v needs the whole counts matrix".into()));
        }
        Ok(CallArgs {
            kind,
            dtype: Dtype::parse(dtype)?,
            send,
            recv,
            op: parse_op(op)?,
            root,
            recv_peer,
            counts,
            matrix,
        })
    }

    /// Whether the call reads its send buffer on this rank (broadcast: the root only).
    fn reads_send(&self, rank: usize) -> bool {
        match self.kind {
            Kind::Broadcast => usize::try_from(self.root).is_ok_and(|r| r == rank),
            Kind::AllReduceInPlace
            | Kind::AllGatherInPlace
            | Kind::ReduceScatterInPlace
            | Kind::BroadcastInPlace
            | Kind::ReduceInPlace
            | Kind::Recv => false,
            _ => true,
        }
    }

    /// Whether the call writes its receive buffer on this rank (reduce: the root only).
    fn writes_recv(&self, rank: usize) -> bool {
        match self.kind {
            Kind::Reduce => usize::try_from(self.root).is_ok_and(|r| r == rank),
            Kind::Send => false,
            _ => true,
        }
    }
}

/// A GPU communicator (one rank), its calls on caller-named streams.
#[pyclass(name = "Comm", module = "purlin_rs._purlin")]
struct PyComm {
    comm: Mutex<Option<Arc<Comm>>>,
    /// The last stream wrapped, by its raw handle (PyTorch's current stream rarely changes).
    streams: Mutex<Option<(u64, Arc<CudaStream>)>>,
    rank: usize,
    world: usize,
    ordinal: usize,
}

impl PyComm {
    fn new(comm: Comm) -> Self {
        let (rank, world, ordinal) = (comm.rank(), comm.world_size(), comm.ordinal());
        PyComm { comm: Mutex::new(Some(Arc::new(comm))), streams: Mutex::new(None), rank, world, ordinal }
    }

    fn comm(&self) -> PyResult<Arc<Comm>> {
        self.comm
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| to_py(Error::InvalidArgument("the communicator is closed".into()), Some(self.rank)))
    }

    /// The stream with raw handle `handle` (0: the legacy default stream) on this GPU.
    fn stream(&self, comm: &Comm, handle: u64) -> Arc<CudaStream> {
        let mut cached = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((h, s)) = cached.as_ref()
            && *h == handle
        {
            return s.clone();
        }
        // SAFETY: the handle is a stream of this GPU's primary context (PyTorch's, which
        // `Comm` shares) that the caller keeps alive for its call's duration; nothing here
        // destroys it (a borrowed wrapper), and the call orders itself on it.
        let s = unsafe { comm.context().wrap_borrowed_stream(handle as sys::CUstream) };
        *cached = Some((handle, s.clone()));
        s
    }
}

/// A new stream on GPU `device`'s primary context (PyTorch's too), for the communicator's own
/// work (teardown); calls run on the streams their callers name.
fn new_stream(device: usize) -> Result<Arc<CudaStream>, Error> {
    if !purlin_collectives::driver_present() {
        return Err(purlin_topo::TopoError::NoDriver.into());
    }
    let ctx = CudaContext::new(device).map_err(|error| Error::Driver { call: "cuDevicePrimaryCtxRetain", error })?;
    ctx.new_stream().map_err(|error| Error::Driver { call: "cuStreamCreate", error })
}

/// The raw buffers of a GPU call on `stream`.
fn gpu_buffers<T: NcclType>(stream: &Arc<CudaStream>, a: &CallArgs) -> (RawBuffer<T>, RawBuffer<T>) {
    // SAFETY: the Python layer passes the address and element count of live, contiguous
    // tensors of this dtype on this communicator's GPU, held by the caller until the call's
    // work on `stream` (its current stream) is done, as `RawBuffer::from_raw` requires.
    let send = unsafe { RawBuffer::<T>::from_raw(a.send.0, a.send.1, stream.clone()) };
    // SAFETY: as for `send`; the Python layer checked an output does not overlap its input.
    let recv = unsafe { RawBuffer::<T>::from_raw(a.recv.0, a.recv.1, stream.clone()) };
    (send, recv)
}

/// A reducing GPU call ([`Kind::reduces`]).
fn gpu_reduce<T: ReduceType>(comm: &Comm, stream: &Arc<CudaStream>, a: &CallArgs) -> Result<(), Error> {
    let on = comm.on_stream(stream)?;
    let (send, mut recv) = gpu_buffers::<T>(stream, a);
    let rank = comm.rank();
    match a.kind {
        Kind::AllReduce => on.all_reduce(&send, &mut recv, &a.op),
        Kind::AllReduceInPlace => on.all_reduce_in_place(&mut recv, &a.op),
        Kind::ReduceScatter => on.reduce_scatter(&send, &mut recv, &a.op),
        Kind::ReduceScatterInPlace => on.reduce_scatter_in_place(&mut recv, &a.op),
        Kind::ReduceScatterV => on.reduce_scatter_v(&send, &mut recv, &a.counts, &a.op),
        Kind::Reduce => {
            let writes = a.writes_recv(rank);
            on.reduce(&send, writes.then_some(&mut recv), &a.op, a.root)
        }
        Kind::ReduceInPlace => on.reduce_in_place(&mut recv, &a.op, a.root),
        other => Err(Error::InvalidArgument(format!("{other:?} does not reduce"))),
    }
    .map(drop)
}

/// A GPU call that moves data without reducing it.
fn gpu_move<T: NcclType>(comm: &Comm, stream: &Arc<CudaStream>, a: &CallArgs) -> Result<(), Error> {
    let on = comm.on_stream(stream)?;
    let (send, mut recv) = gpu_buffers::<T>(stream, a);
    match a.kind {
        Kind::AllGather => on.all_gather(&send, &mut recv),
        Kind::AllGatherInPlace => on.all_gather_in_place(&mut recv),
        Kind::AllToAll => on.all_to_all(&send, &mut recv),
        Kind::AllGatherV => on.all_gather_v(&send, &mut recv, &a.counts),
        Kind::AllToAllV => on.all_to_all_v(&send, &mut recv, &a.matrix),
        Kind::Broadcast => on.broadcast(a.reads_send(comm.rank()).then_some(&send), &mut recv, a.root),
        Kind::BroadcastInPlace => on.broadcast_in_place(&mut recv, a.root),
        Kind::Send => on.send(&send, a.root).map(|()| purlin_collectives::Status::Success),
        Kind::Recv => on.recv(&mut recv, a.root),
        Kind::SendRecv => on.send_recv(&send, a.root, &mut recv, a.recv_peer),
        other => Err(Error::InvalidArgument(format!("{other:?} reduces"))),
    }
    .map(drop)
}

#[pymethods]
impl PyComm {
    /// Under torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`) on GPU
    /// `device` (default: the library's choice from `LOCAL_RANK`). Returns once every rank is
    /// set up.
    #[staticmethod]
    #[pyo3(signature = (device=None))]
    fn from_env(py: Python<'_>, device: Option<usize>) -> PyResult<Self> {
        py.detach(|| match device {
            None => Comm::from_env(),
            Some(device) => {
                let stream = new_stream(device)?;
                Comm::from_env_with_stream(stream, CommConfig::from_env()?)
            }
        })
        .map(PyComm::new)
        .map_err(|e| to_py(e, None))
    }

    /// Rank `rank` of `world_size` on GPU `device`, meeting the others on `id` (the bytes of
    /// `new_id()` made by one rank and shared with every other).
    #[staticmethod]
    fn from_id(py: Python<'_>, id: &[u8], rank: usize, world_size: usize, device: usize) -> PyResult<Self> {
        let id = Id::from_bytes(id).map_err(|e| to_py(e, Some(rank)))?;
        py.detach(|| Comm::from_rank(new_stream(device)?, rank, world_size, id))
            .map(PyComm::new)
            .map_err(|e| to_py(e, Some(rank)))
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    #[getter]
    fn world_size(&self) -> usize {
        self.world
    }

    /// This rank's GPU ordinal.
    #[getter]
    fn device(&self) -> usize {
        self.ordinal
    }

    /// Enqueues one collective on the stream `stream` (a raw `cudaStream_t`; 0 the legacy
    /// default stream); see `purlin_rs.Comm` for the checked, tensor-level calls.
    #[pyo3(signature = (kind, dtype, send, recv, stream, op="sum", root=0, recv_peer=0, counts=None, matrix=None))]
    #[allow(clippy::too_many_arguments)]
    fn call(
        &self,
        py: Python<'_>,
        kind: &str,
        dtype: &str,
        send: (u64, usize),
        recv: (u64, usize),
        stream: u64,
        op: &str,
        root: i32,
        recv_peer: i32,
        counts: Option<Vec<usize>>,
        matrix: Option<Vec<Vec<usize>>>,
    ) -> PyResult<()> {
        let rank = Some(self.rank);
        let args = CallArgs::parse(kind, dtype, send, recv, op, root, recv_peer, counts, matrix)
            .map_err(|e| to_py(e, rank))?;
        let comm = self.comm()?;
        let stream = self.stream(&comm, stream);
        py.detach(|| match args.kind.reduces() {
            true => with_reduce_dtype!(args.dtype, T => gpu_reduce::<T>(&comm, &stream, &args)),
            false => with_dtype!(args.dtype, T => gpu_move::<T>(&comm, &stream, &args)),
        })
        .map_err(|e| to_py(e, rank))
    }

    /// Every rank's `data`, in rank order (a host exchange among the ranks, e.g. of split
    /// sizes; every rank calls it).
    fn exchange<'py>(&self, py: Python<'py>, data: &[u8]) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let comm = self.comm()?;
        let all = py
            .detach(|| comm.diag().host().all_gather(data, "purlin_rs: exchange"))
            .map_err(|e| to_py(e, Some(self.rank)))?;
        Ok(all.iter().map(|b| PyBytes::new(py, b)).collect())
    }

    /// Allocates `nbytes` of symmetric memory on every rank at once (a collective call) and
    /// returns it; collectives on it take the one-copy paths.
    fn alloc_symmetric(&self, py: Python<'_>, nbytes: usize) -> PyResult<PySymmetric> {
        let comm = self.comm()?;
        let buffer = py.detach(|| comm.alloc_symmetric::<u8>(nbytes)).map_err(|e| to_py(e, Some(self.rank)))?;
        Ok(PySymmetric { address: buffer.device_address(), nbytes, device: self.ordinal, buffer: Some(buffer) })
    }

    /// A failure that poisoned this communicator, raised (does not wait).
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        let comm = self.comm()?;
        py.detach(|| comm.async_error()).map_err(|e| to_py(e, Some(self.rank)))
    }

    /// Tears down now (meets the peers: every rank calls it); later calls raise.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let comm = self.comm.lock().unwrap_or_else(|e| e.into_inner()).take();
        *self.streams.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if let Some(comm) = comm {
            py.detach(move || drop(comm));
        }
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!("purlin_rs._purlin.Comm(rank={}, world_size={}, device={})", self.rank, self.world, self.ordinal)
    }
}

/// Symmetric device memory of one rank ([`Comm::alloc_symmetric`]): its address and size,
/// for the Python layer to view as a tensor.
#[pyclass(name = "Symmetric", module = "purlin_rs._purlin")]
struct PySymmetric {
    buffer: Option<SymmetricBuffer<u8>>,
    address: u64,
    nbytes: usize,
    device: usize,
}

#[pymethods]
impl PySymmetric {
    /// This rank's device address.
    #[getter]
    fn address(&self) -> u64 {
        self.address
    }

    /// Bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// The GPU ordinal.
    #[getter]
    fn device(&self) -> usize {
        self.device
    }

    /// Whether the memory is still held.
    #[getter]
    fn held(&self) -> bool {
        self.buffer.is_some()
    }
}

/// A CPU communicator: one rank of a host-executor world whose ranks are threads of this
/// process.
#[pyclass(name = "CpuComm", module = "purlin_rs._purlin")]
struct PyCpuComm {
    comm: Arc<CpuComm>,
}

/// Views `(address, len)` as a slice of `T`, after checking what can be checked here.
///
/// # Safety
/// A nonzero `address` is that of `len` initialised elements of `T` in memory that stays
/// alive and is not written by anything else while the slice lives.
unsafe fn host_slice<'a, T>(address: u64, len: usize, what: &str) -> Result<&'a [T], Error> {
    check_host(address, len, std::mem::align_of::<T>(), what)?;
    if len == 0 {
        return Ok(&[]);
    }
    // SAFETY: nonzero and aligned (checked); the caller promises the rest.
    Ok(unsafe { std::slice::from_raw_parts(address as usize as *const T, len) })
}

/// [`host_slice`], writable.
///
/// # Safety
/// As [`host_slice`], and nothing else reads or writes the memory while the slice lives.
unsafe fn host_slice_mut<'a, T>(address: u64, len: usize, what: &str) -> Result<&'a mut [T], Error> {
    check_host(address, len, std::mem::align_of::<T>(), what)?;
    if len == 0 {
        return Ok(&mut []);
    }
    // SAFETY: nonzero and aligned (checked); the caller promises the rest.
    Ok(unsafe { std::slice::from_raw_parts_mut(address as usize as *mut T, len) })
}

fn check_host(address: u64, len: usize, align: usize, what: &str) -> Result<(), Error> {
    if len > 0 && address == 0 {
        return Err(Error::InvalidArgument(format!("the {what} buffer has no address")));
    }
    if len > 0 && address % align as u64 != 0 {
        return Err(Error::InvalidArgument(format!("the {what} buffer at {address:#x} is not {align}-byte aligned")));
    }
    Ok(())
}

/// A host call's buffers, checked: `(send, recv)`.
///
/// # Safety
/// As the Python layer promises (below): live, contiguous arrays of `T` held for the call.
unsafe fn cpu_buffers<'a, T: purlin_collectives::CpuType>(
    comm: &CpuComm,
    a: &CallArgs,
) -> Result<(&'a [T], &'a mut [T]), Error> {
    let rank = comm.rank();
    let size = std::mem::size_of::<T>() as u64;
    let (reads, writes) = (a.reads_send(rank), a.writes_recv(rank));
    if reads && writes && a.send.1 > 0 && a.recv.1 > 0 {
        let (s0, s1) = (a.send.0, a.send.0 + a.send.1 as u64 * size);
        let (r0, r1) = (a.recv.0, a.recv.0 + a.recv.1 as u64 * size);
        if s0 < r1 && r0 < s1 {
            return Err(Error::InvalidArgument(format!(
                "{:?}: the output overlaps the input (use the in-place form)",
                a.kind
            )));
        }
    }
    // SAFETY: the Python layer passes the addresses and lengths of live, contiguous numpy
    // arrays of this dtype that the calling thread holds for the call (which blocks until
    // done); the output was checked writable, and input and output do not overlap (above).
    let send: &[T] = if reads { unsafe { host_slice(a.send.0, a.send.1, "send") }? } else { &[] };
    // SAFETY: as for `send`.
    let recv: &mut [T] = if writes { unsafe { host_slice_mut(a.recv.0, a.recv.1, "receive") }? } else { &mut [] };
    Ok((send, recv))
}

/// A reducing host call ([`Kind::reduces`]).
fn cpu_reduce<T: purlin_collectives::CpuType + ReduceType>(comm: &CpuComm, a: &CallArgs) -> Result<(), Error> {
    // SAFETY: the Python layer's arrays, as `cpu_buffers` requires.
    let (send, recv) = unsafe { cpu_buffers::<T>(comm, a) }?;
    let writes = a.writes_recv(comm.rank());
    match a.kind {
        Kind::AllReduce => comm.all_reduce(send, recv, &a.op),
        Kind::AllReduceInPlace => comm.all_reduce_in_place(recv, &a.op),
        Kind::ReduceScatter => comm.reduce_scatter(send, recv, &a.op),
        Kind::ReduceScatterInPlace => comm.reduce_scatter_in_place(recv, &a.op),
        Kind::ReduceScatterV => comm.reduce_scatter_v(send, recv, &a.counts, &a.op),
        Kind::Reduce => comm.reduce(send, writes.then_some(recv), &a.op, a.root),
        Kind::ReduceInPlace => comm.reduce_in_place(recv, &a.op, a.root),
        other => Err(Error::InvalidArgument(format!("{other:?} does not reduce"))),
    }
    .map(drop)
}

/// A host call that moves data without reducing it.
fn cpu_move<T: purlin_collectives::CpuType>(comm: &CpuComm, a: &CallArgs) -> Result<(), Error> {
    // SAFETY: the Python layer's arrays, as `cpu_buffers` requires.
    let (send, recv) = unsafe { cpu_buffers::<T>(comm, a) }?;
    let reads = a.reads_send(comm.rank());
    match a.kind {
        Kind::AllGather => comm.all_gather(send, recv),
        Kind::AllGatherInPlace => comm.all_gather_in_place(recv),
        Kind::AllToAll => comm.all_to_all(send, recv),
        Kind::AllGatherV => comm.all_gather_v(send, recv, &a.counts),
        Kind::AllToAllV => comm.all_to_all_v(send, recv, &a.matrix),
        Kind::Broadcast => comm.broadcast(reads.then_some(send), recv, a.root),
        Kind::BroadcastInPlace => comm.broadcast_in_place(recv, a.root),
        Kind::Send => comm.send(send, a.root).map(|()| purlin_collectives::Status::Success),
        Kind::Recv => comm.recv(recv, a.root),
        Kind::SendRecv => comm.send_recv(send, a.root, recv, a.recv_peer),
        other => Err(Error::InvalidArgument(format!("{other:?} reduces"))),
    }
    .map(drop)
}

#[pymethods]
impl PyCpuComm {
    /// A world of `world_size` ranks; rank `r` is the `r`-th, to be driven by its own thread.
    /// `timeout`: seconds a rank waits for the others (default: the library's).
    #[staticmethod]
    #[pyo3(signature = (world_size, timeout=None))]
    fn threads(world_size: usize, timeout: Option<f64>) -> PyResult<Vec<Self>> {
        let mut config = CpuConfig::default();
        if let Some(seconds) = timeout {
            config.timeout = Duration::try_from_secs_f64(seconds)
                .map_err(|_| to_py(Error::InvalidArgument(format!("a timeout of {seconds} seconds")), None))?;
        }
        let comms = CpuComm::threads_with_config(world_size, config).map_err(|e| to_py(e, None))?;
        Ok(comms.into_iter().map(|c| PyCpuComm { comm: Arc::new(c) }).collect())
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// The number of ranks.
    #[getter]
    fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    /// Runs one collective on host memory; blocks (GIL released) until every rank made it.
    #[pyo3(signature = (kind, dtype, send, recv, op="sum", root=0, recv_peer=0, counts=None, matrix=None))]
    #[allow(clippy::too_many_arguments)]
    fn call(
        &self,
        py: Python<'_>,
        kind: &str,
        dtype: &str,
        send: (u64, usize),
        recv: (u64, usize),
        op: &str,
        root: i32,
        recv_peer: i32,
        counts: Option<Vec<usize>>,
        matrix: Option<Vec<Vec<usize>>>,
    ) -> PyResult<()> {
        let rank = Some(self.comm.rank());
        let args = CallArgs::parse(kind, dtype, send, recv, op, root, recv_peer, counts, matrix)
            .map_err(|e| to_py(e, rank))?;
        let comm = self.comm.clone();
        py.detach(move || match args.kind.reduces() {
            true => with_reduce_dtype!(args.dtype, T => cpu_reduce::<T>(&comm, &args)),
            false => with_dtype!(args.dtype, T => cpu_move::<T>(&comm, &args)),
        })
        .map_err(|e| to_py(e, rank))
    }

    /// A failure that poisoned this communicator, raised (does not wait).
    fn check(&self) -> PyResult<()> {
        self.comm.async_error().map_err(|e| to_py(e, Some(self.comm.rank())))
    }

    fn __repr__(&self) -> String {
        format!("purlin_rs._purlin.CpuComm(rank={}, world_size={})", self.comm.rank(), self.comm.world_size())
    }
}

/// A new rendezvous id (bytes): one rank makes it, every rank passes it to `Comm.from_id`.
#[pyfunction]
fn new_id<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
    let id = Id::new().map_err(|e| to_py(e, None))?;
    Ok(PyBytes::new(py, &id.to_bytes()))
}

/// Whether a CUDA driver is present (no context is created).
#[pyfunction]
fn driver_present() -> bool {
    purlin_collectives::driver_present()
}

/// The element types the collectives accept, by PyTorch's names.
#[pyfunction]
fn dtypes() -> Vec<&'static str> {
    vec![
        "float32",
        "float64",
        "float16",
        "bfloat16",
        "float8_e4m3fn",
        "float8_e5m2",
        "int8",
        "uint8",
        "int32",
        "uint32",
        "int64",
        "uint64",
    ]
}

#[pymodule]
#[pyo3(name = "_purlin")]
fn purlin_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The log subscriber of Purlin's programs (PURLIN_LOG, PURLIN_LOG_FILE; warnings only by
    // default); a process that installed a tracing subscriber already keeps its own.
    purlin_log::init().map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
    m.add_class::<PyComm>()?;
    m.add_class::<PyCpuComm>()?;
    m.add_class::<PySymmetric>()?;
    m.add_function(wrap_pyfunction!(new_id, m)?)?;
    m.add_function(wrap_pyfunction!(driver_present, m)?)?;
    m.add_function(wrap_pyfunction!(dtypes, m)?)?;
    m.add("MAX_WORLD", purlin_collectives::MAX_WORLD)?;
    errors::register(m)?;
    Ok(())
}
