//! The standalone device Atom: copy and N-to-1 reduce on device memory, sources and
//! destination local or on a peer GPU, on the caller's stream, with a block-count knob.
//!
//! [`DeviceAtom`] compiles (through the on-disk [`KernelCache`]) and loads the whole-grid
//! kernels of `kernels/atom/standalone.cu` for one context and one [`AtomSpec`]: the copy
//! kernel at construction, each element type's reduce kernels on first use.
//!
//! Two layers:
//! - `*_raw` methods take raw device pointers (`u64`), as kernels see them, record no
//!   events (so they can be captured in CUDA graphs) and are `unsafe`: the caller vouches
//!   for the pointers. Peer memory must come from `cuMemAlloc` (or be otherwise mapped for
//!   this device) and peer access must be enabled ([`DeviceAtom::enable_peer_access`]).
//! - [`DeviceAtom::copy`] and [`DeviceAtom::reduce`] take cudarc buffers (`CudaSlice`,
//!   `CudaView`), check lengths, and order the work against each buffer's own stream; a
//!   buffer of another context is a peer buffer: peer access is enabled and, for memory
//!   from cudarc's stream-ordered pool, the pool is opened to this device.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, DriverError, LaunchConfig,
    PushKernelArg, sys,
};
use cudarc::nvrtc::Ptx;

use crate::dtype::{AtomElem, DType, ReduceOp};
use crate::generation::{AtomSpec, Generation, GenerationError};
use crate::nvrtc::{Arch, KernelCache, NvrtcError};

/// The most sources one reduce combines (`kMaxSources`).
pub const MAX_SOURCES: usize = 16;

