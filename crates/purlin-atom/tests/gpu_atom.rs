//! Device tests of every Atom that runs on this GPU (on an H200: generic, Ampere, Hopper)
//! against the host Atom, bit for bit (NaN payloads aside, except where the contract fixes
//! them: bf16 conversions, and reduces whose NaN is not made by f32 arithmetic): conversions
//! of every code, copy and reduce at odd sizes and misaligned offsets, with sources and
//! destination local or on the peer GPU, fresh random data (specials included) and poisoned
//! outputs; the paired hardware bf16 encode against the software one (`soft_convert`), bit
//! for bit, NaN payloads included.
//!
//! `#[ignore]`d: run on the GPU machine with
//! `gpu_atom-test --ignored --test-threads=1 --nocapture` (the GPU round does this).
//! Each test prints one `ATOM-GPU` line per part it checked.

mod random_data;

use std::sync::Arc;

use cudarc::driver::CudaContext;
use purlin_atom::device::{DeviceBuffer, driver_present};
use purlin_atom::host;
use purlin_atom::sources::standalone_units;
use purlin_atom::{AtomParams, AtomSpec, DType, DeviceAtom, Generation, KernelCache, ReduceOp};
use random_data::{Rng, first_mismatch, random_elements};

struct Gpus {
    ctxs: Vec<Arc<CudaContext>>,
    cache: KernelCache,
    generations: Vec<Generation>,
}

/// The first two GPUs (peer access enabled both ways) and every Atom compiled for them.
/// Panics without a GPU: an ignored test that is run must not pass vacuously.
fn gpus() -> Gpus {
    assert!(driver_present(), "no CUDA driver: these tests need a GPU");
    let count = CudaContext::device_count().expect("device count");
    assert!(count >= 1, "no CUDA device");
    let ctxs: Vec<_> = (0..count.min(2) as usize).map(|i| CudaContext::new(i).expect("context")).collect();
    if ctxs.len() == 2 {
        purlin_atom::device::enable_peer_access(&ctxs[0], &ctxs[1]).expect("peer access 0 -> 1");
        purlin_atom::device::enable_peer_access(&ctxs[1], &ctxs[0]).expect("peer access 1 -> 0");
    } else {
        println!("ATOM-GPU note: one GPU, the peer placements are skipped");
    }
    let arch = purlin_atom::device::arch_of(&ctxs[0]).expect("arch");
    let generations = Generation::selectable_on(arch);
    let cache = KernelCache::default_location();
    let jobs: Vec<_> = generations
        .iter()
        .flat_map(|&g| [AtomSpec::new(g), soft_spec(g)])
        .flat_map(|spec| standalone_units(&spec))
        .map(|u| (u, arch))
        .collect();
    let started = std::time::Instant::now();
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(4).min(16);
    cache.get_or_compile_all(&jobs, threads).unwrap_or_else(|e| panic!("{e}"));
    println!(
        "ATOM-GPU setup: {} GPU(s), {arch}, generations {:?}, {} units ready in {:.1?} (cache {})",
        ctxs.len(),
        generations,
        jobs.len(),
        started.elapsed(),
        cache.dir().display()
    );
    Gpus { ctxs, cache, generations }
}

/// `generation` at its default sizing with the software bf16 conversions.
fn soft_spec(generation: Generation) -> AtomSpec {
    let params = AtomParams { soft_convert: true, ..AtomParams::default_for(generation) };
    AtomSpec::with_params(generation, params).expect("soft-convert spec")
}

/// Collects mismatches instead of stopping at the first, so one round reports every
/// failing (generation, type, op, case); the test fails at the end if any were found.
#[derive(Default)]
struct Failures {
    count: usize,
    shown: Vec<String>,
}

impl Failures {
    fn check(&mut self, ok: bool, msg: impl FnOnce() -> String) {
        if !ok {
            self.count += 1;
            if self.shown.len() < 40 {
                let m = msg();
                println!("ATOM-GPU FAIL {m}");
                self.shown.push(m);
            }
        }
    }
    fn finish(self, what: &str) {
        assert!(self.count == 0, "{what}: {} failures, the first: {:#?}", self.count, self.shown);
    }
}

fn buffer(ctx: &Arc<CudaContext>, bytes: usize) -> DeviceBuffer {
    DeviceBuffer::new(ctx, bytes).expect("cuMemAlloc")
}

