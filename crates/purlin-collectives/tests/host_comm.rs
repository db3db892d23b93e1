//! The host communicator and the workspace set-up protocol, with real threads and real
//! processes (CI, no GPU).

mod child_process;

use std::time::{Duration, Instant};

use child_process::{Kid, ROLE, role, torchrun_env};
use purlin_collectives::Error;
use purlin_collectives::Id;
use purlin_collectives::internal::HostComm;
use purlin_collectives::internal::workspace::{
    HostBackend, SymmetricBackend, SymmetricWorkspace, WorkspaceConfig, WorkspaceLayout,
};

const T: Duration = Duration::from_secs(20);

fn payload(rank: usize, round: usize) -> Vec<u8> {
    (0..(rank * 7 + round) % 50).map(|i| (i + rank * 31 + round) as u8).collect()
}

fn check_rounds(h: &HostComm, rounds: usize) {
    for round in 0..rounds {
        let all = h.all_gather(&payload(h.rank(), round), "test round").unwrap();
        assert_eq!(all.len(), h.world());
        for (r, a) in all.iter().enumerate() {
            assert_eq!(*a, payload(r, round), "rank {} round {round} from {r}", h.rank());
        }
    }
    let b = h.broadcast(1 % h.world(), &[h.rank() as u8; 3], "broadcast").unwrap();
    assert_eq!(b, vec![(1 % h.world()) as u8; 3]);
    h.barrier("final").unwrap();
}

#[test]
fn threads_gather_in_rank_order() {
    let members = HostComm::threads(4, T);
    std::thread::scope(|s| {
        for h in &members {
            s.spawn(move || check_rounds(h, 200));
        }
    });
}

#[test]
fn threads_time_out_naming_the_missing_rank() {
    let members = HostComm::threads(3, Duration::from_millis(300));
    let start = Instant::now();
    std::thread::scope(|s| {
        for h in &members[..2] {
            s.spawn(move || {
                let e = h.barrier("waiting for rank 2").unwrap_err();
                assert!(matches!(e, Error::Timeout { peer: 2, .. }), "{e}");
                assert!(e.to_string().contains("rank 2"), "{e}");
                // Broken from now on: fails at once.
                let t = Instant::now();
                assert!(h.barrier("again").is_err());
                assert!(t.elapsed() < Duration::from_millis(100));
            });
        }
    });
    assert!(start.elapsed() < Duration::from_secs(3));
    // The latecomer learns it was given up on.
    assert!(matches!(members[2].barrier("late"), Err(Error::Poisoned(_))));
}

#[test]
fn threads_report_a_dropped_member_as_lost() {
    let mut members = HostComm::threads(3, T);
    let gone = members.pop().unwrap();
    let start = Instant::now();
    std::thread::scope(|s| {
        for h in &members {
            s.spawn(move || {
                let e = h.barrier("waiting").unwrap_err();
                assert!(matches!(e, Error::PeerLost { peer: 2, .. }), "{e}");
            });
        }
        std::thread::sleep(Duration::from_millis(50));
        drop(gone);
    });
    assert!(matches!(members[0].check_peers(), Err(Error::PeerLost { peer: 2, .. })));
    assert!(start.elapsed() < Duration::from_secs(2));
}

#[test]
fn socket_ranks_as_threads_of_one_process() {
    let id = Id::new().unwrap();
    std::thread::scope(|s| {
        for rank in (0..4).rev() {
            s.spawn(move || {
                let h = HostComm::connect(&id, rank, 4, T).unwrap();
                check_rounds(&h, 100);
            });
        }
    });
    // The name is free again: a second group with the same id can meet.
    std::thread::scope(|s| {
        for rank in 0..2 {
            s.spawn(move || HostComm::connect(&id, rank, 2, T).unwrap().barrier("again").unwrap());
        }
    });
}

#[test]
fn socket_world_of_one() {
    let h = HostComm::connect(&Id::new().unwrap(), 0, 1, T).unwrap();
    check_rounds(&h, 3);
}

#[test]
fn socket_rendezvous_timeouts_name_the_absent_rank() {
    let id = Id::new().unwrap();
    let t = Duration::from_millis(300);
    let start = Instant::now();
    let e = HostComm::connect(&id, 0, 3, t).unwrap_err();
    assert!(matches!(e, Error::Timeout { rank: 0, peer: 1, .. }), "{e}");
    let e = HostComm::connect(&id, 2, 3, t).unwrap_err();
    assert!(matches!(e, Error::Timeout { rank: 2, peer: 0, .. }), "{e}");
    assert!(start.elapsed() < Duration::from_secs(3));
}

