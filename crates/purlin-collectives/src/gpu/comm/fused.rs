//! Collectives inside your own kernel: a call prepared for fusion ([`FusedCall`]) and a user
//! kernel compiled with Purlin's device headers ([`FusedKernel`]).
//!
//! The collective part of a fused kernel is the plan [`Comm`]'s own launch would run for the
//! same call (a copy collective's with its shard-landed words added, `purlin_snac::Landed`):
//! derived, verified and encoded by the same path ([`Comm::prepared_landed`]), interpreted by
//! the same executor code (`kernels/snac/executor.cu`, included by
//! `kernels/include/purlin/collective.cuh` with the contracted blocks' numbering). What the
//! user's kernel may do around it is the contract written in that header and on
//! [`FusedKernel`].

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, LaunchArgs, LaunchConfig, PushKernelArg,
    sys,
};
use cudarc::nvrtc::Ptx;
use purlin_atom::{Arch, TranslationUnit};
use purlin_snac::CollectiveSpec;

use super::launch::{PeerBuffers, PreparedPlan};
use super::{Comm, refuse_in_open_group};
use crate::call::Call;
use crate::call::types::{NcclType, snac_dtype};
use crate::error::{Error, driver};
use crate::gpu::executor::ExecRuntime;
use crate::gpu::kernels::{EXECUTOR_CU, ExecKey};

/// `kernels/include/purlin/collective.cuh`: the call runner and the grid barrier.
pub const COLLECTIVE_CUH: &str = include_str!("../../../../../kernels/include/purlin/collective.cuh");
/// `kernels/include/purlin/atom.cuh`: the Atom's copy and reduce for user code.
pub const ATOM_CUH: &str = include_str!("../../../../../kernels/include/purlin/atom.cuh");

/// The first parameter of a fused kernel, `purlin::Collective` in
/// `kernels/include/purlin/collective.cuh`, field for field: one launch's pointers and call
/// number. Made by [`FusedCall::launch_args`], one per launch.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CollectiveArgs {
    rt: ExecRuntime,
    words: u64,
    barrier: u64,
    blocks: u32,
    smem_bytes: u32,
    landed: u64,
    landed_at_launch: u32,
    world: u32,
}

// SAFETY: `#[repr(C)]` of plain integers and `ExecRuntime` (itself `DeviceRepr`, the C
// `Runtime`), laid out as `purlin::Collective` (u64 fields, then u32 pairs: no padding).
unsafe impl DeviceRepr for CollectiveArgs {}

// collective.cuh asserts the same size of `purlin::Collective`.
const _: () = assert!(std::mem::size_of::<CollectiveArgs>() == std::mem::size_of::<ExecRuntime>() + 3 * 8 + 4 * 4);

/// A collective prepared for a fused kernel ([`Comm::prepare`]): its verified plan, with the
/// plan's parameter words in device memory, the buffers it reads and writes, and its launch
/// contract ([`FusedCall::blocks`], [`FusedCall::threads`], [`FusedCall::smem_bytes`]).
///
/// It borrows the buffers it was prepared on for `'b`: launches of it read and write them.
/// Prepare outside CUDA-graph capture (it uploads the plan's words); launches may be captured.
#[derive(Debug)]
pub struct FusedCall<'b> {
    comm: &'b Comm,
    prepared: Arc<PreparedPlan>,
    key: ExecKey,
    input: u64,
    output: u64,
    peers: PeerBuffers,
    /// The plan's words and the grid barrier's two words, owned for the call's life.
    _words: CudaSlice<u64>,
    _barrier: CudaSlice<u32>,
    /// Their device addresses, read once at preparation: a launch reads no
    /// `CudaSlice`, so it records no cudarc event (captures stay free of them).
    words_at: u64,
    barrier_at: u64,
    /// A copy collective's shard-landed words (`purlin_snac::Landed`): this rank's first, 0
    /// for other collectives; zeroed before each launch.
    landed_at: u64,
    /// Bit `q`: shard `q` is there at launch (empty, or in place), nothing signals it.
    landed_at_launch: u32,
    _buffers: PhantomData<&'b mut ()>,
}

