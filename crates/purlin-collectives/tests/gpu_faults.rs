//! Faults on 2 GPUs (issue #9; docs/design.md §5 "Bounded waits and poisoning"): every device
//! wait is bounded (here by a 1 s `CommConfig::device_timeout`), a wait that expires poisons
//! the communicator, the rest of a captured graph exits at once, the host sees a typed error
//! naming the peer within timeout + 1 s, later calls return `Error::Poisoned`, and the
//! process still tears down and exits cleanly.
//!
//! - eager: rank 1 skips one call of a sequence (two processes, as in production);
//! - graph: rank 0 replays a captured graph of 4 collectives while rank 1 does nothing;
//! - SIGKILL: two processes launched as torchrun does (RANK, WORLD_SIZE, LOCAL_RANK,
//!   MASTER_ADDR, MASTER_PORT), both looping collectives; rank 1 is SIGKILLed mid-loop.
//!
//! Multi-process tests re-run this executable as the ranks (`--exact <name> --ignored`), so
//! they need no launcher; the parent bounds every child (`Kid::finish`) and checks its exit
//! status. Each process collects its observations and prints them before asserting, so one
//! GPU round shows every property, passing or not.
//!
//! Run on the GPU machine: `gpu_faults-test --ignored --test-threads=1 --nocapture`.

mod child_process;
mod gpu_calls;

use std::time::{Duration, Instant};

use child_process::{Kid, ROLE, role, torchrun_env};
use cudarc::driver::CudaGraph;
use gpu_calls::{
    Bufs, Call, Coll, Dt, Rng, call, capture, fresh_seed, is_fault_error, names_peer, need_two_gpus,
    replay_with_fresh_inputs, stream,
};
use purlin_collectives::TorchEnv;
use purlin_collectives::{Comm, CommConfig, Error, Id, ReduceOp};

/// The device wait bound of these tests.
const DEVICE_TIMEOUT: Duration = Duration::from_secs(1);
/// When the host must have the typed error: the documented bound, timeout + 1 s.
const BOUND: Duration = Duration::from_secs(2);
/// Host waits (set-up, barriers) and child processes.
const HOST_TIMEOUT: Duration = Duration::from_secs(60);
const CHILD_LIMIT: Duration = Duration::from_secs(150);
/// Teardown after a fault must not hang.
const CLOSE_LIMIT: Duration = Duration::from_secs(10);

fn fault_config() -> CommConfig {
    CommConfig { timeout: HOST_TIMEOUT, device_timeout: DEVICE_TIMEOUT, ..gpu_calls::base_config() }
}

/// Mixed collectives, latency- and throughput-size.
fn fault_calls() -> Vec<Call> {
    use Coll::*;
    use ReduceOp::*;
    vec![
        call(AllReduce, Dt::F32, Sum, 1000),
        call(AllGather, Dt::Bf16, Sum, 4096),
        call(ReduceScatter, Dt::F32, Sum, 300_000),
        call(AllToAll, Dt::U8, Sum, 1000),
        call(AllReduce, Dt::F32, Sum, 600_000),
        call(AllGatherV, Dt::F32, Sum, 1000),
        call(AllReduce, Dt::I32, Max, 7),
        call(AllToAllV, Dt::U8, Sum, 333),
    ]
}

/// The call rank 1 skips in the eager test (the throughput-size AllReduce; calls 0..4, both
/// regimes, run and are checked on both ranks first).
const SKIP: usize = 4;

fn test_id() -> Id {
    Id::from_hex(&std::env::var("PURLIN_TEST_ID").expect("PURLIN_TEST_ID")).expect("id")
}

/// Observations that must hold, collected so all are printed before the test fails.
struct Checks {
    what: &'static str,
    failed: Vec<String>,
}

impl Checks {
    fn new(what: &'static str) -> Self {
        Checks { what, failed: Vec::new() }
    }
    fn check(&mut self, ok: bool, what: impl Into<String>) {
        let what = what.into();
        println!("COMM fault {}: {} {what}", self.what, if ok { "ok  " } else { "FAIL" });
        if !ok {
            self.failed.push(what);
        }
    }
    fn finish(self) {
        assert!(self.failed.is_empty(), "{}: {} properties failed: {:#?}", self.what, self.failed.len(), self.failed);
    }
}

