//! The device smoke test of a GPU round: an NVRTC-compiled kernel runs on every GPU, peer
//! access is enabled both ways, and a flag ping-pong through the protocol's own sync
//! primitives (`kernels/snac/sync.cuh`) measures the NVLink round trip.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaModule, DriverError, LaunchConfig, PushKernelArg, sys};
use cudarc::nvrtc::Ptx;
use purlin_atom::{Arch, KernelCache, NvrtcError, TranslationUnit};

/// What can stop the smoke test.
#[derive(Debug, thiserror::Error)]
pub enum SmokeError {
    /// No CUDA driver or no device.
    #[error("no CUDA device available")]
    NoDevice,
    /// A driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(#[from] DriverError),
    /// Kernel compilation failed.
    #[error(transparent)]
    Nvrtc(#[from] NvrtcError),
    /// A kernel produced a wrong result.
    #[error("GPU {device}: {what}")]
    Wrong {
        /// The device ordinal.
        device: usize,
        /// What was wrong.
        what: String,
    },
}

/// Per-GPU result of the smoke test.
#[derive(Debug, Clone)]
pub struct DeviceSmoke {
    /// Device ordinal.
    pub ordinal: usize,
    /// Device name.
    pub name: String,
    /// Compute capability.
    pub arch: Arch,
    /// Whether the kernel came from the on-disk cache (prebuilt by `cargo xtask gpu-round`).
    pub kernel_from_cache: bool,
    /// Elements checked against the host reference.
    pub elements_checked: usize,
}

/// The whole smoke report.
#[derive(Debug, Clone)]
pub struct SmokeReport {
    /// One entry per GPU.
    pub devices: Vec<DeviceSmoke>,
    /// `(i, j, enabled)` for each ordered pair of the first two GPUs.
    pub peer_access: Vec<(usize, usize, bool)>,
    /// Ping-pong rounds completed and the mean round trip in microseconds, if ≥ 2 GPUs.
    pub ping_pong: Option<(u64, f64)>,
}

const FILL_ELEMENTS: u32 = 1 << 20;
const PING_PONG_ROUNDS: u32 = 20_000;
const PING_PONG_TIMEOUT_NS: u64 = 2_000_000_000;

fn fill_reference(i: u32, seed: u32) -> u32 {
    i.wrapping_mul(2_654_435_761) ^ seed
}

/// The compute capability of `ctx`'s GPU.
fn arch_of(ctx: &Arc<CudaContext>) -> Result<Arch, SmokeError> {
    let (major, minor) = ctx.compute_capability()?;
    Ok(Arch { major: major as u32, minor: minor as u32 })
}

/// `unit` compiled for `arch` (through `cache`) and loaded on `ctx`; whether the CUBIN came
/// from the cache.
fn load_unit(
    ctx: &Arc<CudaContext>,
    cache: &KernelCache,
    unit: &TranslationUnit,
    arch: Arch,
) -> Result<(Arc<CudaModule>, bool), SmokeError> {
    let compiled = cache.get_or_compile(unit, arch)?;
    Ok((ctx.load_module(Ptx::from_binary(compiled.cubin))?, compiled.from_cache))
}

/// Runs the smoke test on every visible GPU (the ping-pong on GPUs 0 and 1).
pub fn run(cache: &KernelCache) -> Result<SmokeReport, SmokeError> {
    let count = purlin_topo::device_count();
    if count == 0 {
        return Err(SmokeError::NoDevice);
    }
    let unit = crate::gpu::kernels::smoke_unit();
    let mut contexts = Vec::new();
    let mut modules = Vec::new();
    let mut devices = Vec::new();
    for ordinal in 0..count {
        let ctx = CudaContext::new(ordinal)?;
        let arch = arch_of(&ctx)?;
        let (module, from_cache) = load_unit(&ctx, cache, &unit, arch)?;
        let stream = ctx.default_stream();
        let fill = module.load_function("purlin_smoke_fill")?;
        let mut out = stream.alloc_zeros::<u32>(FILL_ELEMENTS as usize)?;
        let seed = 0x9e37_79b9_u32 ^ ordinal as u32;
        let mut launch = stream.launch_builder(&fill);
        launch.arg(&mut out).arg(&FILL_ELEMENTS).arg(&seed);
        // SAFETY: the kernel's signature is (u32*, u32, u32), matching the arguments; `out`
        // holds FILL_ELEMENTS elements and the kernel writes only indices below that.
        unsafe { launch.launch(LaunchConfig::for_num_elems(FILL_ELEMENTS)) }?;
        let host = stream.clone_dtoh(&out)?;
        if let Some(i) = (0..FILL_ELEMENTS).find(|&i| host[i as usize] != fill_reference(i, seed)) {
            return Err(SmokeError::Wrong { device: ordinal, what: format!("fill element {i} wrong") });
        }
        devices.push(DeviceSmoke {
            ordinal,
            name: ctx.name()?,
            arch,
            kernel_from_cache: from_cache,
            elements_checked: FILL_ELEMENTS as usize,
        });
        contexts.push(ctx);
        modules.push(module);
    }
    let mut report = SmokeReport { devices, peer_access: Vec::new(), ping_pong: None };
    if count >= 2 {
        report.peer_access = enable_peer_access(&contexts[0], &contexts[1])?;
        if report.peer_access.iter().all(|&(_, _, ok)| ok) {
            report.ping_pong = Some(ping_pong(&contexts[..2], &modules[..2])?);
        }
    }
    Ok(report)
}

fn enable_peer_access(a: &Arc<CudaContext>, b: &Arc<CudaContext>) -> Result<Vec<(usize, usize, bool)>, SmokeError> {
    let mut out = Vec::new();
    for (from, to) in [(a, b), (b, a)] {
        let mut can = 0;
        // SAFETY: out-pointer valid; both devices come from live contexts.
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, from.cu_device(), to.cu_device()) }.result()?;
        if can == 1 {
            from.bind_to_thread()?;
            // SAFETY: `from` is bound to this thread; `to` is a live context on another device.
            let status = unsafe { sys::cuCtxEnablePeerAccess(to.cu_ctx(), 0) };
            if status != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
                status.result()?;
            }
        }
        out.push((from.ordinal(), to.ordinal(), can == 1));
    }
    Ok(out)
}