impl Comm {
    /// Prepares the out-of-place collective `call` on `sendbuff` and `recvbuff` for a fused
    /// kernel. The buffers are checked as the collective's own method checks them; `call`'s
    /// lengths are in elements of `T`, as there (e.g. `Call::AllReduce { len: sendbuff.len(), op }`).
    pub fn prepare<'b, S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &'b self,
        call: Call,
        sendbuff: &'b S,
        recvbuff: &'b mut R,
    ) -> Result<FusedCall<'b>, Error> {
        refuse_in_open_group("prepare")?;
        let spec = call.spec(self.world, self.rank, snac_dtype::<T>())?;
        spec.validate()?;
        spec.check_buffers(self.rank as u32, sendbuff.len() as u64, recvbuff.len() as u64)?;
        self.check_device(sendbuff)?;
        self.check_device(recvbuff)?;
        let (input, _in) = sendbuff.device_ptr(&self.stream);
        let (output, _out) = recvbuff.device_ptr_mut(&self.stream);
        self.fused_call(spec, false, input, output)
    }

    /// Prepares the in-place collective `call` on `buff` for a fused kernel (NCCL's in-place
    /// layout, as [`Comm::all_reduce_in_place`] and the other `_in_place` calls take it).
    pub fn prepare_in_place<'b, R: DevicePtrMut<T>, T: NcclType>(
        &'b self,
        call: Call,
        buff: &'b mut R,
    ) -> Result<FusedCall<'b>, Error> {
        refuse_in_open_group("prepare_in_place")?;
        let spec = call.spec(self.world, self.rank, snac_dtype::<T>())?;
        spec.validate()?;
        self.check_device(buff)?;
        let bytes = (buff.len() * std::mem::size_of::<T>()) as u64;
        let (ptr, _record) = buff.device_ptr_mut(&self.stream);
        let mut fused = self.fused_call(spec, true, ptr, ptr)?;
        let (input_at, output_at) = super::in_place_offsets(&fused.prepared.plan, bytes)?;
        fused.input = ptr + input_at;
        fused.output = ptr + output_at;
        Ok(fused)
    }

    fn fused_call(
        &self,
        spec: CollectiveSpec,
        in_place: bool,
        input: u64,
        output: u64,
    ) -> Result<FusedCall<'_>, Error> {
        let peers = self.peer_buffers(&spec, in_place, input, output)?;
        // A copy collective's plan sets a word per source shard once it landed
        // (`purlin::wait_shard`); its fused kernel then consumes shards as they arrive.
        let landed = spec.collective.consume_op() == purlin_snac::ConsumeOp::Gather;
        let prepared = self.prepared_landed(spec, in_place, peers.flags(), landed)?;
        if prepared.ce.is_some() {
            return Err(Error::Unsupported(
                "a fused kernel runs SM blocks only; this call's plan runs on the copy engines (PURLIN_DATAPATH=sm)"
                    .into(),
            ));
        }
        let key = self.exec.exec_key(&prepared.plan)?;
        let words = purlin_snac::params::encode(&prepared.plan);
        let words = self.stream.clone_htod(&words).map_err(driver("cuMemcpyHtoDAsync"))?;
        let barrier = self.stream.alloc_zeros::<u32>(2).map_err(driver("cuMemAllocAsync"))?;
        let words_at = words.device_ptr(&self.stream).0;
        let barrier_at = barrier.device_ptr(&self.stream).0;
        let (mut landed_at, mut landed_at_launch) = (0, 0);
        if let Some(l) = &prepared.plan.landed {
            // The plan's landed flags are its last `world` words, shard q's at first + q.
            let first = prepared.plan.resources.flag_words as usize - l.shards.len();
            for (q, s) in l.shards.iter().enumerate() {
                match s.flag {
                    Some(f) if f as usize == first + q => {}
                    Some(f) => {
                        let what = format!("landed flag {f} of shard {q} is not word {}", first + q);
                        return Err(crate::call::verified::internal(self.rank as u32, what));
                    }
                    None => landed_at_launch |= 1 << q,
                }
            }
            landed_at = self.runtime(input, output).flags[self.rank] + 8 * first as u64;
        }
        Ok(FusedCall {
            comm: self,
            prepared,
            key,
            input,
            output,
            peers,
            _words: words,
            _barrier: barrier,
            words_at,
            barrier_at,
            landed_at,
            landed_at_launch,
            _buffers: PhantomData,
        })
    }
}

