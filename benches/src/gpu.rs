//! The little of the CUDA driver the benchmark needs, on raw device pointers: one context and
//! stream per rank, buffers, copies, a bounded stream synchronize and graph capture.
//!
//! Raw pointers (not cudarc's `CudaSlice`) because NCCL's symmetric windows come from
//! `ncclMemAlloc`, and because cudarc's event tracking must stay out of captured graphs: the
//! context's event tracking is turned off and nothing here records events.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cudarc::driver::sys::{CUresult, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaGraph, CudaStream, result, sys};

use crate::coord::Coord;

/// Whether libcuda can be loaded (cudarc panics on first use where it cannot).
pub fn driver_present() -> bool {
    purlin_topo::driver_present()
}

/// The number of visible GPUs (0 without a driver).
pub fn device_count() -> usize {
    purlin_topo::device_count()
}

/// The CUDA driver API version, as "13.0".
pub fn cuda_driver_version() -> Option<String> {
    if !driver_present() {
        return None;
    }
    let mut v = 0;
    // SAFETY: cuDriverGetVersion writes one int; the library is present (checked above).
    let r = unsafe { sys::cuDriverGetVersion(&mut v) };
    (r == CUresult::CUDA_SUCCESS).then(|| format!("{}.{}", v / 1000, (v % 1000) / 10))
}

/// The kernel driver's version (e.g. "580.159.04") from /proc, where it is readable.
pub fn kernel_driver_version() -> Option<String> {
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    let line = text.lines().next()?;
    line.split_whitespace()
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))
        .map(String::from)
}

/// One rank's GPU: its context and the stream every call goes on.
#[derive(Debug)]
pub struct Gpu {
    /// The device ordinal.
    pub ordinal: usize,
    /// The primary context.
    pub ctx: Arc<CudaContext>,
    /// The benchmark's stream.
    pub stream: Arc<CudaStream>,
    /// The device's name.
    pub name: String,
}

impl Gpu {
    /// Opens `ordinal` and binds its context to this thread.
    pub fn open(ordinal: usize) -> Result<Gpu> {
        let ctx = CudaContext::new(ordinal).with_context(|| format!("open GPU {ordinal}"))?;
        // SAFETY: no cudarc allocation of this context exists yet; the benchmark records no
        // events (raw pointers only), which keeps graph capture free of tracked events.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().context("create a stream")?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        Ok(Gpu { ordinal, ctx, stream, name })
    }

    /// Binds the context to the calling thread.
    pub fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().context("bind the CUDA context")
    }

    /// The raw stream.
    pub fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    /// Copies `src` to device memory at `dst`, in order on the stream, and waits for it.
    ///
    /// On the stream (not the legacy default stream, which a non-blocking stream does not
    /// wait for): a pageable host-to-device copy may return before its DMA lands.
    pub fn upload(&self, dst: u64, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: dst is a live device allocation of at least src.len() bytes (the backend
        // sized it for the largest case); src is not touched until the stream is synchronized
        // below.
        unsafe { result::memcpy_htod_async(dst, src, self.cu_stream()) }.context("copy the inputs to the GPU")?;
        self.stream.synchronize().context("wait for the inputs' copy")
    }

    /// Copies device memory at `src` into `dst`, in order on the stream, and waits for it.
    pub fn download(&self, dst: &mut [u8], src: u64) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: src is a live device allocation of at least dst.len() bytes; dst is not
        // read until the stream is synchronized below.
        unsafe { result::memcpy_dtoh_async(dst, src, self.cu_stream()) }.context("copy the outputs from the GPU")?;
        self.stream.synchronize().context("wait for the outputs' copy")
    }

    /// Fills `bytes` at `dst` with `value` on the stream.
    pub fn fill(&self, dst: u64, value: u8, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: dst is a live device allocation of at least `bytes` bytes.
        unsafe { result::memset_d8_async(dst, value, bytes, self.cu_stream()) }.context("poison the outputs")
    }

    /// Waits for the stream, bounded by `timeout`, watching the peers' abort flag and the
    /// backend's asynchronous error. Spins on `cuStreamQuery` (no sleeping: this ends timed runs).
    pub fn sync(&self, coord: &Coord, timeout: Duration, async_error: &dyn Fn() -> Option<String>) -> Result<()> {
        let start = Instant::now();
        let mut spins = 0u64;
        loop {
            // SAFETY: the stream is alive (owned by self).
            let r = unsafe { sys::cuStreamQuery(self.cu_stream()) };
            match r {
                CUresult::CUDA_SUCCESS => return Ok(()),
                CUresult::CUDA_ERROR_NOT_READY => {}
                other => bail!("GPU {}: the stream failed: {other:?}", self.ordinal),
            }
            spins += 1;
            if spins.is_multiple_of(1024) {
                coord.check()?;
                if let Some(e) = async_error() {
                    bail!("GPU {}: {e}", self.ordinal);
                }
                if start.elapsed() > timeout {
                    bail!("GPU {}: the stream did not finish within {timeout:?} (a peer stalled?)", self.ordinal);
                }
            }
            std::hint::spin_loop();
        }
    }

    /// Starts capturing the stream (thread-local mode: other ranks' threads keep working).
    pub fn begin_capture(&self) -> Result<()> {
        self.stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).context("begin capture")
    }

    /// Ends the capture and instantiates the graph.
    pub fn end_capture(&self) -> Result<CudaGraph> {
        match self.stream.end_capture(sys::CUgraphInstantiate_flags(0)).context("end capture")? {
            Some(g) => Ok(g),
            None => bail!("the capture produced no graph"),
        }
    }
}

