//! Point-to-point calls on the host executor (`CpuComm::send`, `recv`, `send_recv`, groups):
//! at world 2 a send and the peer's matching receive are one collective, in every regime, on
//! plain and symmetric buffers; a group runs its k-th send with its k-th receive; what a pair
//! cannot be (a wider world, a rank with itself) is a typed error before anything runs.

mod host_runner;

use std::thread;

use host_runner::{Setup, comms};
use purlin_collectives::CpuComm;
use purlin_collectives::Error;
use purlin_snac::ReductionMode;

/// Element `i` of what `rank` sends in call `call`: distinct per rank, call and index.
fn payload(rank: usize, call: usize, i: usize) -> i32 {
    (i as i32).wrapping_mul(2_654_435).wrapping_add((rank * 1_000 + call * 97) as i32)
}

fn payloads(rank: usize, call: usize, n: usize) -> Vec<i32> {
    (0..n).map(|i| payload(rank, call, i)).collect()
}

/// Runs `f(comm)` on both ranks' threads and returns each rank's result, which must be Ok.
fn on_both<R: Send>(comms: &[CpuComm], f: impl Fn(&CpuComm) -> Result<R, Error> + Sync) -> Vec<R> {
    on_both_results(comms, f)
        .into_iter()
        .enumerate()
        .map(|(r, res)| res.unwrap_or_else(|e| panic!("rank {r}: {e}")))
        .collect()
}

#[test]
fn sends_meet_receives_in_every_regime() {
    let mut checked = 0;
    for setup in [Setup::Default, Setup::Latency, Setup::Latency16, Setup::ThroughputPeer, Setup::ThroughputOwn] {
        let comms = comms(2, setup, ReductionMode::Deterministic);
        for n in [0, 1, 3, 64, 1500, 70_001] {
            let what = format!("{setup:?}, {n} elements");
            // Rank 0 sends, then rank 1 sends back what differs: two calls in one order.
            let got = on_both(&comms, |c| {
                let (me, peer) = (c.rank(), 1 - c.rank() as i32);
                let mut first = vec![-1i32; n];
                let mut second = vec![-1i32; n];
                if me == 0 {
                    c.send(&payloads(me, 0, n), peer)?;
                    c.recv(&mut second, peer)?;
                } else {
                    c.recv(&mut first, peer)?;
                    c.send(&payloads(me, 1, n), peer)?;
                }
                Ok((first, second))
            });
            assert_eq!(got[1].0, payloads(0, 0, n), "{what}: rank 1 received rank 0's send");
            assert_eq!(got[0].1, payloads(1, 1, n), "{what}: rank 0 received rank 1's send");
            assert!(got[0].0.iter().chain(&got[1].1).all(|&x| x == -1), "{what}: an unused buffer was written");

            // An exchange of different lengths in one call on each side, and a one-sided
            // send_recv (a receive of no bytes) met by a lone receive.
            let m = n / 2 + 5;
            let got = on_both(&comms, |c| {
                let (me, peer) = (c.rank(), 1 - c.rank() as i32);
                let (mine, theirs) = if me == 0 { (n, m) } else { (m, n) };
                let mut exchanged = vec![-1i32; theirs];
                c.send_recv(&payloads(me, 2, mine), peer, &mut exchanged, peer)?;
                let mut one_sided = vec![-1i32; n];
                if me == 0 {
                    c.send_recv::<_, [i32], _, i32>(&payloads(me, 3, n), peer, &mut [], peer)?;
                } else {
                    c.recv(&mut one_sided, peer)?;
                }
                Ok((exchanged, one_sided))
            });
            assert_eq!(got[0].0, payloads(1, 2, m), "{what}: rank 0's half of the exchange");
            assert_eq!(got[1].0, payloads(0, 2, n), "{what}: rank 1's half of the exchange");
            assert_eq!(got[1].1, payloads(0, 3, n), "{what}: a send_recv met by a lone recv");
            checked += 5;
        }
    }
    println!("{checked} point-to-point transfers matched");
}