/// Zeroed device memory allocated with `cuMemAlloc` (peer access applies to it; cudarc's
/// stream-ordered pool memory would need pool access rights instead).
struct RawBuffer {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
}

impl RawBuffer {
    fn zeroed(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self, SmokeError> {
        ctx.bind_to_thread()?;
        let mut ptr = 0;
        // SAFETY: the context is current; out-pointer valid.
        unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) }.result()?;
        let buffer = Self { ctx: ctx.clone(), ptr };
        // SAFETY: `ptr` is a fresh allocation of `bytes` bytes; the memset completes before
        // any kernel can see the buffer (it is synchronous with respect to the host).
        unsafe { sys::cuMemsetD8_v2(ptr, 0, bytes) }.result()?;
        Ok(buffer)
    }
}

impl Drop for RawBuffer {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `ptr` came from cuMemAlloc in this context and is freed once; the
            // kernels using it were synchronized before the flag goes out of scope.
            let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
        }
    }
}

fn ping_pong(
    contexts: &[Arc<CudaContext>],
    modules: &[Arc<cudarc::driver::CudaModule>],
) -> Result<(u64, f64), SmokeError> {
    let flags = [RawBuffer::zeroed(&contexts[0], 8)?, RawBuffer::zeroed(&contexts[1], 8)?];
    let streams: Vec<_> = contexts.iter().map(|c| c.default_stream()).collect();
    let mut results = Vec::new();
    for s in &streams {
        results.push(s.alloc_zeros::<u64>(2)?);
    }
    // The responder (GPU 1) is launched first so that it is polling when the initiator starts.
    for side in [1usize, 0] {
        let func = modules[side].load_function("purlin_smoke_pingpong")?;
        let (my_flag, peer_flag) = (flags[side].ptr, flags[1 - side].ptr);
        let initiator = u32::from(side == 0);
        let mut launch = streams[side].launch_builder(&func);
        launch
            .arg(&my_flag)
            .arg(&peer_flag)
            .arg(&PING_PONG_ROUNDS)
            .arg(&initiator)
            .arg(&PING_PONG_TIMEOUT_NS)
            .arg(&mut results[side]);
        let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the signature is (u64*, u64*, u32, u32, u64, u64*); the flags are live
        // cuMemAlloc words, the peer one reachable because peer access was enabled; every
        // wait in the kernel is bounded by PING_PONG_TIMEOUT_NS.
        unsafe { launch.launch(one) }?;
    }
    for s in &streams {
        s.synchronize()?;
    }
    let initiator = streams[0].clone_dtoh(&results[0])?;
    let responder = streams[1].clone_dtoh(&results[1])?;
    for (device, r) in [(0, &initiator), (1, &responder)] {
        if r[0] != u64::from(PING_PONG_ROUNDS) {
            return Err(SmokeError::Wrong {
                device,
                what: format!("ping-pong completed {} of {PING_PONG_ROUNDS} rounds (timed out)", r[0]),
            });
        }
    }
    Ok((initiator[0], initiator[1] as f64 / initiator[0] as f64 / 1e3))
}