/// Device memory from `cuMemAlloc`.
#[derive(Debug)]
pub struct DeviceBuffer {
    /// The device pointer.
    pub ptr: u64,
    /// Its size in bytes.
    pub bytes: usize,
    ctx: Arc<CudaContext>,
}

impl DeviceBuffer {
    /// Allocates `bytes` (at least 256) on `gpu`.
    pub fn new(gpu: &Gpu, bytes: usize) -> Result<DeviceBuffer> {
        gpu.bind()?;
        let bytes = bytes.max(256);
        // SAFETY: a plain allocation on the bound context; freed in Drop.
        let ptr = unsafe { result::malloc_sync(bytes) }
            .with_context(|| format!("cuMemAlloc of {bytes} bytes on GPU {}", gpu.ordinal))?;
        Ok(DeviceBuffer { ptr, bytes, ctx: gpu.ctx.clone() })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: ptr came from cuMemAlloc in this context and is freed once; the owner
        // synchronized its stream before dropping (backends are dropped after their last sync).
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// The calibration probe (one process, GPUs 0 and 1): copy-engine bandwidth between the two
/// GPUs, one direction and both directions at once (per direction), 256 MiB copies. These are
/// the limits a world-2 collective's busbw is judged against (docs/dev/device.md: both directions).
pub fn probe_copy_engine(a: &Gpu, b: &Gpu) -> Result<Vec<String>> {
    const BYTES: usize = 256 << 20;
    const REPS: usize = 5;
    for (x, y) in [(a, b), (b, a)] {
        x.bind()?;
        // SAFETY: enables access from x's (bound) context to y's; "already enabled" is fine.
        let r = unsafe { sys::cuCtxEnablePeerAccess(y.ctx.cu_ctx(), 0) };
        if r != CUresult::CUDA_SUCCESS && r != CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            bail!("peer access GPU {} -> GPU {}: {r:?}", x.ordinal, y.ordinal);
        }
    }
    let (src_a, dst_a) = (DeviceBuffer::new(a, BYTES)?, DeviceBuffer::new(a, BYTES)?);
    let (src_b, dst_b) = (DeviceBuffer::new(b, BYTES)?, DeviceBuffer::new(b, BYTES)?);
    let copy = |g: &Gpu, dst: u64, src: u64| -> Result<()> {
        g.bind()?;
        // SAFETY: both are live 256 MiB allocations; peer access is enabled both ways; the
        // stream is synchronized before the buffers are dropped.
        unsafe { result::memcpy_dtod_async(dst, src, BYTES, g.cu_stream()) }.context("peer copy")
    };
    let wait = |g: &Gpu| -> Result<()> {
        g.bind()?;
        g.stream.synchronize().context("synchronize the probe")
    };
    // Warm up both directions.
    copy(a, dst_b.ptr, src_a.ptr)?;
    copy(b, dst_a.ptr, src_b.ptr)?;
    wait(a)?;
    wait(b)?;
    let t0 = Instant::now();
    for _ in 0..REPS {
        copy(a, dst_b.ptr, src_a.ptr)?;
    }
    wait(a)?;
    let one = (REPS * BYTES) as f64 / t0.elapsed().as_secs_f64() / 1e9;
    let t0 = Instant::now();
    for _ in 0..REPS {
        copy(a, dst_b.ptr, src_a.ptr)?;
        copy(b, dst_a.ptr, src_b.ptr)?;
    }
    wait(a)?;
    wait(b)?;
    let both = (REPS * BYTES) as f64 / t0.elapsed().as_secs_f64() / 1e9;
    Ok(vec![format!(
        "copy engine GPU{}<->GPU{} (256 MiB): one direction {one:.1} GB/s; both directions at once {both:.1} GB/s per direction",
        a.ordinal, b.ordinal
    )])
}

/// A replayable capture of `iters` calls (a CUDA graph on a GPU).
pub trait Replay {
    /// Replays it on the device's stream (asynchronously).
    fn launch(&self) -> Result<()>;
}

impl Replay for CudaGraph {
    fn launch(&self) -> Result<()> {
        CudaGraph::launch(self).map_err(|e| anyhow::anyhow!("graph launch: {e}"))
    }
}

/// What the sweep needs of a rank's device: memory at raw addresses, a stream to wait for,
/// and graph capture. A [`Gpu`]; or [`HostDevice`], host memory, where backends run on CPU
/// threads (Purlin's host executor, and the tests of the sweep itself).
pub trait Device {
    /// Binds the device to the calling thread (a no-op on the host).
    fn bind(&self) -> Result<()>;
    /// Copies `src` to `dst` and waits for it.
    fn upload(&self, dst: u64, src: &[u8]) -> Result<()>;
    /// Copies `src` into `dst` and waits for it.
    fn download(&self, dst: &mut [u8], src: u64) -> Result<()>;
    /// Fills `bytes` at `dst` with `value`, in order with the calls.
    fn fill(&self, dst: u64, value: u8, bytes: usize) -> Result<()>;
    /// Waits until the calls issued so far are done (bounded; watches the peers' abort flag
    /// and `async_error`).
    fn sync(&self, coord: &Coord, timeout: Duration, async_error: &dyn Fn() -> Option<String>) -> Result<()>;
    /// Captures what `issue` enqueues into a replayable graph; `Ok(None)` where the device
    /// cannot capture (graph mode is then reported unsupported).
    fn capture(
        &self,
        issue: &mut dyn FnMut() -> Result<(), crate::backend::CallError>,
    ) -> Result<Option<Box<dyn Replay>>, crate::backend::CallError>;
}

impl Device for Gpu {
    fn bind(&self) -> Result<()> {
        Gpu::bind(self)
    }
    fn upload(&self, dst: u64, src: &[u8]) -> Result<()> {
        Gpu::upload(self, dst, src)
    }
    fn download(&self, dst: &mut [u8], src: u64) -> Result<()> {
        Gpu::download(self, dst, src)
    }
    fn fill(&self, dst: u64, value: u8, bytes: usize) -> Result<()> {
        Gpu::fill(self, dst, value, bytes)
    }
    fn sync(&self, coord: &Coord, timeout: Duration, async_error: &dyn Fn() -> Option<String>) -> Result<()> {
        Gpu::sync(self, coord, timeout, async_error)
    }
    fn capture(
        &self,
        issue: &mut dyn FnMut() -> Result<(), crate::backend::CallError>,
    ) -> Result<Option<Box<dyn Replay>>, crate::backend::CallError> {
        use crate::backend::CallError;
        self.begin_capture().map_err(|e| CallError::Failed(format!("{e:#}")))?;
        let issued = issue();
        // Always end the capture, even when a call failed, so the stream is usable again.
        let graph = self.end_capture();
        issued?;
        match graph {
            Ok(g) => Ok(Some(Box::new(g))),
            Err(e) => Err(CallError::Failed(format!("{e:#}"))),
        }
    }
}

/// Host memory as a device: addresses are host pointers, every call completes before it
/// returns, nothing can be captured.
#[derive(Debug, Default)]
pub struct HostDevice;

impl Device for HostDevice {
    fn bind(&self) -> Result<()> {
        Ok(())
    }
    fn upload(&self, dst: u64, src: &[u8]) -> Result<()> {
        // SAFETY: on a HostDevice, backends hand out addresses of host buffers of at least the
        // case's size, alive while the backend is.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }
    fn download(&self, dst: &mut [u8], src: u64) -> Result<()> {
        // SAFETY: as in upload.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }
    fn fill(&self, dst: u64, value: u8, bytes: usize) -> Result<()> {
        // SAFETY: as in upload.
        unsafe { std::ptr::write_bytes(dst as *mut u8, value, bytes) };
        Ok(())
    }
    fn sync(&self, coord: &Coord, _timeout: Duration, async_error: &dyn Fn() -> Option<String>) -> Result<()> {
        coord.check()?;
        match async_error() {
            Some(e) => bail!("{e}"),
            None => Ok(()),
        }
    }
    fn capture(
        &self,
        _issue: &mut dyn FnMut() -> Result<(), crate::backend::CallError>,
    ) -> Result<Option<Box<dyn Replay>>, crate::backend::CallError> {
        Ok(None)
    }
}
