//! The Atom's device microbenchmark (issue 5): per generation and block count, local
//! copy, peer push and pull (one way, and both GPUs at once), 2-source reduce with one
//! remote source, N-source reduce with remote sources; the copy engine's figures from the
//! same run beside them; a summary against the targets last.
//!
//! Timing: CUDA events after warm-up, median of many; every message is 64 MiB and three
//! buffer sets rotate (L2 is 60 MiB on H200), so nothing is served from cache. One-way
//! rows time each launch; "both" rows time batches of back-to-back launches on both GPUs
//! (per direction = bytes / batch time / launches, the slower GPU counted).
//!
//! Rows for the question "is the bf16 reduce instruction-bound?": `reduce2-both-f32` (f32
//! sum, no conversion: the control), `reduce2-both` of the software-conversion build
//! (`...-soft`, `AtomParams::soft_convert`) beside the default's, and `local-copy-1g` (1 GiB,
//! 132..1056 blocks: the calibration's local-copy measurement, which 64 MiB copies of ~40 us
//! do not reproduce).
//!
//! Usage: `atom_bench [--quick] [--sweep]` (`--sweep`: also Hopper pipeline sizings),
//! `atom_bench --local` (one GPU: local copies of 64 MiB at 1..32 blocks for every build,
//! the bulk-copy sizings included, each build's copy checked byte for byte; what one block
//! copies per second bounds the executor's readers when a call has few blocks), or
//! `atom_bench --probe NAME`: set up, warm up and run only PROBE_LAUNCHES launches of one
//! configuration, then exit (for `ncu`, which replays every profiled kernel); NAME is one of
//! PROBES (`--probe list` prints them).

use std::error::Error;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, sys};
use purlin_atom::device::{DeviceBuffer, arch_of, driver_present, enable_peer_access};
use purlin_atom::sources::standalone_unit;
use purlin_atom::{AtomParams, AtomSpec, DType, DeviceAtom, Generation, KernelCache, ReduceOp};

type Res<T> = Result<T, Box<dyn Error>>;

const MSG: usize = 64 << 20;
const SETS: usize = 3;
/// The local-copy-1g row's buffer (the calibration's size).
const BIG: usize = 1 << 30;
const BIG_BLOCKS: [u32; 4] = [132, 264, 528, 1056];

/// `--probe` configurations: (name, what it runs).
const PROBES: [(&str, &str); 6] = [
    ("reduce2-bf16-8", "default Atom, 8 blocks, bf16 sum of a local and a peer source, GPU 0"),
    ("reduce2-f32-8", "default Atom, 8 blocks, f32 sum of a local and a peer source, GPU 0"),
    ("reduce2-bf16-soft-8", "software-conversion Atom, 8 blocks, bf16 sum of a local and a peer source, GPU 0"),
    ("local-copy-1g-264", "default Atom, 264 blocks, local copy of 1 GiB, GPU 0"),
    ("pull-both-16", "default Atom, 16 blocks, both GPUs pull 64 MiB from the peer"),
    ("push-both-16", "default Atom, 16 blocks, both GPUs push 64 MiB to the peer"),
];
const PROBE_LAUNCHES: usize = 5;

/// docs/dev/device.md's calibration (2×H200, 2026-11-30), for reference beside this run's figures.
const CAL_LOCAL_COPY: f64 = 3950.0;
const CAL_PUSH_BOTH: [(u32, f64); 3] = [(8, 351.0), (32, 349.0), (132, 364.0)];
const CAL_PULL_BOTH: [(u32, f64); 3] = [(16, 324.0), (32, 335.0), (132, 337.0)];
const CAL_PUSH_ONE: [(u32, f64); 3] = [(8, 353.0), (16, 347.0), (132, 369.0)];
const CAL_PULL_ONE: [(u32, f64); 3] = [(8, 206.0), (16, 360.0), (32, 372.0)];

fn cal_at(table: &[(u32, f64)], blocks: u32) -> Option<f64> {
    table.iter().find(|(b, _)| *b == blocks).map(|&(_, v)| v)
}

struct Rig {
    ctxs: Vec<Arc<CudaContext>>,
    streams: Vec<Arc<CudaStream>>,
    cache: KernelCache,
    iters: usize,
    batch: usize,
    rows: Vec<Row>,
}

#[derive(Clone)]
struct Row {
    test: &'static str,
    label: String,
    blocks: u32,
    gbps: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[v.len() / 2]
}

fn event(stream: &CudaStream) -> Res<cudarc::driver::CudaEvent> {
    Ok(stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?)
}