/// The typed-error properties of a fault seen by rank `rank` about peer `peer`.
fn check_fault(checks: &mut Checks, e: &Error, peer: usize, took: Duration) {
    checks.check(is_fault_error(e), format!("the error is a typed peer/poison error: {e:?}"));
    checks.check(names_peer(e, peer), format!("the error names rank {peer}: {e}"));
    checks.check(took <= BOUND, format!("seen {took:?} after the call began (bound {BOUND:?})"));
}

/// A later call on a poisoned communicator returns `Error::Poisoned` at once.
fn check_later_call(checks: &mut Checks, c: &Comm, b: &Bufs, slot: usize) {
    let t = Instant::now();
    let r = b.issue(c, slot);
    let took = t.elapsed();
    checks.check(
        matches!(r, Err(Error::Poisoned(_))),
        format!("a later call ({}) returns Error::Poisoned: {r:?}", b.call.name()),
    );
    checks.check(took < Duration::from_millis(100), format!("and at once ({took:?})"));
}

// ---------------------------------------------------------------- eager: a skipped call

fn eager_skip_rank(rank: usize, id: Id, seed: u64) {
    let mut checks = Checks::new(if rank == 0 { "eager/rank 0" } else { "eager/rank 1" });
    let c = Comm::from_rank_with_config(stream(gpu_calls::rank_ordinal(rank)), rank, 2, id, fault_config())
        .expect("from_rank");
    let calls = fault_calls();
    let mut bufs: Vec<Bufs> = calls.iter().map(|&k| Bufs::for_rank(&c, k)).collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        let inputs = b.call.inputs_seeded(seed, i);
        if rank == 1 && i == SKIP {
            println!("COMM fault eager: rank 1 skips call {i} ({}) and issues nothing more", b.call.name());
            break;
        }
        b.upload(&c, 0, &inputs);
        if i < SKIP {
            b.issue(&c, 0).unwrap_or_else(|e| panic!("rank {rank} call {i}: {e}"));
            b.check(&c, 0, &inputs).unwrap_or_else(|e| panic!("before the skip: {e}"));
            c.async_error().unwrap_or_else(|e| panic!("rank {rank} call {i}: {e}"));
            continue;
        }
        if i == SKIP {
            c.stream().synchronize().expect("uploads done");
            let t = Instant::now();
            let issued = b.issue(&c, 0);
            let sync = c.stream().synchronize();
            let seen = c.async_error();
            let took = t.elapsed();
            println!(
                "COMM fault eager: rank 0 call {i} ({}) alone: enqueue {issued:?}, stream {sync:?}, after {took:?}: {seen:?}",
                b.call.name()
            );
            checks.check(issued.is_ok(), "the call is enqueued (the fault shows on the device, later)");
            checks.check(sync.is_ok(), format!("the kernel ends by itself, without a driver error: {sync:?}"));
            match &seen {
                Err(e) => check_fault(&mut checks, e, 1, took),
                Ok(()) => checks.check(false, "async_error() reports the expired wait"),
            }
            continue;
        }
        check_later_call(&mut checks, &c, b, 0);
    }
    if rank == 0 {
        let again = c.async_error();
        checks.check(
            matches!(again, Err(Error::Poisoned(_))),
            format!("async_error() keeps reporting Poisoned: {again:?}"),
        );
    } else {
        checks.check(c.async_error().is_ok(), "rank 1 (which only skipped) is not poisoned");
    }
    // Both ranks meet once rank 0 has looked (rank 1 waits here, host-bounded), then close.
    let met = c.diag().host().barrier("gpu_faults: eager fault observed");
    checks.check(met.is_ok(), format!("both ranks meet after the fault: {met:?}"));
    let t = Instant::now();
    let report = c.close();
    let took = t.elapsed();
    println!("COMM fault eager: rank {rank} teardown in {took:?}: {report:?}");
    checks.check(took < CLOSE_LIMIT, format!("close() returns ({took:?})"));
    checks.check(report.leaked_bytes == 0, format!("close() frees the workspace: {report:?}"));
    checks.finish();
    println!("COMM fault eager: rank {rank} PASS");
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn eager_a_skipped_call_gives_a_typed_error_then_poisoned() {
    const NAME: &str = "eager_a_skipped_call_gives_a_typed_error_then_poisoned";
    if let Some(role) = role() {
        let rank = role.strip_prefix("rank").and_then(|r| r.parse().ok()).expect("role rankN");
        return eager_skip_rank(rank, test_id(), fresh_seed());
    }
    need_two_gpus();
    let id = Id::new().expect("id");
    let seed = fresh_seed();
    println!("COMM fault eager: seed {seed}");
    let kids: Vec<Kid> = (0..2)
        .map(|r| {
            Kid::spawn(
                NAME,
                true,
                &[(ROLE, format!("rank{r}")), ("PURLIN_TEST_ID", id.to_hex()), ("PURLIN_TEST_SEED", seed.to_string())],
            )
        })
        .collect();
    let results: Vec<bool> = kids.into_iter().map(|k| k.finish(CHILD_LIMIT)).collect();
    println!("COMM fault eager: rank processes exited, success {results:?}");
    assert_eq!(results, vec![true, true], "both rank processes exit cleanly (status 0)");
}