/// Result of the torn-packet stress test, summed over both directions.
#[derive(Debug, Clone, Copy)]
pub struct PacketStress {
    /// 16-byte packets received and checked.
    pub packets: u64,
    /// Packets whose flag was the round's but whose data was not: torn.
    pub torn: u64,
    /// Receiver blocks whose bounded wait expired (0 on a healthy run).
    pub timed_out_blocks: u64,
    /// Wall time of the test on the host, seconds.
    pub seconds: f64,
}

/// Pushes `rounds × pairs × per_block` 16-byte packets from each of GPUs 0 and 1 into the
/// other's window, both directions at once, and counts torn packets
/// (`kernels/snac/packet_stress.cu`). Needs two GPUs with peer access.
pub fn packet_stress(cache: &KernelCache, pairs: u32, per_block: u32, rounds: u32) -> Result<PacketStress, SmokeError> {
    if purlin_topo::device_count() < 2 {
        return Err(SmokeError::NoDevice);
    }
    let contexts = [CudaContext::new(0)?, CudaContext::new(1)?];
    if !enable_peer_access(&contexts[0], &contexts[1])?.iter().all(|p| p.2) {
        return Err(SmokeError::Wrong { device: 0, what: "no peer access between GPUs 0 and 1".into() });
    }
    let unit = crate::gpu::kernels::packet_stress_unit();
    let window_bytes = 2 * pairs as usize * per_block as usize * 16;
    let mut windows = Vec::new();
    let mut acks = Vec::new();
    let mut functions = Vec::new();
    for ctx in &contexts {
        let (module, _) = load_unit(ctx, cache, &unit, arch_of(ctx)?)?;
        functions.push(module.load_function("purlin_packet_stress")?);
        windows.push(RawBuffer::zeroed(ctx, window_bytes)?);
        acks.push(RawBuffer::zeroed(ctx, pairs as usize * 8)?);
    }
    let streams: Vec<_> = contexts.iter().map(|c| c.default_stream()).collect();
    let mut results = Vec::new();
    for s in &streams {
        results.push(s.alloc_zeros::<u64>(4 * pairs as usize)?);
    }
    let timeout_ns: u64 = 5_000_000_000;
    let started = std::time::Instant::now();
    for side in [1usize, 0] {
        let peer = 1 - side;
        let (peer_window, my_window) = (windows[peer].ptr, windows[side].ptr);
        let (peer_acks, my_acks) = (acks[peer].ptr, acks[side].ptr);
        let mut launch = streams[side].launch_builder(&functions[side]);
        launch
            .arg(&peer_window)
            .arg(&my_window)
            .arg(&peer_acks)
            .arg(&my_acks)
            .arg(&pairs)
            .arg(&per_block)
            .arg(&rounds)
            .arg(&timeout_ns)
            .arg(&mut results[side]);
        let grid = LaunchConfig { grid_dim: (2 * pairs, 1, 1), block_dim: (512, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the signature is (Packet16*, Packet16*, u64*, u64*, u32, u32, u32, u64, u64*);
        // both windows hold 2 * pairs * per_block packets and both ack arrays `pairs` words, all
        // cuMemAlloc memory reachable through the peer access enabled above; `results` holds
        // 4 * pairs words; every wait in the kernel is bounded by `timeout_ns`.
        unsafe { launch.launch(grid) }?;
    }
    for s in &streams {
        s.synchronize()?;
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut total = PacketStress { packets: 0, torn: 0, timed_out_blocks: 0, seconds };
    for (s, r) in streams.iter().zip(&results) {
        let r = s.clone_dtoh(r)?;
        for block in r.chunks_exact(4) {
            total.packets += block[0];
            total.torn += block[1];
            total.timed_out_blocks += block[2];
        }
    }
    Ok(total)
}

/// Checks exec.cuh's packet payload loads and stores on GPU 0 with packets of
/// `packet_bytes` (8 or 16): every payload length from 0 to a full payload, from and to
/// every byte offset 0..7, against the bytes the host wrote. Returns the cases checked.
pub fn payload_round_trip(cache: &KernelCache, packet_bytes: u32) -> Result<usize, SmokeError> {
    const SLOT: usize = 32; // kSlot in payload_probe.cu
    const POISON: u8 = 0xee;
    if purlin_topo::device_count() < 1 {
        return Err(SmokeError::NoDevice);
    }
    let ctx = CudaContext::new(0)?;
    let arch = arch_of(&ctx)?;
    let generation =
        purlin_atom::Generation::for_arch(arch).map_err(|e| SmokeError::Wrong { device: 0, what: e.to_string() })?;
    let (module, _) = load_unit(&ctx, cache, &crate::gpu::kernels::payload_probe_unit(generation, packet_bytes), arch)?;
    let probe = module.load_function("purlin_payload_probe")?;
    let payload = packet_bytes as usize / 2;
    let cases = 64 * (payload + 1);
    // Distinct bytes from a fixed LCG, so a byte from the wrong place cannot match.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let src: Vec<u8> = (0..cases * SLOT)
        .map(|_| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (state >> 56) as u8
        })
        .collect();
    let stream = ctx.default_stream();
    let src_dev = stream.clone_htod(&src)?;
    let mut dst_dev = stream.clone_htod(&vec![POISON; cases * SLOT])?;
    let mut launch = stream.launch_builder(&probe);
    launch.arg(&src_dev).arg(&mut dst_dev);
    let grid = LaunchConfig { grid_dim: (cases.div_ceil(64) as u32, 1, 1), block_dim: (64, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: the signature is (const u8*, u8*); both buffers hold `cases` slots of SLOT
    // bytes, and thread t touches only bytes of slot t below offset 7 + payload <= SLOT.
    unsafe { launch.launch(grid) }?;
    let dst = stream.clone_dtoh(&dst_dev)?;
    for t in 0..cases {
        let (from, to, bytes) = (t % 8, t / 8 % 8, t / 64);
        let slot = &dst[SLOT * t..SLOT * (t + 1)];
        let want_at = |i: usize| {
            if (to..to + bytes).contains(&i) { src[SLOT * t + from + i - to] } else { POISON }
        };
        if let Some(i) = (0..SLOT).find(|&i| slot[i] != want_at(i)) {
            return Err(SmokeError::Wrong {
                device: 0,
                what: format!(
                    "{packet_bytes}-byte packets: {bytes} payload bytes from offset {from} to offset {to}: byte {i} is {:#04x}, expected {:#04x}",
                    slot[i],
                    want_at(i)
                ),
            });
        }
    }
    Ok(cases)
}
