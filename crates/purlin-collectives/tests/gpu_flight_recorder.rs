//! The flight recorder on GPUs: rank 1 stops after three all-reduces, rank 0 makes a fourth
//! alone; rank 0's device wait expires, and its error and hang report name the call each rank
//! was on, read from the call words the call check writes (rank 1 one call behind).
//!
//! World 2 in one process (`Comm::from_devices`; `PURLIN_SHARED_GPU=1` on one GPU). Run on
//! the GPU machine: `gpu_flight_recorder-test --ignored --nocapture`.

mod gpu_calls;

use std::time::Duration;

use gpu_calls::{base_config, need_two_gpus, streams};
use purlin_collectives::{Comm, CommConfig, Executor, ReduceOp};

const N: usize = 4096;

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn a_device_timeout_reports_the_call_each_rank_was_on() {
    need_two_gpus();
    let config = CommConfig {
        device_timeout: Duration::from_secs(1),
        timeout: Duration::from_secs(60),
        call_check: true,
        ..base_config()
    };
    let comms = Comm::from_devices_with_config(streams(), config).expect("communicators");
    let bufs: Vec<_> = comms
        .iter()
        .map(|c| {
            let s = c.stream();
            (s.clone_htod(&vec![1.0f32; N]).expect("input"), s.alloc_zeros::<f32>(N).expect("output"))
        })
        .collect();
    let mut bufs = bufs;
    for _ in 0..3 {
        // Every rank's call is enqueued before any stream is waited on.
        for (c, (send, recv)) in comms.iter().zip(bufs.iter_mut()) {
            c.all_reduce(send, recv, &ReduceOp::Sum).expect("all-reduce");
        }
        for c in &comms {
            c.stream().synchronize().expect("synchronize");
            c.async_error().expect("no fault yet");
        }
    }
    // Rank 0 alone: its wait for rank 1 expires after the device timeout.
    let (send, recv) = &mut bufs[0];
    comms[0].all_reduce(send, recv, &ReduceOp::Sum).expect("enqueued");
    let _ = comms[0].stream().synchronize();
    let e = comms[0].async_error().expect_err("the expired wait is reported");
    let text = e.to_string();
    println!("rank 0's error: {text}");
    let report = comms[0].hang_report();
    println!("{report}");

    assert!(text.contains("rank 1 is 1 call behind"), "{text}");
    assert!(text.contains("rank 0 on call 4 (all-reduce F32 16384/16384 B)"), "{text}");
    assert!(text.contains("rank 1 on call 3 (all-reduce F32 16384/16384 B)"), "{text}");
    let numbers: Vec<_> = report.ranks.iter().map(|r| r.number).collect();
    assert_eq!(numbers, [Some(4), Some(3)]);
    assert_eq!(report.most_behind(), Some(1));
    let (a, b) = (comms[0].flight_recorder().entries(), comms[1].flight_recorder().entries());
    assert_eq!(a.iter().map(|e| e.number).collect::<Vec<_>>(), [1, 2, 3, 4]);
    assert_eq!(b.len(), 3);
    assert!(a.iter().all(|e| e.executor == Executor::Gpu && e.collective == "all-reduce"));
    assert_eq!(a[..3].iter().map(|e| e.digest).collect::<Vec<_>>(), b.iter().map(|e| e.digest).collect::<Vec<_>>());
}