// ---------------------------------------------------------------- set-up: unlike tuning

/// Ranks plan every call on their own, so ranks whose tuning differs (here the block cap)
/// must fail set-up, each naming the other, instead of running plans that do not meet.
#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn ranks_that_tune_differently_fail_set_up_naming_each_other() {
    need_two_gpus();
    let id = Id::new().expect("id");
    let results: Vec<Result<Comm, Error>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2usize)
            .map(|rank| {
                s.spawn(move || {
                    let mut config = fault_config();
                    config.tuning.max_blocks = Some(if rank == 0 { 16 } else { 24 });
                    Comm::from_rank_with_config(stream(gpu_calls::rank_ordinal(rank)), rank, 2, id, config)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("set-up thread")).collect()
    });
    for (rank, r) in results.iter().enumerate() {
        match r {
            Err(Error::Mismatch { peer, what, .. }) => {
                println!("COMM set-up rank {rank}: Mismatch with rank {peer}: {what}");
                assert_eq!(*peer, 1 - rank, "rank {rank} names the other rank");
                assert!(what.contains("tuning"), "rank {rank} names the tuning: {what}");
            }
            Err(e) => panic!("rank {rank}: expected a tuning mismatch, got {e}"),
            Ok(_) => panic!("rank {rank}: set-up succeeded with unlike tuning"),
        }
    }
}

