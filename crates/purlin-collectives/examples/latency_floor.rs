//! Where an 8-byte AllReduce's time goes (issue 9's gate: ≤ ping-pong round trip / 2 + 2.5 µs).
//!
//! ```text
//! ./latency_floor                      # every local GPU in one process (world 2 needed)
//! python3 -m torch.distributed.run --no-python --nproc-per-node 2 ./latency_floor
//! ```
//!
//! Same run, same communicator, same CUDA-graph method as `purlin-bench --mode graph` (a
//! graph of `CALLS` launches; one replay's wall-clock / `CALLS`, median of `REPLAYS`):
//! - `empty`: an empty kernel (1 block of 32 threads, one 8-byte parameter, plain launch);
//! - `empty-big`, `empty-big-coop`, `empty-big-coop-g2`: the executor's launch shape step by
//!   step (31 KiB parameter block, 512 threads and the Atom's dynamic shared memory,
//!   cooperative attribute, 2 blocks);
//! - `entry`: the executor's entry and exit without a plan (poison word and epoch loads,
//!   barriers, epoch store) in the executor's launch shape;
//! - `chain8`: 8 dependent parameter-word reads by one thread (an interpreter reading its
//!   records from the constant bank); `prefetch-ldc` / `prefetch-generic`: the first 1024
//!   words copied into shared memory by every thread (indexed parameter reads / 16-byte
//!   generic loads, as the executor does), then the same chain there;
//! - `exchange-min`: the least one-shot 8-byte AllReduce (one 16-byte packet each way, one
//!   thread), smallest launch; `exchange-exec-shape`: the same in the executor's shape;
//! - `purlin`: the real `Comm::all_reduce` of 8 bytes (f32 sum);
//! - eager rows (`CALLS` launches back to back, no graph, then one synchronize): an empty
//!   kernel with an 8-byte parameter, with the 31 KiB block (plain and cooperative), and the
//!   real AllReduce — what an eager launch pays for its parameter block;
//! - the flag ping-pong round trip through the same workspace.
//!
//! Every exchange and AllReduce result is checked. Lines start with `FLOOR`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cudarc::driver::sys::{self, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaGraph, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};
use purlin_collectives::TorchEnv;
use purlin_collectives::internal::KernelRequest;
use purlin_collectives::{Comm, CommConfig, ReduceOp};

const CALLS: usize = 200;
const REPLAYS: usize = 40;
const PARAM_WORDS: usize = 3968;
const DEVICE_TIMEOUT: Duration = Duration::from_secs(2);
const FUNCTIONS: [&str; 7] = [
    "floor_empty",
    "floor_empty_big",
    "floor_entry",
    "floor_exchange",
    "floor_chain",
    "floor_prefetch_ldc",
    "floor_prefetch_generic",
];

/// The executor's parameter block size (`kernels.rs`: EXEC_PARAM_WORDS).
#[repr(C)]
#[derive(Clone, Copy)]
struct BigParams {
    w: [u64; PARAM_WORDS],
}

// SAFETY: plain old data, laid out as the kernels' `BigParams` (3968 u64 words).
unsafe impl DeviceRepr for BigParams {}

/// One rank driven by this process.
struct Rank {
    comm: Comm,
    stream: Arc<CudaStream>,
    sink: CudaSlice<u64>,
    x: CudaSlice<u64>,
    sum: CudaSlice<u64>,
    ar_in: CudaSlice<f32>,
    ar_out: CudaSlice<f32>,
}

#[derive(Clone, Copy)]
struct Shape {
    grid: u32,
    threads: u32,
    smem: u32,
    cooperative: bool,
}

#[derive(Clone, Copy)]
enum Kernel {
    Empty,
    Chain,
    PrefetchLdc,
    PrefetchGeneric,
    EmptyBig,
    Entry,
    Exchange,
    AllReduce,
}

fn config() -> Result<CommConfig> {
    let mut c = CommConfig::from_env()?;
    c.device_timeout = DEVICE_TIMEOUT;
    c.kernels = FUNCTIONS
        .iter()
        .map(|f| KernelRequest {
            unit: purlin_collectives::internal::kernels::latency_floor_unit(),
            function: (*f).into(),
            block_size: 512,
            dynamic_smem: 0,
        })
        .collect();
    Ok(c)
}

fn open(ordinal: usize) -> Result<Arc<CudaStream>> {
    let ctx = CudaContext::new(ordinal).with_context(|| format!("CUDA context on GPU {ordinal}"))?;
    // SAFETY: no allocation of this context exists yet; nothing here records events, which
    // keeps graph capture free of tracked events (docs/dev/device.md).
    unsafe { ctx.disable_event_tracking() };
    Ok(ctx.new_stream()?)
}

