//! The communicator on 2 GPUs, in both process models (needs 2 GPUs; `--ignored`).
//!
//! The two-process tests re-run this executable as the other rank (`--exact <name>
//! --ignored`), so they need no cargo and no launcher. Every wait is bounded: host waits by
//! the communicator's timeout, device waits by the ping-pong's timeout, children by
//! `Kid::finish`.

mod child_process;

use std::sync::Arc;
use std::time::{Duration, Instant};

use child_process::{Kid, ROLE, role, torchrun_env};
use cudarc::driver::{CudaContext, CudaStream};
use purlin_collectives::internal::KernelRequest;
use purlin_collectives::internal::ipc::mem_info;
use purlin_collectives::{Comm, CommConfig};
use purlin_collectives::{Error, Id};

const HOST_TIMEOUT: Duration = Duration::from_secs(60);
const DEVICE_TIMEOUT: Duration = Duration::from_secs(2);
const ROUNDS: u32 = 10_000;
/// Free-memory drift allowed over many set-up/teardown cycles: less than one workspace.
const LEAK_TOLERANCE: usize = 8 << 20;

fn config() -> CommConfig {
    CommConfig { timeout: HOST_TIMEOUT, ..CommConfig::default() }
}

fn need_two_gpus() {
    let n = purlin_collectives::device_count();
    assert!(n >= 2, "needs 2 GPUs, found {n}");
}

fn stream(ordinal: usize) -> Arc<CudaStream> {
    let ctx = CudaContext::new(ordinal).expect("CUDA context");
    ctx.new_stream().expect("stream")
}

fn free_bytes(ordinal: usize) -> usize {
    mem_info(&CudaContext::new(ordinal).unwrap()).unwrap().0
}

fn describe(c: &Comm) {
    let d = c.device();
    println!(
        "COMM rank {}/{} gpu{} {} {} ({:?} Atom) {} SMs, co-residency bound (smoke kernel): {} here, {} agreed",
        c.rank(),
        c.world_size(),
        c.ordinal(),
        d.name,
        d.compute_capability,
        c.diag().generation(),
        d.sm_count,
        c.diag().coresidency().smoke_pingpong_local,
        c.diag().coresidency().smoke_pingpong
    );
    assert!(c.diag().coresidency().smoke_pingpong > 0);
    assert!(c.diag().coresidency().smoke_pingpong <= c.diag().coresidency().smoke_pingpong_local);
    if c.rank() == 0 {
        println!("{}", c.diag().workspace_layout().report());
    }
}

fn child(test: &str, role: &str, id: &Id) -> Kid {
    Kid::spawn(test, true, &[(ROLE, role.to_string()), ("PURLIN_TEST_ID", id.to_hex())])
}

fn test_id() -> Id {
    Id::from_hex(&std::env::var("PURLIN_TEST_ID").expect("PURLIN_TEST_ID")).expect("id")
}