impl Rig {
    /// Median seconds of `op(i)` on GPU `dev`'s stream, each launch timed by events.
    fn time_one(&self, dev: usize, op: &mut dyn FnMut(usize) -> Res<()>) -> Res<f64> {
        let s = &self.streams[dev];
        for i in 0..3 {
            op(i)?;
        }
        s.synchronize()?;
        let mut pairs = Vec::with_capacity(self.iters);
        for i in 0..self.iters {
            let a = event(s)?;
            op(i)?;
            let b = event(s)?;
            pairs.push((a, b));
        }
        s.synchronize()?;
        let times =
            pairs.iter().map(|(a, b)| a.elapsed_ms(b).map(|ms| ms as f64 / 1e3)).collect::<Result<Vec<_>, _>>()?;
        Ok(median(times))
    }

    /// Median seconds per launch with both GPUs running `op(dev, i)` at once, in batches;
    /// the slower GPU's figure.
    fn time_both(&self, op: &mut dyn FnMut(usize, usize) -> Res<()>) -> Res<f64> {
        for i in 0..3 {
            op(0, i)?;
            op(1, i)?;
        }
        for s in &self.streams {
            s.synchronize()?;
        }
        let mut per_launch = Vec::new();
        for _ in 0..5 {
            let starts = [event(&self.streams[0])?, event(&self.streams[1])?];
            for i in 0..self.batch {
                op(0, i)?;
                op(1, i)?;
            }
            let ends = [event(&self.streams[0])?, event(&self.streams[1])?];
            let t0 = starts[0].elapsed_ms(&ends[0])? as f64 / 1e3;
            let t1 = starts[1].elapsed_ms(&ends[1])? as f64 / 1e3;
            per_launch.push(t0.max(t1) / self.batch as f64);
        }
        Ok(median(per_launch))
    }

    fn record(&mut self, test: &'static str, label: &str, blocks: u32, bytes: f64, secs: f64) {
        let gbps = bytes / secs / 1e9;
        let reference = match test {
            "local-copy" | "local-copy-1g" => Some(CAL_LOCAL_COPY),
            "push-one" => cal_at(&CAL_PUSH_ONE, blocks),
            "pull-one" => cal_at(&CAL_PULL_ONE, blocks),
            "push-both" => cal_at(&CAL_PUSH_BOTH, blocks),
            "pull-both" => cal_at(&CAL_PULL_BOTH, blocks),
            _ => None,
        };
        let r =
            reference.map(|c| format!("  ({:.0}% of docs/dev/device.md {c:.0})", 100.0 * gbps / c)).unwrap_or_default();
        println!("ATOM-BENCH {test:<16} {label:<26} blocks {blocks:>4}  {gbps:>8.1} GB/s  {:>9.1} us{r}", secs * 1e6);
        self.rows.push(Row { test, label: label.to_string(), blocks, gbps });
    }
}

/// Three rotating sets of `per_set` buffers of MSG bytes on one device, filled from `fill`.
fn buffers(ctx: &Arc<CudaContext>, per_set: usize, fill: &[u8]) -> Res<Vec<Vec<DeviceBuffer>>> {
    let mut sets = Vec::new();
    for _ in 0..SETS {
        let mut set = Vec::new();
        for _ in 0..per_set {
            let b = DeviceBuffer::new(ctx, MSG)?;
            b.upload(0, fill)?;
            set.push(b);
        }
        sets.push(set);
    }
    Ok(sets)
}

/// A splitmix64 stream: reproducible pseudo-random words from `seed`.
fn splitmix(seed: u64) -> impl Iterator<Item = u64> {
    let mut x = seed;
    std::iter::repeat_with(move || {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z
    })
}

/// `bytes` of bf16 values uniform in [-4, 4).
fn random_bf16(bytes: usize, seed: u64) -> Vec<u8> {
    let mut out: Vec<u8> = splitmix(seed)
        .flat_map(|z| (0..4).map(move |k| ((z >> (16 * k)) & 0xffff) as f32 / 65536.0 * 8.0 - 4.0))
        .take(bytes.div_ceil(2))
        .flat_map(|f| purlin_atom::host::f32_to_bf16(f).to_le_bytes())
        .collect();
    out.truncate(bytes);
    out
}

/// `bytes` of f32 values uniform in [-4, 4).
fn random_f32(bytes: usize, seed: u64) -> Vec<u8> {
    let mut out: Vec<u8> = splitmix(seed)
        .flat_map(|z| (0..2).map(move |k| ((z >> (32 * k)) & 0xffff_ffff) as f32 / 4_294_967_296.0 * 8.0 - 4.0))
        .take(bytes.div_ceil(4))
        .flat_map(f32::to_le_bytes)
        .collect();
    out.truncate(bytes);
    out
}

/// `spec` with the software bf16 conversions.
fn soft(spec: AtomSpec) -> Res<AtomSpec> {
    Ok(AtomSpec::with_params(spec.generation, AtomParams { soft_convert: true, ..spec.params })?)
}