/// A send of one type meets a receive of another of the same bytes (groups on a GPU fuse
/// such pairs), and symmetric buffers are accepted as plain memory.
#[test]
fn bytes_not_types_meet_and_symmetric_buffers_work() {
    let comms = comms(2, Setup::ThroughputOwn, ReductionMode::Deterministic);
    let n = 4099;
    let got = on_both(&comms, |c| {
        let (me, peer) = (c.rank(), 1 - c.rank() as i32);
        let mut sym = c.alloc_symmetric::<i32>(n)?;
        let mut bytes = vec![0u8; 4 * n];
        if me == 0 {
            sym.copy_from_host(&payloads(me, 0, n))?;
            c.send(&sym, peer)?;
            c.send(&payloads(me, 1, n), peer)?;
        } else {
            c.recv(&mut sym, peer)?;
            c.recv(&mut bytes, peer)?;
        }
        Ok((sym.to_vec(), bytes))
    });
    assert_eq!(got[1].0, payloads(0, 0, n), "a symmetric send into a symmetric receive");
    let as_i32: Vec<i32> = got[1].1.chunks_exact(4).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]])).collect();
    assert_eq!(as_i32, payloads(0, 1, n), "i32 sent, received as its bytes");
}

#[test]
fn what_a_pair_cannot_be_is_a_typed_error() {
    let pair = comms(2, Setup::Latency, ReductionMode::Deterministic);
    let x = vec![1i32; 8];
    let mut y = vec![0i32; 8];
    assert!(matches!(pair[0].send(&x, 0), Err(Error::InvalidArgument(_))), "a send to itself");
    assert!(matches!(pair[1].recv(&mut y, 1), Err(Error::InvalidArgument(_))), "a receive from itself");
    assert!(matches!(pair[0].send(&x, 2), Err(Error::InvalidArgument(_))), "a peer outside the world");
    assert!(matches!(pair[0].send_recv(&x, 1, &mut y, 0), Err(Error::InvalidArgument(_))));
    assert_eq!(y, vec![0; 8], "a refused call wrote nothing");

    // A wider world: a pair is not every rank.
    let three = comms(3, Setup::Latency, ReductionMode::Deterministic);
    match three[0].send(&x, 1) {
        Err(Error::Unsupported(why)) => assert!(why.contains("all_to_all_v"), "{why}"),
        other => panic!("world 3 send: {other:?}"),
    }
    assert!(matches!(three[2].recv(&mut y, 0), Err(Error::Unsupported(_))));

    // The refusals left the pair usable.
    assert_a_send_meets_its_receive(&pair, 9);
}

/// Rank 0 sends 8 elements of call `call`, rank 1 receives them.
fn assert_a_send_meets_its_receive(pair: &[CpuComm], call: usize) {
    let got = on_both(pair, |c| {
        let mut y = vec![0i32; 8];
        if c.rank() == 0 {
            c.send(&payloads(0, call, 8), 1)?;
        } else {
            c.recv(&mut y, 0)?;
        }
        Ok(y)
    });
    assert_eq!(got[1], payloads(0, call, 8));
}