// ---------------------------------------------------------------- graph: a silent peer

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn graph_a_silent_peer_times_out_once_and_the_rest_exits_at_once() {
    let mut checks = Checks::new("graph");
    let comms = Comm::from_devices_with_config(gpu_calls::streams(), fault_config()).expect("set-up");
    use Coll::*;
    let calls = [
        call(AllReduce, Dt::F32, ReduceOp::Sum, 1000),
        call(AllGather, Dt::F32, ReduceOp::Sum, 300_000),
        call(ReduceScatter, Dt::Bf16, ReduceOp::Max, 4096),
        call(AllToAll, Dt::U8, ReduceOp::Sum, 1000),
    ];
    let mut bufs: Vec<Bufs> = calls.iter().map(|&k| Bufs::new(&comms, k)).collect();
    let graphs: Vec<CudaGraph> = comms.iter().map(|c| capture(c, &bufs)).collect();
    let seed = fresh_seed();
    let mut rng = Rng::new(seed);

    // Both ranks replay once: the graph is right (else the fault below would mean nothing).
    if let Some(e) = replay_with_fresh_inputs(&comms, &graphs, &calls, &mut bufs, &mut rng).first() {
        panic!("the replay on both ranks: {e} (seed {seed})");
    }
    println!("COMM fault graph: a replay on both ranks is exact ({} calls)", calls.len());

    // Rank 1 does nothing; rank 0 replays alone, with fresh inputs and poisoned outputs.
    let (c0, c1) = (&comms[0], &comms[1]);
    let inputs: Vec<Vec<Vec<i64>>> = calls.iter().map(|k| k.inputs(&mut rng)).collect();
    for (b, x) in bufs.iter_mut().zip(&inputs) {
        b.upload(c0, 0, x);
    }
    c0.stream().synchronize().expect("uploads done");
    let t = Instant::now();
    let launched = graphs[0].launch();
    let sync = c0.stream().synchronize();
    let seen = c0.async_error();
    let took = t.elapsed();
    println!("COMM fault graph: rank 0 replayed alone: launch {launched:?}, stream {sync:?}, after {took:?}: {seen:?}");
    checks.check(launched.is_ok(), "the replay is launched");
    checks.check(sync.is_ok(), format!("its kernels end by themselves, without a driver error: {sync:?}"));
    // Four kernels that each waited the full bound would take 4 s; one wait, then three
    // kernels that exit at entry, stays within timeout + 1 s.
    match &seen {
        Err(e) => check_fault(&mut checks, e, 1, took),
        Ok(()) => checks.check(false, "async_error() reports the expired wait"),
    }
    for b in &bufs[1..] {
        let out = b.output(c0, 0);
        let untouched = out == b.call.poisoned(b.call.lens(0).1);
        checks.check(
            untouched,
            format!("{} after the failed one exited at entry: its output is untouched", b.call.name()),
        );
    }
    let control = c0.diag().workspace_layout().control.offset;
    if let Ok(words) = c0.diag().read_own_workspace(control, 48) {
        let w: Vec<u64> = words.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().unwrap())).collect();
        println!(
            "COMM fault graph: rank 0 control words: poisoned {} peer+1 {} epoch {} block {} step {} chunk {}",
            w[0], w[1], w[2], w[3], w[4], w[5]
        );
    }
    check_later_call(&mut checks, c0, &bufs[0], 0);
    let again = c0.async_error();
    checks.check(matches!(again, Err(Error::Poisoned(_))), format!("async_error() keeps reporting: {again:?}"));
    checks.check(c1.async_error().is_ok(), "rank 1 (silent) is not poisoned");
    let t = Instant::now();
    drop(graphs);
    drop(comms);
    checks.check(t.elapsed() < CLOSE_LIMIT, format!("teardown returns ({:?})", t.elapsed()));
    checks.finish();
    println!("COMM fault graph: PASS (seed {seed})");
}

// ---------------------------------------------------------------- SIGKILL under torchrun

