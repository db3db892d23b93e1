//! The device executor's host side: loads the executor kernels (`kernels/snac/executor.cu`)
//! for every key the runtime can request, and launches one per call with the call's pointers
//! as a `__grid_constant__` kernel parameter and the plan's parameter block: by value where
//! the launch is captured into a CUDA graph (the graph keeps it), else in device memory,
//! uploaded at the plan's first eager launch, for calls up to
//! `Tuning::device_params_max_bytes` (an eager launch would otherwise upload the whole
//! 31 KiB block every time: 2.4 µs per launch, round 49).
//!
//! Launches are cooperative: a grid that cannot be co-resident fails at launch instead of
//! hanging (plans stay one block below the co-residency bound agreed at set-up: every launch
//! adds the call check's block, kernels/snac/exec.cuh). No cudarc event is
//! recorded by a launch (every argument is a plain value), so launches can be captured in
//! CUDA graphs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg, sys};
use cudarc::nvrtc::Ptx;
use purlin_atom::{Arch, AtomSpec, DType, Generation, KernelCache};
use purlin_snac::{PacketFormat, Plan, ReduceOp};

use crate::call::types::atom_dtype;
use crate::error::{Error, driver};
use crate::gpu::kernels::{
    EXEC_PARAM_WORDS, EXEC_RUNTIME_BYTES, ExecKey, ExecOp, ShapedKey, executor_keys, packet_bytes_for,
};

/// Ranks the executor's `Runtime` has room for (`kMaxWorld` in `kernels/snac/exec.cuh`).
pub use purlin_snac::MAX_WORLD;

/// The per-call pointers (`struct Runtime` in `kernels/snac/executor.cu`, field for field).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ExecRuntime {
    /// This rank's input.
    pub input: u64,
    /// This rank's output.
    pub output: u64,
    /// Every rank's staging base, as mapped here.
    pub staging: [u64; MAX_WORLD],
    /// Every rank's packet window base.
    pub window: [u64; MAX_WORLD],
    /// Every rank's flag words.
    pub flags: [u64; MAX_WORLD],
    /// This rank's arrival counters.
    pub counters: u64,
    /// This rank's per-block epochs.
    pub epochs: u64,
    /// This rank's control words (poison word and failure record).
    pub control: u64,
    /// Bound of every device wait, nanoseconds.
    pub timeout_ns: u64,
    /// Debug trace buffer (0: off).
    pub trace: u64,
    /// Trace entries per block.
    pub trace_capacity: u32,
    /// This rank's count of launched calls, this one included: the call check's number
    /// (kernels/snac/exec.cuh `run_call_check`); 0: no check, no check block. It shares a
    /// word with `trace_capacity` so that every word the plan reads keeps its pre-check offset
    /// in the constant bank: moved 8 bytes later, they cost small graph calls ≈ 0.2 µs (round 149).
    pub call_number: u32,
    /// Every rank's registered output as mapped here (one-copy plans; own rank: `output`).
    pub peer_output: [u64; MAX_WORLD],
    /// Every rank's registered input as mapped here (one-copy plans; own rank: `input`).
    pub peer_input: [u64; MAX_WORLD],
}

const _: () = assert!(std::mem::size_of::<ExecRuntime>() == EXEC_RUNTIME_BYTES);

// SAFETY: ExecRuntime is #[repr(C)], made of u64s and one pair of u32s (no padding), and
// matches the kernel's `Runtime` parameter field for field (size checked above, offsets by
// the order).
unsafe impl DeviceRepr for ExecRuntime {}

/// The plan's parameter block, passed by value (the kernel's `ParamBlock<PURLIN_PARAM_WORDS>`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ParamWords {
    /// The plan's words (purlin_snac::params), zero-padded.
    pub words: [u64; EXEC_PARAM_WORDS],
}