/// Errors of the device Atom.
#[derive(Debug, thiserror::Error)]
pub enum AtomError {
    /// No CUDA driver library on this machine.
    #[error("no CUDA driver (libcuda) on this machine")]
    NoDriver,
    /// A driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(#[from] DriverError),
    /// Compiling the Atom failed.
    #[error(transparent)]
    Nvrtc(#[from] NvrtcError),
    /// The generation cannot be used on this GPU.
    #[error(transparent)]
    Generation(#[from] GenerationError),
    /// The stream belongs to another context than the Atom's.
    #[error("the stream belongs to device {stream_device}, the Atom to device {atom_device}")]
    WrongContext {
        /// The stream's device ordinal.
        stream_device: usize,
        /// The Atom's device ordinal.
        atom_device: usize,
    },
    /// Buffers of different lengths.
    #[error("length mismatch: destination holds {dst} elements, source {index} holds {src}")]
    LengthMismatch {
        /// Destination elements.
        dst: usize,
        /// The offending source.
        index: usize,
        /// Its elements.
        src: usize,
    },
    /// No sources, or more than [`MAX_SOURCES`].
    #[error("reduce takes 1..={MAX_SOURCES} sources, got {0}")]
    SourceCount(usize),
    /// A pointer is not aligned to its element size.
    #[error("pointer {ptr:#x} is not aligned to {align} bytes")]
    Misaligned {
        /// The pointer.
        ptr: u64,
        /// The alignment required.
        align: usize,
    },
    /// Block count out of range.
    #[error("block count {0} is out of range (1..=65535)")]
    Blocks(u32),
    /// This device cannot access the peer's memory.
    #[error("device {from} cannot access device {to}'s memory (no peer access)")]
    NoPeerAccess {
        /// The accessing device.
        from: usize,
        /// The owning device.
        to: usize,
    },
    /// A transfer outside a [`DeviceBuffer`].
    #[error("bytes {offset}..{offset}+{len} are outside a buffer of {size} bytes")]
    OutOfBounds {
        /// Start of the range.
        offset: usize,
        /// Its length.
        len: usize,
        /// The buffer's size.
        size: usize,
    },
    /// The element type has no conversion kernels (32-bit types convert trivially).
    #[error("{0} has no conversion kernels")]
    NoConversion(DType),
}

/// Whether the CUDA driver library can be loaded (call before anything else touches CUDA:
/// with cudarc's `dynamic-loading`, it panics when libcuda is missing). Without this crate's
/// `dynamic-loading` feature, libcuda is linked into the program, which could not have
/// started without it: always `true`.
pub fn driver_present() -> bool {
    #[cfg(feature = "dynamic-loading")]
    // SAFETY: only tries to dlopen libcuda; no other precondition.
    return unsafe { sys::is_culib_present() };
    #[cfg(not(feature = "dynamic-loading"))]
    true
}

/// The compute capability of a context's device.
pub fn arch_of(ctx: &CudaContext) -> Result<Arch, AtomError> {
    let (major, minor) = ctx.compute_capability()?;
    Ok(Arch { major: major as u32, minor: minor as u32 })
}

/// Enables `ctx`'s access to `peer`'s memory (idempotent). Errors with
/// [`AtomError::NoPeerAccess`] where the hardware has no path.
pub fn enable_peer_access(ctx: &Arc<CudaContext>, peer: &Arc<CudaContext>) -> Result<(), AtomError> {
    if ctx.cu_device() == peer.cu_device() {
        return Ok(());
    }
    let mut can = 0;
    // SAFETY: valid out-pointer; both devices come from live contexts.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, ctx.cu_device(), peer.cu_device()) }.result()?;
    if can != 1 {
        return Err(AtomError::NoPeerAccess { from: ctx.ordinal(), to: peer.ordinal() });
    }
    ctx.bind_to_thread()?;
    // SAFETY: `ctx` is current on this thread; `peer` is a live context of another device.
    let status = unsafe { sys::cuCtxEnablePeerAccess(peer.cu_ctx(), 0) };
    if status != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        status.result()?;
    }
    Ok(())
}

/// Device memory from `cuMemAlloc` (not cudarc's stream-ordered pool), so that
/// `cuCtxEnablePeerAccess` makes it reachable from peers; freed on drop. Transfers are
/// synchronous. For tests, benchmarks and raw-pointer users.
#[derive(Debug)]
pub struct DeviceBuffer {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
    bytes: usize,
}

impl DeviceBuffer {
    /// Allocates `bytes` bytes (at least 1) on `ctx`'s device; the start is 256-byte aligned.
    pub fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self, AtomError> {
        ctx.bind_to_thread()?;
        let mut ptr = 0;
        // SAFETY: the context is current; valid out-pointer.
        unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes.max(1)) }.result()?;
        Ok(Self { ctx: ctx.clone(), ptr, bytes })
    }

    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The owning context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    fn check_range(&self, offset: usize, len: usize) -> Result<(), AtomError> {
        if offset.checked_add(len).is_some_and(|end| end <= self.bytes) {
            Ok(())
        } else {
            Err(AtomError::OutOfBounds { offset, len, size: self.bytes })
        }
    }

    /// Copies `data` to byte offset `offset` (synchronous: done when this returns).
    pub fn upload(&self, offset: usize, data: &[u8]) -> Result<(), AtomError> {
        self.check_range(offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread()?;
        // SAFETY: the range lies inside the allocation (checked); `data` is valid for reads.
        unsafe { sys::cuMemcpyHtoD_v2(self.ptr + offset as u64, data.as_ptr().cast(), data.len()) }.result()?;
        self.ctx.synchronize()?;
        Ok(())
    }

    /// Reads `len` bytes from byte offset `offset`, after all work of the context is done.
    pub fn download(&self, offset: usize, len: usize) -> Result<Vec<u8>, AtomError> {
        self.check_range(offset, len)?;
        let mut out = vec![0u8; len];
        if len == 0 {
            return Ok(out);
        }
        self.ctx.synchronize()?;
        // SAFETY: the range lies inside the allocation (checked); `out` holds `len` bytes.
        unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), self.ptr + offset as u64, len) }.result()?;
        Ok(out)
    }

    /// Sets every byte to `value` (synchronous).
    pub fn fill(&self, value: u8) -> Result<(), AtomError> {
        self.ctx.bind_to_thread()?;
        // SAFETY: the whole allocation.
        unsafe { sys::cuMemsetD8_v2(self.ptr, value, self.bytes.max(1)) }.result()?;
        // cuMemset on device memory may return before it is done.
        self.ctx.synchronize()?;
        Ok(())
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `ptr` came from cuMemAlloc in this context and is freed once. Work
            // that uses it must be finished: cuMemFree synchronizes the device first.
            let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
        }
    }
}