/// What a build is in this run: a generation's default (every row), a sizing of the sweep,
/// or the default's software-conversion twin (the reduce rows only).
#[derive(Clone, Copy, PartialEq)]
enum Role {
    Base,
    Sweep,
    Soft,
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let sweep = args.iter().any(|a| a == "--sweep");
    let probe = match args.iter().position(|a| a == "--probe") {
        None => None,
        Some(i) => {
            let names = PROBES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ");
            match args.get(i + 1).map(String::as_str) {
                Some("list") => {
                    for (n, what) in PROBES {
                        println!("{n:<22} {what}");
                    }
                    return Ok(());
                }
                Some(name) if PROBES.iter().any(|(n, _)| *n == name) => Some(name.to_string()),
                Some(name) => return Err(format!("unknown probe {name:?}; probes: {names}").into()),
                None => return Err(format!("--probe needs a name: {names}").into()),
            }
        }
    };
    if !driver_present() {
        return Err("no CUDA driver on this machine".into());
    }
    if args.iter().any(|a| a == "--local") {
        return local_only();
    }
    let count = CudaContext::device_count()? as usize;
    if count < 2 {
        return Err(format!("atom_bench needs 2 GPUs, found {count}").into());
    }
    let ctxs = vec![CudaContext::new(0)?, CudaContext::new(1)?];
    enable_peer_access(&ctxs[0], &ctxs[1])?;
    enable_peer_access(&ctxs[1], &ctxs[0])?;
    let streams = vec![ctxs[0].new_stream()?, ctxs[1].new_stream()?];
    let arch = arch_of(&ctxs[0])?;
    let cache = KernelCache::default_location();
    let default_spec = AtomSpec::new(Generation::for_arch(arch)?);
    let soft_default = soft(default_spec)?;

    if let Some(name) = probe {
        let rig = Rig { ctxs, streams, cache, iters: 0, batch: 0, rows: Vec::new() };
        return run_probe(&rig, &name, default_spec, soft_default);
    }

    let base_count = Generation::selectable_on(arch).len();
    let mut specs: Vec<(AtomSpec, Role)> =
        Generation::selectable_on(arch).into_iter().map(|g| (AtomSpec::new(g), Role::Base)).collect();
    specs.push((soft_default, Role::Soft));
    if sweep {
        for (threads, depth, vecs) in
            [(512, 8, 2), (512, 9, 2), (256, 8, 4), (1024, 5, 2), (1024, 4, 1), (512, 3, 4), (256, 5, 2), (512, 9, 1)]
        {
            let params = AtomParams { threads, depth, vecs, bulk: false, soft_convert: false };
            specs.push((AtomSpec::with_params(Generation::Hopper, params)?, Role::Sweep));
        }
        // The bulk-copy (TMA) engine, kept only if it measures faster.
        for (threads, depth, vecs) in [(512, 5, 2), (512, 8, 2), (512, 4, 4), (512, 3, 8)] {
            let params = AtomParams { threads, depth, vecs, bulk: true, soft_convert: false };
            specs.push((AtomSpec::with_params(Generation::Hopper, params)?, Role::Sweep));
        }
        let params = AtomParams { threads: 512, depth: 16, vecs: 1, bulk: false, soft_convert: false };
        specs.push((AtomSpec::with_params(Generation::Generic, params)?, Role::Sweep));
    }
    let started = std::time::Instant::now();
    let jobs: Vec<_> = specs
        .iter()
        .flat_map(|(s, role)| {
            let mut units = vec![standalone_unit(s, None), standalone_unit(s, Some(DType::BF16))];
            if *role == Role::Base {
                units.push(standalone_unit(s, Some(DType::F32)));
            }
            units
        })
        .map(|u| (u, arch))
        .collect();
    cache.get_or_compile_all(&jobs, 16)?;
    println!(
        "atom_bench: {} and {} ({arch}), {} Atom builds compiled/cached in {:.1?}; {} MiB messages, {SETS} rotating sets",
        ctxs[0].name()?,
        ctxs[1].name()?,
        specs.len(),
        started.elapsed(),
        MSG >> 20
    );
    let mut rig = Rig { ctxs, streams, cache, iters: if quick { 7 } else { 25 }, batch: 10, rows: Vec::new() };

    // Buffers: on each GPU, sources (random bf16 data) and destinations.
    let data = random_bf16(MSG, 7);
    let srcs: Vec<Vec<Vec<DeviceBuffer>>> = (0..2).map(|d| buffers(&rig.ctxs[d], 8, &data)).collect::<Res<_>>()?;
    let dsts: Vec<Vec<Vec<DeviceBuffer>>> = (0..2).map(|d| buffers(&rig.ctxs[d], 1, &data)).collect::<Res<_>>()?;
    // f32 sources for the control rows (one per GPU and set).
    let data_f32 = random_f32(MSG, 11);
    let srcs_f32: Vec<Vec<Vec<DeviceBuffer>>> =
        (0..2).map(|d| buffers(&rig.ctxs[d], 1, &data_f32)).collect::<Res<_>>()?;