// SAFETY: a #[repr(C)] array of u64s, the layout of the kernel's `ParamBlock<N>` for
// N = EXEC_PARAM_WORDS, the -D option every executor module is compiled with.
unsafe impl DeviceRepr for ParamWords {}

impl ParamWords {
    /// The block for `words`; a plan longer than the block is unsupported.
    pub fn new(words: &[u64]) -> Result<Box<Self>, Error> {
        if words.len() > EXEC_PARAM_WORDS {
            return Err(Error::Unsupported(format!(
                "a plan of {} parameter words (the executor takes {EXEC_PARAM_WORDS})",
                words.len()
            )));
        }
        let mut p = Box::new(Self { words: [0; EXEC_PARAM_WORDS] });
        p.words[..words.len()].copy_from_slice(words);
        Ok(p)
    }
}

/// A plan made ready to launch ([`DeviceExecutor::params`]): its parameter block, whether
/// the shaped executor runs it, and the block's copy in device memory once an eager launch
/// has uploaded it.
///
/// The copy is uploaded on the stream of the plan's first eager launch, so one `ExecParams`
/// is launched on one stream (a `Comm` launches on its own).
#[derive(Debug)]
pub struct ExecParams {
    block: Box<ParamWords>,
    /// The plan's words (the block's unpadded prefix).
    len: usize,
    shaped: bool,
    /// Whether eager launches read the block from device memory.
    eager_from_device: bool,
    /// Where the block was uploaded (`None`: the arena was full, launches pass it by value).
    device: OnceLock<Option<u64>>,
}

impl ExecParams {
    /// The plan's parameter words.
    fn words(&self) -> &[u64] {
        &self.block.words[..self.len]
    }
}

/// One module's two entry points (same code; the parameter block by value, or in device
/// memory).
#[derive(Debug)]
struct EntryPoints {
    by_value: CudaFunction,
    global: CudaFunction,
    _module: Arc<CudaModule>,
}

impl EntryPoints {
    /// Loads the entry points `NAME` and `NAME_global` from `module`, letting each use `smem`
    /// bytes of dynamic shared memory; returns them with the lower of their co-residency
    /// bounds.
    fn load(
        module: Arc<CudaModule>,
        name: &str,
        atom: AtomSpec,
        smem: u32,
        sm_count: u32,
    ) -> Result<(Self, u32), Error> {
        let entry = |name: &str| -> Result<CudaFunction, Error> {
            let function = module.load_function(name).map_err(driver("cuModuleGetFunction"))?;
            if smem > 48 << 10 {
                function
                    .set_attribute(
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        smem as i32,
                    )
                    .map_err(driver("cuFuncSetAttribute"))?;
            }
            Ok(function)
        };
        let entries =
            EntryPoints { by_value: entry(name)?, global: entry(&format!("{name}_global"))?, _module: module };
        let mut bound = u32::MAX;
        for function in [&entries.by_value, &entries.global] {
            bound =
                bound.min(crate::gpu::ipc::max_coresident_blocks(function, atom.threads(), smem as usize, sm_count)?);
        }
        Ok((entries, bound))
    }
}

/// Environment variable that turns cooperative launches off (`0`), for A/B runs.
pub const COOPERATIVE_ENV: &str = "PURLIN_COOPERATIVE";

/// Device memory holding uploaded parameter blocks: handed out front to back, never
/// rewritten (a prepared plan keeps its block for the communicator's life), freed with the
/// executor. When full, later plans pass their blocks by value.
#[derive(Debug)]
struct ParamArena {
    ctx: Arc<CudaContext>,
    base: sys::CUdeviceptr,
    bytes: usize,
    used: Mutex<usize>,
}

/// Bytes of each GPU's parameter arena: room for 130 full-size blocks, or thousands of
/// small ones (a latency plan takes 100-600 words).
const PARAM_ARENA_BYTES: usize = 4 << 20;

