//! The set-up sequence both process models share (the parent module's docs): agreed steps,
//! device checks, kernel compiles and co-residency bounds, the workspace.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaStream, sys};
use cudarc::nvrtc::Ptx;
use purlin_atom::{Arch, KernelCache};
use purlin_topo::{Device, GenerationHint};

use super::{CoResidency, Comm, CommConfig, KernelRequest, LoadedKernel, Owner};
use crate::bootstrap::HostComm;
use crate::error::{Error, driver};
use crate::gpu::executor::DeviceExecutor;
use crate::gpu::ipc::{IpcBackend, PeerBackend, max_coresident_blocks};
use crate::workspace::{SymmetricWorkspace, WorkspaceLayout};

/// Turns this rank's outcome of a step into everyone's: all ranks exchange their status;
/// this rank's own error is returned as is, a peer's as a [`Error::PeerFailed`] naming it.
pub(super) fn agree<T>(host: &HostComm, mine: Result<T, Error>, during: &str) -> Result<T, Error> {
    let status = match &mine {
        Ok(_) => String::new(),
        Err(e) => format!("{e}"),
    };
    let all = match host.all_gather(status.as_bytes(), during) {
        Ok(all) => all,
        Err(e) => return mine.and(Err(e)),
    };
    let value = mine?;
    if let Some((peer, why)) = all.iter().enumerate().find(|(_, s)| !s.is_empty()) {
        return Err(Error::PeerFailed {
            rank: host.rank(),
            peer,
            during: during.into(),
            error: String::from_utf8_lossy(why).into_owned(),
        });
    }
    Ok(value)
}

fn encode_device(d: &Device) -> Vec<u8> {
    // Plain text fields separated by NULs: no serde format needed between ranks.
    let uuid = d.uuid.clone().unwrap_or_default();
    [
        d.ordinal.to_string(),
        d.name.clone(),
        uuid,
        d.compute_capability.major.to_string(),
        d.compute_capability.minor.to_string(),
        d.sm_count.to_string(),
        d.total_memory_bytes.to_string(),
        d.pci_bus_id.clone(),
    ]
    .join("\0")
    .into_bytes()
}

fn decode_device(peer: usize, bytes: &[u8]) -> Result<Device, Error> {
    let text = String::from_utf8_lossy(bytes);
    let f: Vec<&str> = text.split('\0').collect();
    let bad = || Error::Protocol { peer: Some(peer), what: "device description".into() };
    if f.len() != 8 {
        return Err(bad());
    }
    let num = |s: &str| s.parse::<u64>().map_err(|_| bad());
    Ok(Device {
        ordinal: num(f[0])? as usize,
        name: f[1].into(),
        uuid: (!f[2].is_empty()).then(|| f[2].to_string()),
        compute_capability: purlin_topo::ComputeCapability { major: num(f[3])? as u32, minor: num(f[4])? as u32 },
        sm_count: num(f[5])? as u32,
        total_memory_bytes: num(f[6])?,
        pci_bus_id: f[7].into(),
        max_shared_memory_per_block_optin: 0,
        cooperative_launch: false,
    })
}

/// Whether two device descriptions are the same GPU (UUIDs where known, else PCI bus ids).
fn same_gpu(a: &Device, b: &Device) -> bool {
    match (&a.uuid, &b.uuid) {
        (Some(x), Some(y)) => x == y,
        _ => a.pci_bus_id == b.pci_bus_id,
    }
}