fn comms() -> Result<Vec<Comm>> {
    if !purlin_collectives::driver_present() {
        bail!("latency_floor needs a GPU (no CUDA driver here)");
    }
    if std::env::var_os("WORLD_SIZE").is_some() {
        let env = TorchEnv::from_process()?;
        let stream = open(env.device_ordinal(purlin_collectives::device_count())?)?;
        Ok(vec![Comm::from_env_with_stream(stream, config()?).context("Comm::from_env")?])
    } else {
        let streams = (0..purlin_collectives::device_count()).map(open).collect::<Result<Vec<_>>>()?;
        Comm::from_devices_with_config(streams, config()?).context("Comm::from_devices")
    }
}

impl Rank {
    fn new(comm: Comm) -> Result<Self> {
        let stream = comm.stream();
        comm.context().bind_to_thread()?;
        let r = comm.rank() as u64;
        Ok(Rank {
            sink: stream.alloc_zeros::<u64>(2)?,
            x: stream.clone_htod(&[1000 + r])?,
            sum: stream.alloc_zeros::<u64>(1)?,
            ar_in: stream.clone_htod(&[1.0 + r as f32, 10.0 * (1.0 + r as f32)])?,
            ar_out: stream.alloc_zeros::<f32>(2)?,
            stream,
            comm,
        })
    }

    fn addr(&self, rank: usize, offset: usize) -> u64 {
        self.comm.diag().workspace_addrs()[rank] + offset as u64
    }

