//! Device backends of the symmetric workspace: `cuMemAlloc` memory shared by CUDA IPC
//! between processes ([`IpcBackend`]), or reached directly through peer access between the
//! GPUs of one process ([`PeerBackend`]).
//!
//! `cuMemAlloc`, not cudarc's allocations: those come from a stream-ordered pool that legacy
//! IPC cannot export (docs/dev/device.md).

use std::sync::Arc;

use cudarc::driver::{CudaContext, sys};

use crate::error::{Error, driver};
use crate::workspace::SymmetricBackend;

/// A `cuMemAlloc` allocation on one device.
#[derive(Debug)]
pub struct DeviceAlloc {
    /// The device pointer.
    pub ptr: sys::CUdeviceptr,
    /// Its size.
    pub bytes: usize,
}

fn alloc_zeroed(ctx: &Arc<CudaContext>, bytes: usize) -> Result<DeviceAlloc, Error> {
    ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
    let mut ptr = 0;
    // SAFETY: the context is current on this thread; the out-pointer is valid.
    unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) }.result().map_err(driver("cuMemAlloc"))?;
    let a = DeviceAlloc { ptr, bytes };
    // SAFETY: `ptr` is a fresh allocation of `bytes` bytes in the current context.
    let zeroed = unsafe { sys::cuMemsetD8_v2(ptr, 0, bytes) }.result().map_err(driver("cuMemsetD8"));
    // The memset may be asynchronous: wait for it before anyone can learn the address.
    let synced = zeroed.and_then(|()| ctx.synchronize().map_err(driver("cuCtxSynchronize")));
    if let Err(e) = synced {
        free(ctx, a);
        return Err(e);
    }
    Ok(a)
}

fn free(ctx: &Arc<CudaContext>, a: DeviceAlloc) {
    if ctx.bind_to_thread().is_ok() {
        // SAFETY: `a.ptr` came from cuMemAlloc in this context and is freed exactly once
        // (`DeviceAlloc` is moved in); callers synchronised the kernels that used it and
        // made sure no peer maps it any more.
        let _ = unsafe { sys::cuMemFree_v2(a.ptr) };
    }
}

/// CUDA IPC between processes: export with `cuIpcGetMemHandle`, open with
/// `cuIpcOpenMemHandle` (lazily enabling peer access). CUDA IPC cannot open a handle in the
/// process that made it, so ranks that turn out to share a process (cudarc allows
/// `from_rank` on threads) use the pointer directly through peer access instead.
#[derive(Debug, Clone)]
pub struct IpcBackend {
    ctx: Arc<CudaContext>,
}

impl IpcBackend {
    /// The backend for this rank's device.
    pub fn new(ctx: Arc<CudaContext>) -> Self {
        Self { ctx }
    }
}

/// A peer's workspace as mapped by [`IpcBackend`].
#[derive(Debug)]
pub enum IpcRemote {
    /// Opened with `cuIpcOpenMemHandle`; closed at teardown.
    Ipc(sys::CUdeviceptr),
    /// The same process: the peer's pointer itself, reached through peer access (the
    /// peer's primary context is retained so the access stays valid).
    SameProcess(sys::CUdeviceptr, Arc<CudaContext>),
}

const IPC_HANDLE_BYTES: usize = 64;
/// handle, size, pid, pointer, device ordinal.
const IPC_EXPORT_BYTES: usize = IPC_HANDLE_BYTES + 8 + 4 + 8 + 4;

impl SymmetricBackend for IpcBackend {
    type Local = DeviceAlloc;
    type Remote = IpcRemote;

    fn alloc_zeroed(&mut self, bytes: usize) -> Result<DeviceAlloc, Error> {
        alloc_zeroed(&self.ctx, bytes)
    }