impl ParamArena {
    fn new(ctx: &Arc<CudaContext>) -> Result<Self, Error> {
        ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let mut base = 0;
        // SAFETY: the context is current on this thread; the out-pointer is valid.
        unsafe { sys::cuMemAlloc_v2(&mut base, PARAM_ARENA_BYTES) }.result().map_err(driver("cuMemAlloc"))?;
        Ok(Self { ctx: ctx.clone(), base, bytes: PARAM_ARENA_BYTES, used: Mutex::new(0) })
    }

    /// Room for `bytes`, or `None` when the arena is full.
    fn take(&self, bytes: usize) -> Option<u64> {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        bump(&mut used, bytes, self.bytes).map(|at| self.base + at as u64)
    }
}

/// Hands out `bytes` at the next 128-byte boundary after `used` (a block's first words share
/// no cache line with another block's) within `capacity`; `None`, with `used` unchanged, when
/// they do not fit.
fn bump(used: &mut usize, bytes: usize, capacity: usize) -> Option<usize> {
    let at = used.next_multiple_of(128);
    if at.checked_add(bytes)? > capacity {
        return None;
    }
    *used = at + bytes;
    Some(at)
}

impl Drop for ParamArena {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `base` came from cuMemAlloc in this context and is freed once; the
            // executor is dropped with its communicator, whose teardown synchronised the
            // kernels that read the arena (and cuMemFree waits for the device besides).
            let _ = unsafe { sys::cuMemFree_v2(self.base) };
        }
    }
}

/// Environment variable that turns the shaped executor off (`0`): every plan is interpreted.
pub const SHAPED_ENV: &str = "PURLIN_SHAPED";

/// A shaped kernel and the block shapes it runs.
#[derive(Debug)]
struct Shaped {
    key: ShapedKey,
    entries: EntryPoints,
}

/// The executor kernels of one GPU.
#[derive(Debug)]
pub struct DeviceExecutor {
    atom: AtomSpec,
    packet: PacketFormat,
    functions: HashMap<ExecKey, EntryPoints>,
    /// The shaped executor per datapath key (none where `PURLIN_SHAPED=0`).
    shaped: HashMap<ExecKey, Shaped>,
    coresident_local: u32,
    /// Where eager launches' parameter blocks go.
    arena: ParamArena,
    cooperative: bool,
}

fn exec_op(op: Option<ReduceOp>) -> ExecOp {
    match op {
        None => ExecOp::Copy,
        Some(ReduceOp::Sum) => ExecOp::Sum,
        Some(ReduceOp::Prod) => ExecOp::Prod,
        Some(ReduceOp::Min) => ExecOp::Min,
        Some(ReduceOp::Max) => ExecOp::Max,
        Some(ReduceOp::Avg) => ExecOp::Avg,
    }
}

