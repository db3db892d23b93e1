//! Fused kernels on the GPU: a user kernel that runs the collective itself (`FusedKernel`),
//! eager and captured in a CUDA graph, in and out of place, checked against purlin-testkit's
//! reference; the launch contract's refusals. Two ranks (`PURLIN_SHARED_GPU=1`: both on GPU 0).

mod gpu_calls;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use gpu_calls::{base_config, fresh_seed, streams};
use purlin_collectives::{Call, Comm, Error, FusedCall, FusedKernel, ReduceOp};
use purlin_testkit::{Case, Collective, Dtype, Op, poisoned};

/// The smallest fused kernel: the contracted blocks run the call; the others only meet the
/// grid barrier (which they must not skip).
const PLAIN: &str = r#"
#include <purlin/collective.cuh>
extern "C" __global__ void __launch_bounds__(purlin::atom::kThreads)
    plain(const __grid_constant__ purlin::Collective call) {
  if (blockIdx.x < call.blocks) purlin::run_collective(call, blockIdx.x);
  purlin::grid_barrier(call);
}
"#;

/// A consumer of shards as they land: the contracted blocks run the AllGather; the others,
/// for each source rank from this one on, wait for its shard (`purlin::wait_shard`) and copy
/// it from the output into `seen` while the other shards are still on the way.
const LANDED_COPY: &str = r#"
#include <purlin/collective.cuh>
extern "C" __global__ void __launch_bounds__(purlin::atom::kThreads)
    landed_copy(const __grid_constant__ purlin::Collective call, const float* gathered, float* seen,
                unsigned long long per_rank, unsigned world, unsigned rank) {
  if (blockIdx.x < call.blocks) {
    purlin::run_collective(call, blockIdx.x);
    return;
  }
  const unsigned long long s = blockIdx.x - call.blocks, spare = gridDim.x - call.blocks;
  for (unsigned step = 0; step < world; ++step) {
    const unsigned q = (rank + step) % world;
    if (!purlin::wait_shard(call, q)) return;
    for (unsigned long long i = s * blockDim.x + threadIdx.x; i < per_rank; i += spare * blockDim.x)
      seen[q * per_rank + i] = gathered[q * per_rank + i];
  }
}
"#;

fn comms() -> Vec<Comm> {
    Comm::from_devices_with_config(streams(), base_config()).expect("from_devices")
}

fn cfg(call: &FusedCall<'_>, grid: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (call.threads(), 1, 1), shared_mem_bytes: call.smem_bytes() }
}