/// f32 inputs that probe rounding for a type whose decoded values are `decoded`.
fn probe_inputs(decoded: &[u32], rng: &mut Rng) -> Vec<u32> {
    let mut finite: Vec<f64> =
        decoded.iter().map(|&b| f32::from_bits(b)).filter(|v| v.is_finite()).map(f64::from).collect();
    finite.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    finite.dedup();
    let mut out: Vec<u32> = decoded.to_vec();
    for w in finite.windows(2) {
        let mid = ((w[0] + w[1]) / 2.0) as f32;
        out.extend([mid.to_bits(), mid.to_bits().wrapping_add(1), mid.to_bits().wrapping_sub(1)]);
    }
    for f in [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, f32::MAX, f32::MIN, 1e-45, 448.0, 464.0]
    {
        out.push(f.to_bits());
    }
    out.extend((0..1_000_000).map(|_| rng.next_u32()));
    out
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_conversions_of_every_code_match_the_host_atom() {
    let g = gpus();
    let ctx = &g.ctxs[0];
    let stream = ctx.default_stream();
    let mut rng = Rng::new(0x5eed_0001);
    let mut failures = Failures::default();
    // Every generation, with the default (on sm_80+: paired hardware bf16 encode) and the
    // software conversions.
    let specs: Vec<AtomSpec> = g.generations.iter().flat_map(|&gn| [AtomSpec::new(gn), soft_spec(gn)]).collect();
    for spec in specs {
        let generation = spec.label();
        let atom = DeviceAtom::with_spec(ctx, spec, &g.cache).expect("atom");
        for dtype in [DType::F16, DType::BF16, DType::E4M3, DType::E5M2] {
            // bf16's NaN codes are the contract's (quieted, sign and top payload kept), so
            // its conversions are compared bit for bit, NaN payloads included.
            let strict = dtype == DType::BF16;
            let size = dtype.size();
            let ncodes = 1usize << (8 * size);
            // Decode every code.
            let codes: Vec<u8> = (0..ncodes).flat_map(|c| (c as u32).to_le_bytes()[..size].to_vec()).collect();
            let codes_d = buffer(ctx, codes.len());
            codes_d.upload(0, &codes).expect("upload");
            let out_d = buffer(ctx, ncodes * 4);
            out_d.fill(0xa5).expect("poison");
            // SAFETY: both buffers hold `ncodes` elements on this device.
            unsafe { atom.decode_raw(&stream, dtype, out_d.ptr(), codes_d.ptr(), ncodes) }.expect("decode");
            stream.synchronize().expect("sync");
            let got = out_d.download(0, ncodes * 4).expect("download");
            let got: Vec<u32> = got.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
            for (c, &gc) in got.iter().enumerate() {
                let want = host::decode_bits(dtype, c as u32);
                let both_nan = !strict && f32::from_bits(want).is_nan() && f32::from_bits(gc).is_nan();
                failures.check(gc == want || both_nan, || {
                    format!("{generation} {dtype} decode {c:#x}: {gc:#010x} vs host {want:#010x}")
                });
            }
            // Encode every decoded value, the ties between neighbours and random f32s.
            let probes = probe_inputs(&got, &mut rng);
            let bytes: Vec<u8> = probes.iter().flat_map(|b| b.to_le_bytes()).collect();
            let in_d = buffer(ctx, bytes.len());
            in_d.upload(0, &bytes).expect("upload");
            let enc_d = buffer(ctx, probes.len() * size);
            enc_d.fill(0xa5).expect("poison");
            // SAFETY: `in_d` holds probes.len() u32s, `enc_d` as many elements.
            unsafe { atom.encode_raw(&stream, dtype, enc_d.ptr(), in_d.ptr(), probes.len()) }.expect("encode");
            stream.synchronize().expect("sync");
            let enc = enc_d.download(0, probes.len() * size).expect("download");
            for (i, &p) in probes.iter().enumerate() {
                let got = random_data::code_at(dtype, &enc, i);
                let want = host::encode_bits(dtype, p);
                let both_nan = !strict && host::is_nan_code(dtype, got) && host::is_nan_code(dtype, want);
                failures.check(got == want || both_nan, || {
                    format!("{generation} {dtype} encode {p:#010x}: {got:#x} vs host {want:#x}")
                });
            }
            println!(
                "ATOM-GPU conversions {generation} {dtype}: {ncodes} codes decoded, {} values encoded ({} failures so far)",
                probes.len(),
                failures.count
            );
        }
    }
    failures.finish("conversions");
}

/// Where a test's buffers live: device 0 (local) or device 1 (peer); the kernel runs on 0.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Place {
    Local,
    Peer,
}

fn placements(g: &Gpus) -> Vec<(Place, Place)> {
    let mut p = vec![(Place::Local, Place::Local)];
    if g.ctxs.len() == 2 {
        p.extend([(Place::Peer, Place::Local), (Place::Local, Place::Peer), (Place::Peer, Place::Peer)]);
    }
    p
}