impl DeviceExecutor {
    /// Compiles (through `cache`) and loads every executor key for `generation` on `ctx` —
    /// the interpreter and, unless `PURLIN_SHAPED=0`, the shaped executor with the block
    /// shapes of `world` ([`crate::gpu::kernels::shape_catalog`]) — and computes this GPU's
    /// co-residency bound for the interpreter (occupancy × SMs, the minimum over the keys).
    ///
    /// Every module loads here, at set-up: loading one may synchronize the GPU, which must
    /// never happen while a kernel of a call waits for a peer whose launch this thread has yet
    /// to make (round 51: a shaped kernel loaded at its first launch hung a one-process
    /// AllGather queued behind an AllReduce).
    pub fn load(
        ctx: &Arc<CudaContext>,
        cache: &KernelCache,
        arch: Arch,
        generation: Generation,
        sm_count: u32,
        world: u32,
    ) -> Result<Self, Error> {
        let atom = AtomSpec::new(generation);
        let keys = executor_keys(atom);
        let shaped_keys: Vec<ShapedKey> = if std::env::var(SHAPED_ENV).map_or(true, |v| v != "0") {
            ShapedKey::catalogs(&keys, world)
        } else {
            vec![]
        };
        let jobs: Vec<_> =
            keys.iter().map(ExecKey::unit).chain(shaped_keys.iter().map(ShapedKey::unit)).map(|u| (u, arch)).collect();
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let started = std::time::Instant::now();
        let compiled = cache.get_or_compile_all(&jobs, threads)?;
        let hits = compiled.iter().filter(|k| k.from_cache).count();
        tracing::info!(
            cache = %cache.dir().display(),
            hits,
            misses = compiled.len() - hits,
            seconds = started.elapsed().as_secs_f64(),
            "executor kernels: {hits} of {} from the kernel cache, {} compiled",
            compiled.len(),
            compiled.len() - hits
        );
        let mut compiled = compiled.into_iter();
        let mut module = || -> Result<Arc<CudaModule>, Error> {
            let kernel = compiled.next().ok_or_else(|| Error::Unsupported("a kernel was not compiled".into()))?;
            ctx.load_module(Ptx::from_binary(kernel.cubin)).map_err(driver("cuModuleLoadData"))
        };
        let mut functions = HashMap::new();
        let mut bound = u32::MAX;
        for key in &keys {
            let (entries, b) = EntryPoints::load(module()?, "purlin_snac_exec", atom, atom.smem_bytes(), sm_count)?;
            bound = bound.min(b);
            functions.insert(*key, entries);
        }
        let mut shaped = HashMap::new();
        for key in shaped_keys {
            let (entries, b) = EntryPoints::load(module()?, "purlin_snac_shaped", atom, 0, sm_count)?;
            // Plans are derived under the interpreter's bound; the shaped kernel needs fewer
            // resources, but were it ever to hold fewer blocks, the interpreter would run all.
            if b >= bound {
                shaped.insert(key.exec, Shaped { key, entries });
            }
        }
        let packet = if packet_bytes_for(generation) == 16 { PacketFormat::B16 } else { PacketFormat::B8 };
        let arena = ParamArena::new(ctx)?;
        let cooperative = std::env::var(COOPERATIVE_ENV).map_or(true, |v| v.trim() != "0");
        Ok(Self { atom, packet, functions, shaped, coresident_local: bound, arena, cooperative })
    }

    /// The Atom build the kernels run.
    pub fn atom(&self) -> AtomSpec {
        self.atom
    }

    /// The packet format of the latency regime on this GPU.
    pub fn packet(&self) -> PacketFormat {
        self.packet
    }

    /// This GPU's co-residency bound for the executor kernels.
    pub fn coresident_local(&self) -> u32 {
        self.coresident_local
    }

    /// The datapath key of a plan's kernels; a typed error where the Atom lacks the dtype.
    pub(crate) fn exec_key(&self, plan: &Plan) -> Result<ExecKey, Error> {
        let op = exec_op(plan.spec.op);
        let dtype = match (op, atom_dtype(plan.spec.dtype)) {
            (ExecOp::Copy, _) => DType::U32,
            (_, Some(d)) => d,
            (_, None) => {
                return Err(Error::Unsupported(format!(
                    "reductions of {:?} on the GPU (the Atom reduces f32, f16, bf16, fp8, i32, u32)",
                    plan.spec.dtype
                )));
            }
        };
        Ok(ExecKey { atom: self.atom, dtype, op, packet_bytes: packet_bytes_for(self.atom.generation) }.normalized())
    }

    /// The interpreter's kernels for a datapath key.
    fn interpreter(&self, key: &ExecKey) -> Result<&EntryPoints, Error> {
        self.functions.get(key).ok_or_else(|| Error::Unsupported(format!("no executor kernel for {key:?}")))
    }

    /// Checks that a kernel exists for the plan's dtype and op (a typed error where the Atom
    /// lacks the dtype).
    pub fn check_supported(&self, plan: &Plan) -> Result<(), Error> {
        // A copy-engine plan is an entry kernel, the engine's work and an exit kernel
        // (`comm/engine.rs`); as one kernel it would run without its copies.
        if plan.engine.is_some() {
            return Err(Error::Unsupported("a copy-engine plan launches as two kernels and copies, not as one".into()));
        }
        self.interpreter(&self.exec_key(plan)?).map(|_| ())
    }

