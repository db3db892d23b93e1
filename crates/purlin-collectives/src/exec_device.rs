//! The device executor's host side: loads the executor kernels (`kernels/snac/executor.cu`)
//! for every key the runtime can request, and launches one per call with the plan's
//! parameter block and the call's pointers as `__grid_constant__` kernel parameters.
//!
//! Launches are cooperative: a grid that cannot be co-resident fails at launch instead of
//! hanging (plans never exceed the co-residency bound agreed at set-up). No cudarc event is
//! recorded by a launch (every argument is a plain value), so launches can be captured in
//! CUDA graphs.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg, sys};
use cudarc::nvrtc::Ptx;
use purlin_atom::{Arch, AtomSpec, DType, Generation, KernelCache};
use purlin_snac::{PacketFormat, Plan, ReduceOp};

use crate::error::{Error, driver};
use crate::host_exec::atom_dtype;
use crate::kernels::{
    EXEC_PARAM_WORDS, EXEC_RUNTIME_BYTES, EXEC_SMALL_PARAM_WORDS, ExecKey, ExecOp, ShapedKey, executor_keys,
    packet_bytes_for,
};

/// Ranks the executor's `Runtime` has room for.
pub const MAX_WORLD: usize = 16;

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
    pub trace_capacity: u64,
}

const _: () = assert!(std::mem::size_of::<ExecRuntime>() == EXEC_RUNTIME_BYTES);

// SAFETY: ExecRuntime is #[repr(C)], made only of u64s, and matches the kernel's
// `Runtime` parameter field for field (size checked above, offsets by the order).
unsafe impl DeviceRepr for ExecRuntime {}

/// A parameter block of `N` words, passed by value (the kernel's `ParamBlock<N>`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ParamWords<const N: usize> {
    /// The plan's words (purlin_snac::params), zero-padded.
    pub words: [u64; N],
}

// SAFETY: a #[repr(C)] array of u64s, the layout of the kernel's `ParamBlock<N>`.
unsafe impl<const N: usize> DeviceRepr for ParamWords<N> {}

impl<const N: usize> ParamWords<N> {
    fn boxed(words: &[u64]) -> Box<Self> {
        let mut p = Box::new(Self { words: [0; N] });
        p.words[..words.len()].copy_from_slice(words);
        p
    }
}

/// A plan's parameter block, in the smaller of the executor's two entry points that holds
/// it: every eager launch uploads its whole parameter block (`EXEC_SMALL_PARAM_WORDS`).
#[derive(Debug, Clone)]
pub enum ParamBlock {
    /// For the `_small` entry points.
    Small(Box<ParamWords<EXEC_SMALL_PARAM_WORDS>>),
    /// For the full-size entry points.
    Full(Box<ParamWords<EXEC_PARAM_WORDS>>),
}

impl ParamBlock {
    /// The block for `words`; a plan longer than the largest block is unsupported.
    pub fn new(words: &[u64]) -> Result<Self, Error> {
        if words.len() <= EXEC_SMALL_PARAM_WORDS {
            Ok(Self::Small(ParamWords::boxed(words)))
        } else if words.len() <= EXEC_PARAM_WORDS {
            Ok(Self::Full(ParamWords::boxed(words)))
        } else {
            Err(Error::Unsupported(format!(
                "a plan of {} parameter words (the executor takes {EXEC_PARAM_WORDS})",
                words.len()
            )))
        }
    }
}

/// A plan made ready to launch ([`DeviceExecutor::params`]): its parameter block and
/// whether the shaped executor runs it.
#[derive(Debug)]
pub struct ExecParams {
    block: ParamBlock,
    shaped: bool,
}

/// One module's two entry points (same code; full-size and small parameter blocks).
#[derive(Debug)]
struct EntryPoints {
    full: CudaFunction,
    small: CudaFunction,
    _module: Arc<CudaModule>,
}