    // The copy engine, same run.
    {
        let ce = |rig: &Rig, dev: usize, dst: u64, src: u64| -> Res<()> {
            rig.ctxs[dev].bind_to_thread()?;
            // SAFETY: both are live MSG-byte allocations reachable from `dev` (peer access
            // enabled both ways); the stream belongs to `dev`'s context.
            unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, MSG, rig.streams[dev].cu_stream()) }.result()?;
            Ok(())
        };
        let t = rig.time_one(0, &mut |i| ce(&rig, 0, dsts[0][i % SETS][0].ptr(), srcs[0][i % SETS][0].ptr()))?;
        rig.record("ce-local", "copy engine", 0, 2.0 * MSG as f64, t);
        let t = rig.time_one(0, &mut |i| ce(&rig, 0, dsts[1][i % SETS][0].ptr(), srcs[0][i % SETS][0].ptr()))?;
        rig.record("ce-one", "copy engine", 0, MSG as f64, t);
        let t = rig.time_both(&mut |d, i| ce(&rig, d, dsts[1 - d][i % SETS][0].ptr(), srcs[d][i % SETS][0].ptr()))?;
        rig.record("ce-both", "copy engine", 0, MSG as f64, t);
    }

    let block_counts: &[u32] = if quick { &[8, 16, 32] } else { &[4, 8, 16, 32, 66, 132, 264] };
    for (k, (spec, role)) in specs.iter().enumerate() {
        let label = spec.label();
        let base = *role == Role::Base;
        debug_assert_eq!(base, k < base_count);
        let atoms = [
            DeviceAtom::with_spec(&rig.ctxs[0], *spec, &rig.cache)?,
            DeviceAtom::with_spec(&rig.ctxs[1], *spec, &rig.cache)?,
        ];
        let copy = |rig: &Rig, dev: usize, dst: u64, src: u64, blocks: u32| -> Res<()> {
            // SAFETY: MSG-byte live allocations reachable from `dev`; the stream is `dev`'s.
            unsafe { atoms[dev].copy_raw(&rig.streams[dev], dst, src, MSG, blocks) }?;
            Ok(())
        };
        let reduce = |rig: &Rig, dev: usize, dtype: DType, dst: u64, s: &[u64], blocks: u32| -> Res<()> {
            // SAFETY: as for copy: every pointer is a live MSG-byte allocation reachable
            // from `dev`; MSG / size elements.
            unsafe {
                atoms[dev].reduce_raw(&rig.streams[dev], dtype, ReduceOp::Sum, dst, s, MSG / dtype.size(), blocks)
            }?;
            Ok(())
        };
        let counts: Vec<u32> = if base { block_counts.to_vec() } else { vec![8, 16, 32] };
        for &b in &counts {
            if base {
                let t =
                    rig.time_one(0, &mut |i| copy(&rig, 0, dsts[0][i % SETS][0].ptr(), srcs[0][i % SETS][0].ptr(), b))?;
                rig.record("local-copy", &label, b, 2.0 * MSG as f64, t);
                let t =
                    rig.time_one(0, &mut |i| copy(&rig, 0, dsts[1][i % SETS][0].ptr(), srcs[0][i % SETS][0].ptr(), b))?;
                rig.record("push-one", &label, b, MSG as f64, t);
                let t =
                    rig.time_one(0, &mut |i| copy(&rig, 0, dsts[0][i % SETS][0].ptr(), srcs[1][i % SETS][0].ptr(), b))?;
                rig.record("pull-one", &label, b, MSG as f64, t);
            }
            if *role != Role::Soft {
                let t = rig.time_both(&mut |d, i| {
                    copy(&rig, d, dsts[1 - d][i % SETS][0].ptr(), srcs[d][i % SETS][0].ptr(), b)
                })?;
                rig.record("push-both", &label, b, MSG as f64, t);
                let t = rig.time_both(&mut |d, i| {
                    copy(&rig, d, dsts[d][i % SETS][0].ptr(), srcs[1 - d][i % SETS][0].ptr(), b)
                })?;
                rig.record("pull-both", &label, b, MSG as f64, t);
            }
            // 2-source reduce, one remote source: link bytes = MSG per launch.
            if base {
                let t = rig.time_one(0, &mut |i| {
                    let s = [srcs[0][i % SETS][0].ptr(), srcs[1][i % SETS][0].ptr()];
                    reduce(&rig, 0, DType::BF16, dsts[0][i % SETS][0].ptr(), &s, b)
                })?;
                rig.record("reduce2-one", &label, b, MSG as f64, t);
            }
            let t = rig.time_both(&mut |d, i| {
                let s = [srcs[d][i % SETS][0].ptr(), srcs[1 - d][i % SETS][0].ptr()];
                reduce(&rig, d, DType::BF16, dsts[d][i % SETS][0].ptr(), &s, b)
            })?;
            rig.record("reduce2-both", &label, b, MSG as f64, t);
            // The control: f32 sum, no conversions, the same bytes (base builds, 8/16/32).
            if base && [8, 16, 32].contains(&b) {
                let t = rig.time_both(&mut |d, i| {
                    let s = [srcs_f32[d][i % SETS][0].ptr(), srcs_f32[1 - d][i % SETS][0].ptr()];
                    reduce(&rig, d, DType::F32, dsts[d][i % SETS][0].ptr(), &s, b)
                })?;
                rig.record("reduce2-both-f32", &label, b, MSG as f64, t);
            }
            // N-source reduce: one local source, N-1 remote ones (the peer's distinct buffers).
            if base && !quick {
                for n in [4usize, 8] {
                    let t = rig.time_one(0, &mut |i| {
                        let mut s = vec![srcs[0][i % SETS][0].ptr()];
                        s.extend((1..n).map(|r| srcs[1][i % SETS][r].ptr()));
                        reduce(&rig, 0, DType::BF16, dsts[0][i % SETS][0].ptr(), &s, b)
                    })?;
                    let name = if n == 4 { "reduce4-one" } else { "reduce8-one" };
                    rig.record(name, &label, b, ((n - 1) * MSG) as f64, t);
                }
            }
        }
    }

    // Local copy of 1 GiB (the calibration's measurement: 1 GiB, 512 threads, 132..1056
    // blocks, read + write counted), default Atom and copy engine; buffers only for this row.
    {
        let atom = DeviceAtom::with_spec(&rig.ctxs[0], default_spec, &rig.cache)?;
        let label = default_spec.label();
        let src = DeviceBuffer::new(&rig.ctxs[0], BIG)?;
        let dst = DeviceBuffer::new(&rig.ctxs[0], BIG)?;
        src.fill(0x3c)?;
        dst.fill(0)?;
        for b in BIG_BLOCKS {
            let t = rig.time_one(0, &mut |_| {
                // SAFETY: two live BIG-byte allocations on GPU 0; the stream is GPU 0's.
                unsafe { atom.copy_raw(&rig.streams[0], dst.ptr(), src.ptr(), BIG, b) }?;
                Ok(())
            })?;
            rig.record("local-copy-1g", &label, b, 2.0 * BIG as f64, t);
        }
        let t = rig.time_one(0, &mut |_| {
            rig.ctxs[0].bind_to_thread()?;
            // SAFETY: two live BIG-byte allocations on GPU 0; the stream is GPU 0's.
            unsafe { sys::cuMemcpyDtoDAsync_v2(dst.ptr(), src.ptr(), BIG, rig.streams[0].cu_stream()) }.result()?;
            Ok(())
        })?;
        rig.record("ce-local-1g", "copy engine", 0, 2.0 * BIG as f64, t);
        rig.streams[0].synchronize()?;
        // src and dst are freed here.
    }
    // What the executor's per-chunk calls cost: push, both GPUs at once, 16 blocks, one Atom
    // call per chunk (pipeline fill and drain each time), by chunk size.
    for generation in Generation::selectable_on(arch) {
        let atoms = [
            DeviceAtom::new(&rig.ctxs[0], Some(generation), &rig.cache)?,
            DeviceAtom::new(&rig.ctxs[1], Some(generation), &rig.cache)?,
        ];
        let label = atoms[0].spec().label();
        for chunk in [16usize << 10, 64 << 10, 256 << 10, 1 << 20] {
            let t = rig.time_both(&mut |d, i| {
                let (dst, src) = (dsts[1 - d][i % SETS][0].ptr(), srcs[d][i % SETS][0].ptr());
                // SAFETY: MSG-byte live allocations reachable from `d`; the stream is `d`'s.
                unsafe { atoms[d].copy_chunked_raw(&rig.streams[d], dst, src, MSG, chunk, 16) }?;
                Ok(())
            })?;
            let name = format!("{label} chunk {}K", chunk >> 10);
            rig.record("push-both-chunked", &name, 16, MSG as f64, t);
        }
    }

    // Spot checks that what was timed is right: a pushed copy and a reduce.
    let wrong = {
        let mut wrong = 0usize;
        // Fresh, known results: copy src -> peer, reduce local + peer.
        let atom = DeviceAtom::new(&rig.ctxs[0], None, &rig.cache)?;
        // SAFETY: live MSG-byte allocations; peer access enabled.
        unsafe { atom.copy_raw(&rig.streams[0], dsts[1][1][0].ptr(), srcs[0][1][0].ptr(), MSG, 16) }?;
        rig.streams[0].synchronize()?;
        if dsts[1][1][0].download(0, MSG)? != data {
            wrong += 1;
        }
        let s = [srcs[0][2][0].ptr(), srcs[1][2][1].ptr()];
        // SAFETY: as above, MSG / 2 bf16 elements.
        unsafe { atom.reduce_raw(&rig.streams[0], DType::BF16, ReduceOp::Sum, dsts[0][2][0].ptr(), &s, MSG / 2, 16) }?;
        rig.streams[0].synchronize()?;
        let mut want = vec![0u8; MSG];
        purlin_atom::host::reduce_bytes(DType::BF16, ReduceOp::Sum, &mut want, &[&data, &data])?;
        if dsts[0][2][0].download(0, MSG)? != want {
            wrong += 1;
        }
        // The software-conversion build gives the same bytes.
        let soft_atom = DeviceAtom::with_spec(&rig.ctxs[0], soft_default, &rig.cache)?;
        dsts[0][1][0].fill(0)?;
        // SAFETY: as above.
        unsafe {
            soft_atom.reduce_raw(&rig.streams[0], DType::BF16, ReduceOp::Sum, dsts[0][1][0].ptr(), &s, MSG / 2, 16)
        }?;
        rig.streams[0].synchronize()?;
        if dsts[0][1][0].download(0, MSG)? != want {
            wrong += 1;
        }
        // The f32 control: local + peer f32 sources.
        let s = [srcs_f32[0][0][0].ptr(), srcs_f32[1][0][0].ptr()];
        // SAFETY: as above, MSG / 4 f32 elements.
        unsafe { atom.reduce_raw(&rig.streams[0], DType::F32, ReduceOp::Sum, dsts[0][0][0].ptr(), &s, MSG / 4, 16) }?;
        rig.streams[0].synchronize()?;
        purlin_atom::host::reduce_bytes(DType::F32, ReduceOp::Sum, &mut want, &[&data_f32, &data_f32])?;
        if dsts[0][0][0].download(0, MSG)? != want {
            wrong += 1;
        }
        wrong
    };

    // Summary against the targets.
    let rows = rig.rows.clone();
    let best = |test: &str, max_blocks: u32| -> Option<Row> {
        rows.iter()
            .filter(|r| r.test == test && r.blocks <= max_blocks && r.blocks > 0)
            .max_by(|a, b| a.gbps.partial_cmp(&b.gbps).unwrap_or(std::cmp::Ordering::Equal))
            .cloned()
    };
    let at = |test: &str, label: &str, blocks: u32| {
        rows.iter().find(|r| r.test == test && r.label == label && r.blocks == blocks).map(|r| r.gbps)
    };
    println!("==== atom_bench summary ({} rows, #wrong {wrong})", rows.len());
    let ce_local = rows.iter().find(|r| r.test == "ce-local").map(|r| r.gbps).unwrap_or(0.0);
    if let Some(r) = best("local-copy", 1024) {
        println!(
            "ATOM-SUMMARY local copy 64 MiB best {:.0} GB/s ({} x{}) = {:.0}% of docs/dev/device.md {CAL_LOCAL_COPY:.0}, {:.0}% of this run's copy engine {ce_local:.0} [target >= 92%]",
            r.gbps,
            r.label,
            r.blocks,
            100.0 * r.gbps / CAL_LOCAL_COPY,
            100.0 * r.gbps / ce_local.max(1.0)
        );
    }
    for (test, table) in [("push-both", &CAL_PUSH_BOTH[..]), ("pull-both", &CAL_PULL_BOTH[..])] {
        if let Some(r) = best(test, 16) {
            println!(
                "ATOM-SUMMARY {test} best with <= 16 blocks: {:.0} GB/s per direction ({} x{}) [target >= 340: {}]",
                r.gbps,
                r.label,
                r.blocks,
                if r.gbps >= 340.0 { "MET" } else { "MISSED" }
            );
        }
        for &(b, cal) in table {
            let per_gen: Vec<String> = Generation::selectable_on(arch)
                .iter()
                .filter_map(|g| at(test, &AtomSpec::new(*g).label(), b).map(|v| format!("{g} {:.0}%", 100.0 * v / cal)))
                .collect();
            if !per_gen.is_empty() {
                println!(
                    "ATOM-SUMMARY {test} x{b} vs docs/dev/device.md {cal:.0}: {} [target >= 97%]",
                    per_gen.join(", ")
                );
            }
        }
    }
    // Is the bf16 reduce instruction-bound? Same run: default (paired hardware bf16 encode),
    // software encode, f32 (no conversion), against push and pull.
    let label = default_spec.label();
    let soft_label = soft_default.label();
    for b in [8u32, 16, 32] {
        let (Some(red), Some(push), Some(pull)) =
            (at("reduce2-both", &label, b), at("push-both", &label, b), at("pull-both", &label, b))
        else {
            continue;
        };
        let pct = |v: Option<f64>| match v {
            Some(v) => format!("{v:.0} GB/s ({:.0}% of push, {:.0}% of pull)", 100.0 * v / push, 100.0 * v / pull),
            None => "-".to_string(),
        };
        println!(
            "ATOM-SUMMARY reduce2-both {label} x{b}: bf16 {}; bf16 soft {}; f32 {}; same-run push {push:.0}, pull {pull:.0} [target >= 95% of one]",
            pct(Some(red)),
            pct(at("reduce2-both", &soft_label, b)),
            pct(at("reduce2-both-f32", &label, b)),
        );
    }
    let big = rows.iter().filter(|r| r.test == "local-copy-1g").max_by(|a, b| a.gbps.total_cmp(&b.gbps));
    if let Some(r) = big {
        let ce = rows.iter().find(|r| r.test == "ce-local-1g").map(|r| r.gbps).unwrap_or(0.0);
        let pct = 100.0 * r.gbps / CAL_LOCAL_COPY;
        println!(
            "ATOM-SUMMARY local copy 1 GiB best {:.0} GB/s ({} x{}) = {pct:.0}% of docs/dev/device.md {CAL_LOCAL_COPY:.0}, {:.0}% of this run's copy engine {ce:.0} [target >= 92%: {}]",
            r.gbps,
            r.label,
            r.blocks,
            100.0 * r.gbps / ce.max(1.0),
            if pct >= 92.0 { "MET" } else { "MISSED" }
        );
    }
    if wrong > 0 {
        return Err(format!("{wrong} spot checks wrong").into());
    }
    Ok(())
}