/// Local checks of the gathered devices: one generation, distinct GPUs (unless
/// `shared_gpu`), peer access from this GPU to every other GPU this process can see.
fn check_devices(
    rank: usize,
    devices: &[Device],
    ctx: &Arc<CudaContext>,
    shared_gpu: bool,
) -> Result<GenerationHint, Error> {
    let refs: Vec<&Device> = devices.iter().collect();
    let (_, generation) = purlin_topo::common_generation(&refs)?;
    let me = &devices[rank];
    for (peer, d) in devices.iter().enumerate() {
        if peer == rank {
            continue;
        }
        if same_gpu(d, me) {
            if shared_gpu {
                continue;
            }
            return Err(Error::Mismatch {
                rank,
                peer,
                what: format!("both ranks drive the same GPU ({}; PURLIN_SHARED_GPU=1 allows it)", d.pci_bus_id),
            });
        }
        let Ok(bus) = std::ffi::CString::new(d.pci_bus_id.clone()) else { continue };
        let mut dev: sys::CUdevice = 0;
        // SAFETY: `bus` is NUL-terminated; out-pointer valid. A GPU hidden from this process
        // (CUDA_VISIBLE_DEVICES) is simply not found, and then CUDA IPC decides.
        if unsafe { sys::cuDeviceGetByPCIBusId(&mut dev, bus.as_ptr()) } != sys::CUresult::CUDA_SUCCESS {
            continue;
        }
        let mut can = 0;
        // SAFETY: out-pointer valid; both devices valid after cuInit.
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, ctx.cu_device(), dev) }
            .result()
            .map_err(driver("cuDeviceCanAccessPeer"))?;
        if can != 1 {
            return Err(purlin_topo::TopoError::NoPeerAccess { from: ctx.ordinal(), to: dev as usize }.into());
        }
    }
    Ok(generation)
}

pub(super) enum Backend {
    Ipc(IpcBackend),
    Peer(PeerBackend),
}