#[test]
fn socket_world_size_mismatch_is_named() {
    let id = Id::new().unwrap();
    std::thread::scope(|s| {
        let root = s.spawn(move || HostComm::connect(&id, 0, 2, Duration::from_secs(5)));
        let other = s.spawn(move || HostComm::connect(&id, 1, 3, Duration::from_secs(5)));
        let e = root.join().unwrap().unwrap_err();
        assert!(matches!(e, Error::Mismatch { rank: 0, peer: 1, .. }), "{e}");
        assert!(other.join().unwrap().is_err());
    });
}

#[test]
fn bad_ranks_are_refused() {
    let id = Id::new().unwrap();
    assert!(matches!(HostComm::connect(&id, 2, 2, T), Err(Error::InvalidArgument(_))));
    assert!(matches!(HostComm::connect(&id, 0, 0, T), Err(Error::InvalidArgument(_))));
    assert!(matches!(HostComm::connect(&id, 0, 17, T), Err(Error::InvalidArgument(_))));
    let nccl_like = Id::uninit([0; 128]);
    assert!(matches!(HostComm::connect(&nccl_like, 0, 2, T), Err(Error::InvalidArgument(_))));
}

// ---------------------------------------------------------------- real processes

/// Entry point of the child processes (returns at once in a normal test run).
#[test]
fn child_entry() {
    let Some(role) = role() else { return };
    if role == "torchrun" {
        // Only the variables torchrun sets: every process derives the same name alone.
        let env = purlin_collectives::TorchEnv::from_process().unwrap();
        for seq in 0..3 {
            let h = HostComm::connect(&env.id(seq), env.rank, env.world_size, T).unwrap();
            check_rounds(&h, 20);
        }
        println!("@@TORCHRUN rank {} ok", env.rank);
        return;
    }
    let id = Id::from_hex(&std::env::var("PURLIN_TEST_ID").unwrap()).unwrap();
    let rank: usize = std::env::var("PURLIN_TEST_RANK").unwrap().parse().unwrap();
    let world: usize = std::env::var("PURLIN_TEST_WORLD").unwrap().parse().unwrap();
    let h = HostComm::connect(&id, rank, world, T).unwrap();
    match role.as_str() {
        "rounds" => {
            check_rounds(&h, 100);
            workspace_bookkeeping(&h);
        }
        "victim" => {
            let layout = WorkspaceLayout::new(WorkspaceConfig::default(), world).unwrap();
            let ws = SymmetricWorkspace::establish(&h, &mut FakeIpc::default(), layout).unwrap();
            h.barrier("set-up").unwrap();
            println!("@@READY");
            std::mem::forget(ws);
            std::thread::sleep(Duration::from_secs(60)); // until killed
        }
        "survivor" => {
            let layout = WorkspaceLayout::new(WorkspaceConfig::default(), world).unwrap();
            let mut b = FakeIpc::default();
            let ws = SymmetricWorkspace::establish(&h, &mut b, layout).unwrap();
            h.barrier("set-up").unwrap();
            println!("@@READY");
            let start = Instant::now();
            let e = h.barrier("after the kill").unwrap_err();
            let victim: usize = std::env::var("PURLIN_TEST_VICTIM").unwrap().parse().unwrap();
            assert!(matches!(e, Error::PeerLost { peer, .. } if peer == victim), "{e}");
            assert!(start.elapsed() < Duration::from_secs(10));
            // Teardown does not wait for the dead, unmaps everything and frees.
            let report = ws.release(&h, &mut b);
            assert!(!report.met_peers && report.leaked_bytes == 0 && report.closed == world - 1, "{report:?}");
            assert_eq!(b.events.last().unwrap(), "free");
            println!("@@SURVIVED {e}");
        }
        other => panic!("unknown role {other}"),
    }
}

fn kid(role: &str, id: &Id, rank: usize, world: usize, extra: &[(&str, String)]) -> Kid {
    let mut env = vec![
        (ROLE, role.to_string()),
        ("PURLIN_TEST_ID", id.to_hex()),
        ("PURLIN_TEST_RANK", rank.to_string()),
        ("PURLIN_TEST_WORLD", world.to_string()),
    ];
    env.extend(extra.iter().cloned());
    Kid::spawn("child_entry", false, &env)
}