impl EntryPoints {
    /// Loads `full` and `small` from `module`, letting each use `smem` bytes of dynamic shared
    /// memory; returns them with the lower of their co-residency bounds.
    fn load(
        module: Arc<CudaModule>,
        full: &str,
        small: &str,
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
        let entries = EntryPoints { full: entry(full)?, small: entry(small)?, _module: module };
        let mut bound = u32::MAX;
        for function in [&entries.full, &entries.small] {
            bound = bound.min(crate::device::max_coresident_blocks(function, atom.threads(), smem as usize, sm_count)?);
        }
        Ok((entries, bound))
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
    /// shapes of `world` ([`crate::kernels::shape_catalog`]) — and computes this GPU's
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
        let mut compiled = cache.get_or_compile_all(&jobs, threads)?.into_iter();
        let mut module = || -> Result<Arc<CudaModule>, Error> {
            let kernel = compiled.next().ok_or_else(|| Error::Unsupported("a kernel was not compiled".into()))?;
            ctx.load_module(Ptx::from_binary(kernel.cubin)).map_err(driver("cuModuleLoadData"))
        };
        let mut functions = HashMap::new();
        let mut bound = u32::MAX;
        for key in &keys {
            let (entries, b) = EntryPoints::load(
                module()?,
                "purlin_snac_exec",
                "purlin_snac_exec_small",
                atom,
                atom.smem_bytes(),
                sm_count,
            )?;
            bound = bound.min(b);
            functions.insert(*key, entries);
        }
        let mut shaped = HashMap::new();
        for key in shaped_keys {
            let (entries, b) =
                EntryPoints::load(module()?, "purlin_snac_shaped", "purlin_snac_shaped_small", atom, 0, sm_count)?;
            // Plans are derived under the interpreter's bound; the shaped kernel needs fewer
            // resources, but were it ever to hold fewer blocks, the interpreter would run all.
            if b >= bound {
                shaped.insert(key.exec, Shaped { key, entries });
            }
        }
        let packet = if packet_bytes_for(generation) == 16 { PacketFormat::B16 } else { PacketFormat::B8 };
        Ok(Self { atom, packet, functions, shaped, coresident_local: bound })
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
    fn exec_key(&self, plan: &Plan) -> Result<ExecKey, Error> {
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
        self.interpreter(&self.exec_key(plan)?).map(|_| ())
    }

    /// Makes `plan` ready to launch: its parameter block and, where the shaped executor runs
    /// it, each block's catalog index in the block table (the plan's own shape indices, which
    /// the interpreter ignores, are replaced).
    pub fn params(&self, plan: &Plan) -> Result<ExecParams, Error> {
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
        Ok(ExecParams { block: ParamBlock::new(&words)?, shaped: indices.is_some() })
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
        if grid == 0 {
            return Ok(()); // an empty call: nothing moves, nothing advances (on every rank)
        }
        // One key lookup per launch: the shaped kernel where `params` says the plan runs shaped.
        let key = self.exec_key(plan)?;
        let (entries, smem) = match self.shaped.get(&key) {
            Some(shaped) if params.shaped => (&shaped.entries, 0),
            _ => (self.interpreter(&key)?, self.atom.smem_bytes()),
        };
        let cfg =
            LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (self.atom.threads(), 1, 1), shared_mem_bytes: smem };
        let mut launch = match &params.block {
            ParamBlock::Small(words) => {
                let mut l = stream.launch_builder(&entries.small);
                l.arg(rt).arg(&**words);
                l
            }
            ParamBlock::Full(words) => {
                let mut l = stream.launch_builder(&entries.full);
                l.arg(rt).arg(&**words);
                l
            }
        };
        // SAFETY: every entry point's parameters are (Runtime, ParamBlock<N>), which
        // ExecRuntime and the ParamWords<N> of its variant mirror (N = EXEC_SMALL_PARAM_WORDS
        // for the `_small` entry points, EXEC_PARAM_WORDS for the others, the -D options all
        // are compiled with); a shaped kernel runs only plans whose every block shape it holds, at
        // the catalog index `params` wrote into the block table, and needs no dynamic shared
        // memory; the caller guarantees the addresses in `rt`; the
        // grid is within the co-residency bound the plan was derived under, and the
        // cooperative launch refuses a grid that cannot be co-resident instead of hanging;
        // every device wait is bounded by rt.timeout_ns.
        unsafe { launch.launch_cooperative(cfg) }.map_err(driver("cuLaunchCooperativeKernel"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plan goes to the smallest entry point that holds it; one too long for both is a
    /// typed error, not a truncation.
    #[test]
    fn a_plan_takes_the_smallest_parameter_block_that_holds_it() {
        let words: Vec<u64> = (1..=EXEC_PARAM_WORDS as u64).collect();
        match ParamBlock::new(&words[..EXEC_SMALL_PARAM_WORDS]) {
            Ok(ParamBlock::Small(p)) => assert_eq!(&p.words[..], &words[..EXEC_SMALL_PARAM_WORDS]),
            other => panic!("{other:?}"),
        }
        match ParamBlock::new(&words[..EXEC_SMALL_PARAM_WORDS + 1]) {
            Ok(ParamBlock::Full(p)) => {
                assert_eq!(&p.words[..EXEC_SMALL_PARAM_WORDS + 1], &words[..EXEC_SMALL_PARAM_WORDS + 1]);
                assert!(p.words[EXEC_SMALL_PARAM_WORDS + 1..].iter().all(|&w| w == 0));
            }
            other => panic!("{other:?}"),
        }
        let too_long = [0u64; EXEC_PARAM_WORDS + 1];
        assert!(matches!(ParamBlock::new(&too_long), Err(Error::Unsupported(_))));
    }
}