/// The reduce kernels' source-pointer table, passed by value (`SrcPtrs` in standalone.cu).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
struct SrcPtrs([u64; MAX_SOURCES]);
// SAFETY: a plain array of 64-bit integers, the layout of `struct SrcPtrs { u64 p[16]; }`.
unsafe impl DeviceRepr for SrcPtrs {}

/// The standalone Atom on one device.
#[derive(Debug)]
pub struct DeviceAtom {
    ctx: Arc<CudaContext>,
    spec: AtomSpec,
    arch: Arch,
    cache: KernelCache,
    copy_fn: CudaFunction,
    copy_module: Arc<CudaModule>,
    modules: Mutex<HashMap<DType, Arc<CudaModule>>>,
    functions: Mutex<HashMap<String, CudaFunction>>,
}

impl DeviceAtom {
    /// The Atom for `ctx`'s device: `generation` if given (else `$PURLIN_ATOM_GENERATION`,
    /// else the newest that runs there) at its default sizing. Compiles (or loads from
    /// `cache`) and loads the copy kernel.
    pub fn new(ctx: &Arc<CudaContext>, generation: Option<Generation>, cache: &KernelCache) -> Result<Self, AtomError> {
        let arch = arch_of(ctx)?;
        let generation = Generation::choose(arch, generation)?;
        Self::with_spec(ctx, AtomSpec::new(generation), cache)
    }

    /// The Atom for `ctx`'s device with an explicit build (generation and sizing).
    pub fn with_spec(ctx: &Arc<CudaContext>, spec: AtomSpec, cache: &KernelCache) -> Result<Self, AtomError> {
        let arch = arch_of(ctx)?;
        if !spec.generation.runs_on(arch) {
            return Err(GenerationError::Unsupported { generation: spec.generation, arch }.into());
        }
        let module = load_unit(ctx, &spec, arch, cache, None)?;
        let copy_fn = prepare_function(ctx, &module, "purlin_atom_copy", &spec)?;
        Ok(Self {
            ctx: ctx.clone(),
            spec,
            arch,
            cache: cache.clone(),
            copy_fn,
            copy_module: module,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
        })
    }

    /// The build in use.
    pub fn spec(&self) -> &AtomSpec {
        &self.spec
    }

    /// The generation in use.
    pub fn generation(&self) -> Generation {
        self.spec.generation
    }

    /// The device's architecture.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Compiles and loads the kernels of `dtype` now (they load on first use otherwise).
    pub fn preload(&self, dtype: DType) -> Result<(), AtomError> {
        self.module(dtype).map(|_| ())
    }

    /// Enables this device's access to `peer`'s memory (idempotent).
    pub fn enable_peer_access(&self, peer: &Arc<CudaContext>) -> Result<(), AtomError> {
        enable_peer_access(&self.ctx, peer)
    }

    fn module(&self, dtype: DType) -> Result<Arc<CudaModule>, AtomError> {
        // A poisoned lock only means another thread panicked mid-insert; the map is intact.
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = modules.get(&dtype) {
            return Ok(m.clone());
        }
        let m = load_unit(&self.ctx, &self.spec, self.arch, &self.cache, Some(dtype))?;
        modules.insert(dtype, m.clone());
        Ok(m)
    }