/// The set-up sequence shared by both process models (module docs).
pub(super) fn setup(
    stream: Arc<CudaStream>,
    host: HostComm,
    config: &CommConfig,
    backend: Backend,
) -> Result<Comm, Error> {
    let (rank, world) = (host.rank(), host.world());
    // Every rank sees the same world, so all fail alike, before any kernel is compiled.
    if !purlin_snac::WORLD_RANGE.contains(&world) {
        return Err(purlin_snac::SpecError::WorldOutOfRange { world: world.min(u32::MAX as usize) as u32 }.into());
    }
    let ctx = stream.context().clone();
    let layout = WorkspaceLayout::new(config.workspace, world)?;

    let device = purlin_topo::local_device(ctx.ordinal()).map_err(Error::from);
    let device = agree(&host, device, "set-up: describing the GPU")?;
    let gathered = host.all_gather(&encode_device(&device), "set-up: exchanging GPU descriptions")?;
    let devices: Vec<Device> =
        gathered.iter().enumerate().map(|(p, b)| decode_device(p, b)).collect::<Result<_, _>>()?;
    let generation = agree(&host, check_devices(rank, &devices, &ctx, config.shared_gpu), "set-up: checking the GPUs")?;
    // Ranks sharing this GPU (only with `shared_gpu`) split its co-resident blocks.
    let sharing = devices.iter().filter(|d| same_gpu(d, &device)).count().max(1) as u32;

    // Every rank must ask for the same kernels (else the bounds below would pair up wrongly).
    let wanted: Vec<String> = config.kernels.iter().map(KernelRequest::digest).collect();
    let lists = host.all_gather(wanted.join("\n").as_bytes(), "set-up: kernel lists")?;
    if let Some(peer) = lists.iter().position(|l| *l != wanted.join("\n").into_bytes()) {
        return Err(Error::Mismatch { rank, peer, what: "the kernels requested in CommConfig::kernels".into() });
    }

    // Ranks plan each call on their own, so they must plan alike: a writer and a reader with
    // different chunks, block counts or regimes would wait out the device timeout.
    let tuning = format!("{:?}, call check {}", config.tuning, config.call_check);
    let tunings = host.all_gather(tuning.as_bytes(), "set-up: tuning")?;
    if let Some(peer) = tunings.iter().position(|t| *t != tuning.as_bytes()) {
        return Err(Error::Mismatch {
            rank,
            peer,
            what: "the tuning (CommConfig::tuning and call_check, PURLIN_* variables)".into(),
        });
    }

    // Copy engines only where every rank has them: each rank plans a call for the copy
    // engines on its own, so all must be able to run such plans or none plans them.
    let engine = purlin_atom::copy_engine::CopyEngine::new(&ctx);
    if let Err(e) = &engine {
        tracing::debug!(rank, error = %e, "no copy engine on this GPU: one-copy gathers stay on SM blocks");
    }
    let engines = host.all_gather(&[u8::from(engine.is_ok())], "set-up: copy engines")?;
    let copy_engine = engine.ok().filter(|_| engines.iter().all(|e| e.first() == Some(&1)));
    if copy_engine.is_none() && config.tuning.datapath != crate::call::tuning::Datapath::Sm {
        tracing::warn!(rank, "a rank's GPU has no 64-bit stream memory operations: no call runs on the copy engines");
    }

    // Kernels are compiled before the final barrier, so a peer compiling for seconds is
    // waited for under the set-up timeout, not taken for dead later.
    let cache = config.kernel_cache.clone().map_or_else(KernelCache::default_location, KernelCache::new);
    let kernels = (|| {
        // One compile at a time in this process: the ranks of `from_devices` would otherwise
        // compile the same key at once, and KernelCache's temporary file is named by pid only.
        let _one_at_a_time = COMPILE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let arch = Arch { major: device.compute_capability.major, minor: device.compute_capability.minor };
        let load = |unit: &purlin_atom::TranslationUnit, name: &str, block: u32, smem: usize| {
            let started = std::time::Instant::now();
            let compiled = cache.get_or_compile(unit, arch)?;
            tracing::debug!(
                rank,
                kernel = name,
                from_cache = compiled.from_cache,
                seconds = started.elapsed().as_secs_f64(),
                "kernel {}",
                if compiled.from_cache { "cache hit" } else { "compiled (cache miss)" }
            );
            let module = ctx.load_module(Ptx::from_binary(compiled.cubin)).map_err(driver("cuModuleLoadData"))?;
            let function = module.load_function(name).map_err(driver("cuModuleGetFunction"))?;
            let bound = max_coresident_blocks(&function, block, smem, device.sm_count)?;
            Ok::<_, Error>((module, function, bound))
        };
        let smoke = load(&crate::gpu::kernels::smoke_unit(), "purlin_smoke_pingpong", 32, 0)?;
        let generation = purlin_atom::Generation::choose(arch, None)
            .map_err(|e| Error::Unsupported(format!("no Atom for this GPU: {e}")))?;
        let exec = DeviceExecutor::load(&ctx, &cache, arch, generation, device.sm_count, world as u32)?;
        let extra = config
            .kernels
            .iter()
            .map(|r| load(&r.unit, &r.function, r.block_size, r.dynamic_smem).map(|k| (r.clone(), k)))
            .collect::<Result<Vec<_>, Error>>()?;
        Ok::<_, Error>((smoke, extra, exec))
    })();
    let ((module, pingpong, local_bound), extra, exec) = agree(&host, kernels, "set-up: compiling kernels")?;
    let locals: Vec<u32> = std::iter::once(local_bound)
        .chain(extra.iter().map(|(_, k)| k.2))
        .chain(std::iter::once(exec.coresident_local()))
        .map(|bound| (bound / sharing).max(1))
        .collect();
    let bytes: Vec<u8> = locals.iter().flat_map(|b| b.to_le_bytes()).collect();
    let all = host.all_gather(&bytes, "set-up: co-residency bounds")?;
    let mut agreed = locals.clone();
    for (peer, theirs) in all.iter().enumerate() {
        if theirs.len() != bytes.len() {
            return Err(Error::Protocol { peer: Some(peer), what: "co-residency bounds".into() });
        }
        for (a, chunk) in agreed.iter_mut().zip(theirs.chunks_exact(4)) {
            *a = (*a).min(u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]));
        }
    }
    let min_bound = agreed[0];
    let exec_bound = agreed[agreed.len() - 1].saturating_sub(1).max(1);
    let kernels: Vec<LoadedKernel> = extra
        .into_iter()
        .zip(&agreed[1..agreed.len() - 1])
        .map(|((request, (module, function, local)), &coresident)| LoadedKernel {
            request,
            module,
            function,
            coresident_local: local,
            coresident,
        })
        .collect();

    let peer_path = match &backend {
        Backend::Ipc(_) => "CUDA IPC (one process per GPU)",
        Backend::Peer(_) => "peer access (one process, several GPUs)",
    };
    log_setup(rank, &devices, generation, peer_path, config.shared_gpu);
    let (addrs, owner) = match backend {
        Backend::Ipc(mut b) => {
            let ws = SymmetricWorkspace::establish(&host, &mut b, layout.clone())?;
            (ws.addrs().to_vec(), Owner::Ipc(Some((ws, b))))
        }
        Backend::Peer(mut b) => {
            let ws = SymmetricWorkspace::establish(&host, &mut b, layout.clone())?;
            (ws.addrs().to_vec(), Owner::Peer(Some((ws, b))))
        }
    };
    let comm = Comm {
        stream,
        rank,
        world,
        host,
        device,
        devices,
        generation,
        layout,
        addrs,
        module,
        pingpong,
        coresidency: CoResidency { smoke_pingpong: min_bound, smoke_pingpong_local: local_bound },
        kernels,
        exec,
        exec_bound,
        tuning: config.tuning,
        verify: config.verify,
        device_timeout: config.device_timeout,
        plans: Mutex::new(HashMap::new()),
        poison: Mutex::new(None),
        next_flag_slot: Mutex::new(vec![0; world]),
        calls_launched: AtomicU64::new(0),
        call_check: config.call_check,
        flight: Mutex::new(crate::flight::FlightRecorder::new()),
        symmetric: Mutex::new(vec![]),
        kernel_cache: cache,
        gpu_sharing: sharing,
        launches: Default::default(),
        copy_engine,
        owner,
    };
    comm.host.barrier("set-up: final barrier")?;
    tracing::info!(
        rank,
        world,
        workspace_bytes = comm.layout.total_bytes,
        exec_bound,
        call_check = comm.call_check,
        "set-up done: {} workspace bytes per rank, plans of up to {exec_bound} blocks",
        comm.layout.total_bytes
    );
    Ok(comm)
}

