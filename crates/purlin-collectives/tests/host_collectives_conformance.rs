//! Conformance of the host executor (docs/design.md §3.4): it runs the plan it is given. A derived
//! plan passes the output check; the same plan with one region shifted by one byte runs to
//! completion and FAILS it. Also: bounded waits and poisoning.

mod plan_on_host;

use std::time::Duration;

use plan_on_host::{execute_on_host, shift_first};
use purlin_collectives::Error;
use purlin_collectives::internal::host_executor::{HostMemoryConfig, HostWorld};
use purlin_collectives::{CpuComm, CpuConfig};
use purlin_snac::{CollectiveSpec, DataType, Plan, PlanConfig, Regime, Space, StagingSide, Step, derive};

fn memory(cfg: &PlanConfig) -> HostMemoryConfig {
    HostMemoryConfig {
        staging_bytes: cfg.staging_bytes as usize,
        window_bytes: cfg.window_bytes as usize,
        ..HostMemoryConfig::default()
    }
}

/// Runs one call of `plans` (one per rank) on a fresh host world; every rank's output.
fn run(plans: &[Plan], cfg: &PlanConfig, inputs: &[Vec<u8>]) -> Result<Vec<Vec<u8>>, Error> {
    let world = HostWorld::new(plans.len(), memory(cfg), Duration::from_secs(10));
    let mut outputs: Vec<Vec<u8>> = plans.iter().map(|p| vec![0xA5u8; p.spec.output_bytes(p.rank) as usize]).collect();
    let results = execute_on_host(&world, plans, inputs, &mut outputs, true);
    for r in results {
        assert!(!r?.is_empty(), "a traced call records its steps");
    }
    Ok(outputs)
}

/// AllGather: rank `r` contributes bytes `r * 64 + i` (mod 251); the independent reference.
fn inputs(world: usize, n: usize) -> Vec<Vec<u8>> {
    (0..world).map(|r| (0..n).map(|i| ((r * 64 + i) % 251) as u8).collect()).collect()
}

fn check(outputs: &[Vec<u8>], inputs: &[Vec<u8>]) -> Result<(), String> {
    let want = inputs.concat();
    for (r, o) in outputs.iter().enumerate() {
        if *o != want {
            let at = o.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!("rank {r} differs at byte {at}"));
        }
    }
    Ok(())
}

#[test]
fn a_region_shifted_by_one_fails_the_output_check() {
    let world = 3;
    let n = 3000; // bytes per rank: several 1 KiB chunks
    let spec = CollectiveSpec::all_gather(world as u32, DataType::U8, n as u64);
    let base = PlanConfig {
        chunk_bytes: 1024,
        slots: 2,
        staging_bytes: 1 << 16,
        window_bytes: 1 << 16,
        blocks_per_role: 2,
        ..PlanConfig::default()
    };
    let x = inputs(world, n);
    let mut ran = 0;
    type Pick = fn(&Step) -> bool;
    let cases: [(&str, PlanConfig, Pick); 4] = [
        (
            "throughput/push: a stage's staging destination + 1",
            PlanConfig { regime: Regime::Throughput, staging_side: StagingSide::Peer, ..base },
            |s| matches!(s, Step::Stage { .. }),
        ),
        (
            "throughput/pull: a stage's staging destination + 1",
            PlanConfig { regime: Regime::Throughput, staging_side: StagingSide::Own, ..base },
            |s| matches!(s, Step::Stage { .. }),
        ),
        (
            "throughput/push: a gather's output destination + 1",
            PlanConfig { regime: Regime::Throughput, staging_side: StagingSide::Peer, ..base },
            |s| matches!(s, Step::Gather { dst, src, .. } if dst.space == Space::Output && matches!(src.space, Space::Staging(_))),
        ),
        ("latency: a put's input source + 1", PlanConfig { regime: Regime::Latency, ..base }, |s| {
            matches!(s, Step::PutPackets { .. })
        }),
    ];
    for (what, cfg, pick) in cases {
        let plans = derive(&spec, &cfg).expect("derive");
        let outputs = run(&plans, &cfg, &x).expect("the derived plan runs");
        check(&outputs, &x).unwrap_or_else(|e| panic!("{what}: the derived plan must pass: {e}"));

        let mut broken = plans.clone();
        assert!(shift_first(&mut broken[0], pick), "{what}: no such region in rank 0's plan");
        assert_ne!(broken, plans);
        let outputs = run(&broken, &cfg, &x).unwrap_or_else(|e| panic!("{what}: the shifted plan must still run: {e}"));
        let verdict = check(&outputs, &x);
        assert!(
            verdict.is_err(),
            "{what}: the output check passed on a shifted plan — the executor ran something else"
        );
        println!("{what}: output check fails as it must ({})", verdict.unwrap_err());
        ran += 1;
    }
    assert_eq!(ran, 4);
}

