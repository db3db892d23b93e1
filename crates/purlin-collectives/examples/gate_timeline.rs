//! Where a large throughput call's time goes, step by step (issue 8's gate: a 256 MiB
//! AllGather against the Atom's copy at the same block count).
//!
//! ```text
//! ./gate_timeline [--collective all-gather|all-reduce|reduce-scatter] [--mib 256 | --bytes N] [--runs 3] [--warm N] [--symmetric]
//! ```
//!
//! Both GPUs in one process (`PURLIN_SHARED_GPU=1`: both ranks on GPU 0). Each rank runs
//! the plan a call would run (same tuning, same derivation) through the executor with its
//! trace on, which stamps every step's start and every block's end with the GPU's global
//! timer. Printed per rank: the call's span (first step to last block end) and bus
//! bandwidth, and per role the mean time its blocks spend in each kind of step, the spread
//! of block end times, and when the writers' last stage and the readers' last step finished
//! (the tail), and chunk by chunk when each role's blocks began and left each kind of step.
//! With `--warm N`, N untraced calls through the public API run back to back just before
//! each traced one (a benchmark loop's conditions). With `--symmetric`, input and output are
//! symmetric buffers (`Comm::alloc_symmetric`), so the plan traced is the one-copy one. The
//! output is checked on every run.
//! Lines start with `TIMELINE`.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut};
use purlin_collectives::internal::conformance::TimedBlock;
use purlin_collectives::{Comm, CommConfig};
use purlin_snac::{CollectiveSpec, DataType, Plan, ReduceOp, Role, Step};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

/// The step a trace entry names.
fn step_of(plan: &Plan, block: u32, step: u32, body: Option<u32>) -> Option<&Step> {
    let s = plan.blocks.get(block as usize)?.steps.get(step as usize)?;
    match (s, body) {
        (Step::ChunkLoop { body: b, .. }, Some(i)) => b.get(i as usize),
        (s, None) => Some(s),
        _ => None,
    }
}

fn role_name(r: Role) -> String {
    format!("{r:?}").to_lowercase()
}

/// One role's blocks in a timed trace.
#[derive(Default)]
struct RoleTimes {
    blocks: usize,
    /// Summed over its blocks, by step kind.
    per_kind_us: BTreeMap<&'static str, f64>,
    first: u64,
    last: u64,
    first_end: u64,
}