impl FusedCall<'_> {
    /// Blocks that must call `purlin::run_collective`: blocks `0..blocks()` of the launch,
    /// each once (the plan's grid and, with the call check on, its check block, which an
    /// empty call runs alone; with the check off an empty call has none).
    pub fn blocks(&self) -> u32 {
        self.prepared.plan.grid() as u32 + u32::from(self.comm.call_check)
    }

    /// The device address of the call's input on this rank (in place: where it lies in the
    /// buffer), for the kernel's own reads or writes outside `run_collective`.
    pub fn input_address(&self) -> u64 {
        self.input
    }

    /// The device address of the call's output on this rank.
    pub fn output_address(&self) -> u64 {
        self.output
    }

    /// Threads per block of a fused launch (`purlin::atom::kThreads`).
    pub fn threads(&self) -> u32 {
        self.comm.exec.atom().threads()
    }

    /// Dynamic shared memory a contracted block needs (the Atom's workspace); a launch may
    /// give more, which the user's code may use outside `run_collective`.
    pub fn smem_bytes(&self) -> u32 {
        self.comm.exec.atom().smem_bytes()
    }

    /// The first kernel argument of one launch: this call's pointers and the next call
    /// number of the communicator (the call check's). Take one per launch, in the order of
    /// the communicator's calls, as every rank does.
    pub fn launch_args(&self) -> Result<CollectiveArgs, Error> {
        if let Some(why) = self.comm.poison.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Err(Error::Poisoned(why));
        }
        let mut rt = self.comm.runtime(self.input, self.output);
        self.peers.fill(&mut rt);
        let plan = &self.prepared.plan;
        // Numbered as Comm's own launches (an empty call too: its check block meets the peers'),
        // so the call check and a hang report compare like with like.
        rt.call_number = self.comm.next_call_number();
        let mut flight = self.comm.flight.lock().unwrap_or_else(|e| e.into_inner());
        flight.start(&plan.spec, self.comm.rank as u32, plan.call_digest(), crate::flight::Executor::Gpu);
        Ok(CollectiveArgs {
            rt,
            words: self.words_at,
            barrier: self.barrier_at,
            blocks: self.blocks(),
            smem_bytes: self.smem_bytes(),
            landed: self.landed_at,
            landed_at_launch: self.landed_at_launch,
            world: self.comm.world as u32,
        })
    }
}

/// A user kernel that runs a Purlin collective itself, compiled by NVRTC for this GPU with
/// Purlin's device headers:
/// - `#include <purlin/collective.cuh>`: `purlin::Collective` (the kernel's first parameter,
///   `const __grid_constant__ purlin::Collective call`), `purlin::run_collective(call, block)`,
///   `purlin::grid_barrier(call)` and, for copy collectives, `purlin::wait_shard(call, q)` (a
///   source rank's shard of the output has landed: read it while the call goes on); the
///   contract is written at the top of that header;
/// - `#include <purlin/atom.cuh>`: the Atom's `copy` and `reduce<T, Op>` on local or peer
///   pointers.
///
/// It is compiled for one call's datapath (element type and operator, [`FusedCall`]) through
/// the communicator's kernel cache, and launched only on that communicator's stream.
#[derive(Debug)]
pub struct FusedKernel {
    function: CudaFunction,
    module: Arc<CudaModule>,
    key: ExecKey,
    name: String,
    /// The dynamic shared memory the kernel is set to accept.
    smem_set: u32,
}