/// A rank whose peers never call times out (bounded wait), and the world is poisoned: every
/// later call fails at once with `Error::Poisoned`.
#[test]
fn a_missing_peer_times_out_and_poisons() {
    let config = CpuConfig { timeout: Duration::from_millis(500), ..CpuConfig::default() };
    let comms = CpuComm::threads_with_config(2, config).expect("comms");
    let mut out = vec![0f32; 4];
    let t0 = std::time::Instant::now();
    let e = comms[0].all_reduce(&[1f32; 4], &mut out, &purlin_collectives::ReduceOp::Sum).unwrap_err();
    assert!(matches!(e, Error::Timeout { rank: 0, .. }), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(30), "the wait is bounded");
    assert!(comms[1].async_error().is_err());
    let e = comms[1].all_gather(&[1f32; 2], &mut [0f32; 4]).unwrap_err();
    assert!(matches!(e, Error::Poisoned(_)), "{e}");
}

/// Back-to-back calls on one host world with different grids (blocks per role 2, then 3,
/// then 1): arrival counters are reset by each round's last arriver (the plan contract), so
/// a later call with another arrival count still notifies.
#[test]
fn back_to_back_calls_with_different_grids() {
    let world = 2;
    let n = 5000;
    let x = inputs(world, n);
    let spec = CollectiveSpec::all_gather(world as u32, DataType::U8, n as u64);
    let mem = HostMemoryConfig { staging_bytes: 1 << 16, window_bytes: 1 << 16, ..HostMemoryConfig::default() };
    let host = HostWorld::new(world, mem, Duration::from_secs(10));
    for (k, blocks) in [2u32, 3, 1, 2].into_iter().enumerate() {
        let cfg = PlanConfig {
            regime: Regime::Throughput,
            staging_side: StagingSide::Peer,
            chunk_bytes: 48 * 32,
            blocks_per_role: blocks,
            slots: 2,
            staging_bytes: 1 << 16,
            window_bytes: 1 << 16,
            ..PlanConfig::default()
        };
        let plans = derive(&spec, &cfg).expect("derive");
        let mut outputs: Vec<Vec<u8>> = vec![vec![0u8; n * world]; world];
        let results = execute_on_host(&host, &plans, &x, &mut outputs, false);
        for r in results {
            r.unwrap_or_else(|e| panic!("call {k} ({blocks} blocks per role): {e}"));
        }
        check(&outputs, &x).unwrap_or_else(|e| panic!("call {k}: {e}"));
        for r in 0..world {
            for i in 0..mem.counter_words {
                assert_eq!(host.counter(r, i), 0, "call {k}: rank {r} counter {i} not reset");
            }
        }
    }
}

/// What every rank's output must hold, from the spec's meaning (`segments`), not the plans.
fn gathered(spec: &CollectiveSpec, inputs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    (0..spec.world)
        .map(|r| {
            let mut out = vec![0u8; spec.output_bytes(r) as usize];
            for seg in spec.segments(r) {
                let (src, off) = seg.sources[0];
                let (a, n) = (seg.out_offset as usize, seg.len as usize);
                out[a..a + n].copy_from_slice(&inputs[src as usize][off as usize..off as usize + n]);
            }
            out
        })
        .collect()
}

/// The small staged throughput configuration the one-copy host tests run between one-copy
/// calls (1 KiB chunks, two slots), and the host world that fits it.
fn small_staged() -> PlanConfig {
    PlanConfig {
        regime: Regime::Throughput,
        chunk_bytes: 1024,
        blocks_per_role: 2,
        slots: 2,
        staging_bytes: 1 << 16,
        window_bytes: 1 << 16,
        ..PlanConfig::default()
    }
}

fn small_world(world: usize) -> HostWorld {
    let mem = HostMemoryConfig { staging_bytes: 1 << 16, window_bytes: 1 << 16, ..HostMemoryConfig::default() };
    HostWorld::new(world, mem, Duration::from_secs(10))
}

/// Runs `spec` one-copy, staged, then one-copy again on `host` (the three share flag and
/// counter words); every rank's output must equal `want` after each call.
fn one_copy_between_staged(
    host: &HostWorld,
    spec: &CollectiveSpec,
    one_copy: PlanConfig,
    x: &[Vec<u8>],
    want: &[Vec<u8>],
) {
    for (k, cfg) in [one_copy, small_staged(), one_copy].iter().enumerate() {
        let plans = derive(spec, cfg).expect("derive");
        let mut outputs: Vec<Vec<u8>> = want.iter().map(|o| vec![0xA5; o.len()]).collect();
        for r in execute_on_host(host, &plans, x, &mut outputs, false) {
            r.unwrap_or_else(|e| panic!("{:?} w{} call {k}: {e}", spec.collective, spec.world));
        }
        assert_eq!(outputs, want, "{:?} w{} call {k}", spec.collective, spec.world);
    }
}