    /// Makes `plan` ready to launch: its parameter block and, where the shaped executor runs
    /// it, each block's catalog index in the block table (the plan's own shape indices, which
    /// the interpreter ignores, are replaced). `eager_from_device`: eager launches read the
    /// block from device memory (graphs always take it by value).
    pub fn params(&self, plan: &Plan, eager_from_device: bool) -> Result<ExecParams, Error> {
        let mut words = purlin_snac::params::encode(plan);
        let shaped = self.shaped.get(&self.exec_key(plan)?);
        let indices = shaped.and_then(|s| s.key.indices_for(plan));
        if let Some(indices) = &indices {
            // `encode` puts the block table right after the header.
            let table = purlin_snac::params::HEADER_WORDS;
            for (b, own) in plan.block_shape_ids().into_iter().enumerate() {
                let word = &mut words[table + 3 * b];
                *word = (*word & 0xffff_ffff) | (indices[own as usize] as u64) << 32;
            }
        }
        Ok(ExecParams {
            block: ParamWords::new(&words)?,
            len: words.len(),
            shaped: indices.is_some(),
            eager_from_device,
            device: OnceLock::new(),
        })
    }

    /// Launches `plan` (whose parameter words are `params`) on `stream`.
    ///
    /// # Safety
    /// `rt` must hold valid device addresses for this call: input and output buffers of at
    /// least the plan's sizes, alive until the kernel finishes, and the live symmetric
    /// workspace of every rank, mapped on this GPU.
    pub unsafe fn launch(
        &self,
        stream: &CudaStream,
        plan: &Plan,
        params: &ExecParams,
        rt: &ExecRuntime,
    ) -> Result<(), Error> {
        let grid = plan.grid() as u32;
        if grid == 0 && rt.call_number == 0 {
            return Ok(()); // an empty call with the call check off: nothing to launch
        }
        // One key lookup per launch: the shaped kernel where `params` says the plan runs shaped.
        let key = self.exec_key(plan)?;
        let (entries, smem) = match self.shaped.get(&key) {
            Some(shaped) if params.shaped => (&shaped.entries, 0),
            _ => (self.interpreter(&key)?, self.atom.smem_bytes()),
        };
        // One block past the plan's runs the call check where it is on (a nonzero number,
        // kernels/snac/exec.cuh).
        let cfg = LaunchConfig {
            grid_dim: (grid + u32::from(rt.call_number != 0), 1, 1),
            block_dim: (self.atom.threads(), 1, 1),
            shared_mem_bytes: smem,
        };
        let uploaded = if params.eager_from_device { self.uploaded(stream, params)? } else { None };
        let mut launch = match &uploaded {
            Some(words) => {
                let mut l = stream.launch_builder(&entries.global);
                l.arg(rt).arg(words);
                l
            }
            None => {
                let mut l = stream.launch_builder(&entries.by_value);
                l.arg(rt).arg(&*params.block);
                l
            }
        };
        if self.cooperative {
            // SAFETY: the by-value entry points take (Runtime, ParamBlock<EXEC_PARAM_WORDS>),
            // which ExecRuntime and ParamWords mirror; the `_global` ones (Runtime, const u64*),
            // whose address holds the plan's words, uploaded earlier on this stream and never
            // rewritten;
            // a shaped kernel runs only plans whose every block shape it holds, at the catalog
            // index `params` wrote into the block table, and needs no dynamic shared memory; the
            // caller guarantees the addresses in `rt`; the grid (the plan's and the call check's
            // block) is within the co-residency bound the plan was derived under, which
            // `Comm::exec_bound` keeps one block below the kernels' (a cooperative launch refuses a grid that cannot be
            // co-resident instead of hanging; a plain one, an A/B knob, relies on that bound);
            // every device wait is bounded by rt.timeout_ns.
            unsafe { launch.launch_cooperative(cfg) }.map_err(driver("cuLaunchCooperativeKernel"))?;
        } else {
            // SAFETY: as for the cooperative launch above.
            unsafe { launch.launch(cfg) }.map_err(driver("cuLaunchKernel"))?;
        }
        Ok(())
    }