/// A send and a receive of different sizes, or a send met by the peer's send, are an
/// `Error::Mismatch` on both ranks before anything moves (the ranks compare their calls
/// first); the receive buffer is untouched and the pair stays usable.
#[test]
fn mismatched_sends_and_receives_are_mismatch_errors_on_both_ranks() {
    let pair = comms(2, Setup::ThroughputPeer, ReductionMode::Deterministic);
    for (sent, received) in [(100usize, 50usize), (50, 100), (70_001, 70_000)] {
        let outcomes = thread::scope(|s| {
            let hs: Vec<_> = pair
                .iter()
                .map(|c| {
                    s.spawn(move || {
                        let mut y = vec![-1i32; received];
                        let r =
                            if c.rank() == 0 { c.send(&payloads(0, 0, sent), 1) } else { c.recv(&mut y, 0).map(drop) };
                        (r, y)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("rank thread")).collect::<Vec<_>>()
        });
        for (rank, (r, y)) in outcomes.into_iter().enumerate() {
            match r {
                Err(Error::Mismatch { rank: me, peer, what }) => {
                    assert_eq!((me, peer), (rank, 1 - rank), "{what}");
                }
                other => panic!("{sent} sent, {received} received: rank {rank} got {other:?}"),
            }
            assert!(y.iter().all(|&v| v == -1), "rank {rank}: the receive buffer was written");
        }
    }
    // Both ranks sending to each other (each expecting the other to receive): a mismatch too.
    let outcomes = on_both_results(&pair, |c| c.send(&payloads(c.rank(), 1, 8), 1 - c.rank() as i32));
    assert!(outcomes.iter().all(|r| matches!(r, Err(Error::Mismatch { .. }))), "{outcomes:?}");
    // Nothing was poisoned: a matched pair still runs.
    assert_a_send_meets_its_receive(&pair, 2);
}

/// Runs `f(comm)` on both ranks' threads and returns each rank's result as it came.
fn on_both_results<R: Send>(
    comms: &[CpuComm],
    f: impl Fn(&CpuComm) -> Result<R, Error> + Sync,
) -> Vec<Result<R, Error>> {
    thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    })
}

/// A group of several sends and receives runs them as NCCL matches them, whatever their
/// interleaving: the k-th send to the peer meets the peer's k-th receive. Rank 0 sends two
/// buffers and receives one, rank 1 receives two and sends one; then the other way round,
/// and a group dropped without `end` runs its calls too.
#[test]
fn groups_run_the_kth_send_with_the_kth_receive() {
    for setup in [Setup::Default, Setup::Latency, Setup::ThroughputPeer, Setup::ThroughputOwn] {
        let pair = comms(2, setup, ReductionMode::Deterministic);
        for (call, lens) in [[5000usize, 1667, 777], [1, 0, 70_001]].into_iter().enumerate() {
            let got = on_both(&pair, |c| {
                let (me, peer) = (c.rank(), 1 - c.rank() as i32);
                // Buffer k is sent by rank 0 for k < 2 and by rank 1 for k = 2.
                let sends = |k: usize| if me == 0 { k < 2 } else { k == 2 };
                let mut bufs: Vec<Vec<i32>> = (0..3)
                    .map(|k| if sends(k) { payloads(me, 10 * call + k, lens[k]) } else { vec![-1; lens[k]] })
                    .collect();
                let [b0, b1, b2] = &mut bufs[..] else { unreachable!() };
                let mut group = c.group();
                if me == 0 {
                    group.send(&*b0, peer)?;
                    group.recv(b2, peer)?;
                    group.send(&*b1, peer)?;
                    group.end()?;
                } else {
                    group.recv(b0, peer)?;
                    group.recv(b1, peer)?;
                    group.send(&*b2, peer)?;
                    drop(group); // runs the held calls as `end` does
                    c.async_error()?;
                }
                Ok(bufs)
            });
            for (r, bufs) in got.iter().enumerate() {
                for (k, buf) in bufs.iter().enumerate() {
                    let sent_by = if k < 2 { 0 } else { 1 };
                    assert_eq!(buf, &payloads(sent_by, 10 * call + k, lens[k]), "{setup:?}, rank {r}, buffer {k}");
                }
            }
        }
    }
}

/// Groups that do not mirror each other (the first send meets a receive of another size) are
/// an `Error::Mismatch` on both ranks at their first call, and the rest do not run; the
/// receive buffers are untouched and the pair stays usable.
#[test]
fn groups_that_do_not_mirror_each_other_are_a_mismatch() {
    let pair = comms(2, Setup::ThroughputPeer, ReductionMode::Deterministic);
    let outcomes = on_both_results(&pair, |c| {
        let (a, b) = (payloads(0, 0, 100), payloads(0, 1, 50));
        let (mut x, mut y) = (vec![-1i32; 50], vec![-1i32; 100]);
        let mut group = c.group();
        let ended = if c.rank() == 0 {
            group.send(&a, 1)?;
            group.send(&b, 1)?;
            group.end()
        } else {
            group.recv(&mut x, 0)?;
            group.recv(&mut y, 0)?;
            group.end()
        };
        Ok((ended, x, y))
    });
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let (ended, x, y) = outcome.expect("the group was made");
        assert!(matches!(ended, Err(Error::Mismatch { peer, .. }) if peer == 1 - rank), "rank {rank}: {ended:?}");
        assert!(x.iter().chain(&y).all(|&v| v == -1), "rank {rank}: a receive buffer was written");
    }
    assert_a_send_meets_its_receive(&pair, 3);
}

/// A group whose calls fail when it is dropped cannot return the error, so it poisons the
/// world: every rank's `async_error` then quotes the mismatch, and later calls fail at once.
#[test]
fn a_dropped_group_that_fails_poisons_the_world() {
    let pair = comms(2, Setup::ThroughputPeer, ReductionMode::Deterministic);
    on_both(&pair, |c| {
        let a = payloads(0, 0, 100);
        let mut x = vec![-1i32; 50];
        let mut group = c.group();
        if c.rank() == 0 { group.send(&a, 1) } else { group.recv(&mut x, 0).map(drop) }?;
        drop(group);
        Ok(())
    });
    for c in &pair {
        let e = c.async_error().expect_err("the world is poisoned");
        assert!(matches!(&e, Error::Poisoned(why) if why.contains("disagree")), "rank {}: {e}", c.rank());
    }
    let e = pair[0].send(&payloads(0, 1, 8), 1).expect_err("a poisoned world runs nothing");
    assert!(matches!(e, Error::Poisoned(_)), "{e}");
}