#[test]
fn socket_ranks_as_separate_processes() {
    if role().is_some() {
        return;
    }
    let id = Id::new().unwrap();
    let kids: Vec<Kid> = (1..3).map(|r| kid("rounds", &id, r, 3, &[])).collect();
    let h = HostComm::connect(&id, 0, 3, T).unwrap();
    check_rounds(&h, 100);
    workspace_bookkeeping(&h);
    for k in kids {
        assert!(k.finish(T), "a child rank failed");
    }
}

#[test]
fn torchrun_processes_meet_on_the_name_derived_from_their_environment() {
    if role().is_some() {
        return;
    }
    // Like torchrun's store, something already listens on MASTER_PORT; Purlin must not care.
    let store = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let port = store.local_addr().unwrap().port().to_string();
    let run_id = format!("ci-{}", std::process::id());
    let kids: Vec<Kid> =
        (0..3).map(|r| Kid::spawn("child_entry", false, &torchrun_env(r, 3, &port, &run_id))).collect();
    for k in kids {
        k.expect_line("@@TORCHRUN", T);
        assert!(k.finish(T));
    }
    drop(store);
}

#[test]
fn killed_process_is_named_by_every_survivor_promptly() {
    if role().is_some() {
        return;
    }
    // Rank 2 is SIGKILLed after set-up; rank 0 (this process) and rank 1 (a child) must both
    // name rank 2, well within 2 s, though their timeout is 20 s.
    let id = Id::new().unwrap();
    let victim_env = [("PURLIN_TEST_VICTIM", "2".to_string())];
    let survivor = kid("survivor", &id, 1, 3, &victim_env);
    let victim = kid("victim", &id, 2, 3, &[]);
    let h = HostComm::connect(&id, 0, 3, T).unwrap();
    let layout = WorkspaceLayout::new(WorkspaceConfig::default(), 3).unwrap();
    let mut b = FakeIpc::default();
    let ws = SymmetricWorkspace::establish(&h, &mut b, layout).unwrap();
    h.barrier("set-up").unwrap();
    victim.expect_line("@@READY", T);
    survivor.expect_line("@@READY", T);
    h.check_peers().unwrap();
    victim.kill();
    let start = Instant::now();
    // Noticed without any collective call (what Comm::async_error reports)...
    let e = loop {
        match h.check_peers() {
            Ok(()) if start.elapsed() < Duration::from_secs(2) => std::thread::sleep(Duration::from_millis(5)),
            Ok(()) => panic!("the death of rank 2 went unnoticed for 2 s"),
            Err(e) => break e,
        }
    };
    assert!(matches!(e, Error::PeerLost { rank: 0, peer: 2, .. }), "{e}");
    // ...and every later call fails at once, naming it.
    let e = h.barrier("after the kill").unwrap_err();
    assert!(matches!(e, Error::PeerLost { rank: 0, peer: 2, .. }), "{e}");
    assert!(start.elapsed() < Duration::from_secs(2), "took {:?}", start.elapsed());
    let report = ws.release(&h, &mut b);
    assert!(!report.met_peers && report.leaked_bytes == 0 && report.closed == 2, "{report:?}");
    assert!(report.error.unwrap().contains("lost rank 2"));
    survivor.expect_line("@@SURVIVED", Duration::from_secs(2));
    assert!(survivor.finish(T));
}

#[test]
fn killed_root_is_named_by_the_others() {
    if role().is_some() {
        return;
    }
    let id = Id::new().unwrap();
    let victim = kid("victim", &id, 0, 2, &[]);
    let h = HostComm::connect(&id, 1, 2, T).unwrap();
    let layout = WorkspaceLayout::new(WorkspaceConfig::default(), 2).unwrap();
    let mut b = FakeIpc::default();
    let ws = SymmetricWorkspace::establish(&h, &mut b, layout).unwrap();
    h.barrier("set-up").unwrap();
    victim.expect_line("@@READY", T);
    victim.kill();
    let start = Instant::now();
    let e = h.barrier("after the kill").unwrap_err();
    assert!(matches!(e, Error::PeerLost { rank: 1, peer: 0, .. }), "{e}");
    assert!(start.elapsed() < Duration::from_secs(2));
    let report = ws.release(&h, &mut b);
    assert!(!report.met_peers && report.leaked_bytes == 0 && report.closed == 1, "{report:?}");
}

// ---------------------------------------------------------------- workspace bookkeeping