// ---------------------------------------------------------------- one process, two GPUs

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_single_process_setup_pingpong_teardown() {
    need_two_gpus();
    let before = [free_bytes(0), free_bytes(1)];
    let t = Instant::now();
    let comms = Comm::from_devices_with_config(vec![stream(0), stream(1)], config()).expect("from_devices");
    println!("COMM single-process set-up on 2 GPUs: {:?}", t.elapsed());
    assert_eq!(comms.len(), 2);
    for (r, c) in comms.iter().enumerate() {
        assert_eq!((c.rank(), c.world_size(), c.ordinal()), (r, 2, r));
        describe(c);
        c.async_error().expect("no async error after set-up");
    }
    // One process: both ranks see the same (direct) pointers.
    assert_eq!(comms[0].diag().workspace_addrs(), comms[1].diag().workspace_addrs());
    // The responder is launched first; one thread drives both GPUs.
    let l1 = comms[1].diag().launch_ping_pong(0, ROUNDS, DEVICE_TIMEOUT).expect("launch rank 1");
    let l0 = comms[0].diag().launch_ping_pong(1, ROUNDS, DEVICE_TIMEOUT).expect("launch rank 0");
    let p0 = l0.wait().expect("ping-pong rank 0");
    let p1 = l1.wait().expect("ping-pong rank 1");
    assert_eq!((p0.rounds, p1.rounds), (u64::from(ROUNDS), u64::from(ROUNDS)));
    println!(
        "COMM single-process ping-pong through the workspace: {} rounds, round trip {:.2} us",
        p0.rounds, p0.round_trip_us
    );
    let t = Instant::now();
    drop(comms);
    println!("COMM single-process teardown: {:?}", t.elapsed());
    let after = [free_bytes(0), free_bytes(1)];
    println!("COMM single-process free memory before/after: {before:?} / {after:?}");
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_single_process_100_cycles_no_leak() {
    need_two_gpus();
    let streams = [stream(0), stream(1)];
    let cycle = || {
        let comms = Comm::from_devices_with_config(streams.to_vec(), config()).expect("from_devices");
        let l1 = comms[1].diag().launch_ping_pong(0, 10, DEVICE_TIMEOUT).unwrap();
        let l0 = comms[0].diag().launch_ping_pong(1, 10, DEVICE_TIMEOUT).unwrap();
        l0.wait().unwrap();
        l1.wait().unwrap();
    };
    cycle(); // warm-up: module loading, pools
    let before = [free_bytes(0), free_bytes(1)];
    let t = Instant::now();
    for _ in 0..100 {
        cycle();
    }
    let after = [free_bytes(0), free_bytes(1)];
    println!(
        "COMM single-process 100 set-up/ping-pong/teardown cycles in {:?}; free before {before:?} after {after:?}",
        t.elapsed()
    );
    for g in 0..2 {
        assert!(before[g] <= after[g] + LEAK_TOLERANCE, "gpu{g} lost {} bytes", before[g] - after[g]);
    }
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_from_rank_on_threads_of_one_process() {
    // cudarc allows from_rank on threads; CUDA IPC cannot open a handle in its own process,
    // so the backend falls back to peer access.
    need_two_gpus();
    let id = Id::new().unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                s.spawn(move || {
                    let c = Comm::from_rank_with_config(stream(rank), rank, 2, id, config()).expect("from_rank");
                    let p = c.diag().ping_pong(1 - rank, ROUNDS, DEVICE_TIMEOUT).expect("ping-pong");
                    let report = c.close();
                    assert!(report.met_peers && report.leaked_bytes == 0, "{report:?}");
                    p
                })
            })
            .collect();
        let p: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        println!("COMM from_rank on threads: ping-pong round trip {:.2} us", p[0].round_trip_us);
    });
}

// ---------------------------------------------------------------- one process per GPU