/// One-copy plans (every rank's output registered: writers store straight into the peers'
/// outputs) move real bytes on the host executor: AllGather, AllToAll and their V forms on
/// worlds 2-4, back to back with staged calls that share the flag and counter words; and the
/// same plans with one peer-output store shifted by a byte fail the check.
#[test]
fn one_copy_plans_move_every_byte_once() {
    for world in 2u32..=4 {
        let w = world as usize;
        let specs = [
            CollectiveSpec::all_gather(world, DataType::U8, 3000),
            CollectiveSpec::all_to_all(world, DataType::U8, 1100),
            CollectiveSpec::all_gather_v(
                world,
                DataType::U8,
                (0..w as u64).map(|r| [2500, 0, 77, 1024][r as usize]).collect(),
            ),
            CollectiveSpec::all_to_all_v(
                world,
                DataType::U8,
                (0..w).map(|s| (0..w).map(|d| ((s * 7 + d * 13) % 5) as u64 * 300).collect()).collect(),
            ),
        ];
        let host = small_world(w);
        for spec in specs {
            let one_copy = PlanConfig { peer_outputs: true, blocks_per_role: 4, ..small_staged() };
            let x: Vec<Vec<u8>> = (0..world)
                .map(|r| (0..spec.input_bytes(r)).map(|i| ((r as u64 * 97 + i * 31) % 251) as u8).collect())
                .collect();
            let want = gathered(&spec, &x);
            one_copy_between_staged(&host, &spec, one_copy, &x, &want);
            let mut shifted = derive(&spec, &one_copy).expect("derive");
            let is_peer_store =
                |s: &Step| matches!(s, Step::Gather { dst, .. } if matches!(dst.space, Space::PeerOutput(_)));
            assert!(shifted.iter_mut().any(|p| shift_first(p, is_peer_store)), "no peer-output store to shift");
            let mut outputs: Vec<Vec<u8>> = want.iter().map(|o| vec![0xA5; o.len()]).collect();
            let ran = execute_on_host(&host, &shifted, &x, &mut outputs, false);
            let failed = ran.iter().any(Result::is_err) || outputs != want;
            assert!(failed, "{:?} w{world}: a shifted peer-output store passed the check", spec.collective);
        }
    }
}