/// `--probe NAME`: one configuration, warmed up, then PROBE_LAUNCHES launches; one line.
fn run_probe(rig: &Rig, name: &str, default_spec: AtomSpec, soft_spec: AtomSpec) -> Res<()> {
    let spec = if name == "reduce2-bf16-soft-8" { soft_spec } else { default_spec };
    let atoms = [
        DeviceAtom::with_spec(&rig.ctxs[0], spec, &rig.cache)?,
        DeviceAtom::with_spec(&rig.ctxs[1], spec, &rig.cache)?,
    ];
    let (dtype, data) = match name {
        "reduce2-f32-8" => (DType::F32, random_f32(MSG, 11)),
        _ => (DType::BF16, random_bf16(MSG, 7)),
    };
    let launches = 3 + PROBE_LAUNCHES; // warm-up, then the ones to profile
    let started = std::time::Instant::now();
    match name {
        "local-copy-1g-264" => {
            let src = DeviceBuffer::new(&rig.ctxs[0], BIG)?;
            let dst = DeviceBuffer::new(&rig.ctxs[0], BIG)?;
            src.fill(0x3c)?;
            for _ in 0..launches {
                // SAFETY: two live BIG-byte allocations on GPU 0; the stream is GPU 0's.
                unsafe { atoms[0].copy_raw(&rig.streams[0], dst.ptr(), src.ptr(), BIG, 264) }?;
            }
            rig.streams[0].synchronize()?;
        }
        "pull-both-16" | "push-both-16" => {
            let src: Vec<DeviceBuffer> =
                (0..2).map(|d| DeviceBuffer::new(&rig.ctxs[d], MSG)).collect::<Result<_, _>>()?;
            let dst: Vec<DeviceBuffer> =
                (0..2).map(|d| DeviceBuffer::new(&rig.ctxs[d], MSG)).collect::<Result<_, _>>()?;
            for b in &src {
                b.upload(0, &data)?;
            }
            let pull = name == "pull-both-16";
            for _ in 0..launches {
                for d in 0..2 {
                    let (to, from) =
                        if pull { (dst[d].ptr(), src[1 - d].ptr()) } else { (dst[1 - d].ptr(), src[d].ptr()) };
                    // SAFETY: MSG-byte live allocations reachable from `d` (peer access is
                    // enabled both ways); the stream is `d`'s.
                    unsafe { atoms[d].copy_raw(&rig.streams[d], to, from, MSG, 16) }?;
                }
            }
            for s in &rig.streams {
                s.synchronize()?;
            }
        }
        _ => {
            // reduce2-*-8: GPU 0 sums its own source and GPU 1's into its own destination.
            let a = DeviceBuffer::new(&rig.ctxs[0], MSG)?;
            let b = DeviceBuffer::new(&rig.ctxs[1], MSG)?;
            let out = DeviceBuffer::new(&rig.ctxs[0], MSG)?;
            a.upload(0, &data)?;
            b.upload(0, &data)?;
            for _ in 0..launches {
                // SAFETY: three live MSG-byte allocations reachable from GPU 0; MSG / size
                // elements; the stream is GPU 0's.
                unsafe {
                    atoms[0].reduce_raw(
                        &rig.streams[0],
                        dtype,
                        ReduceOp::Sum,
                        out.ptr(),
                        &[a.ptr(), b.ptr()],
                        MSG / dtype.size(),
                        8,
                    )
                }?;
            }
            rig.streams[0].synchronize()?;
        }
    }
    let what = PROBES.iter().find(|(n, _)| *n == name).map(|(_, w)| *w).unwrap_or("");
    println!(
        "ATOM-PROBE {name}: {} ({}), {launches} launches (3 warm-up + {PROBE_LAUNCHES}) in {:.1?}",
        what,
        spec.label(),
        started.elapsed()
    );
    Ok(())
}