fn rank_main(rank: usize, id: Id) {
    let t = Instant::now();
    // One extra kernel compiled, loaded and bounded at set-up (the executor's path).
    let fill = KernelRequest {
        unit: purlin_collectives::internal::kernels::smoke_unit(),
        function: "purlin_smoke_fill".into(),
        block_size: 256,
        dynamic_smem: 0,
    };
    let cfg = CommConfig { kernels: vec![fill], ..config() };
    let c = Comm::from_rank_with_config(stream(rank), rank, 2, id, cfg).expect("from_rank");
    let k = c.diag().kernel("purlin_smoke_fill").expect("requested kernel loaded");
    println!(
        "COMM two-process rank {rank}: kernel purlin_smoke_fill (256 threads) co-residency bound {} here, {} agreed",
        k.coresident_local, k.coresident
    );
    assert!(k.coresident > 0 && k.coresident <= k.coresident_local);
    println!("COMM two-process set-up, rank {rank}: {:?}", t.elapsed());
    describe(&c);
    assert_ne!(c.diag().workspace_addrs()[0], 0);
    assert_ne!(c.diag().workspace_addrs()[1], 0);
    // Zeroed before the handles were published; nobody has written yet (the barrier below
    // keeps the peer's ping-pong from starting before this check).
    let total = c.diag().workspace_layout().total_bytes;
    let ws = c.diag().read_own_workspace(0, total).expect("read workspace");
    assert!(ws.iter().all(|&b| b == 0), "rank {rank}: workspace not zero at set-up");
    assert!(c.diag().read_own_workspace(total - 8, 16).is_err());
    c.diag().host().barrier("zero check done").expect("barrier");
    println!("COMM two-process rank {rank}: all {total} workspace bytes zero after set-up");
    let p = c.diag().ping_pong(1 - rank, ROUNDS, DEVICE_TIMEOUT).expect("ping-pong");
    assert_eq!(p.rounds, u64::from(ROUNDS));
    if p.initiator {
        println!(
            "COMM two-process ping-pong through CUDA IPC: {} rounds, round trip {:.2} us",
            p.rounds, p.round_trip_us
        );
    }
    c.async_error().expect("no async error");
    let t = Instant::now();
    let report = c.close();
    println!("COMM two-process teardown, rank {rank}: {:?} {report:?}", t.elapsed());
    assert!(report.met_peers && report.leaked_bytes == 0 && report.closed == 1, "{report:?}");
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_two_processes_setup_pingpong_teardown() {
    if role().is_some() {
        return rank_main(1, test_id());
    }
    need_two_gpus();
    let id = Id::new().unwrap();
    let kid = child("gpu_two_processes_setup_pingpong_teardown", "rank1", &id);
    rank_main(0, id);
    assert!(kid.finish(HOST_TIMEOUT), "rank 1 (child process) failed");
}

fn cycles_main(rank: usize, id: Id, cycles: u64) {
    let cycle = |n: u64| {
        let c = Comm::from_rank_with_config(stream(rank), rank, 2, id.derive(n), config()).expect("from_rank");
        c.diag().ping_pong(1 - rank, 10, DEVICE_TIMEOUT).expect("ping-pong");
        let report = c.close();
        assert!(report.met_peers && report.leaked_bytes == 0, "cycle {n}: {report:?}");
    };
    cycle(0);
    let before = free_bytes(rank);
    let t = Instant::now();
    for n in 1..=cycles {
        cycle(n);
    }
    let after = free_bytes(rank);
    println!(
        "COMM two-process rank {rank}: {cycles} set-up/ping-pong/teardown cycles in {:?}; free before {before} after {after}",
        t.elapsed()
    );
    assert!(before <= after + LEAK_TOLERANCE, "rank {rank} lost {} bytes", before - after);
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_two_processes_100_cycles_no_leak() {
    if role().is_some() {
        return cycles_main(1, test_id(), 100);
    }
    need_two_gpus();
    let id = Id::new().unwrap();
    let kid = child("gpu_two_processes_100_cycles_no_leak", "rank1", &id);
    cycles_main(0, id, 100);
    assert!(kid.finish(HOST_TIMEOUT), "rank 1 (child process) failed");
}

/// Symmetric buffers between processes (CUDA IPC): `cycles` rounds of allocation, a one-copy
/// AllGather checked element by element, and `Comm::free_symmetric`, then the GPU's free
/// memory against the first round's. `PURLIN_SHARED_GPU=1` puts both ranks on GPU 0.
fn symmetric_cycles_main(rank: usize, id: Id, cycles: usize) {
    let shared = CommConfig::shared_gpu_from_env().expect("PURLIN_SHARED_GPU");
    let ordinal = if shared { 0 } else { rank };
    let cfg = CommConfig { shared_gpu: shared, ..config() };
    let c = Comm::from_rank_with_config(stream(ordinal), rank, 2, id, cfg).expect("from_rank");
    // 16 MiB per rank: the one-copy (throughput) plan, and 32 MiB per cycle a leak would lose.
    let n = 4 << 20;
    let mut baseline = 0;
    for cycle in 0..cycles {
        let mut input = c.alloc_symmetric::<u32>(n).expect("symmetric input");
        let mut output = c.alloc_symmetric::<u32>(2 * n).expect("symmetric output");
        let mine: Vec<u32> = (0..n as u32).map(|i| i ^ ((rank as u32 + 1) << 28) ^ cycle as u32).collect();
        c.stream().memcpy_htod(&mine, &mut input).expect("upload");
        c.all_gather(&input, &mut output).expect("all_gather on symmetric buffers");
        let mut got = vec![0u32; 2 * n];
        c.stream().memcpy_dtoh(&output, &mut got).expect("download");
        c.stream().synchronize().expect("sync");
        for (i, &v) in got.iter().enumerate() {
            let (r, j) = (i / n, (i % n) as u32);
            assert_eq!(v, j ^ ((r as u32 + 1) << 28) ^ cycle as u32, "rank {rank} cycle {cycle} element {i}");
        }
        c.free_symmetric(input).expect("free the input");
        c.free_symmetric(output).expect("free the output");
        // Both ranks have freed theirs before either reads the (shared) GPU's free memory.
        c.diag().host().barrier("symmetric cycle done").expect("barrier");
        if cycle == 0 {
            baseline = free_bytes(ordinal);
        }
    }
    let after = free_bytes(ordinal);
    println!(
        "COMM two-process symmetric rank {rank}: {cycles} alloc/all_gather/free cycles; free after cycle 1 {baseline}, after {cycles} {after}"
    );
    assert!(after + LEAK_TOLERANCE >= baseline, "rank {rank} lost {} bytes", baseline - after);
    let report = c.close();
    assert!(report.met_peers && report.leaked_bytes == 0, "{report:?}");
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_two_processes_symmetric_buffers_free_together() {
    if role().is_some() {
        return symmetric_cycles_main(1, test_id(), 10);
    }
    let id = Id::new().unwrap();
    let kid = child("gpu_two_processes_symmetric_buffers_free_together", "rank1", &id);
    symmetric_cycles_main(0, id, 10);
    assert!(kid.finish(HOST_TIMEOUT), "rank 1 (child process) failed");
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_sigkilled_peer_gives_a_typed_timeout_naming_it() {
    // Rank 0 (child process) is SIGKILLed after set-up. Rank 1 (this process) then waits on
    // the device for rank 0's flag: it must end in a DeviceTimeout naming rank 0 after the
    // 2 s bound, without ever writing rank 0's memory (rank 1 is the ping-pong responder, so
    // it writes only after a successful wait), and teardown must not hang.
    if role().is_some() {
        let c = Comm::from_rank_with_config(stream(0), 0, 2, test_id(), config()).expect("from_rank (victim)");
        println!("@@READY rank {}", c.rank());
        std::thread::sleep(Duration::from_secs(120)); // SIGKILLed long before this
        return;
    }
    need_two_gpus();
    let id = Id::new().unwrap();
    let victim = child("gpu_sigkilled_peer_gives_a_typed_timeout_naming_it", "victim", &id);
    let c = Comm::from_rank_with_config(stream(1), 1, 2, id, config()).expect("from_rank (survivor)");
    victim.expect_line("@@READY", HOST_TIMEOUT);
    victim.kill();
    println!("COMM sigkill: rank 0 killed after set-up");

    let t = Instant::now();
    let e = c.diag().ping_pong(0, 1, DEVICE_TIMEOUT).expect_err("the dead peer cannot answer");
    let waited = t.elapsed();
    println!("COMM sigkill: survivor's device wait ended after {waited:?}: {e}");
    assert!(matches!(e, Error::DeviceTimeout { rank: 1, peer: 0, .. }), "{e:?}");
    assert!(waited < DEVICE_TIMEOUT + Duration::from_secs(2), "took {waited:?}");
    assert!(matches!(c.async_error(), Err(Error::Poisoned(_))));
    assert!(matches!(c.diag().ping_pong(0, 1, DEVICE_TIMEOUT), Err(Error::Poisoned(_))));

    let t = Instant::now();
    let e = c.diag().host().barrier("after the kill").expect_err("the dead peer cannot meet");
    println!("COMM sigkill: survivor's host wait ended after {:?}: {e}", t.elapsed());
    assert!(matches!(e, Error::PeerLost { rank: 1, peer: 0, .. }), "{e:?}");
    assert!(t.elapsed() < Duration::from_secs(2));

    let t = Instant::now();
    let report = c.close();
    println!("COMM sigkill: survivor's teardown took {:?}: {report:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(10));
    assert!(!report.met_peers && report.leaked_bytes == 0, "{report:?}");

    // The survivor's GPU is still healthy (no sticky error from touching dead memory).
    let s = stream(1);
    let x = s.clone_htod(&[1u32, 2, 3]).expect("the survivor's context still works");
    assert_eq!(s.clone_dtoh(&x).unwrap(), vec![1, 2, 3]);
    println!("COMM sigkill: survivor's GPU still healthy");
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_from_env_as_under_torchrun() {
    // Two child processes with the variables torchrun sets; both call Comm::from_env().
    if let Some(role) = role() {
        assert_eq!(role, "torchrun");
        let t = Instant::now();
        let c = Comm::from_env().expect("from_env");
        println!("COMM from_env set-up, rank {}: {:?}", c.rank(), t.elapsed());
        assert_eq!(c.world_size(), 2);
        assert_eq!(c.ordinal(), c.rank());
        let p = c.diag().ping_pong(1 - c.rank(), ROUNDS, DEVICE_TIMEOUT).expect("ping-pong");
        if p.initiator {
            println!("COMM from_env ping-pong: round trip {:.2} us", p.round_trip_us);
        }
        // A second communicator of the same job meets on the next name.
        let c2 = Comm::from_env().expect("second from_env");
        c2.diag().ping_pong(1 - c.rank(), 10, DEVICE_TIMEOUT).expect("ping-pong on the second");
        assert!(c2.close().met_peers);
        assert!(c.close().met_peers);
        return;
    }
    need_two_gpus();
    let port = 20000 + (std::process::id() % 20000);
    let kids: Vec<Kid> = (0..2)
        .map(|r| {
            let mut env = torchrun_env(r, 2, &port.to_string(), &format!("purlin-test-{}", std::process::id()));
            env.push(("PURLIN_TIMEOUT_S", "60".to_string()));
            Kid::spawn("gpu_from_env_as_under_torchrun", true, &env)
        })
        .collect();
    for (r, k) in kids.into_iter().enumerate() {
        assert!(k.finish(HOST_TIMEOUT * 2), "rank {r} failed");
    }
}