impl FusedKernel {
    /// Compiles `source`, whose `extern "C" __global__` kernel `name` takes
    /// `const __grid_constant__ purlin::Collective` first, for `call`'s datapath.
    pub fn compile(call: &FusedCall<'_>, source: &str, name: &str) -> Result<Self, Error> {
        let comm = call.comm;
        let unit = fused_unit(&call.key, source, name);
        let cc = comm.device().compute_capability;
        let compiled = comm.kernel_cache.get_or_compile(&unit, Arch { major: cc.major, minor: cc.minor })?;
        let module =
            comm.context().load_module(Ptx::from_binary(compiled.cubin)).map_err(driver("cuModuleLoadData"))?;
        let function = module.load_function(name).map_err(driver("cuModuleGetFunction"))?;
        let smem = call.smem_bytes();
        if smem > 48 << 10 {
            function
                .set_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)
                .map_err(driver("cuFuncSetAttribute"))?;
        }
        Ok(Self { function, module, key: call.key, name: name.into(), smem_set: smem })
    }

    /// The kernel, for occupancy queries or attributes.
    pub fn function(&self) -> &CudaFunction {
        &self.function
    }

    /// The largest co-resident grid of this kernel for `call` with `smem_bytes` of dynamic
    /// shared memory per block: occupancy × SMs, split among the ranks that share this GPU
    /// (their fused kernels run at once).
    pub fn max_blocks(&self, call: &FusedCall<'_>, smem_bytes: u32) -> Result<u32, Error> {
        let comm = call.comm;
        let all = crate::gpu::ipc::max_coresident_blocks(
            &self.function,
            call.threads(),
            smem_bytes as usize,
            comm.device().sm_count,
        )?;
        Ok(all / comm.gpu_sharing)
    }

    /// Another `extern "C"` kernel of the same source (a companion kernel, e.g. an unfused
    /// twin), launched as any cudarc function.
    pub fn sibling(&self, name: &str) -> Result<CudaFunction, Error> {
        self.module.load_function(name).map_err(driver("cuModuleGetFunction"))
    }

    /// A launch of this kernel for `call` with `args` (from [`FusedCall::launch_args`]) as
    /// its first argument, on the communicator's stream; push the kernel's other arguments
    /// as with cudarc's `LaunchArgs` (it dereferences to one), then [`FusedLaunch::launch`].
    pub fn launch_builder<'a>(&'a self, call: &'a FusedCall<'a>, args: &'a CollectiveArgs) -> FusedLaunch<'a> {
        let mut builder = call.comm.stream.launch_builder(&self.function);
        builder.arg(args);
        FusedLaunch { builder, call, kernel: self, args }
    }
}

/// The translation unit of a fused kernel: the user's `source` with Purlin's device headers
/// (`purlin/collective.cuh`, `purlin/atom.cuh` and what they include) and the options of the
/// call's datapath `key`.
pub fn fused_unit(key: &ExecKey, source: &str, name: &str) -> TranslationUnit {
    let mut headers = key.headers();
    headers.push(("purlin_snac_executor.cuh".into(), EXECUTOR_CU.into()));
    headers.push(("purlin/collective.cuh".into(), COLLECTIVE_CUH.into()));
    headers.push(("purlin/atom.cuh".into(), ATOM_CUH.into()));
    TranslationUnit { name: format!("purlin_fused_{name}"), source: source.into(), headers, options: key.options() }
}

/// One launch of a [`FusedKernel`]: cudarc's `LaunchArgs` with the collective's argument
/// pushed first.
pub struct FusedLaunch<'a> {
    builder: LaunchArgs<'a>,
    call: &'a FusedCall<'a>,
    kernel: &'a FusedKernel,
    args: &'a CollectiveArgs,
}

impl std::fmt::Debug for FusedLaunch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FusedLaunch")
            .field("kernel", &self.kernel.name)
            .field("args", self.args)
            .finish_non_exhaustive()
    }
}

impl<'a> Deref for FusedLaunch<'a> {
    type Target = LaunchArgs<'a>;
    fn deref(&self) -> &Self::Target {
        &self.builder
    }
}