const GUARD: usize = 64;
const POISON: u8 = 0xa5;

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_copy_matches_for_every_generation_size_alignment_and_placement() {
    let g = gpus();
    let stream = g.ctxs[0].default_stream();
    let mut rng = Rng::new(0x5eed_0002);
    const MAX: usize = (8 << 20) + 13;
    const DST_SLACK: usize = 64;
    let small = [0usize, 1, 2, 15, 16, 17, 31, 255, 4095, 4096, 4097, 65_537];
    let large = [1_000_003usize, MAX];
    // (src offset, dst offset): aligned, equally misaligned, misaligned by a multiple of 4,
    // and byte-misaligned.
    let offsets = [(0usize, 0usize), (5, 5), (16, 0), (4, 8), (3, 6), (1, 0)];
    let mut cases = 0;
    let mut failures = Failures::default();
    for (sp, dp) in placements(&g) {
        let ctx_of = |p: Place| if p == Place::Local { &g.ctxs[0] } else { &g.ctxs[1] };
        let src_host = rng.bytes(MAX + GUARD);
        let src = buffer(ctx_of(sp), MAX + GUARD);
        src.upload(0, &src_host).expect("upload");
        // Room for the largest destination offset (32) past MAX, plus a guard on each side.
        let dst = buffer(ctx_of(dp), MAX + 2 * GUARD + DST_SLACK);
        for &generation in &g.generations {
            let atom = DeviceAtom::new(&g.ctxs[0], Some(generation), &g.cache).expect("atom");
            let mut run = |size: usize, so: usize, doff: usize, blocks: u32| {
                dst.fill(POISON).expect("poison");
                let d = GUARD + doff;
                // SAFETY: src holds MAX + GUARD bytes and so + size <= that; dst holds
                // MAX + 2 GUARD + DST_SLACK bytes and d + size <= that; peer access is enabled.
                unsafe { atom.copy_raw(&stream, dst.ptr() + d as u64, src.ptr() + so as u64, size, blocks) }
                    .expect("copy");
                stream.synchronize().expect("sync");
                let got = dst.download(d - GUARD, size + 2 * GUARD).expect("download");
                let what =
                    || format!("{generation} copy {sp:?}->{dp:?} size {size} offsets ({so},{doff}) blocks {blocks}");
                failures.check(got[..GUARD].iter().all(|&b| b == POISON), || format!("{}: wrote before", what()));
                failures.check(got[GUARD + size..].iter().all(|&b| b == POISON), || format!("{}: wrote past", what()));
                let bad = (0..size).find(|&i| got[GUARD + i] != src_host[so + i]);
                failures.check(bad.is_none(), || {
                    let i = bad.unwrap_or(0);
                    format!("{}: byte {i} is {:#x}, want {:#x}", what(), got[GUARD + i], src_host[so + i])
                });
            };
            for &size in &small {
                for &(so, doff) in &offsets {
                    for blocks in [1, 3, 64] {
                        run(size, so, doff, blocks);
                        cases += 1;
                    }
                }
            }
            for &size in &large {
                for &(so, doff) in &[(0, 0), (3, 3), (1, 2)] {
                    run(size.min(MAX - so), so, doff, 16);
                    cases += 1;
                }
            }
            // The executor's pattern: one Atom call per chunk (odd chunk sizes too).
            for &(size, chunk, so, doff, blocks) in &[
                (1_000_003usize, 65_536usize, 0usize, 0usize, 16u32),
                (777_777, 4_099, 5, 5, 7),
                (300_001, 1 << 20, 1, 2, 3),
            ] {
                dst.fill(POISON).expect("poison");
                let d = GUARD + doff;
                // SAFETY: as in `run`: both ranges lie inside their buffers; peers enabled.
                unsafe {
                    atom.copy_chunked_raw(&stream, dst.ptr() + d as u64, src.ptr() + so as u64, size, chunk, blocks)
                }
                .expect("chunked copy");
                stream.synchronize().expect("sync");
                let got = dst.download(d - GUARD, size + 2 * GUARD).expect("download");
                let what = format!("{generation} chunked copy {sp:?}->{dp:?} size {size} chunk {chunk}");
                let ok = got[..GUARD].iter().all(|&b| b == POISON)
                    && got[GUARD + size..].iter().all(|&b| b == POISON)
                    && got[GUARD..GUARD + size] == src_host[so..so + size];
                failures.check(ok, || format!("{what}: wrong bytes or out-of-range writes"));
                cases += 1;
            }
        }
        println!("ATOM-GPU copy {sp:?}->{dp:?}: done ({} failures so far)", failures.count);
    }
    println!("ATOM-GPU copy: {cases} cases, {} failures", failures.count);
    failures.finish("copy");
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_reduce_matches_the_host_atom_for_every_generation_dtype_op_size_and_placement() {
    let g = gpus();
    let stream = g.ctxs[0].default_stream();
    let mut rng = Rng::new(0x5eed_0003);
    const MAXN: usize = 16;
    let counts = [1usize, 2, 7, 33, 1000, 4099, 70_001];
    const BIG: usize = 1_000_003;
    let peers = g.ctxs.len() == 2;
    let mut cases = 0;
    let mut failures = Failures::default();
    for dtype in DType::ALL {
        let size = dtype.size();
        let cap = (BIG + GUARD) * size;
        // Fresh random data per source, held on both GPUs, so a placement picks pointers.
        let data: Vec<Vec<u8>> = (0..MAXN).map(|_| random_elements(&mut rng, dtype, BIG + GUARD, true)).collect();
        let mut local = Vec::new();
        let mut remote = Vec::new();
        for d in &data {
            let b = buffer(&g.ctxs[0], cap);
            b.upload(0, d).expect("upload");
            local.push(b);
            if peers {
                let b = buffer(&g.ctxs[1], cap);
                b.upload(0, d).expect("upload");
                remote.push(b);
            }
        }
        let dst_local = buffer(&g.ctxs[0], cap + 2 * GUARD * size);
        let dst_remote = peers.then(|| buffer(&g.ctxs[1], cap + 2 * GUARD * size));
        for &generation in &g.generations {
            let atom = DeviceAtom::new(&g.ctxs[0], Some(generation), &g.cache).expect("atom");
            for op in ReduceOp::ALL {
                // placement: 0 all local; 1 odd ranks on the peer; 2 destination on the peer;
                // 3 in place (destination is rank 1's buffer, local).
                let mut run = |n: usize, count: usize, soff: usize, doff: usize, placement: u32, blocks: u32| {
                    let in_place = placement == 3;
                    let (dst, dst_ptr_base, guard) = if in_place {
                        (&local[1], local[1].ptr(), 0usize)
                    } else if placement == 2 {
                        let d = dst_remote.as_ref().expect("peer");
                        (d, d.ptr(), GUARD * size)
                    } else {
                        (&dst_local, dst_local.ptr(), GUARD * size)
                    };
                    if !in_place {
                        dst.fill(POISON).expect("poison");
                    }
                    let srcs: Vec<u64> = (0..n)
                        .map(|r| {
                            let on_peer = placement == 1 && r % 2 == 1;
                            let b = if on_peer { &remote[r] } else { &local[r] };
                            if in_place && r == 1 {
                                b.ptr() + (doff * size) as u64
                            } else {
                                b.ptr() + (soff * size) as u64
                            }
                        })
                        .collect();
                    let d = dst_ptr_base + (guard + doff * size) as u64;
                    // SAFETY: every source holds BIG + GUARD elements, offsets + count stay
                    // below that; the destination has GUARD elements of margin either side
                    // (none in place, where it is exactly rank 1's range); peers enabled.
                    unsafe { atom.reduce_raw(&stream, dtype, op, d, &srcs, count, blocks) }.expect("reduce");
                    stream.synchronize().expect("sync");
                    let got = dst.download(doff * size, count * size + 2 * guard).expect("download");
                    let want = {
                        let slices: Vec<&[u8]> = (0..n)
                            .map(|r| {
                                let o = if in_place && r == 1 { doff } else { soff };
                                &data[r][o * size..(o + count) * size]
                            })
                            .collect();
                        let mut w = vec![0u8; count * size];
                        host::reduce_bytes(dtype, op, &mut w, &slices).expect("host reduce");
                        w
                    };
                    let what = format!(
                        "{generation} reduce {dtype} {op} n={n} count={count} offsets ({soff},{doff}) placement {placement} blocks {blocks}"
                    );
                    if guard > 0 {
                        failures.check(got[..guard].iter().all(|&b| b == POISON), || format!("{what}: wrote before"));
                        let past = got[guard + count * size..].iter().all(|&b| b == POISON);
                        failures.check(past, || format!("{what}: wrote past the end"));
                    }
                    let bad = first_mismatch(dtype, &got[guard..guard + count * size], &want);
                    failures.check(bad.is_none(), || {
                        let (i, gv, wv) = bad.unwrap_or_default();
                        format!("{what}: element {i} is {gv:#x}, host Atom says {wv:#x}")
                    });
                    if in_place {
                        dst.upload(0, &data[1]).expect("restore rank 1's source");
                    }
                };
                let place_set: &[u32] = if peers { &[0, 1, 2, 3] } else { &[0, 3] };
                for &n in &[1usize, 2, 3, 16] {
                    for &count in &counts {
                        for &placement in place_set {
                            // aligned; all equally misaligned (vector path after a head);
                            // destination misaligned differently (scalar path).
                            for &(soff, doff) in &[(0usize, 0usize), (1, 1), (0, 1)] {
                                if placement == 3 && soff != doff {
                                    continue;
                                }
                                let blocks = if count > 5000 { 24 } else { 1 + (count % 5) as u32 };
                                run(n, count, soff, doff, placement, blocks);
                                cases += 1;
                            }
                        }
                    }
                }
                run(3, BIG, 0, 0, if peers { 1 } else { 0 }, 32);
                run(2, BIG - 5, 3, 3, if peers { 2 } else { 0 }, 7);
                cases += 2;
            }
            println!("ATOM-GPU reduce {generation} {dtype}: done ({} failures so far)", failures.count);
        }
    }
    println!("ATOM-GPU reduce: {cases} cases, {} failures", failures.count);
    failures.finish("reduce");
}

/// Codes for a two-source sum or mean of a 16- or 8-bit float type: every pair of fp8 codes; every
/// 16-bit code against `PARTNERS` others, half uniformly random, half with an exponent 0 to
/// 16 steps from its own (random sign and mantissa), where the f32 sum is inexact or the
/// result lands on a rounding midpoint.
fn two_source_codes(dtype: DType, rng: &mut Rng) -> (Vec<u32>, Vec<u32>) {
    const PARTNERS: u32 = 48;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    if dtype.size() == 1 {
        for i in 0..65536u32 {
            a.push(i & 0xff);
            b.push(i >> 8);
        }
        return (a, b);
    }
    let man_bits = if dtype == DType::BF16 { 7 } else { 10 };
    let max_exp = if dtype == DType::BF16 { 0xff } else { 0x1f };
    for x in 0..65536u32 {
        for k in 0..PARTNERS {
            let y = if k % 2 == 0 {
                rng.next_u32() & 0xffff
            } else {
                let exp = ((x & 0x7fff) >> man_bits) as i64 + rng.below(33) as i64 - 16;
                let exp = exp.clamp(0, max_exp) as u32;
                (rng.next_u32() & 0x8000) | (exp << man_bits) | (rng.next_u32() & ((1 << man_bits) - 1))
            };
            a.push(x);
            b.push(y);
        }
    }
    (a, b)
}

/// Two-source sums and means (every reduce at world 2; on sm_90+ the Atom adds bf16 and fp8
/// in a 16-bit format and halves fp8 there for a mean, `Pairwise` in atom_common.cuh; f16 is
/// the f32 path's check) against the host Atom, through the pipelined engine (one block) and
/// the direct path (a block per few vectors), on every generation.
#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_two_source_sums_and_means_match_the_host_atom_on_every_code() {
    let g = gpus();
    let ctx = &g.ctxs[0];
    let stream = ctx.default_stream();
    let mut rng = Rng::new(0x5eed_0005);
    let mut failures = Failures::default();
    for dtype in [DType::E4M3, DType::E5M2, DType::BF16, DType::F16] {
        let size = dtype.size();
        let (a, b) = two_source_codes(dtype, &mut rng);
        let count = a.len();
        let bytes =
            |codes: &[u32]| -> Vec<u8> { codes.iter().flat_map(|c| c.to_le_bytes()[..size].to_vec()).collect() };
        let (a_bytes, b_bytes) = (bytes(&a), bytes(&b));
        let want = |op| {
            let mut w = vec![0u8; count * size];
            host::reduce_bytes(dtype, op, &mut w, &[&a_bytes, &b_bytes]).expect("host reduce");
            w
        };
        let wants = [(ReduceOp::Sum, want(ReduceOp::Sum)), (ReduceOp::Mean, want(ReduceOp::Mean))];
        let (a_d, b_d) = (buffer(ctx, a_bytes.len()), buffer(ctx, b_bytes.len()));
        a_d.upload(0, &a_bytes).expect("upload");
        b_d.upload(0, &b_bytes).expect("upload");
        let dst = buffer(ctx, count * size + 2 * GUARD);
        // One block: every vector through the engine; count / 1024 bytes per block: through
        // the direct path (at most one vector per thread).
        let direct_blocks = (count * size / 1024).max(1) as u32;
        for &generation in &g.generations {
            let atom = DeviceAtom::new(ctx, Some(generation), &g.cache).expect("atom");
            for ((op, want), blocks) in wants.iter().flat_map(|w| [(w, 1), (w, direct_blocks)]) {
                dst.fill(POISON).expect("poison");
                // SAFETY: both sources hold `count` elements; the destination has GUARD bytes
                // of margin either side.
                unsafe {
                    atom.reduce_raw(
                        &stream,
                        dtype,
                        *op,
                        dst.ptr() + GUARD as u64,
                        &[a_d.ptr(), b_d.ptr()],
                        count,
                        blocks,
                    )
                }
                .expect("reduce");
                stream.synchronize().expect("sync");
                let got = dst.download(0, count * size + 2 * GUARD).expect("download");
                let what = format!("{generation} {dtype} two-source {op} of {count} blocks {blocks}");
                let guards = got[..GUARD].iter().chain(&got[GUARD + count * size..]).all(|&x| x == POISON);
                failures.check(guards, || format!("{what}: wrote outside the destination"));
                let bad = first_mismatch(dtype, &got[GUARD..GUARD + count * size], want);
                failures.check(bad.is_none(), || {
                    let (i, gv, wv) = bad.unwrap_or_default();
                    format!("{what}: {op}({:#x}, {:#x}) is {gv:#x}, host Atom says {wv:#x}", a[i], b[i])
                });
            }
            println!(
                "ATOM-GPU two-source sums and means {generation} {dtype}: {count} pairs ({} failures so far)",
                failures.count
            );
        }
    }
    failures.finish("two-source sums and means");
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_safe_api_on_cudarc_buffers_local_and_peer() {
    let g = gpus();
    let s0 = g.ctxs[0].new_stream().expect("stream");
    let atom = DeviceAtom::new(&g.ctxs[0], None, &g.cache).expect("atom");
    println!("ATOM-GPU safe API: default generation on this GPU is {}", atom.generation());
    let mut rng = Rng::new(0x5eed_0004);
    let n = 100_003;
    let a: Vec<f32> = (0..n).map(|_| rng.f32(8.0)).collect();
    let b: Vec<f32> = (0..n).map(|_| rng.f32(8.0)).collect();
    let mut want = vec![0f32; n];
    host::reduce(ReduceOp::Sum, &mut want, &[&a, &b]).expect("host");

    let a_d = s0.clone_htod(&a).expect("htod");
    let b_local = s0.clone_htod(&b).expect("htod");
    let mut out = s0.alloc_zeros::<f32>(n).expect("alloc");
    atom.reduce(&s0, ReduceOp::Sum, &mut out, &[&a_d, &b_local], 8).expect("reduce");
    assert_eq!(s0.clone_dtoh(&out).expect("dtoh"), want, "local reduce");

    // Errors: lengths, source count, blocks, a stream of another device.
    let short = s0.alloc_zeros::<f32>(n - 1).expect("alloc");
    assert!(matches!(
        atom.reduce(&s0, ReduceOp::Sum, &mut out, &[&a_d, &short], 8),
        Err(purlin_atom::AtomError::LengthMismatch { index: 1, .. })
    ));
    assert!(matches!(atom.copy(&s0, &mut out, &a_d, 0), Err(purlin_atom::AtomError::Blocks(0))));
    let none: [&cudarc::driver::CudaSlice<f32>; 0] = [];
    assert!(matches!(atom.reduce(&s0, ReduceOp::Sum, &mut out, &none, 8), Err(purlin_atom::AtomError::SourceCount(0))));

    if g.ctxs.len() == 2 {
        let s1 = g.ctxs[1].new_stream().expect("stream");
        assert!(matches!(
            atom.copy(&s1, &mut out, &a_d, 4),
            Err(purlin_atom::AtomError::WrongContext { stream_device: 1, atom_device: 0 })
        ));
        // A peer source from cudarc's stream-ordered pool, and a peer destination.
        let b_peer = s1.clone_htod(&b).expect("htod");
        let mut out2 = s0.alloc_zeros::<f32>(n).expect("alloc");
        atom.reduce(&s0, ReduceOp::Sum, &mut out2, &[&a_d, &b_peer], 8).expect("peer reduce");
        assert_eq!(s0.clone_dtoh(&out2).expect("dtoh"), want, "reduce with a peer source");
        let mut peer_dst = s1.alloc_zeros::<f32>(n).expect("alloc");
        atom.copy(&s0, &mut peer_dst, &out2, 16).expect("push copy");
        assert_eq!(s1.clone_dtoh(&peer_dst).expect("dtoh"), want, "copy to a peer destination");
        println!("ATOM-GPU safe API: local and peer (pool memory) reduce and copy: OK");
    } else {
        println!("ATOM-GPU safe API: local reduce OK (one GPU: peer part skipped)");
    }
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_bulk_copy_engine_variant_matches() {
    // The opt-in bulk-copy (TMA) engine of the Hopper Atom, apart from the main tests so a
    // fault here cannot hide their results. Sizes cross chunk boundaries (16 KiB chunks at
    // 512 threads x 2 vectors) and leave heads and tails.
    let g = gpus();
    let arch = purlin_atom::device::arch_of(&g.ctxs[0]).expect("arch");
    if !Generation::Hopper.runs_on(arch) {
        println!("ATOM-GPU bulk: skipped ({arch} has no bulk-copy engine)");
        return;
    }
    let stream = g.ctxs[0].default_stream();
    let mut rng = Rng::new(0x5eed_0005);
    let mut failures = Failures::default();
    let mut cases = 0;
    const MAX: usize = (4 << 20) + 77;
    const DST_SLACK: usize = 64;
    for (threads, depth, vecs) in [(512u32, 5u32, 2u32), (256, 2, 1), (512, 3, 8)] {
        let params = purlin_atom::AtomParams { threads, depth, vecs, bulk: true, soft_convert: false };
        let spec = AtomSpec::with_params(Generation::Hopper, params).expect("spec");
        let atom = DeviceAtom::with_spec(&g.ctxs[0], spec, &g.cache).expect("atom");
        for (sp, dp) in placements(&g) {
            let ctx_of = |p: Place| if p == Place::Local { &g.ctxs[0] } else { &g.ctxs[1] };
            let src_host = rng.bytes(MAX + GUARD);
            let src = buffer(ctx_of(sp), MAX + GUARD);
            src.upload(0, &src_host).expect("upload");
            // Room for the largest destination offset (32) past MAX, plus a guard on each side.
            let dst = buffer(ctx_of(dp), MAX + 2 * GUARD + DST_SLACK);
            for &size in &[16usize, 1000, 16 * 1024, 16 * 1024 + 16, 100_000, 1_000_003, MAX - 3] {
                for &(so, doff, blocks) in &[(0usize, 0usize, 1u32), (3, 3, 5), (0, 0, 16), (16, 32, 64)] {
                    dst.fill(POISON).expect("poison");
                    let d = GUARD + doff;
                    // SAFETY: both ranges lie inside their buffers; peer access is enabled.
                    unsafe { atom.copy_raw(&stream, dst.ptr() + d as u64, src.ptr() + so as u64, size, blocks) }
                        .expect("copy");
                    stream.synchronize().expect("sync");
                    let got = dst.download(d - GUARD, size + 2 * GUARD).expect("download");
                    let ok = got[..GUARD].iter().all(|&b| b == POISON)
                        && got[GUARD + size..].iter().all(|&b| b == POISON)
                        && got[GUARD..GUARD + size] == src_host[so..so + size];
                    failures.check(ok, || {
                        format!(
                            "{} copy {sp:?}->{dp:?} size {size} offsets ({so},{doff}) blocks {blocks}",
                            spec.label()
                        )
                    });
                    cases += 1;
                }
            }
        }
        println!("ATOM-GPU bulk {}: done ({} failures so far)", spec.label(), failures.count);
    }
    println!("ATOM-GPU bulk: {cases} cases, {} failures", failures.count);
    failures.finish("bulk copy");
}

/// bf16 codes heavy in specials: a quarter NaNs with random payloads and signs (signalling
/// ones included), ±Inf, ±0, the largest finite values (sums overflow), moderate values.
fn special_heavy_bf16(rng: &mut Rng, count: usize) -> Vec<u16> {
    (0..count)
        .map(|_| match rng.below(16) {
            0..=3 => {
                let payload = (rng.next_u32() & 0x7f) as u16;
                (rng.next_u32() as u16 & 0x8000) | 0x7f80 | payload.max(1)
            }
            4 => 0x7f80,
            5 => 0xff80,
            6 => 0x8000,
            7 => 0x7f7f | (rng.next_u32() as u16 & 0x8000),
            _ => host::f32_to_bf16(rng.f32(4.0)),
        })
        .collect()
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_hardware_bf16_encode_matches_the_software_one_nan_payloads_included() {
    // The paired hardware bf16 encode (sm_80+, the default) fixes NaN lanes up to the
    // software code; both must agree bit for bit on every reduce, NaN payloads included, and
    // with the host Atom wherever a NaN is not made by f32 arithmetic (min, max, and one
    // source of sum or product: a NaN source element passes through); where a sum, product
    // or mean makes the NaN (a mean divides even one source by its count), the GPU's f32
    // arithmetic gives its canonical NaN and the host's CPU its own, so only NaN-ness is
    // compared with the host there (the count of such elements is printed).
    let g = gpus();
    let stream = g.ctxs[0].default_stream();
    let mut rng = Rng::new(0x5eed_0006);
    let peers = g.ctxs.len() == 2;
    const N: usize = 3;
    const CAP: usize = 70_001 + 64;
    // Fixed cases at the front, element i of every source: NaN with a payload + 1; 1 +
    // signalling negative NaN with a payload; Inf + -Inf; -Inf + Inf; two signalling NaNs;
    // max + max (overflow to Inf); two NaNs with different payloads; -0 + -0.
    let fixed: [[u16; N]; 8] = [
        [0x7fc1, 0x3f80, 0x0000],
        [0x3f80, 0xffa5, 0x0000],
        [0x7f80, 0xff80, 0x0000],
        [0xff80, 0x7f80, 0x0000],
        [0x7f81, 0x7f81, 0x0000],
        [0x7f7f, 0x7f7f, 0x0000],
        [0x7f82, 0xffc3, 0x7fd5],
        [0x8000, 0x8000, 0x8000],
    ];
    let data: Vec<Vec<u8>> = (0..N)
        .map(|r| {
            let mut codes = special_heavy_bf16(&mut rng, CAP);
            // Each case in both lanes of a pair (elements 2i, 2i + 1), and in the upper lane
            // only of another (element 17 + 2i, beside a random one).
            for (i, row) in fixed.iter().enumerate() {
                codes[2 * i] = row[r];
                codes[2 * i + 1] = row[r];
                codes[17 + 2 * i] = row[r];
            }
            codes.iter().flat_map(|c| c.to_le_bytes()).collect()
        })
        .collect();
    let upload = |ctx: &Arc<CudaContext>, d: &[u8]| {
        let b = buffer(ctx, d.len());
        b.upload(0, d).expect("upload");
        b
    };
    let local: Vec<DeviceBuffer> = data.iter().map(|d| upload(&g.ctxs[0], d)).collect();
    let remote: Vec<DeviceBuffer> = if peers { data.iter().map(|d| upload(&g.ctxs[1], d)).collect() } else { vec![] };
    let out_fast = buffer(&g.ctxs[0], CAP * 2);
    let out_soft = buffer(&g.ctxs[0], CAP * 2);
    let mut failures = Failures::default();
    let (mut cases, mut arithmetic_nans) = (0usize, 0usize);
    for &generation in &g.generations {
        let fast = DeviceAtom::with_spec(&g.ctxs[0], AtomSpec::new(generation), &g.cache).expect("atom");
        let soft = DeviceAtom::with_spec(&g.ctxs[0], soft_spec(generation), &g.cache).expect("soft atom");
        for op in ReduceOp::ALL {
            for n in 1..=N {
                for &(count, off) in &[(8usize, 0usize), (40, 0), (1000, 1), (70_001, 0), (70_001 - 3, 3)] {
                    for on_peer in [false, true] {
                        if on_peer && !peers {
                            continue;
                        }
                        let srcs: Vec<u64> = (0..n)
                            .map(|r| {
                                let b = if on_peer && r % 2 == 1 { &remote[r] } else { &local[r] };
                                b.ptr() + (off * 2) as u64
                            })
                            .collect();
                        let mut outs = Vec::new();
                        for (atom, out) in [(&fast, &out_fast), (&soft, &out_soft)] {
                            out.fill(POISON).expect("poison");
                            let d = out.ptr() + (off * 2) as u64;
                            // SAFETY: every source holds CAP elements and off + count <= CAP;
                            // so does the destination; peer access is enabled.
                            unsafe { atom.reduce_raw(&stream, DType::BF16, op, d, &srcs, count, 7) }.expect("reduce");
                            stream.synchronize().expect("sync");
                            outs.push(out.download(off * 2, count * 2).expect("download"));
                        }
                        let slices: Vec<&[u8]> = (0..n).map(|r| &data[r][off * 2..(off + count) * 2]).collect();
                        let mut want = vec![0u8; count * 2];
                        host::reduce_bytes(DType::BF16, op, &mut want, &slices).expect("host reduce");
                        let what = format!("{generation} bf16 {op} n={n} count={count} offset {off} peer {on_peer}");
                        let bad = (0..count).find(|&i| outs[0][2 * i..2 * i + 2] != outs[1][2 * i..2 * i + 2]);
                        failures.check(bad.is_none(), || {
                            let i = bad.unwrap_or(0);
                            let code = |v: &[u8]| u16::from_le_bytes([v[2 * i], v[2 * i + 1]]);
                            format!(
                                "{what}: element {i} is {:#06x} (hardware) vs {:#06x} (software)",
                                code(&outs[0]),
                                code(&outs[1])
                            )
                        });
                        let passes_through = matches!(op, ReduceOp::Min | ReduceOp::Max)
                            || (n == 1 && matches!(op, ReduceOp::Sum | ReduceOp::Prod));
                        for i in 0..count {
                            let gv = u32::from(u16::from_le_bytes([outs[0][2 * i], outs[0][2 * i + 1]]));
                            let wv = u32::from(u16::from_le_bytes([want[2 * i], want[2 * i + 1]]));
                            let both_nan = host::is_nan_code(DType::BF16, gv) && host::is_nan_code(DType::BF16, wv);
                            if gv != wv && both_nan && !passes_through {
                                arithmetic_nans += 1;
                                continue;
                            }
                            failures.check(gv == wv, || {
                                format!("{what}: element {i} is {gv:#06x}, host Atom says {wv:#06x}")
                            });
                        }
                        cases += 1;
                    }
                }
            }
        }
        println!("ATOM-GPU bf16 hardware vs software {generation}: done ({} failures so far)", failures.count);
    }
    println!(
        "ATOM-GPU bf16 hardware vs software: {cases} cases, {} failures; {arithmetic_nans} NaNs made by sum/prod/mean differ from the host's only in payload",
        failures.count
    );
    failures.finish("bf16 hardware vs software encode");
}