    /// One launch of `kernel` in `shape` on this rank's stream (captured by the caller).
    fn launch(&mut self, kernel: Kernel, shape: Shape, big: &BigParams) -> Result<()> {
        let name = match kernel {
            Kernel::Empty => "floor_empty",
            Kernel::EmptyBig => "floor_empty_big",
            Kernel::Entry => "floor_entry",
            Kernel::Exchange => "floor_exchange",
            Kernel::Chain => "floor_chain",
            Kernel::PrefetchLdc => "floor_prefetch_ldc",
            Kernel::PrefetchGeneric => "floor_prefetch_generic",
            Kernel::AllReduce => {
                self.comm.all_reduce(&self.ar_in, &mut self.ar_out, &ReduceOp::Sum)?;
                return Ok(());
            }
        };
        let f = &self.comm.diag().kernel(name).context("a floor kernel was not loaded")?.function;
        if shape.smem > 48 << 10 {
            f.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shape.smem as i32,
            )?;
        }
        let layout = self.comm.diag().workspace_layout();
        let (me, peer) = (self.comm.rank(), 1 - self.comm.rank());
        // Scratch in this experiment's own staging (no collective runs while it does):
        // packet slots at 0, entry epochs at 4096, the exchange's epoch at 8192.
        let staging = layout.staging.offset;
        let control = self.addr(me, layout.control.offset);
        let (my_slots, peer_slots) = (self.addr(me, staging), self.addr(peer, staging));
        let (epochs, epoch) = (self.addr(me, staging + 4096), self.addr(me, staging + 8192));
        let timeout_ns = DEVICE_TIMEOUT.as_nanos() as u64;
        let sink = {
            let (p, _record) = cudarc::driver::DevicePtr::device_ptr(&self.sink, &self.stream);
            p
        };
        let (x, sum) = {
            let (a, _ra) = cudarc::driver::DevicePtr::device_ptr(&self.x, &self.stream);
            let (b, _rb) = cudarc::driver::DevicePtr::device_ptr(&self.sum, &self.stream);
            (a, b)
        };
        let cfg = LaunchConfig {
            grid_dim: (shape.grid, 1, 1),
            block_dim: (shape.threads, 1, 1),
            shared_mem_bytes: shape.smem,
        };
        let mut b = self.stream.launch_builder(f);
        match kernel {
            Kernel::Empty => b.arg(&sink),
            Kernel::EmptyBig | Kernel::Chain | Kernel::PrefetchLdc | Kernel::PrefetchGeneric => b.arg(big).arg(&sink),
            Kernel::Entry => b.arg(big).arg(&control).arg(&epochs),
            _ => {
                b.arg(big).arg(&peer_slots).arg(&my_slots).arg(&epoch).arg(&x).arg(&sum).arg(&control).arg(&timeout_ns)
            }
        };
        // SAFETY: each kernel's signature matches the arguments pushed above (latency_floor.cu);
        // every address is live device memory of this rank or the peer's workspace, mapped
        // here until the communicator is dropped at the end of main; the kernels touch only
        // the first 16 KiB of staging (no collective runs meanwhile) and the slices above;
        // every wait is bounded by DEVICE_TIMEOUT; grids of ≤ 2 blocks are co-resident.
        unsafe {
            if shape.cooperative {
                b.launch_cooperative(cfg)?;
            } else {
                b.launch(cfg)?;
            }
        }
        Ok(())
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One warm-up run of `run`, then the median of `REPLAYS` runs (each returns µs per call).
fn median_of_runs(mut run: impl FnMut() -> Result<f64>) -> Result<f64> {
    run()?;
    Ok(median((0..REPLAYS).map(|_| run()).collect::<Result<Vec<_>>>()?))
}

/// Per-call microseconds of `kernel` on every rank of this process, graph-replayed.
fn measure(ranks: &mut [Rank], kernel: Kernel, shape: Shape) -> Result<f64> {
    let mut big = Box::new(BigParams { w: [0; PARAM_WORDS] });
    if matches!(kernel, Kernel::Chain | Kernel::PrefetchLdc | Kernel::PrefetchGeneric) {
        // The chain the kernels follow: w[16k] = 16(k + 1) for k < 8, ending at w[128] = 0.
        for k in 0..8 {
            big.w[16 * k] = 16 * (k as u64 + 1);
        }
    }
    let mut graphs: Vec<CudaGraph> = Vec::new();
    for r in ranks.iter_mut() {
        r.comm.context().bind_to_thread()?;
        r.stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let issued: Result<()> = (0..CALLS).try_for_each(|_| r.launch(kernel, shape, &big));
        let graph = r.stream.end_capture(CUgraphInstantiate_flags(0));
        issued?;
        graphs.push(graph?.context("the capture made no graph")?);
    }
    let replay = |ranks: &[Rank], graphs: &[CudaGraph]| -> Result<f64> {
        // One rank per process (torchrun): start together. One process drives all ranks.
        if let [r] = ranks {
            r.comm.diag().host().barrier("latency_floor replay")?;
        }
        let t0 = Instant::now();
        for (r, g) in ranks.iter().zip(graphs) {
            r.comm.context().bind_to_thread()?;
            g.launch()?;
        }
        for r in ranks {
            r.stream.synchronize()?;
            r.comm.async_error()?;
        }
        Ok(t0.elapsed().as_secs_f64() * 1e6 / CALLS as f64)
    };
    median_of_runs(|| replay(ranks, &graphs))
}

/// Per-call microseconds of `kernel` launched eagerly (no graph) CALLS times on every rank
/// of this process, then synchronized: what a launch costs the host and the upload of its
/// parameters, which a graph replay does not pay.
fn measure_eager(ranks: &mut [Rank], kernel: Kernel, shape: Shape) -> Result<f64> {
    let big = Box::new(BigParams { w: [0; PARAM_WORDS] });
    median_of_runs(|| {
        if let [r] = &ranks[..] {
            r.comm.diag().host().barrier("latency_floor eager")?;
        }
        let t0 = Instant::now();
        for _ in 0..CALLS {
            for r in ranks.iter_mut() {
                r.comm.context().bind_to_thread()?;
                r.launch(kernel, shape, &big)?;
            }
        }
        for r in ranks.iter() {
            r.stream.synchronize()?;
            r.comm.async_error()?;
        }
        Ok(t0.elapsed().as_secs_f64() * 1e6 / CALLS as f64)
    })
}

fn check(ranks: &[Rank]) -> Result<usize> {
    let world = ranks[0].comm.world_size() as u64;
    let mut wrong = 0;
    for r in ranks {
        let sum = r.stream.clone_dtoh(&r.sum)?[0];
        let ar = r.stream.clone_dtoh(&r.ar_out)?;
        let want_sum = 1000 * world + world * (world - 1) / 2;
        let want_ar = [(world * (world + 1) / 2) as f32, 10.0 * (world * (world + 1) / 2) as f32];
        if sum != want_sum {
            eprintln!("rank {}: exchange sum {sum}, expected {want_sum}", r.comm.rank());
            wrong += 1;
        }
        if ar != want_ar {
            eprintln!("rank {}: all_reduce {ar:?}, expected {want_ar:?}", r.comm.rank());
            wrong += 1;
        }
    }
    Ok(wrong)
}

fn main() -> Result<()> {
    purlin_log::init()?;
    let mut ranks = comms()?.into_iter().map(Rank::new).collect::<Result<Vec<_>>>()?;
    let first = ranks[0].comm.rank();
    if ranks[0].comm.world_size() != 2 {
        bail!("latency_floor measures world 2 (this world is {})", ranks[0].comm.world_size());
    }
    let smem = purlin_atom::AtomSpec::new(purlin_atom::Generation::Hopper).smem_bytes();
    let small = Shape { grid: 1, threads: 32, smem: 0, cooperative: false };
    let exec = Shape { grid: 1, threads: 512, smem, cooperative: true };
    let rows: [(&str, Kernel, Shape); 12] = [
        ("empty", Kernel::Empty, small),
        ("empty-big", Kernel::EmptyBig, Shape { threads: 512, ..small }),
        ("empty-big-smem", Kernel::EmptyBig, Shape { cooperative: false, ..exec }),
        ("empty-big-coop", Kernel::EmptyBig, exec),
        ("empty-big-coop-g2", Kernel::EmptyBig, Shape { grid: 2, ..exec }),
        ("entry", Kernel::Entry, exec),
        ("chain8", Kernel::Chain, exec),
        ("prefetch-ldc", Kernel::PrefetchLdc, exec),
        ("prefetch-generic", Kernel::PrefetchGeneric, exec),
        ("exchange-min", Kernel::Exchange, small),
        ("exchange-exec-shape", Kernel::Exchange, exec),
        ("purlin", Kernel::AllReduce, exec),
    ];
    let spec = purlin_snac::CollectiveSpec::all_reduce(2, purlin_snac::DataType::F32, purlin_snac::ReduceOp::Sum, 2);
    let plan = ranks[0].comm.plan_for_conformance(spec, false)?;
    println!(
        "FLOOR rank {first}: the 8-byte AllReduce runs a {:?} plan of {} blocks ({} steps)",
        plan.regime,
        plan.grid(),
        plan.blocks.iter().map(|b| b.steps.len()).sum::<usize>()
    );
    let mode = if ranks.len() == 1 { "one process per GPU" } else { "one process" };
    println!("FLOOR {mode}, rank {first}: graph of {CALLS} launches, median of {REPLAYS} replays, us per call");
    let mut results = Vec::new();
    for (name, kernel, shape) in rows {
        let us = measure(&mut ranks, kernel, shape).with_context(|| format!("row {name}"))?;
        println!(
            "FLOOR rank {first} {name:<20} {us:7.3} us  (grid {}, {} threads, smem {}, {})",
            shape.grid,
            shape.threads,
            shape.smem,
            if shape.cooperative { "cooperative" } else { "plain" }
        );
        results.push((name, us));
    }
    // Eager launches: the executor's 31 KiB parameter block against an 8-byte one, same shape.
    for (name, kernel, shape) in [
        ("eager-empty", Kernel::Empty, Shape { threads: 512, ..small }),
        ("eager-empty-big", Kernel::EmptyBig, Shape { threads: 512, ..small }),
        ("eager-empty-big-coop", Kernel::EmptyBig, exec),
        ("eager-purlin", Kernel::AllReduce, exec),
    ] {
        let us = measure_eager(&mut ranks, kernel, shape).with_context(|| format!("row {name}"))?;
        println!("FLOOR rank {first} {name:<20} {us:7.3} us  (eager, {} ranks in this process)", ranks.len());
        results.push((name, us));
    }
    let wrong = check(&ranks)?;
    // The same run's ping-pong through this workspace (lower rank initiates).
    let rtt = if ranks.len() == 2 {
        let launches = [
            ranks[0].comm.diag().launch_ping_pong(1, 20_000, DEVICE_TIMEOUT)?,
            ranks[1].comm.diag().launch_ping_pong(0, 20_000, DEVICE_TIMEOUT)?,
        ];
        let mut rtt = 0.0;
        for l in launches {
            let p = l.wait()?;
            if p.initiator {
                rtt = p.round_trip_us;
            }
        }
        rtt
    } else {
        let c = &ranks[0].comm;
        c.diag().ping_pong(1 - c.rank(), 20_000, DEVICE_TIMEOUT)?.round_trip_us
    };
    let get = |n: &str| results.iter().find(|(k, _)| *k == n).map_or(f64::NAN, |(_, v)| *v);
    println!(
        "FLOOR-SUMMARY {mode} rank {first}: ping-pong {rtt:.2} us -> gate {:.2} us; purlin {:.2}; least exchange {:.2} (exec shape {:.2}); empty graph kernel {:.2} (exec shape {:.2}); entry+exit {:.2}; param chain x8 {:.2}; prefetch ldc {:.2} generic {:.2}; eager: empty {:.2}, 31 KiB params {:.2} (coop {:.2}), purlin {:.2}; wrong {wrong}",
        rtt / 2.0 + 2.5,
        get("purlin"),
        get("exchange-min"),
        get("exchange-exec-shape"),
        get("empty"),
        get("empty-big-coop"),
        get("entry"),
        get("chain8"),
        get("prefetch-ldc"),
        get("prefetch-generic"),
        get("eager-empty"),
        get("eager-empty-big"),
        get("eager-empty-big-coop"),
        get("eager-purlin"),
    );
    if wrong > 0 {
        bail!("{wrong} wrong results");
    }
    Ok(())
}