    fn export(&mut self, local: &DeviceAlloc) -> Result<Vec<u8>, Error> {
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let mut handle = sys::CUipcMemHandle { reserved: [0; IPC_HANDLE_BYTES] };
        // SAFETY: `local.ptr` is the base of a live cuMemAlloc allocation of the current
        // context; the out-pointer is valid.
        unsafe { sys::cuIpcGetMemHandle(&mut handle, local.ptr) }.result().map_err(driver("cuIpcGetMemHandle"))?;
        let mut out: Vec<u8> = handle.reserved.iter().map(|&c| c as u8).collect();
        out.extend_from_slice(&(local.bytes as u64).to_le_bytes());
        out.extend_from_slice(&std::process::id().to_le_bytes());
        out.extend_from_slice(&local.ptr.to_le_bytes());
        out.extend_from_slice(&(self.ctx.ordinal() as u32).to_le_bytes());
        Ok(out)
    }

    fn import(&mut self, peer: usize, handle: &[u8], bytes: usize) -> Result<IpcRemote, Error> {
        if handle.len() != IPC_EXPORT_BYTES {
            return Err(Error::Protocol { peer: Some(peer), what: format!("IPC handle of {} bytes", handle.len()) });
        }
        let word = |at: usize, n: usize| {
            let mut b = [0u8; 8];
            b[..n].copy_from_slice(&handle[at..at + n]);
            u64::from_le_bytes(b)
        };
        let size = word(IPC_HANDLE_BYTES, 8);
        let pid = word(IPC_HANDLE_BYTES + 8, 4);
        let ptr = word(IPC_HANDLE_BYTES + 12, 8);
        let ordinal = word(IPC_HANDLE_BYTES + 20, 4) as usize;
        if size != bytes as u64 {
            return Err(Error::Protocol {
                peer: Some(peer),
                what: format!("workspace of {size} bytes, expected {bytes}"),
            });
        }
        if pid == u64::from(std::process::id()) {
            let to = CudaContext::new(ordinal).map_err(driver("cuDevicePrimaryCtxRetain"))?;
            if to.cu_device() != self.ctx.cu_device() {
                enable_peer_access(&self.ctx, &to)?;
            }
            return Ok(IpcRemote::SameProcess(ptr, to));
        }
        let mut h = sys::CUipcMemHandle { reserved: [0; IPC_HANDLE_BYTES] };
        for (d, s) in h.reserved.iter_mut().zip(handle) {
            *d = *s as std::ffi::c_char;
        }
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let mut mapped = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as std::ffi::c_uint;
        // SAFETY: the context is current; `h` is a handle exported by another process for a
        // live allocation (it keeps it alive until our teardown meeting); out-pointer valid.
        unsafe { sys::cuIpcOpenMemHandle_v2(&mut mapped, h, flags) }.result().map_err(driver("cuIpcOpenMemHandle"))?;
        Ok(IpcRemote::Ipc(mapped))
    }

    fn local_addr(&self, local: &DeviceAlloc) -> u64 {
        local.ptr
    }

    fn remote_addr(&self, remote: &IpcRemote) -> u64 {
        match remote {
            IpcRemote::Ipc(p) | IpcRemote::SameProcess(p, _) => *p,
        }
    }

    fn close(&mut self, remote: IpcRemote) {
        let IpcRemote::Ipc(ptr) = remote else { return };
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `ptr` came from cuIpcOpenMemHandle in this context and is closed
            // once; this rank's kernels that used it have completed. Unmapping never
            // accesses the peer's memory, so it is safe after the peer died.
            let _ = unsafe { sys::cuIpcCloseMemHandle(ptr) };
        }
    }

    fn free(&mut self, local: DeviceAlloc) {
        free(&self.ctx, local);
    }
}

/// Peer access between the GPUs of one process: the handle is the device pointer itself,
/// opening it enables peer access from this GPU to the peer's.
#[derive(Debug, Clone)]
pub struct PeerBackend {
    ctx: Arc<CudaContext>,
    /// Every rank's context, in rank order.
    peers: Vec<Arc<CudaContext>>,
}