/// A stand-in for CUDA IPC that records what happened, in which order, and checks handles.
#[derive(Default)]
struct FakeIpc {
    events: Vec<String>,
    zeroed_and_synced: bool,
    fail_import_from: Option<usize>,
}

struct FakeLocal {
    addr: u64,
}

impl SymmetricBackend for FakeIpc {
    type Local = FakeLocal;
    type Remote = (usize, u64);

    fn alloc_zeroed(&mut self, bytes: usize) -> Result<FakeLocal, Error> {
        self.events.push(format!("alloc {bytes}"));
        self.zeroed_and_synced = true;
        Ok(FakeLocal { addr: 0x1000_0000 * (u64::from(std::process::id() % 1000) + 1) })
    }

    fn export(&mut self, local: &FakeLocal) -> Result<Vec<u8>, Error> {
        assert!(self.zeroed_and_synced, "handle exported before the memory was zeroed");
        self.events.push("export".into());
        Ok(local.addr.to_le_bytes().to_vec())
    }

    fn import(&mut self, peer: usize, handle: &[u8], _bytes: usize) -> Result<(usize, u64), Error> {
        self.events.push(format!("import {peer}"));
        if self.fail_import_from == Some(peer) {
            return Err(Error::Unsupported(format!("cannot map rank {peer}")));
        }
        Ok((peer, u64::from_le_bytes(handle.try_into().unwrap()) + 0x10))
    }

    fn local_addr(&self, local: &FakeLocal) -> u64 {
        local.addr
    }

    fn remote_addr(&self, remote: &(usize, u64)) -> u64 {
        remote.1
    }

    fn close(&mut self, remote: (usize, u64)) {
        self.events.push(format!("close {}", remote.0));
    }

    fn free(&mut self, _local: FakeLocal) {
        self.events.push("free".into());
    }
}

/// Set-up and teardown with the fake backend on every rank of `h`.
fn workspace_bookkeeping(h: &HostComm) {
    let (rank, world) = (h.rank(), h.world());
    let layout = WorkspaceLayout::new(WorkspaceConfig::default(), world).unwrap();
    let mut b = FakeIpc::default();
    let ws = SymmetricWorkspace::establish(h, &mut b, layout.clone()).unwrap();
    // Every rank learnt every other rank's address (through its "mapping", +0x10).
    let addrs = h.all_gather(&ws.addrs()[rank].to_le_bytes(), "own addresses").unwrap();
    for (p, a) in addrs.iter().enumerate() {
        let own = u64::from_le_bytes(a.as_slice().try_into().unwrap());
        let seen = ws.addrs()[p];
        assert_eq!(seen, if p == rank { own } else { own + 0x10 }, "rank {rank} sees rank {p}");
    }
    let report = ws.release(h, &mut b);
    assert!(report.met_peers && report.leaked_bytes == 0 && report.closed == world - 1, "{report:?}");
    let e = &b.events;
    assert_eq!(e[0], format!("alloc {}", layout.total_bytes));
    assert_eq!(e[1], "export");
    assert_eq!(e.iter().filter(|x| x.starts_with("import")).count(), world - 1);
    assert_eq!(e.last().unwrap(), "free", "{e:?}");
    let first_close = e.iter().position(|x| x.starts_with("close")).unwrap_or(e.len());
    assert!(first_close > 2 + world - 2, "{e:?}");

    // A rank with another configuration is named by everyone.
    let config = if rank == world - 1 {
        WorkspaceConfig { staging_bytes: 1 << 20, ..WorkspaceConfig::default() }
    } else {
        WorkspaceConfig::default()
    };
    let mut b = FakeIpc::default();
    let e = SymmetricWorkspace::establish(h, &mut b, WorkspaceLayout::new(config, world).unwrap()).unwrap_err();
    let expected = if rank == world - 1 { 0 } else { world - 1 };
    assert!(matches!(e, Error::Mismatch { peer, .. } if peer == expected), "rank {rank}: {e}");
    assert!(b.events.is_empty(), "nothing allocated on a mismatch: {:?}", b.events);

    // A rank that cannot map a peer fails everyone; everything opened is released.
    let mut b = FakeIpc { fail_import_from: (rank == 0).then_some(world - 1), ..FakeIpc::default() };
    let e = SymmetricWorkspace::establish(h, &mut b, layout).unwrap_err();
    if rank == 0 {
        assert!(matches!(e, Error::Protocol { .. }), "{e}");
    } else {
        assert!(matches!(e, Error::PeerFailed { peer: 0, .. }), "rank {rank}: {e}");
    }
    assert_eq!(b.events.last().unwrap(), "free", "{:?}", b.events);
    let opened = b.events.iter().filter(|x| x.starts_with("import")).count();
    let closed = b.events.iter().filter(|x| x.starts_with("close")).count();
    assert_eq!(opened - usize::from(rank == 0), closed, "{:?}", b.events);
}