/// Summarises one rank's timed trace.
fn report(rank: usize, plan: &Plan, blocks: &[TimedBlock], bus_bytes: f64) -> Result<()> {
    let t0 = blocks.iter().map(|b| b.begin_ns).min().context("an empty trace")?;
    let first_step = blocks.iter().filter_map(|b| b.steps.first().map(|s| s.1)).min().unwrap_or(t0);
    let t_end = blocks.iter().map(|b| b.end_ns).max().unwrap_or(t0);
    let span_us = (t_end - t0) as f64 / 1e3;
    println!(
        "TIMELINE rank {rank}: {} blocks, span {span_us:.2} us (first block began +0, first step +{:.2}, last block began +{:.2}), busbw {:.1} GB/s",
        blocks.len(),
        (first_step - t0) as f64 / 1e3,
        (blocks.iter().map(|b| b.begin_ns).max().unwrap_or(t0) - t0) as f64 / 1e3,
        bus_bytes / (span_us * 1e3)
    );
    // Per role: time in each step kind (mean over its blocks), first start, last end.
    let mut roles: BTreeMap<String, RoleTimes> = BTreeMap::new();
    for (b, tb) in blocks.iter().enumerate() {
        let role = role_name(plan.blocks[b].role);
        let entry =
            roles.entry(role).or_insert(RoleTimes { first: u64::MAX, first_end: u64::MAX, ..Default::default() });
        entry.blocks += 1;
        for (i, (e, start)) in tb.steps.iter().enumerate() {
            let next = tb.steps.get(i + 1).map_or(tb.end_ns, |s| s.1);
            let name = step_of(plan, e.block, e.step, e.body).map_or("?", Step::name);
            *entry.per_kind_us.entry(name).or_insert(0.0) += (next.saturating_sub(*start)) as f64 / 1e3;
        }
        entry.first = entry.first.min(tb.begin_ns);
        entry.last = entry.last.max(tb.end_ns);
        entry.first_end = entry.first_end.min(tb.end_ns);
    }
    for (role, RoleTimes { blocks: n, per_kind_us: kinds, first, last, first_end }) in &roles {
        let per: Vec<String> = kinds.iter().map(|(k, us)| format!("{k} {:.1}", us / *n as f64)).collect();
        println!(
            "TIMELINE rank {rank} {role:<9} x{n:<3} starts +{:.1} ends +{:.1}..+{:.1} us; mean us per block: {}",
            (*first - t0) as f64 / 1e3,
            (*first_end - t0) as f64 / 1e3,
            (*last - t0) as f64 / 1e3,
            per.join(", ")
        );
    }
    // Chunk by chunk, per role and step kind: when the first block began it and when the
    // first and last block left it (the spread between blocks of one chunk).
    let mut per_chunk: BTreeMap<(u64, String, &'static str), (u64, u64, u64)> = BTreeMap::new();
    for (b, tb) in blocks.iter().enumerate() {
        let role = role_name(plan.blocks[b].role);
        for (i, (e, start)) in tb.steps.iter().enumerate() {
            let end = tb.steps.get(i + 1).map_or(tb.end_ns, |s| s.1);
            let name = step_of(plan, e.block, e.step, e.body).map_or("?", Step::name);
            let slot = per_chunk.entry((e.chunk, role.clone(), name)).or_insert((u64::MAX, u64::MAX, 0));
            slot.0 = slot.0.min(*start);
            slot.1 = slot.1.min(end);
            slot.2 = slot.2.max(end);
        }
    }
    let mut chunks: Vec<u64> = per_chunk.keys().map(|k| k.0).collect();
    chunks.dedup();
    for c in chunks {
        let parts: Vec<String> = per_chunk
            .range((c, String::new(), "")..(c + 1, String::new(), ""))
            .map(|((_, role, name), (s, e0, e1))| {
                let us = |t: &u64| (*t - t0) as f64 / 1e3;
                format!("{role}.{name} +{:.1}..+{:.1}/+{:.1}", us(s), us(e0), us(e1))
            })
            .collect();
        println!("TIMELINE rank {rank} chunk {c}: {}", parts.join("  "));
    }
    // Block 0 of each role, chunk by chunk: when each step of the loop began.
    let mut seen = Vec::new();
    for (b, tb) in blocks.iter().enumerate() {
        let role = plan.blocks[b].role;
        if seen.contains(&role) {
            continue;
        }
        seen.push(role);
        let line: Vec<String> = tb
            .steps
            .iter()
            .map(|(e, s)| {
                let name = step_of(plan, e.block, e.step, e.body).map_or("?", Step::name);
                format!("{name}[{}]@{:.2}", e.chunk, (*s - t0) as f64 / 1e3)
            })
            .collect();
        println!(
            "TIMELINE rank {rank} block {b} ({}): {} end@{:.1}",
            role_name(role),
            line.join(" "),
            (tb.end_ns - t0) as f64 / 1e3
        );
    }
    Ok(())
}

struct Rank<B> {
    comm: Comm,
    stream: Arc<CudaStream>,
    input: B,
    output: B,
    expected: Vec<f32>,
}

/// What one timeline run needs besides the ranks.
struct Setup {
    collective: String,
    spec: CollectiveSpec,
    bytes: u64,
    bus_bytes: f64,
    runs: usize,
    warm: usize,
}

fn main() -> Result<()> {
    purlin_log::init()?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let collective = arg(&args, "--collective").unwrap_or_else(|| "all-gather".into());
    let mib: u64 = arg(&args, "--mib").map_or(Ok(256), |s| s.parse()).context("--mib")?;
    let runs: usize = arg(&args, "--runs").map_or(Ok(3), |s| s.parse()).context("--runs")?;
    let warm: usize = arg(&args, "--warm").map_or(Ok(0), |s| s.parse()).context("--warm")?;
    // --bytes: an exact size (the larger buffer), for latency-regime calls.
    let bytes: u64 = arg(&args, "--bytes").map_or(Ok(mib << 20), |s| s.parse()).context("--bytes")?;
    // PURLIN_SHARED_GPU=1: both ranks on GPU 0 (steps and spans, no NVLink figure).
    let config = CommConfig::from_env()?;
    let ordinals = if config.shared_gpu { [0, 0] } else { [0, 1] };
    let gpus = if purlin_collectives::driver_present() { purlin_collectives::device_count() } else { 0 };
    if gpus <= ordinals[1] {
        bail!("gate_timeline needs 2 GPUs (or PURLIN_SHARED_GPU=1 and one)");
    }
    let streams = ordinals.iter().map(|&d| Ok(CudaContext::new(d)?.new_stream()?)).collect::<Result<Vec<_>>>()?;
    let comms = Comm::from_devices_with_config(streams, config)?;
    let world = 2u64;
    // Sizes as purlin-bench counts them: `bytes` is the larger buffer; f32 elements.
    let big = bytes / 4;
    let (spec, in_count, out_count) = match collective.as_str() {
        "all-gather" => (CollectiveSpec::all_gather(2, DataType::F32, big / world), big / world, big),
        "all-reduce" => (CollectiveSpec::all_reduce(2, DataType::F32, ReduceOp::Sum, big), big, big),
        "reduce-scatter" => {
            (CollectiveSpec::reduce_scatter(2, DataType::F32, ReduceOp::Sum, big / world), big, big / world)
        }
        other => bail!("--collective {other}: all-gather, all-reduce or reduce-scatter"),
    };
    // Small integers: every sum is exact whatever the order.
    let input_of = |r: u64| -> Vec<f32> { (0..in_count).map(|i| ((i * 7 + r * 3) % 64) as f32).collect() };
    let inputs: Vec<Vec<f32>> = (0..world).map(input_of).collect();
    let symmetric = args.iter().any(|a| a == "--symmetric");
    let bus_bytes = match collective.as_str() {
        "all-reduce" => 2.0 * (out_count * 4) as f64 * 0.5,
        _ => (big * 4) as f64 * 0.5,
    };
    let setup = Setup { collective, spec, bytes, bus_bytes, runs, warm };
    let expected = |r: u64| -> Vec<f32> {
        match setup.collective.as_str() {
            "all-gather" => inputs.iter().flatten().copied().collect(),
            "all-reduce" => (0..in_count as usize).map(|i| inputs[0][i] + inputs[1][i]).collect(),
            _ => {
                let at = (r * out_count) as usize;
                (0..out_count as usize).map(|i| inputs[0][at + i] + inputs[1][at + i]).collect()
            }
        }
    };
    if !symmetric {
        let mut ranks = Vec::new();
        for comm in comms {
            let r = comm.rank() as u64;
            let stream = comm.stream();
            comm.context().bind_to_thread()?;
            let input = stream.clone_htod(&inputs[r as usize])?;
            let output = stream.alloc_zeros::<f32>(out_count as usize)?;
            ranks.push(Rank { comm, stream, input, output, expected: expected(r) });
        }
        timeline(&mut ranks, &setup)?;
        return Ok(());
    }
    // --symmetric: input and output are symmetric buffers (`Comm::alloc_symmetric`), so calls
    // run the one-copy plans, and the traced launch gets every rank's buffers as a call does.
    let sym_inputs = Comm::alloc_symmetric_group::<f32>(&comms, in_count as usize)?;
    let sym_outputs = Comm::alloc_symmetric_group::<f32>(&comms, out_count as usize)?;
    let mut ranks = Vec::new();
    for ((comm, mut input), output) in comms.into_iter().zip(sym_inputs).zip(sym_outputs) {
        let r = comm.rank() as u64;
        let stream = comm.stream();
        comm.context().bind_to_thread()?;
        stream.memcpy_htod(&inputs[r as usize], &mut input)?;
        ranks.push(Rank { comm, stream, input, output, expected: expected(r) });
    }
    timeline(&mut ranks, &setup)?;
    // Freed together before the communicators close (a buffer still held at teardown is
    // reported leaked).
    let (mut comms, mut ins, mut outs) = (Vec::new(), Vec::new(), Vec::new());
    for r in ranks {
        comms.push(r.comm);
        ins.push(r.input);
        outs.push(r.output);
    }
    Comm::free_symmetric_group(&comms, outs)?;
    Comm::free_symmetric_group(&comms, ins)?;
    Ok(())
}

/// Traces `setup.runs` launches of every rank's plan (resolved for these buffers as a call
/// resolves it), checking the output of each.
fn timeline<B: DevicePtr<f32> + DevicePtrMut<f32>>(ranks: &mut [Rank<B>], setup: &Setup) -> Result<()> {
    let Setup { collective, spec, bytes, bus_bytes, runs, warm } = setup;
    let (bytes, bus_bytes, runs, warm) = (*bytes, *bus_bytes, *runs, *warm);
    let plans = ranks
        .iter()
        .map(|r| {
            let (input, _) = r.input.device_ptr(&r.stream);
            let (output, _) = r.output.device_ptr(&r.stream);
            r.comm.plan_for_buffers(spec.clone(), false, input, output)
        })
        .collect::<Result<Vec<_>, _>>()?;
    println!(
        "TIMELINE {collective} {bytes} bytes, f32, plan grid {} ({}), {runs} runs (first is warm-up)",
        plans[0].grid(),
        plans[0]
            .blocks
            .iter()
            .map(|b| role_name(b.role))
            .fold(BTreeMap::<String, usize>::new(), |mut m, r| {
                *m.entry(r).or_default() += 1;
                m
            })
            .iter()
            .map(|(r, n)| format!("{n} {r}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for run in 0..runs {
        let mut launches = Vec::new();
        for r in ranks.iter_mut() {
            r.comm.context().bind_to_thread()?;
            r.stream.memset_zeros(&mut r.output)?;
        }
        // --warm: calls through the public API just before the traced one, so that the traced
        // call starts the way calls in a benchmark loop do (links busy, peer mid-call).
        for _ in 0..warm {
            for r in ranks.iter_mut() {
                r.comm.context().bind_to_thread()?;
                match collective.as_str() {
                    "all-gather" => r.comm.all_gather(&r.input, &mut r.output)?,
                    "all-reduce" => r.comm.all_reduce(&r.input, &mut r.output, &purlin_collectives::ReduceOp::Sum)?,
                    _ => r.comm.reduce_scatter(&r.input, &mut r.output, &purlin_collectives::ReduceOp::Sum)?,
                };
            }
        }
        for (r, plan) in ranks.iter_mut().zip(&plans) {
            r.comm.context().bind_to_thread()?;
            launches.push(r.comm.launch_plan_for_conformance(plan, &r.input, &mut r.output)?);
        }
        let traces = launches.into_iter().map(|l| l.timed_trace()).collect::<Result<Vec<_>, _>>()?;
        for r in ranks.iter() {
            let got = r.stream.clone_dtoh(&r.output)?;
            let wrong = got.iter().zip(&r.expected).filter(|(a, b)| a != b).count();
            if wrong > 0 {
                bail!("rank {}: {wrong} wrong elements in run {run}", r.comm.rank());
            }
        }
        if run + 1 == runs || run > 0 {
            println!("TIMELINE run {run} (output checked)");
            for (rank, (plan, trace)) in plans.iter().zip(&traces).enumerate() {
                report(rank, plan, trace, bus_bytes)?;
            }
        }
    }
    Ok(())
}