impl DerefMut for FusedLaunch<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.builder
    }
}

impl FusedLaunch<'_> {
    /// Checks the launch against the call's contract, then launches it cooperatively (the
    /// driver refuses a grid that cannot be co-resident instead of letting it hang).
    ///
    /// # Safety
    /// As cudarc's `LaunchArgs::launch`: the pushed arguments must match the kernel's
    /// parameters, and the kernel must keep the contract of `purlin/collective.cuh`
    /// (blocks `0..call.blocks()` each call `run_collective` once with every thread; no
    /// block writes the input or touches the output while a block may be inside it, except
    /// to read a shard after `purlin::wait_shard` returned true).
    pub unsafe fn launch(mut self, cfg: LaunchConfig) -> Result<(), Error> {
        let call = self.call;
        let comm = call.comm;
        if self.kernel.key != call.key {
            return Err(Error::InvalidArgument(format!(
                "fused kernel {} was compiled for another call's datapath ({:?}, not {:?})",
                self.kernel.name, self.kernel.key, call.key
            )));
        }
        if self.args.words != call.words_at {
            return Err(Error::InvalidArgument("launch arguments of another prepared call".into()));
        }
        let (gx, gy, gz) = cfg.grid_dim;
        let grid = gx.saturating_mul(gy).saturating_mul(gz);
        let block = cfg.block_dim;
        if block != (call.threads(), 1, 1) {
            return Err(Error::InvalidArgument(format!(
                "a fused launch takes ({}, 1, 1) threads per block (purlin::atom::kThreads), not {block:?}",
                call.threads()
            )));
        }
        if grid < call.blocks() {
            return Err(Error::InvalidArgument(format!(
                "the call needs {} contracted blocks; the launch has {grid}",
                call.blocks()
            )));
        }
        if cfg.shared_mem_bytes < call.smem_bytes() {
            return Err(Error::InvalidArgument(format!(
                "contracted blocks need {} bytes of dynamic shared memory; the launch gives {}",
                call.smem_bytes(),
                cfg.shared_mem_bytes
            )));
        }
        if cfg.shared_mem_bytes > self.kernel.smem_set {
            self.kernel
                .function
                .set_attribute(
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    cfg.shared_mem_bytes as i32,
                )
                .map_err(driver("cuFuncSetAttribute"))?;
        }
        let bound = self.kernel.max_blocks(call, cfg.shared_mem_bytes)?;
        if grid > bound {
            return Err(Error::InvalidArgument(format!(
                "a fused grid of {grid} blocks is not co-resident on this GPU (at most {bound} of kernel {} \
                 with {} bytes of shared memory{})",
                self.kernel.name,
                cfg.shared_mem_bytes,
                if comm.gpu_sharing > 1 { ", split among the ranks sharing it" } else { "" }
            )));
        }
        // Fused launches run on the communicator's stream, after its last launch on any stream.
        comm.join_launches()?;
        if call.landed_at != 0 {
            // SAFETY: `landed_at` holds this rank's `world` shard-landed words of the
            // communicator's live workspace, which only this rank's fused launches write
            // (their plans' landed signals, to this rank's own words), each after this memset
            // on the same stream; no peer writes them.
            unsafe {
                cudarc::driver::result::memset_d8_async(call.landed_at, 0, 8 * comm.world, comm.stream.cu_stream())
            }
            .map_err(driver("cuMemsetD8Async"))?;
        }
        // SAFETY: the first argument is the call's `CollectiveArgs` (checked above), whose
        // pointers are this call's buffers (borrowed for the call's life), the communicator's
        // live workspace and the plan's uploaded words; the grid holds every contracted block,
        // the block size and shared memory are the executor's, and the grid is co-resident
        // (checked, and refused by a cooperative launch otherwise); the rest is the caller's
        // contract (this function's safety section).
        unsafe { self.builder.launch_cooperative(cfg) }.map_err(driver("cuLaunchCooperativeKernel"))?;
        Ok(())
    }
}