/// Launches every rank's call once with `grid` blocks (all launches enqueued first).
fn launch_all(calls: &[FusedCall<'_>], kernels: &[FusedKernel], grid: u32) -> Result<(), Error> {
    for (call, kernel) in calls.iter().zip(kernels) {
        let args = call.launch_args()?;
        let launch = kernel.launch_builder(call, &args);
        // SAFETY: `plain` takes the collective's argument only and keeps the contract.
        unsafe { launch.launch(cfg(call, grid)) }?;
    }
    Ok(())
}

fn upload(comms: &[Comm], case: &Case) -> Vec<CudaSlice<u8>> {
    comms.iter().map(|c| c.stream().clone_htod(&case.input(c.rank())).expect("upload")).collect()
}

fn check(comms: &[Comm], case: &Case, outs: &[CudaSlice<u8>], what: &str) {
    for (c, out) in comms.iter().zip(outs) {
        let got = c.stream().clone_dtoh(out).expect("read back");
        c.async_error().unwrap_or_else(|e| panic!("{what}: rank {}: {e}", c.rank()));
        let wrong = case.count_wrong(&got, &case.expected(c.rank()));
        assert_eq!(wrong.count, 0, "{what}: rank {}: {wrong:?} ({})", c.rank(), case.name());
    }
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_fused_all_reduce_eager_and_captured_matches_the_reference() {
    let comms = comms();
    let elems = 300_000;
    for replay in 0..3u64 {
        let case =
            Case::new(Collective::AllReduce, Dtype::F32, Op::Sum, comms.len(), elems * 4, 0.0, fresh_seed() + replay)
                .expect("case");
        let ins = upload(&comms, &case);
        let mut outs: Vec<CudaSlice<u8>> = comms.iter().map(|c| c.stream().alloc_zeros(elems * 4).unwrap()).collect();
        {
            // f32 elements as bytes: the call is in f32 over views of the byte buffers.
            // SAFETY: every bit pattern is an f32; the buffers hold `elems` × 4 bytes.
            let ins32: Vec<_> = ins.iter().map(|b| unsafe { b.transmute::<f32>(elems) }.expect("view")).collect();
            let mut outs32: Vec<_> =
                // SAFETY: as above.
                outs.iter_mut().map(|b| unsafe { b.transmute_mut::<f32>(elems) }.expect("view")).collect();
            let calls: Vec<_> = comms
                .iter()
                .zip(&ins32)
                .zip(outs32.iter_mut())
                .map(|((c, i), o)| c.prepare(Call::AllReduce { len: elems, op: ReduceOp::Sum }, i, o).expect("prepare"))
                .collect();
            let kernels: Vec<_> =
                calls.iter().map(|c| FusedKernel::compile(c, PLAIN, "plain").expect("compile")).collect();
            let grid = calls[0].blocks() + 2;
            if replay == 0 {
                launch_all(&calls, &kernels, grid).expect("launch");
            } else {
                // Captured: each rank's launch in its own graph, replayed once.
                let graphs: Vec<_> = comms
                    .iter()
                    .zip(calls.iter().zip(&kernels))
                    .map(|(c, (call, kernel))| {
                        let s = c.stream();
                        s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).expect("capture");
                        let launched = launch_all(std::slice::from_ref(call), std::slice::from_ref(kernel), grid);
                        let graph = s.end_capture(CUgraphInstantiate_flags(0));
                        launched.expect("captured launch");
                        graph.expect("end capture").expect("a graph")
                    })
                    .collect();
                for g in &graphs {
                    g.launch().expect("replay");
                }
                for c in &comms {
                    c.stream().synchronize().expect("sync");
                }
            }
        }
        check(&comms, &case, &outs, if replay == 0 { "eager" } else { "captured" });
    }
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_fused_all_gather_in_place_matches_the_reference() {
    let comms = comms();
    let world = comms.len();
    let per_rank = 100_003;
    let case = Case::new(Collective::AllGather, Dtype::F32, Op::Sum, world, per_rank * world * 4, 0.0, fresh_seed())
        .expect("case")
        .in_place(true);
    // Each rank's buffer: poison, with its contribution at partition `rank`.
    let mut bufs: Vec<CudaSlice<u8>> = comms
        .iter()
        .map(|c| {
            let layout = case.in_place_layout(c.rank()).expect("an in-place case");
            let mut b = poisoned(Dtype::F32, layout.len);
            let input = case.input(c.rank());
            b[layout.input_at * 4..layout.input_at * 4 + input.len()].copy_from_slice(&input);
            c.stream().clone_htod(&b).expect("upload")
        })
        .collect();
    {
        let mut views: Vec<_> =
            // SAFETY: every bit pattern is an f32; the buffers hold per_rank × world × 4 bytes.
            bufs.iter_mut().map(|b| unsafe { b.transmute_mut::<f32>(per_rank * world) }.expect("view")).collect();
        let calls: Vec<_> = comms
            .iter()
            .zip(views.iter_mut())
            .map(|(c, v)| c.prepare_in_place(Call::AllGatherInPlace { len: per_rank * world }, v).expect("prepare"))
            .collect();
        let kernels: Vec<_> = calls.iter().map(|c| FusedKernel::compile(c, PLAIN, "plain").expect("compile")).collect();
        launch_all(&calls, &kernels, calls[0].blocks()).expect("launch");
    }
    check(&comms, &case, &bufs, "in place");
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_fused_all_gather_consumers_read_each_shard_once_it_landed() {
    let comms = comms();
    let world = comms.len();
    let per_rank = 200_003;
    // Two rounds on fresh data: a landed word left set by the first would let the second's
    // consumers read the first's bytes.
    for round in 0..2 {
        let case =
            Case::new(Collective::AllGather, Dtype::F32, Op::Sum, world, per_rank * world * 4, 0.0, fresh_seed())
                .expect("case");
        let ins = upload(&comms, &case);
        let mut outs: Vec<CudaSlice<u8>> = comms
            .iter()
            .map(|c| c.stream().clone_htod(&poisoned(Dtype::F32, per_rank * world)).expect("out"))
            .collect();
        let seen: Vec<CudaSlice<u8>> = comms
            .iter()
            .map(|c| c.stream().clone_htod(&poisoned(Dtype::F32, per_rank * world)).expect("seen"))
            .collect();
        {
            // SAFETY: every bit pattern is an f32; each input holds per_rank f32 values.
            let in_views: Vec<_> = ins.iter().map(|b| unsafe { b.transmute::<f32>(per_rank) }.expect("view")).collect();
            let mut out_views: Vec<_> = outs
                .iter_mut()
                // SAFETY: as above; each output holds per_rank × world f32 values.
                .map(|b| unsafe { b.transmute_mut::<f32>(per_rank * world) }.expect("view"))
                .collect();
            let calls: Vec<_> = comms
                .iter()
                .zip(&in_views)
                .zip(out_views.iter_mut())
                .map(|((c, i), o)| c.prepare(Call::AllGather { len: per_rank }, i, o).expect("prepare"))
                .collect();
            let kernels: Vec<_> =
                calls.iter().map(|c| FusedKernel::compile(c, LANDED_COPY, "landed_copy").expect("compile")).collect();
            for (((comm, call), kernel), s) in comms.iter().zip(&calls).zip(&kernels).zip(&seen) {
                let args = call.launch_args().expect("args");
                let gathered = call.output_address();
                let (n, w, r) = (per_rank as u64, world as u32, comm.rank() as u32);
                let mut launch = kernel.launch_builder(call, &args);
                launch.arg(&gathered).arg(s).arg(&n).arg(&w).arg(&r);
                // SAFETY: the arguments match landed_copy's parameters (`seen` holds
                // per_rank × world f32 values); the kernel keeps the contract (the spare blocks
                // read a shard of the output only after wait_shard, and write only `seen`); the
                // buffers live until the streams are synchronised.
                unsafe { launch.launch(cfg(call, call.blocks() + 3)) }.expect("launch");
            }
        }
        // What the consumers copied, and the gathered output itself.
        check(&comms, &case, &seen, &format!("round {round}: consumers"));
        check(&comms, &case, &outs, &format!("round {round}: gathered"));
    }
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_fused_launches_that_break_the_contract_are_refused() {
    let comms = comms();
    let c = &comms[0];
    let s = c.stream();
    let send = s.alloc_zeros::<f32>(1 << 16).unwrap();
    let mut recv = s.alloc_zeros::<f32>(1 << 16).unwrap();
    let mut other = s.alloc_zeros::<f32>(1 << 16).unwrap();
    let call = c.prepare(Call::AllReduce { len: 1 << 16, op: ReduceOp::Sum }, &send, &mut recv).unwrap();
    let second = c.prepare(Call::AllReduce { len: 1 << 16, op: ReduceOp::Sum }, &send, &mut other).unwrap();
    let kernel = FusedKernel::compile(&call, PLAIN, "plain").unwrap();
    let args = call.launch_args().unwrap();
    let refused = |cfg: LaunchConfig, args: &purlin_collectives::CollectiveArgs| {
        let launch = kernel.launch_builder(&call, args);
        // SAFETY: every one of these launches is refused before it reaches the driver.
        match unsafe { launch.launch(cfg) } {
            Err(Error::InvalidArgument(m)) => m,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    };
    let ok = cfg(&call, call.blocks());
    let few = refused(LaunchConfig { grid_dim: (call.blocks() - 1, 1, 1), ..ok }, &args);
    assert!(few.contains("contracted blocks"), "{few}");
    let threads = refused(LaunchConfig { block_dim: (128, 1, 1), ..ok }, &args);
    assert!(threads.contains("threads per block"), "{threads}");
    let smem = refused(LaunchConfig { shared_mem_bytes: call.smem_bytes() - 16, ..ok }, &args);
    assert!(smem.contains("shared memory"), "{smem}");
    let huge = refused(LaunchConfig { grid_dim: (1 << 20, 1, 1), ..ok }, &args);
    assert!(huge.contains("co-resident"), "{huge}");
    let foreign = second.launch_args().unwrap();
    let wrong_args = refused(ok, &foreign);
    assert!(wrong_args.contains("another prepared call"), "{wrong_args}");
}