    fn function(&self, dtype: DType, name: String) -> Result<CudaFunction, AtomError> {
        if let Some(f) = self.functions.lock().unwrap_or_else(|e| e.into_inner()).get(&name) {
            return Ok(f.clone());
        }
        let module = self.module(dtype)?;
        let f = prepare_function(&self.ctx, &module, &name, &self.spec)?;
        self.functions.lock().unwrap_or_else(|e| e.into_inner()).insert(name, f.clone());
        Ok(f)
    }

    fn function_in_copy_unit(&self, name: &str) -> Result<CudaFunction, AtomError> {
        if let Some(f) = self.functions.lock().unwrap_or_else(|e| e.into_inner()).get(name) {
            return Ok(f.clone());
        }
        let f = prepare_function(&self.ctx, &self.copy_module, name, &self.spec)?;
        self.functions.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_string(), f.clone());
        Ok(f)
    }

    fn check_stream(&self, stream: &CudaStream) -> Result<(), AtomError> {
        if stream.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(AtomError::WrongContext {
                stream_device: stream.context().ordinal(),
                atom_device: self.ctx.ordinal(),
            });
        }
        Ok(())
    }

    fn config(&self, blocks: u32) -> Result<LaunchConfig, AtomError> {
        if !(1..=65535).contains(&blocks) {
            return Err(AtomError::Blocks(blocks));
        }
        Ok(LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (self.spec.threads(), 1, 1),
            shared_mem_bytes: self.spec.smem_bytes(),
        })
    }

    /// Copies `bytes` bytes from `src` to `dst` on `stream` with `blocks` blocks. Any
    /// alignment works; 16-byte-aligned (or equally misaligned) pointers take the vector
    /// path. No events are recorded (graph-capturable).
    ///
    /// # Safety
    /// `src` must be readable and `dst` writable for `bytes` bytes from this device (local
    /// memory, or peer memory this device has access to) until the kernel completes, and
    /// they must not partially overlap.
    pub unsafe fn copy_raw(
        &self,
        stream: &CudaStream,
        dst: u64,
        src: u64,
        bytes: usize,
        blocks: u32,
    ) -> Result<(), AtomError> {
        self.check_stream(stream)?;
        let cfg = self.config(blocks)?;
        if bytes == 0 {
            return Ok(());
        }
        let bytes = bytes as u64;
        let mut launch = stream.launch_builder(&self.copy_fn);
        launch.arg(&dst).arg(&src).arg(&bytes);
        // SAFETY: the kernel is `purlin_atom_copy(u64 dst, u64 src, u64 bytes)`; its dynamic
        // shared memory is the spec's workspace (the function's limit was raised to it when
        // loaded); the caller vouches for the pointers.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }

    /// [`copy_raw`](Self::copy_raw) the way an executor calls the Atom: block `b` copies
    /// chunks `b, b + blocks, ...` of `chunk` bytes, one Atom call (pipeline fill and drain)
    /// per chunk. For measuring what a chunk size costs.
    ///
    /// # Safety
    /// As for [`copy_raw`](Self::copy_raw).
    pub unsafe fn copy_chunked_raw(
        &self,
        stream: &CudaStream,
        dst: u64,
        src: u64,
        bytes: usize,
        chunk: usize,
        blocks: u32,
    ) -> Result<(), AtomError> {
        self.check_stream(stream)?;
        let cfg = self.config(blocks)?;
        if bytes == 0 {
            return Ok(());
        }
        let f = self.function_in_copy_unit("purlin_atom_copy_chunked")?;
        let (bytes, chunk) = (bytes as u64, chunk.max(1) as u64);
        let mut launch = stream.launch_builder(&f);
        launch.arg(&dst).arg(&src).arg(&bytes).arg(&chunk);
        // SAFETY: the kernel is `(u64 dst, u64 src, u64 bytes, u64 chunk)`; workspace as for
        // copy; the caller vouches for the pointers.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }

    /// `dst[i] = srcs[0][i] op ... op srcs[n-1][i]` for `count` elements of `dtype`, in rank
    /// order, on `stream` with `blocks` blocks; 1 ≤ n ≤ [`MAX_SOURCES`]. No events are
    /// recorded (graph-capturable).
    ///
    /// # Safety
    /// Every source must be readable and `dst` writable for `count` elements from this
    /// device until the kernel completes; `dst` may equal a source exactly but must not
    /// partially overlap one.
    #[allow(clippy::too_many_arguments)] // mirrors the kernel's parameters one for one
    pub unsafe fn reduce_raw(
        &self,
        stream: &CudaStream,
        dtype: DType,
        op: ReduceOp,
        dst: u64,
        srcs: &[u64],
        count: usize,
        blocks: u32,
    ) -> Result<(), AtomError> {
        self.check_stream(stream)?;
        let cfg = self.config(blocks)?;
        if srcs.is_empty() || srcs.len() > MAX_SOURCES {
            return Err(AtomError::SourceCount(srcs.len()));
        }
        let align = dtype.size();
        for &p in std::iter::once(&dst).chain(srcs) {
            if p % align as u64 != 0 {
                return Err(AtomError::Misaligned { ptr: p, align });
            }
        }
        if count == 0 {
            return Ok(());
        }
        let f = self.function(dtype, format!("purlin_atom_reduce_{}_{}", dtype.name(), op.name()))?;
        let mut table = SrcPtrs([0; MAX_SOURCES]);
        table.0[..srcs.len()].copy_from_slice(srcs);
        let n = srcs.len() as u32;
        let count = count as u64;
        let mut launch = stream.launch_builder(&f);
        launch.arg(&dst).arg(&table).arg(&n).arg(&count);
        // SAFETY: the kernel is `(u64 dst, SrcPtrs srcs, u32 n, u64 count)` with SrcPtrs a
        // 128-byte array of u64 matching `SrcPtrs` here; n ≤ 16; dynamic shared memory as
        // for copy; the caller vouches for the pointers.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }

    /// Decodes `n` codes of `dtype` at `codes` to f32 bits at `out` (the device half of the
    /// conversion tests). 8- and 16-bit float types only.
    ///
    /// # Safety
    /// `codes` must hold `n` elements and `out` `n` u32s, on this device.
    pub unsafe fn decode_raw(
        &self,
        stream: &CudaStream,
        dtype: DType,
        out: u64,
        codes: u64,
        n: usize,
    ) -> Result<(), AtomError> {
        // SAFETY: forwarded.
        unsafe { self.convert_raw(stream, dtype, "decode", out, codes, n) }
    }

    /// Encodes `n` f32 bit patterns at `bits` to codes of `dtype` at `out`.
    ///
    /// # Safety
    /// `bits` must hold `n` u32s and `out` `n` elements, on this device.
    pub unsafe fn encode_raw(
        &self,
        stream: &CudaStream,
        dtype: DType,
        out: u64,
        bits: u64,
        n: usize,
    ) -> Result<(), AtomError> {
        // SAFETY: forwarded.
        unsafe { self.convert_raw(stream, dtype, "encode", out, bits, n) }
    }

    unsafe fn convert_raw(
        &self,
        stream: &CudaStream,
        dtype: DType,
        what: &str,
        out: u64,
        input: u64,
        n: usize,
    ) -> Result<(), AtomError> {
        self.check_stream(stream)?;
        if !matches!(dtype, DType::F16 | DType::BF16 | DType::E4M3 | DType::E5M2) {
            return Err(AtomError::NoConversion(dtype));
        }
        if n == 0 {
            return Ok(());
        }
        let f = self.function(dtype, format!("purlin_atom_{what}_{}", dtype.name()))?;
        let n = n as u64;
        let mut launch = stream.launch_builder(&f);
        launch.arg(&out).arg(&input).arg(&n);
        let cfg = LaunchConfig { grid_dim: (256, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the kernel is `(out*, const in*, u64 n)`, a grid-stride loop below n; the
        // caller vouches for the buffers.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }

    /// Copies `src` into `dst` (equal lengths) on `stream`, with `blocks` blocks. Either
    /// buffer may belong to another device's context (a peer buffer).
    pub fn copy<T, D, S>(&self, stream: &Arc<CudaStream>, dst: &mut D, src: &S, blocks: u32) -> Result<(), AtomError>
    where
        T: DeviceRepr,
        D: DevicePtrMut<T>,
        S: DevicePtr<T>,
    {
        self.check_stream(stream)?;
        self.config(blocks)?;
        if dst.len() != src.len() {
            return Err(AtomError::LengthMismatch { dst: dst.len(), index: 0, src: src.len() });
        }
        let bytes = std::mem::size_of::<T>() * src.len();
        let streams = [src.stream().clone(), dst.stream().clone()];
        let peer = self.peers(&streams)?;
        {
            let (s, _gs) = src.device_ptr(if peer[0] { &streams[0] } else { stream });
            let (d, _gd) = dst.device_ptr_mut(if peer[1] { &streams[1] } else { stream });
            self.order_before(stream, &streams, &peer)?;
            self.open_pools(&[s, d], &peer)?;
            // SAFETY: both pointers come from live cudarc buffers of `bytes` bytes (equal
            // lengths checked), borrowed until the guards drop; peer buffers were made
            // reachable above and their streams are joined after the launch (below), before
            // the guards record their events. `dst` is borrowed mutably, so no overlap.
            unsafe { self.copy_raw(stream, d, s, bytes, blocks) }?;
            self.order_after(stream, &streams, &peer)?;
        }
        Ok(())
    }

    /// `dst = srcs[0] op srcs[1] op ...` elementwise in rank order on `stream`, with
    /// `blocks` blocks; all lengths equal, 1 ≤ n ≤ [`MAX_SOURCES`]. Any buffer may belong to
    /// another device's context (a peer buffer).
    pub fn reduce<T, D, S>(
        &self,
        stream: &Arc<CudaStream>,
        op: ReduceOp,
        dst: &mut D,
        srcs: &[&S],
        blocks: u32,
    ) -> Result<(), AtomError>
    where
        T: AtomElem + DeviceRepr,
        D: DevicePtrMut<T>,
        S: DevicePtr<T>,
    {
        self.check_stream(stream)?;
        self.config(blocks)?;
        if srcs.is_empty() || srcs.len() > MAX_SOURCES {
            return Err(AtomError::SourceCount(srcs.len()));
        }
        for (index, s) in srcs.iter().enumerate() {
            if s.len() != dst.len() {
                return Err(AtomError::LengthMismatch { dst: dst.len(), index, src: s.len() });
            }
        }
        let mut streams: Vec<Arc<CudaStream>> = srcs.iter().map(|s| s.stream().clone()).collect();
        streams.push(dst.stream().clone());
        let peer = self.peers(&streams)?;
        let count = dst.len();
        {
            let mut ptrs = Vec::with_capacity(streams.len());
            let mut guards = Vec::with_capacity(streams.len());
            for (i, s) in srcs.iter().enumerate() {
                let (p, g) = s.device_ptr(if peer[i] { &streams[i] } else { stream });
                ptrs.push(p);
                guards.push(g);
            }
            let last = streams.len() - 1;
            let (d, gd) = dst.device_ptr_mut(if peer[last] { &streams[last] } else { stream });
            ptrs.push(d);
            guards.push(gd);
            self.order_before(stream, &streams, &peer)?;
            self.open_pools(&ptrs, &peer)?;
            // SAFETY: every pointer comes from a live cudarc buffer of `count` elements of T
            // (lengths checked), borrowed until the guards drop; peer buffers were made
            // reachable and their streams are joined after the launch, before the guards
            // record their events. `dst` is borrowed mutably, so it overlaps no source.
            unsafe { self.reduce_raw(stream, T::DTYPE, op, d, &ptrs[..last], count, blocks) }?;
            self.order_after(stream, &streams, &peer)?;
            drop(guards);
        }
        Ok(())
    }

    /// For each buffer stream: whether it is a peer's (and then peer access is enabled).
    fn peers(&self, streams: &[Arc<CudaStream>]) -> Result<Vec<bool>, AtomError> {
        let mut peer = Vec::with_capacity(streams.len());
        for s in streams {
            let is_peer = s.context().cu_ctx() != self.ctx.cu_ctx();
            if is_peer {
                self.enable_peer_access(s.context())?;
            }
            peer.push(is_peer);
        }
        Ok(peer)
    }

    /// Orders the pending work of peer buffers' streams (including the waits their
    /// `device_ptr` calls just enqueued) before `stream`.
    fn order_before(
        &self,
        stream: &Arc<CudaStream>,
        streams: &[Arc<CudaStream>],
        peer: &[bool],
    ) -> Result<(), AtomError> {
        for (s, &p) in streams.iter().zip(peer) {
            if p {
                stream.join(s)?;
            }
        }
        Ok(())
    }

    /// Orders `stream`'s launch before later work on each peer buffer's stream.
    fn order_after(
        &self,
        stream: &Arc<CudaStream>,
        streams: &[Arc<CudaStream>],
        peer: &[bool],
    ) -> Result<(), AtomError> {
        for (s, &p) in streams.iter().zip(peer) {
            if p {
                s.join(stream)?;
            }
        }
        Ok(())
    }

    /// Opens the stream-ordered memory pools that peer pointers come from to this device.
    fn open_pools(&self, ptrs: &[u64], peer: &[bool]) -> Result<(), AtomError> {
        for (&p, &is_peer) in ptrs.iter().zip(peer) {
            if !is_peer {
                continue;
            }
            let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
            // SAFETY: valid out-pointer of the attribute's type (a pool handle); `p` is a
            // live device pointer. Memory not from a pool reports a null handle.
            let status = unsafe {
                sys::cuPointerGetAttribute(
                    (&mut pool as *mut sys::CUmemoryPool).cast(),
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
                    p,
                )
            };
            if status != sys::CUresult::CUDA_SUCCESS || pool.is_null() {
                continue;
            }
            let desc = sys::CUmemAccessDesc {
                location: sys::CUmemLocation {
                    type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    id: self.ctx.ordinal() as i32,
                },
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            // SAFETY: `pool` is a live pool handle; one valid descriptor.
            unsafe { sys::cuMemPoolSetAccess(pool, &desc, 1) }.result()?;
        }
        Ok(())
    }
}

fn load_unit(
    ctx: &Arc<CudaContext>,
    spec: &AtomSpec,
    arch: Arch,
    cache: &KernelCache,
    dtype: Option<DType>,
) -> Result<Arc<CudaModule>, AtomError> {
    let unit = crate::sources::standalone_unit(spec, dtype);
    let compiled = cache.get_or_compile(&unit, arch)?;
    Ok(ctx.load_module(Ptx::from_binary(compiled.cubin))?)
}

fn prepare_function(
    ctx: &Arc<CudaContext>,
    module: &Arc<CudaModule>,
    name: &str,
    spec: &AtomSpec,
) -> Result<CudaFunction, AtomError> {
    ctx.bind_to_thread()?;
    let f = module.load_function(name)?;
    if spec.smem_bytes() > 48 * 1024 {
        f.set_attribute(
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            spec.smem_bytes() as i32,
        )?;
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn handles_can_be_shared_across_threads() {
        send_sync::<DeviceAtom>();
        send_sync::<DeviceBuffer>();
        assert_eq!(std::mem::size_of::<SrcPtrs>(), 8 * MAX_SOURCES);
    }
}