/// The AllReduce in place on symmetric buffers (two-shot, one copy: each rank reduces its
/// shard from every rank's buffer and stores it into every peer's) on the host executor,
/// worlds 2-4, three calls back to back, against sums computed here.
#[test]
fn one_copy_all_reduce_in_place_sums_every_buffer() {
    use purlin_collectives::internal::host_executor::CallBuffers;
    use purlin_snac::ReduceOp;
    for world in 2usize..=4 {
        let n = 2500u64; // u32 elements
        let spec = CollectiveSpec::all_reduce(world as u32, DataType::U32, ReduceOp::Sum, n);
        let cfg = PlanConfig {
            regime: Regime::Throughput,
            chunk_bytes: 512,
            blocks_per_role: 4,
            staging_bytes: 1 << 16,
            window_bytes: 1 << 16,
            in_place: true,
            peer_outputs: true,
            peer_inputs: true,
            ..PlanConfig::default()
        };
        let plans = derive(&spec, &cfg).expect("derive");
        let mem = HostMemoryConfig { staging_bytes: 1 << 16, window_bytes: 1 << 16, ..HostMemoryConfig::default() };
        let host = HostWorld::new(world, mem, Duration::from_secs(10));
        for call in 0..3u64 {
            let inputs: Vec<Vec<u32>> =
                (0..world).map(|r| (0..n).map(|i| (r as u64 * 7919 + i * 31 + call) as u32).collect()).collect();
            let le = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
            let sums: Vec<u32> = (0..n as usize).map(|i| inputs.iter().map(|x| x[i]).sum()).collect();
            let want = le(&sums);
            let mut bufs: Vec<Vec<u8>> = inputs.iter().map(|x| le(x)).collect();
            let mut peers = [(std::ptr::null_mut(), 0); purlin_collectives::MAX_WORLD];
            for (slot, b) in peers.iter_mut().zip(bufs.iter_mut()) {
                *slot = (b.as_mut_ptr(), b.len());
            }
            let results: Vec<_> = std::thread::scope(|s| {
                let hs: Vec<_> = plans
                    .iter()
                    .zip(peers)
                    .map(|(p, (buf, len))| {
                        // In place: the input is the buffer itself (alias at 0).
                        // In place, every rank's input is its buffer too.
                        let b = CallBuffers {
                            peer_outputs: peers,
                            peer_inputs: peers,
                            ..CallBuffers::new(buf, len, buf, len)
                        };
                        let host = &host;
                        s.spawn(move || host.execute(p, b, false))
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
            });
            for r in results {
                r.unwrap_or_else(|e| panic!("w{world} call {call}: {e}"));
            }
            for (r, b) in bufs.iter().enumerate() {
                assert_eq!(*b, want, "w{world} call {call} rank {r}");
            }
        }
    }
}

/// One-copy reductions (every rank's input registered, and for the AllReduce its output):
/// ReduceScatter, its V form and the AllReduce out of place pull each rank's part straight
/// from every rank's input, on worlds 2-4, back to back with staged calls; against sums
/// computed here from the spec's meaning.
#[test]
fn one_copy_reductions_pull_from_every_input() {
    use purlin_snac::ReduceOp;
    for world in 2u32..=4 {
        let w = world as usize;
        let specs = [
            CollectiveSpec::reduce_scatter(world, DataType::U32, ReduceOp::Sum, 700),
            CollectiveSpec::reduce_scatter_v(world, DataType::U32, ReduceOp::Sum, [600, 0, 90, 256][..w].to_vec()),
            CollectiveSpec::all_reduce(world, DataType::U32, ReduceOp::Sum, 1900),
        ];
        let host = small_world(w);
        for spec in specs {
            let one_copy = PlanConfig { peer_inputs: true, peer_outputs: true, blocks_per_role: 4, ..small_staged() };
            let x: Vec<Vec<u8>> = (0..world)
                .map(|r| {
                    (0..spec.input_bytes(r) / 4)
                        .map(|i| (r as u64 * 7919 + i * 31) as u32)
                        .flat_map(u32::to_le_bytes)
                        .collect()
                })
                .collect();
            let word =
                |v: &[u8], at: u64| u32::from_le_bytes(v[at as usize..at as usize + 4].try_into().expect("4 bytes"));
            let want: Vec<Vec<u8>> = (0..world)
                .map(|r| {
                    let mut out = vec![0u8; spec.output_bytes(r) as usize];
                    for seg in spec.segments(r) {
                        for i in (0..seg.len).step_by(4) {
                            let sum: u32 = seg.sources.iter().map(|&(q, off)| word(&x[q as usize], off + i)).sum();
                            let a = (seg.out_offset + i) as usize;
                            out[a..a + 4].copy_from_slice(&sum.to_le_bytes());
                        }
                    }
                    out
                })
                .collect();
            one_copy_between_staged(&host, &spec, one_copy, &x, &want);
        }
    }
}

/// A rank whose output is symmetric runs the one-copy plan, its peer (plain memory) the
/// staged one: their flags never meet, so both time out, and neither writes the other's
/// part of an output (the one-copy writers wait for an entry signal that never comes).
#[test]
fn one_copy_against_staged_times_out_and_writes_no_peer_part() {
    let (world, n) = (2usize, 3000usize);
    let spec = CollectiveSpec::all_gather(world as u32, DataType::U8, n as u64);
    let staged = small_staged();
    let one_copy = PlanConfig { peer_outputs: true, ..staged };
    let plans = vec![
        purlin_snac::derive_rank(&spec, &one_copy, 0).expect("one-copy plan"),
        purlin_snac::derive_rank(&spec, &staged, 1).expect("staged plan"),
    ];
    let mem = HostMemoryConfig { staging_bytes: 1 << 16, window_bytes: 1 << 16, ..HostMemoryConfig::default() };
    let host = HostWorld::new(world, mem, Duration::from_millis(500));
    let x = inputs(world, n);
    let mut outputs = vec![vec![0xA5u8; n * world]; world];
    let results = execute_on_host(&host, &plans, &x, &mut outputs, false);
    for (r, res) in results.iter().enumerate() {
        let err = res.as_ref().expect_err("mismatched plans cannot complete");
        println!("rank {r}: {err}");
    }
    // Rank 0's part in rank 1's output and rank 1's part in rank 0's are never written.
    assert!(outputs[1][..n].iter().all(|&b| b == 0xA5), "rank 1's copy of rank 0's part was written");
    assert!(outputs[0][n..].iter().all(|&b| b == 0xA5), "rank 0's copy of rank 1's part was written");
}
