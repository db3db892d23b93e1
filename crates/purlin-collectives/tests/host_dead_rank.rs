//! A rank that dies mid-sequence, on the host executor: every survivor's error names the
//! dead rank (never itself, never a live rank), and carries the flight recorder's report of
//! the call each rank was on — the dead rank one call behind.
//!
//! Worlds 2–4, plain buffers (staged plans, the executor's waits and call check) and
//! symmetric buffers (one-copy plans, whose ranks first meet to compare the call).

use std::time::Duration;

use purlin_collectives::{CpuComm, CpuConfig, CpuSymmetricBuffer, Error, ReduceOp};
use purlin_snac::Regime;

/// Calls every rank makes before the dead rank stops.
const BEFORE: usize = 3;
const COUNT: usize = 20_000;

fn comms(world: usize) -> Vec<CpuComm> {
    let mut config = CpuConfig { timeout: Duration::from_secs(1), ..CpuConfig::default() };
    // Throughput plans: the one-copy path takes symmetric buffers only in this regime.
    config.tuning.regime = Some(Regime::Throughput);
    CpuComm::threads_with_config(world, config).expect("host communicators")
}

/// The survivors' errors when `dead` stops after [`BEFORE`] all-reduces and the others make
/// one more; `symmetric`: on symmetric buffers.
fn survivors_errors(world: usize, dead: usize, symmetric: bool) -> Vec<(usize, Error, String)> {
    let comms = comms(world);
    let results: Vec<Option<(Error, String)>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, comm)| {
                s.spawn(move || {
                    let calls = if r == dead { BEFORE } else { BEFORE + 1 };
                    let input = vec![r as f32 + 1.0; COUNT];
                    let mut sym_in: Option<CpuSymmetricBuffer<f32>> = None;
                    let mut sym_out: Option<CpuSymmetricBuffer<f32>> = None;
                    if symmetric {
                        let mut i = comm.alloc_symmetric::<f32>(COUNT).expect("symmetric input");
                        i.copy_from_host(&input).expect("fill");
                        sym_in = Some(i);
                        sym_out = Some(comm.alloc_symmetric::<f32>(COUNT).expect("symmetric output"));
                    }
                    let mut output = vec![0f32; COUNT];
                    for call in 1..=calls {
                        let ran = match (&sym_in, &mut sym_out) {
                            (Some(i), Some(o)) => comm.all_reduce(i, o, &ReduceOp::Sum),
                            _ => comm.all_reduce(&input, &mut output, &ReduceOp::Sum),
                        };
                        match ran {
                            Ok(_) => assert!(call <= BEFORE, "rank {r}'s call {call} returned without the dead rank"),
                            Err(e) => {
                                assert_eq!(call, BEFORE + 1, "rank {r}'s call {call} failed: {e}");
                                let report = comm.hang_report().summary();
                                return Some((e, report));
                            }
                        }
                    }
                    None
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
    });
    let mut errors = vec![];
    for (r, got) in results.into_iter().enumerate() {
        match got {
            Some((e, report)) => errors.push((r, e, report)),
            None => assert_eq!(r, dead, "survivor {r} returned Ok from the call the dead rank never made"),
        }
    }
    assert_eq!(errors.len(), world - 1, "every survivor fails");
    errors
}

fn check(world: usize, dead: usize, symmetric: bool) {
    let what = if symmetric { "one-copy" } else { "staged" };
    for (r, e, report) in survivors_errors(world, dead, symmetric) {
        let text = e.to_string();
        let ctx = format!("world {world}, dead rank {dead}, {what}: survivor {r}: {text}");
        match &e {
            Error::Timeout { rank, peer, .. } => {
                assert_eq!((*rank, *peer), (r, dead), "{ctx}");
                assert!(e.is_peer_failure(), "{ctx}");
            }
            // A survivor whose wait another survivor's expiry cut short: the reason it quotes
            // names the dead rank.
            Error::Poisoned(why) => assert!(why.contains(&format!("host wait for rank {dead}")), "{ctx}"),
            other => panic!("{ctx}: expected a timeout or a poisoned world, got {other:?}"),
        }
        // The flight recorder's report, in the error and from the communicator.
        let behind = format!("rank {dead} is 1 call behind");
        assert!(text.contains(&behind), "{ctx}");
        assert!(text.contains(&format!("rank {dead} on call {BEFORE} (all-reduce F32")), "{ctx}");
        assert!(text.contains(&format!("rank {r} on call {} (all-reduce F32", BEFORE + 1)), "{ctx}");
        assert!(report.contains(&behind), "{report}");
    }
}

#[test]
fn a_dead_rank_is_named_by_every_survivor_at_world_2() {
    check(2, 1, false);
    check(2, 0, true);
}

#[test]
fn a_dead_rank_is_named_by_every_survivor_at_world_3() {
    check(3, 2, false);
    check(3, 1, true);
}

#[test]
fn a_dead_rank_is_named_by_every_survivor_at_world_4() {
    check(4, 1, false);
    check(4, 3, true);
}

#[test]
fn the_flight_recorder_keeps_each_calls_number_sizes_digest_and_outcome() {
    let comms = comms(2);
    std::thread::scope(|s| {
        for comm in &comms {
            s.spawn(move || {
                for _ in 0..3 {
                    comm.all_reduce(&[1u32; 8], &mut [0u32; 8], &ReduceOp::Sum).expect("all-reduce");
                }
                comm.all_gather(&[1u8; 3], &mut [0u8; 6]).expect("all-gather");
            });
        }
    });
    let (a, b) = (comms[0].flight_recorder().entries(), comms[1].flight_recorder().entries());
    assert_eq!(a.iter().map(|e| e.number).collect::<Vec<_>>(), [1, 2, 3, 4]);
    assert_eq!(a[3].collective, "all-gather");
    assert_eq!((a[0].input_bytes, a[0].output_bytes, a[3].input_bytes, a[3].output_bytes), (32, 32, 3, 6));
    assert!(a.iter().all(|e| e.ok == Some(true) && e.executor == purlin_collectives::Executor::Host));
    // The same calls have the same digests on both ranks; different calls differ.
    assert_eq!(a.iter().map(|e| e.digest).collect::<Vec<_>>(), b.iter().map(|e| e.digest).collect::<Vec<_>>());
    assert_ne!(a[0].digest, a[3].digest);
    let report = comms[0].hang_report();
    assert!(report.behind().is_empty(), "{report}");
}