/// Set-up's info lines: the GPUs, the peer path, and the NVRTC and driver versions.
fn log_setup(rank: usize, devices: &[Device], generation: GenerationHint, peer_path: &str, shared_gpu: bool) {
    if !tracing::enabled!(tracing::Level::INFO) {
        return;
    }
    let gpus: Vec<String> = devices
        .iter()
        .enumerate()
        .map(|(r, d)| {
            format!(
                "rank {r}: GPU {} {} sm_{}{} {}",
                d.ordinal, d.name, d.compute_capability.major, d.compute_capability.minor, d.pci_bus_id
            )
        })
        .collect();
    let nvrtc = purlin_atom::nvrtc::version().map_or_else(|e| format!("unknown ({e})"), |(a, b)| format!("{a}.{b}"));
    let mut driver = 0;
    // SAFETY: out-pointer valid; the driver is initialised (a context exists).
    let driver = match unsafe { sys::cuDriverGetVersion(&mut driver) }.result() {
        Ok(()) => format!("{}.{}", driver / 1000, driver % 1000 / 10),
        Err(e) => format!("unknown ({e})"),
    };
    tracing::info!(rank, generation = ?generation, shared_gpu, "set-up: topology: {}", gpus.join("; "));
    tracing::info!(rank, peer_path, nvrtc = %nvrtc, driver = %driver, "set-up: peer path {peer_path}, NVRTC {nvrtc}, CUDA driver {driver}");
}

/// Serialises kernel-cache lookups and compiles within this process.
static COMPILE_LOCK: Mutex<()> = Mutex::new(());