#[test]
fn workspace_bookkeeping_in_threads() {
    let members = HostComm::threads(3, T);
    std::thread::scope(|s| {
        for h in &members {
            s.spawn(move || workspace_bookkeeping(h));
        }
    });
}

#[test]
fn host_workspace_in_threads_is_symmetric() {
    let members = HostComm::threads(3, T);
    let addrs: Vec<Vec<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = members
            .iter()
            .map(|h| {
                s.spawn(move || {
                    let mut b = HostBackend;
                    let layout = WorkspaceLayout::new(WorkspaceConfig::default(), 3).unwrap();
                    let ws = SymmetricWorkspace::establish(h, &mut b, layout).unwrap();
                    let addrs = ws.addrs().to_vec();
                    assert!(ws.release(h, &mut b).met_peers);
                    addrs
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for a in &addrs {
        assert_eq!(a, &addrs[0], "every rank sees the same addresses");
    }
}

#[test]
fn teardown_after_a_lost_peer_frees_and_after_a_timeout_leaks() {
    // Lost: the peer's host member is dropped; our memory may be freed.
    let mut members = HostComm::threads(2, Duration::from_millis(300));
    let layout = WorkspaceLayout::new(WorkspaceConfig::default(), 2).unwrap();
    let (h1, h0) = (members.pop().unwrap(), members.pop().unwrap());
    let (ws0, mut b0, ws1, b1) = std::thread::scope(|s| {
        let l = layout.clone();
        let t = s.spawn(move || {
            let mut b = FakeIpc::default();
            (SymmetricWorkspace::establish(&h1, &mut b, l).unwrap(), b, h1)
        });
        let mut b0 = FakeIpc::default();
        let ws0 = SymmetricWorkspace::establish(&h0, &mut b0, layout.clone()).unwrap();
        let (ws1, b1, h1) = t.join().unwrap();
        drop(h1);
        (ws0, b0, ws1, b1)
    });
    let r = ws0.release(&h0, &mut b0);
    assert!(!r.met_peers && r.leaked_bytes == 0 && r.closed == 1, "{r:?}");
    assert!(r.error.unwrap().contains("lost rank 1"));
    assert_eq!(b0.events.last().unwrap(), "free");
    drop((ws1, b1));

    // Timeout: the peer is alive but does not come; our memory stays allocated.
    let members = HostComm::threads(2, Duration::from_millis(300));
    let (ws, mut b) = std::thread::scope(|s| {
        let l = layout.clone();
        let other = &members[1];
        let t = s.spawn(move || {
            let mut b = FakeIpc::default();
            let ws = SymmetricWorkspace::establish(other, &mut b, l).unwrap();
            std::mem::forget(ws); // never tears down
        });
        let mut b = FakeIpc::default();
        let ws = SymmetricWorkspace::establish(&members[0], &mut b, layout).unwrap();
        t.join().unwrap();
        (ws, b)
    });
    let r = ws.release(&members[0], &mut b);
    assert!(!r.met_peers && r.leaked_bytes > 0 && r.closed == 1, "{r:?}");
    assert!(!b.events.contains(&"free".to_string()), "{:?}", b.events);
}

#[test]
fn all_min_over_threads_and_comm_is_send_and_sync() {
    let members = HostComm::threads(3, T);
    std::thread::scope(|s| {
        for h in &members {
            s.spawn(move || assert_eq!(h.all_min(100 - h.rank() as u64 * 7, "bounds").unwrap(), 86));
        }
    });
    fn send_sync<T: Send + Sync>() {}
    send_sync::<purlin_collectives::Comm>();
    send_sync::<HostComm>();
}

#[test]
fn from_env_outside_torchrun_is_a_typed_error() {
    if std::env::var_os("RANK").is_some() {
        return;
    }
    let e = purlin_collectives::Comm::from_env().unwrap_err();
    assert!(matches!(e, Error::Env { var: "RANK", .. }), "{e}");
}