    /// The device address of `params`' words for an eager launch on `stream`, uploading them
    /// at the first one; `None` when `stream` is capturing a graph or the arena is full.
    /// Graphs keep the by-value block: the graph holds it, in a graph its size costs nothing
    /// (round 19), and an upload could not be captured as a one-time step.
    fn uploaded(&self, stream: &CudaStream, params: &ExecParams) -> Result<Option<u64>, Error> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: a live stream of this executor's context; out-pointer valid.
        unsafe { sys::cuStreamIsCapturing(stream.cu_stream(), &mut status) }
            .result()
            .map_err(driver("cuStreamIsCapturing"))?;
        if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Ok(None);
        }
        let words = params.words();
        let bytes = std::mem::size_of_val(words);
        let mut result = Ok(());
        let at = *params.device.get_or_init(|| {
            let Some(at) = self.arena.take(bytes) else {
                crate::observe::warn_once("parameter arena full".into(), || {
                    tracing::warn!(
                        arena_bytes = PARAM_ARENA_BYTES,
                        block_bytes = bytes,
                        "parameter arena full: later new plans pass their parameter blocks by value"
                    )
                });
                return None;
            };
            // SAFETY: `at` is `bytes` bytes of this context's arena that no kernel reads yet
            // (just handed out); `words` is pageable host memory, which cuMemcpyHtoDAsync
            // copies out before returning; the copy is ordered before this launch on `stream`.
            let copied = unsafe { sys::cuMemcpyHtoDAsync_v2(at, words.as_ptr().cast(), bytes, stream.cu_stream()) };
            match copied.result() {
                Ok(()) => Some(at),
                Err(e) => {
                    result = Err(driver("cuMemcpyHtoDAsync")(e));
                    None
                }
            }
        });
        result.map(|()| at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plan's words are copied into the by-value block and zero-padded; one too long for
    /// it is a typed error, not a truncation.
    #[test]
    fn a_plan_fills_the_parameter_block_or_is_refused() {
        let words: Vec<u64> = (1..=EXEC_PARAM_WORDS as u64).collect();
        let p = ParamWords::new(&words[..100]).expect("fits");
        assert_eq!(&p.words[..100], &words[..100]);
        assert!(p.words[100..].iter().all(|&w| w == 0));
        assert_eq!(&ParamWords::new(&words).expect("fits").words[..], &words[..]);
        let too_long = [0u64; EXEC_PARAM_WORDS + 1];
        assert!(matches!(ParamWords::new(&too_long), Err(Error::Unsupported(_))));
    }

    /// The arena hands out aligned, disjoint ranges until one does not fit, and a refusal
    /// leaves it as it was (a smaller block may still fit after a larger one was refused).
    #[test]
    fn the_parameter_arena_hands_out_aligned_disjoint_ranges_until_full() {
        let capacity = 1024;
        let mut used = 0;
        let mut taken = Vec::new();
        for bytes in [8, 200, 128, 1] {
            let at = bump(&mut used, bytes, capacity).expect("fits");
            assert_eq!(at % 128, 0);
            taken.push((at, at + bytes));
        }
        assert_eq!(taken, [(0, 8), (128, 328), (384, 512), (512, 513)]);
        assert_eq!(bump(&mut used, 512, capacity), None);
        assert_eq!(used, 513);
        assert_eq!(bump(&mut used, 384, capacity), Some(640));
        assert_eq!(bump(&mut used, 1, capacity), None);
        assert_eq!(bump(&mut used, usize::MAX, capacity), None);
    }
}