/// One rank of the torchrun-like launch: loops mixed collectives, each checked, until the
/// communicator reports a fault (rank 0, after rank 1 is killed) or 90 s pass.
fn torchrun_loop_rank() {
    let env = TorchEnv::from_process().expect("the torchrun variables");
    let ordinal = env.device_ordinal(purlin_topo::device_count()).expect("LOCAL_RANK names a GPU");
    let c = Comm::from_env_with_stream(stream(ordinal), fault_config()).expect("Comm::from_env_with_stream");
    let rank = c.rank();
    let mut checks = Checks::new(if rank == 0 { "sigkill/rank 0" } else { "sigkill/rank 1" });
    let seed = fresh_seed();
    let calls = fault_calls();
    let mut bufs: Vec<Bufs> = calls.iter().map(|&k| Bufs::for_rank(&c, k)).collect();
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut i = 0usize;
    loop {
        assert!(Instant::now() < deadline, "rank {rank}: no fault after {i} calls and 90 s");
        let k = i % calls.len();
        let inputs = calls[k].inputs_seeded(seed, i);
        let b = &mut bufs[k];
        b.upload(&c, 0, &inputs);
        let t = Instant::now();
        let issued = b.issue(&c, 0);
        let sync = if issued.is_ok() { c.stream().synchronize().map_err(|e| format!("{e:?}")) } else { Ok(()) };
        let seen = c.async_error();
        if issued.is_ok() && sync.is_ok() && seen.is_ok() {
            // No fault seen: the call completed on both ranks, so it is exact.
            b.check(&c, 0, &inputs).unwrap_or_else(|e| panic!("rank {rank} call {i} (seed {seed}): {e}"));
            if rank == 1 && i == 40 {
                println!("@@LOOPING rank 1 after {i} checked calls");
            }
            i += 1;
            continue;
        }
        let took = t.elapsed();
        println!(
            "@@TYPED-ERROR rank {rank} call {i} ({}) after {took:?}: enqueue {issued:?}, stream {sync:?}, async_error {seen:?}",
            b.call.name()
        );
        checks.check(rank == 0, "only the survivor sees a fault");
        checks.check(sync.is_ok(), format!("the kernel ends by itself, without a driver error: {sync:?}"));
        match (&issued, &seen) {
            (Err(e), _) | (_, Err(e)) => check_fault(&mut checks, e, 1, took),
            _ => checks.check(false, "a typed error"),
        }
        break;
    }
    check_later_call(&mut checks, &c, &bufs[0], 0);
    let again = c.async_error();
    checks.check(matches!(again, Err(Error::Poisoned(_))), format!("async_error() keeps reporting: {again:?}"));
    let t = Instant::now();
    let report = c.close();
    let took = t.elapsed();
    println!("COMM fault sigkill: rank {rank} teardown in {took:?}: {report:?}");
    checks.check(took < CLOSE_LIMIT, format!("close() returns ({took:?})"));
    checks.check(!report.met_peers, "teardown does not pretend to have met the dead peer");
    // The survivor's GPU still works (no sticky error from touching the dead peer's memory).
    let s = stream(ordinal);
    let healthy = s.clone_htod(&[1u32, 2, 3]).and_then(|x| s.clone_dtoh(&x));
    checks.check(matches!(&healthy, Ok(v) if *v == vec![1, 2, 3]), format!("the GPU is still healthy: {healthy:?}"));
    checks.finish();
    println!("COMM fault sigkill: rank {rank} PASS (exits cleanly)");
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn sigkill_mid_loop_under_torchrun_gives_rank0_a_typed_error_and_a_clean_exit() {
    const NAME: &str = "sigkill_mid_loop_under_torchrun_gives_rank0_a_typed_error_and_a_clean_exit";
    if let Some(role) = role() {
        assert_eq!(role, "torchrun");
        return torchrun_loop_rank();
    }
    need_two_gpus();
    let port = 20000 + (std::process::id() % 20000);
    let seed = fresh_seed();
    let mut kids: Vec<Kid> = (0..2)
        .map(|r| {
            let mut env = torchrun_env(r, 2, &port.to_string(), &format!("purlin-faults-{}", std::process::id()));
            env.push(("PURLIN_TEST_SEED", seed.to_string()));
            Kid::spawn(NAME, true, &env)
        })
        .collect();
    let victim = kids.pop().expect("rank 1");
    let survivor = kids.pop().expect("rank 0");
    victim.expect_line("@@LOOPING", HOST_TIMEOUT * 2);
    // Somewhere inside a later call of the loop.
    std::thread::sleep(Duration::from_millis(3));
    let t = Instant::now();
    victim.kill();
    println!("COMM fault sigkill: rank 1 SIGKILLed mid-loop (seed {seed})");
    let line = survivor.expect_line("@@TYPED-ERROR", BOUND);
    let took = t.elapsed();
    println!("COMM fault sigkill: rank 0 reported {took:?} after the kill: {line}");
    assert!(took <= BOUND, "rank 0 saw the fault {took:?} after the kill (bound {BOUND:?})");
    assert!(survivor.finish(CHILD_LIMIT), "rank 0 exits cleanly (status 0) after the fault");
    println!("COMM fault sigkill: rank 0 exited with status 0");
}