/// The builds of `--local`: every generation's default, the Hopper pipeline sizings of
/// `--sweep`, and bulk-copy (TMA) sizings up to the 227 KiB shared-memory limit.
fn local_specs(arch: purlin_atom::Arch) -> Res<Vec<AtomSpec>> {
    let mut specs: Vec<AtomSpec> = Generation::selectable_on(arch).into_iter().map(AtomSpec::new).collect();
    if Generation::selectable_on(arch).contains(&Generation::Hopper) {
        let sizings: [(u32, u32, u32, bool); 12] = [
            (512, 8, 2, false),
            (512, 13, 2, false),
            (1024, 6, 2, false),
            (256, 8, 4, false),
            (512, 5, 2, true),
            (512, 8, 2, true),
            (512, 13, 2, true),
            (512, 4, 4, true),
            (512, 6, 4, true),
            (512, 3, 8, true),
            (256, 13, 4, true),
            (1024, 6, 2, true),
        ];
        for (threads, depth, vecs, bulk) in sizings {
            let params = AtomParams { threads, depth, vecs, bulk, soft_convert: false };
            specs.push(AtomSpec::with_params(Generation::Hopper, params)?);
        }
    }
    Ok(specs)
}

/// `--local`: one GPU, local copies only (see the module docs).
fn local_only() -> Res<()> {
    let ctx = CudaContext::new(0)?;
    let stream = ctx.new_stream()?;
    let arch = arch_of(&ctx)?;
    let cache = KernelCache::default_location();
    let specs = local_specs(arch)?;
    let started = std::time::Instant::now();
    let jobs: Vec<_> = specs.iter().map(|s| (standalone_unit(s, None), arch)).collect();
    cache.get_or_compile_all(&jobs, 16)?;
    println!(
        "atom_bench --local: {} ({arch}), {} Atom builds compiled/cached in {:.1?}; {} MiB messages, {SETS} rotating sets",
        ctx.name()?,
        specs.len(),
        started.elapsed(),
        MSG >> 20
    );
    let mut rig = Rig { ctxs: vec![ctx], streams: vec![stream], cache, iters: 15, batch: 0, rows: Vec::new() };
    let data = random_bf16(MSG, 7);
    let srcs = buffers(&rig.ctxs[0], 1, &data)?;
    let dsts = buffers(&rig.ctxs[0], 1, &data)?;
    let mut wrong = 0usize;
    for spec in &specs {
        let label = spec.label();
        let atom = DeviceAtom::with_spec(&rig.ctxs[0], *spec, &rig.cache)?;
        let copy = |rig: &Rig, i: usize, blocks: u32| -> Res<()> {
            // SAFETY: MSG-byte live allocations on GPU 0; the stream is GPU 0's.
            unsafe { atom.copy_raw(&rig.streams[0], dsts[i % SETS][0].ptr(), srcs[i % SETS][0].ptr(), MSG, blocks) }?;
            Ok(())
        };
        for b in [1u32, 2, 4, 8, 16, 32] {
            let t = rig.time_one(0, &mut |i| copy(&rig, i, b))?;
            rig.record("local-copy", &label, b, 2.0 * MSG as f64, t);
        }
        // What was timed is right: a fresh copy into a poisoned destination, at 8 blocks.
        dsts[0][0].fill(0xa5)?;
        copy(&rig, 0, 8)?;
        rig.streams[0].synchronize()?;
        if dsts[0][0].download(0, MSG)? != data {
            println!("ATOM-BENCH local-copy {label}: WRONG bytes");
            wrong += 1;
        }
    }
    let per_block = |r: &Row| r.gbps / 2.0 / r.blocks as f64;
    let best8 = rig
        .rows
        .iter()
        .filter(|r| r.blocks == 8)
        .max_by(|a, b| a.gbps.partial_cmp(&b.gbps).unwrap_or(std::cmp::Ordering::Equal));
    if let Some(r) = best8 {
        println!(
            "ATOM-SUMMARY local copy at 8 blocks: best {} {:.0} GB/s read+write ({:.1} GB/s of payload per block); {} builds, {wrong} wrong",
            r.label,
            r.gbps,
            per_block(r),
            specs.len()
        );
    }
    if wrong > 0 {
        return Err(format!("{wrong} builds copied wrong bytes").into());
    }
    Ok(())
}