impl PeerBackend {
    /// The backend for rank `ctx`, with every rank's context.
    pub fn new(ctx: Arc<CudaContext>, peers: Vec<Arc<CudaContext>>) -> Self {
        Self { ctx, peers }
    }
}

/// Enables peer access from `from` to `to` (idempotent).
pub(crate) fn enable_peer_access(from: &Arc<CudaContext>, to: &Arc<CudaContext>) -> Result<(), Error> {
    let mut can = 0;
    // SAFETY: out-pointer valid; both devices come from live contexts.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, from.cu_device(), to.cu_device()) }
        .result()
        .map_err(driver("cuDeviceCanAccessPeer"))?;
    if can != 1 {
        return Err(purlin_topo::TopoError::NoPeerAccess { from: from.ordinal(), to: to.ordinal() }.into());
    }
    from.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
    // SAFETY: `from` is current on this thread; `to` is a live context of another device.
    let status = unsafe { sys::cuCtxEnablePeerAccess(to.cu_ctx(), 0) };
    if status != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        status.result().map_err(driver("cuCtxEnablePeerAccess"))?;
    }
    Ok(())
}

impl SymmetricBackend for PeerBackend {
    type Local = DeviceAlloc;
    type Remote = sys::CUdeviceptr;

    fn alloc_zeroed(&mut self, bytes: usize) -> Result<DeviceAlloc, Error> {
        alloc_zeroed(&self.ctx, bytes)
    }

    fn export(&mut self, local: &DeviceAlloc) -> Result<Vec<u8>, Error> {
        let mut h = local.ptr.to_le_bytes().to_vec();
        h.extend_from_slice(&std::process::id().to_le_bytes());
        Ok(h)
    }

    fn import(&mut self, peer: usize, handle: &[u8], _bytes: usize) -> Result<sys::CUdeviceptr, Error> {
        let bad = || Error::Protocol { peer: Some(peer), what: "peer workspace handle".into() };
        let ptr: [u8; 8] = handle.get(..8).and_then(|a| a.try_into().ok()).ok_or_else(bad)?;
        let pid: [u8; 4] = handle.get(8..12).and_then(|a| a.try_into().ok()).ok_or_else(bad)?;
        if u32::from_le_bytes(pid) != std::process::id() {
            return Err(Error::Protocol { peer: Some(peer), what: "peer backend used across processes".into() });
        }
        let to = self.peers.get(peer).ok_or_else(bad)?;
        if to.cu_device() != self.ctx.cu_device() {
            enable_peer_access(&self.ctx, to)?;
        }
        Ok(u64::from_le_bytes(ptr))
    }

    fn local_addr(&self, local: &DeviceAlloc) -> u64 {
        local.ptr
    }

    fn remote_addr(&self, remote: &sys::CUdeviceptr) -> u64 {
        *remote
    }

    fn close(&mut self, _remote: sys::CUdeviceptr) {}

    fn free(&mut self, local: DeviceAlloc) {
        free(&self.ctx, local);
    }
}

/// Free and total device memory (`cuMemGetInfo`) on `ctx`'s device.
pub fn mem_info(ctx: &Arc<CudaContext>) -> Result<(usize, usize), Error> {
    ctx.mem_get_info().map_err(driver("cuMemGetInfo"))
}

/// The most blocks of `func` that can be resident at once on a device with `sm_count` SMs,
/// for `block_size` threads and `dynamic_smem` bytes of dynamic shared memory: the occupancy
/// API's blocks per SM × SMs. Kernels whose blocks wait on each other must not launch more.
pub fn max_coresident_blocks(
    func: &cudarc::driver::CudaFunction,
    block_size: u32,
    dynamic_smem: usize,
    sm_count: u32,
) -> Result<u32, Error> {
    let per_sm = func
        .occupancy_max_active_blocks_per_multiprocessor(block_size, dynamic_smem, None)
        .map_err(driver("cuOccupancyMaxActiveBlocksPerMultiprocessor"))?;
    Ok(per_sm.saturating_mul(sm_count))
}
