//! The host communicator: ranks exchanging small messages with bounded waits, either as
//! threads of one process ([`HostComm::threads`]) or as processes meeting on a Unix-domain
//! socket in the abstract namespace ([`HostComm::connect`]). Set-up uses it to agree on
//! configuration, exchange workspace handles and meet at barriers; the host executor uses
//! it for its own synchronisation.
//!
//! Every wait is bounded by the communicator's timeout. A failure names the peer: a closed
//! connection (the peer's process died) is [`Error::PeerLost`], an expired wait is
//! [`Error::Timeout`]. After a failure the communicator is broken and every later call
//! reports that failure again instead of waiting.
//!
//! The socket model is a star around rank 0: rank 0 listens on `\0purlin-<session>` (from
//! the [`Id`]), the others connect; a collective is "everyone sends rank 0 a frame, rank 0
//! answers everyone with all frames". A failure seen by rank 0 is forwarded to the others
//! as an abort frame naming the failed rank, so every survivor names the same peer.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub mod id;

pub use id::{Id, TorchEnv};

use crate::error::Error;

/// Default bound on every host-side wait (torch's NCCL default is 600 s, docs/design.md asks ≥ 300 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// How much longer a non-root rank waits for rank 0 than rank 0 waits for the others, so
/// rank 0's verdict (naming the real culprit) arrives first.
const ROOT_MARGIN: Duration = Duration::from_secs(1);
const MAX_FRAME: usize = 1 << 30;

const HELLO: u8 = 1;
const WELCOME: u8 = 2;
const DATA: u8 = 3;
const ABORT: u8 = 4;

/// A recorded failure, replayed by every later call.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Failure {
    Lost { peer: usize, during: String },
    Timeout { peer: usize, waited: Duration, during: String },
    Other(String),
}

impl Failure {
    fn to_error(&self, rank: usize) -> Error {
        match self {
            Failure::Lost { peer, during } if *peer != rank => {
                Error::PeerLost { rank, peer: *peer, during: during.clone() }
            }
            Failure::Timeout { peer, waited, during } if *peer != rank => {
                Error::Timeout { rank, peer: *peer, waited: *waited, during: during.clone() }
            }
            Failure::Lost { during, .. } | Failure::Timeout { during, .. } => {
                Error::Poisoned(format!("the other ranks gave up on rank {rank} ({during})"))
            }
            Failure::Other(what) => Error::Poisoned(what.clone()),
        }
    }

    fn encode(&self) -> Vec<u8> {
        let (kind, peer, waited, text) = match self {
            Failure::Lost { peer, during } => (0u8, *peer, Duration::ZERO, during.as_str()),
            Failure::Timeout { peer, waited, during } => (1, *peer, *waited, during.as_str()),
            Failure::Other(what) => (2, 0, Duration::ZERO, what.as_str()),
        };
        let mut out = vec![kind];
        out.extend_from_slice(&(peer as u32).to_le_bytes());
        out.extend_from_slice(&(waited.as_millis() as u64).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Failure {
        if bytes.len() < 13 {
            return Failure::Other("malformed abort from rank 0".into());
        }
        let peer = u32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
        let mut ms = [0u8; 8];
        ms.copy_from_slice(&bytes[5..13]);
        let waited = Duration::from_millis(u64::from_le_bytes(ms));
        let during = String::from_utf8_lossy(&bytes[13..]).into_owned();
        match bytes[0] {
            0 => Failure::Lost { peer, during },
            1 => Failure::Timeout { peer, waited, during },
            _ => Failure::Other(during),
        }
    }
}

/// One rank of a host communicator.
#[derive(Debug)]
pub struct HostComm {
    rank: usize,
    world: usize,
    timeout: Duration,
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    Threads(ThreadMember),
    Socket(Mutex<SocketMember>),
}

impl HostComm {
    /// `world` members of one in-process group, for `world` threads (member `r` is rank `r`).
    pub fn threads(world: usize, timeout: Duration) -> Vec<HostComm> {
        let shared = Arc::new(ThreadShared {
            world,
            state: Mutex::new(ThreadState {
                op: 0,
                slots: vec![None; world],
                count: 0,
                last: None,
                left: vec![false; world],
                failed: None,
            }),
            cv: Condvar::new(),
        });
        (0..world)
            .map(|rank| HostComm {
                rank,
                world,
                timeout,
                inner: Inner::Threads(ThreadMember { shared: shared.clone(), rank, next_op: Mutex::new(0) }),
            })
            .collect()
    }

    /// Joins the group named by `id` as `rank` of `world`: rank 0 listens on the abstract
    /// socket `\0purlin-<session>`, the others connect (retrying until rank 0 is there).
    /// Returns once all `world` ranks have met, or fails within `timeout` naming the rank
    /// that did not come.
    pub fn connect(id: &Id, rank: usize, world: usize, timeout: Duration) -> Result<HostComm, Error> {
        id.check()?;
        check_rank(rank, world)?;
        let member = if world == 1 {
            SocketMember {
                root: None,
                peer_conn: None,
                events: channel().1,
                pending: VecDeque::new(),
                op: 0,
                failed: None,
            }
        } else if rank == 0 {
            SocketMember::root(id, world, timeout)?
        } else {
            SocketMember::leaf(id, rank, world, timeout)?
        };
        Ok(HostComm { rank, world, timeout, inner: Inner::Socket(Mutex::new(member)) })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The bound on each wait.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Changes the bound on later waits.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Every rank contributes `data`; every rank gets all contributions in rank order.
    /// `during` names the step in errors.
    pub fn all_gather(&self, data: &[u8], during: &str) -> Result<Vec<Vec<u8>>, Error> {
        match &self.inner {
            Inner::Threads(m) => m.all_gather(data, self.timeout, during),
            Inner::Socket(m) => lock(m).all_gather(self.rank, self.world, data, self.timeout, during),
        }
    }

    /// Waits until every rank has arrived.
    pub fn barrier(&self, during: &str) -> Result<(), Error> {
        self.all_gather(&[], during).map(drop)
    }

    /// Rank `root`'s `data` on every rank (other ranks' `data` is ignored).
    pub fn broadcast(&self, root: usize, data: &[u8], during: &str) -> Result<Vec<u8>, Error> {
        check_rank(root, self.world)?;
        let mine = if self.rank == root { data } else { &[] };
        let mut all = self.all_gather(mine, during)?;
        Ok(std::mem::take(&mut all[root]))
    }

    /// The minimum of every rank's `value` (e.g. co-residency bounds at set-up).
    pub fn all_min(&self, value: u64, during: &str) -> Result<u64, Error> {
        let all = self.all_gather(&value.to_le_bytes(), during)?;
        let mut min = u64::MAX;
        for (peer, b) in all.iter().enumerate() {
            let bytes: [u8; 8] = b
                .as_slice()
                .try_into()
                .map_err(|_| Error::Protocol { peer: Some(peer), what: format!("{during}: {} bytes", b.len()) })?;
            min = min.min(u64::from_le_bytes(bytes));
        }
        Ok(min)
    }

    /// Without waiting: fails if an earlier call failed or a peer's connection has closed
    /// since (its process died), naming that peer; for threads, if a member was dropped.
    pub fn check_peers(&self) -> Result<(), Error> {
        match &self.inner {
            Inner::Threads(m) => {
                let st = lock(&m.shared.state);
                if let Some(f) = &st.failed {
                    return Err(f.to_error(self.rank));
                }
                match st.left.iter().position(|&l| l) {
                    Some(peer) if peer != self.rank => {
                        Err(Error::PeerLost { rank: self.rank, peer, during: "checking the peers".into() })
                    }
                    _ => Ok(()),
                }
            }
            Inner::Socket(m) => lock(m).check_peers(self.rank),
        }
    }

    /// Whether an earlier failure broke this communicator.
    pub fn is_broken(&self) -> bool {
        match &self.inner {
            Inner::Threads(m) => lock(&m.shared.state).failed.is_some(),
            Inner::Socket(m) => lock(m).failed.is_some(),
        }
    }

    /// Marks the communicator broken (e.g. after a device timeout naming `peer`), so later
    /// host waits fail at once instead of waiting for a dead peer. Local only.
    pub fn poison(&self, peer: usize, during: &str) {
        let f = Failure::Timeout { peer, waited: Duration::ZERO, during: during.into() };
        match &self.inner {
            Inner::Threads(m) => {
                let mut st = lock(&m.shared.state);
                st.failed.get_or_insert(f);
                m.shared.cv.notify_all();
            }
            Inner::Socket(m) => {
                lock(m).failed.get_or_insert(f);
            }
        }
    }
}

fn check_rank(rank: usize, world: usize) -> Result<(), Error> {
    if world == 0 || world > purlin_topo::MAX_WORLD {
        return Err(Error::InvalidArgument(format!("world size {world} is outside 1..={}", purlin_topo::MAX_WORLD)));
    }
    if rank >= world {
        return Err(Error::InvalidArgument(format!("rank {rank} is not below world size {world}")));
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave the state half-updated in a way that
    // matters more than the panic itself; keep going.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// ---------------------------------------------------------------- threads of one process

#[derive(Debug)]
struct ThreadShared {
    world: usize,
    state: Mutex<ThreadState>,
    cv: Condvar,
}

#[derive(Debug)]
struct ThreadState {
    /// The collective being gathered.
    op: u64,
    slots: Vec<Option<Vec<u8>>>,
    count: usize,
    /// The result of the last completed collective; it stays until every rank has read it
    /// because the next one cannot complete without every rank.
    last: Option<(u64, Arc<Vec<Vec<u8>>>)>,
    left: Vec<bool>,
    failed: Option<Failure>,
}

#[derive(Debug)]
struct ThreadMember {
    shared: Arc<ThreadShared>,
    rank: usize,
    next_op: Mutex<u64>,
}

impl ThreadMember {
    fn all_gather(&self, data: &[u8], timeout: Duration, during: &str) -> Result<Vec<Vec<u8>>, Error> {
        let mut next = lock(&self.next_op);
        let my_op = *next;
        let start = Instant::now();
        let mut st = lock(&self.shared.state);
        if let Some(f) = &st.failed {
            return Err(f.to_error(self.rank));
        }
        debug_assert_eq!(st.op, my_op);
        st.slots[self.rank] = Some(data.to_vec());
        st.count += 1;
        if st.count == self.shared.world {
            let all: Vec<Vec<u8>> = st.slots.iter_mut().map(|s| s.take().unwrap_or_default()).collect();
            let all = Arc::new(all);
            st.last = Some((my_op, all.clone()));
            st.count = 0;
            st.op += 1;
            *next += 1;
            self.shared.cv.notify_all();
            return Ok((*all).clone());
        }
        loop {
            if let Some((op, all)) = &st.last {
                if *op == my_op {
                    *next += 1;
                    return Ok((**all).clone());
                }
            }
            if let Some(f) = &st.failed {
                return Err(f.to_error(self.rank));
            }
            let missing = (0..self.shared.world).find(|&k| st.slots[k].is_none()).unwrap_or(0);
            if let Some(peer) = (0..self.shared.world).find(|&k| st.left[k] && st.slots[k].is_none()) {
                let f = Failure::Lost { peer, during: during.into() };
                st.failed = Some(f.clone());
                self.shared.cv.notify_all();
                return Err(f.to_error(self.rank));
            }
            let waited = start.elapsed();
            if waited >= timeout {
                let f = Failure::Timeout { peer: missing, waited, during: during.into() };
                st.failed = Some(f.clone());
                self.shared.cv.notify_all();
                return Err(f.to_error(self.rank));
            }
            st = self.shared.cv.wait_timeout(st, timeout - waited).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

impl Drop for ThreadMember {
    fn drop(&mut self) {
        let mut st = lock(&self.shared.state);
        st.left[self.rank] = true;
        self.shared.cv.notify_all();
    }
}

// ---------------------------------------------------------------- processes over a socket

#[derive(Debug)]
struct Frame {
    kind: u8,
    seq: u64,
    payload: Vec<u8>,
}

fn write_frame(stream: &mut UnixStream, kind: u8, seq: u64, payload: &[u8]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(13 + payload.len());
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(&seq.to_le_bytes());
    buf.push(kind);
    buf.extend_from_slice(payload);
    stream.write_all(&buf)
}

fn read_frame(stream: &mut UnixStream) -> std::io::Result<Frame> {
    let mut head = [0u8; 13];
    stream.read_exact(&mut head)?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(ErrorKind::InvalidData, format!("frame of {len} bytes")));
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&head[4..12]);
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload)?;
    Ok(Frame { kind: head[12], seq: u64::from_le_bytes(seq), payload })
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

fn encode_all(all: &[Vec<u8>]) -> Vec<u8> {
    let mut out = (all.len() as u32).to_le_bytes().to_vec();
    for a in all {
        out.extend_from_slice(&(a.len() as u32).to_le_bytes());
        out.extend_from_slice(a);
    }
    out
}

fn decode_all(bytes: &[u8], world: usize) -> Option<Vec<Vec<u8>>> {
    let mut at = 0usize;
    let word = |at: &mut usize| -> Option<usize> {
        let w = bytes.get(*at..*at + 4)?;
        *at += 4;
        Some(u32::from_le_bytes([w[0], w[1], w[2], w[3]]) as usize)
    };
    let n = word(&mut at)?;
    if n != world {
        return None;
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let len = word(&mut at)?;
        out.push(bytes.get(at..at + len)?.to_vec());
        at += len;
    }
    (at == bytes.len()).then_some(out)
}

/// What a reader thread reports: a frame or the end of the connection.
type Event = (usize, Result<Frame, std::io::Error>);

#[derive(Debug)]
struct Conn {
    peer: usize,
    stream: UnixStream,
    reader: Option<JoinHandle<()>>,
}

impl Conn {
    /// Starts a thread that forwards every frame from `peer` to `events` and ends with the
    /// connection (the socket is shut down in Drop, which ends it promptly).
    fn start(peer: usize, stream: UnixStream, events: Sender<Event>) -> Result<Conn, Error> {
        let mut reading = stream.try_clone().map_err(|source| Error::Io { what: "clone socket".into(), source })?;
        reading.set_read_timeout(None).map_err(|source| Error::Io { what: "set_read_timeout".into(), source })?;
        let reader = std::thread::Builder::new()
            .name(format!("purlin-rdv-{peer}"))
            .spawn(move || {
                loop {
                    let r = read_frame(&mut reading);
                    let end = r.is_err();
                    if events.send((peer, r)).is_err() || end {
                        break;
                    }
                }
            })
            .map_err(|source| Error::Io { what: "spawn reader thread".into(), source })?;
        Ok(Conn { peer, stream, reader: Some(reader) })
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

#[derive(Debug)]
struct SocketMember {
    /// Rank 0: connections to ranks 1.. (index k-1 is rank k).
    root: Option<Vec<Conn>>,
    /// Other ranks: the connection to rank 0.
    peer_conn: Option<Conn>,
    events: Receiver<Event>,
    /// Frames that arrived while [`HostComm::check_peers`] looked for closed connections.
    pending: VecDeque<Event>,
    op: u64,
    failed: Option<Failure>,
}

fn hello_payload(id: &Id, rank: usize, world: usize) -> Vec<u8> {
    let mut p = id.session().to_vec();
    p.extend_from_slice(&(rank as u32).to_le_bytes());
    p.extend_from_slice(&(world as u32).to_le_bytes());
    p.extend_from_slice(&std::process::id().to_le_bytes());
    p
}

fn abstract_addr(id: &Id) -> Result<SocketAddr, Error> {
    SocketAddr::from_abstract_name(id.socket_name().as_bytes())
        .map_err(|source| Error::Io { what: "abstract socket name".into(), source })
}

impl SocketMember {
    fn root(id: &Id, world: usize, timeout: Duration) -> Result<SocketMember, Error> {
        let start = Instant::now();
        let listener = UnixListener::bind_addr(&abstract_addr(id)?).map_err(|source| {
            if source.kind() == ErrorKind::AddrInUse {
                Error::Protocol {
                    peer: None,
                    what: format!(
                        "rendezvous name {} is in use: is rank 0 started twice with one Id?",
                        id.socket_name()
                    ),
                }
            } else {
                Error::Io { what: format!("bind {}", id.socket_name()), source }
            }
        })?;
        listener.set_nonblocking(true).map_err(|source| Error::Io { what: "set_nonblocking".into(), source })?;
        let mut streams: Vec<Option<UnixStream>> = (1..world).map(|_| None).collect();
        let during = "rendezvous: waiting for ranks to connect";
        while streams.iter().any(Option::is_none) {
            let waited = start.elapsed();
            if waited >= timeout {
                let missing = streams.iter().position(Option::is_none).unwrap_or(0) + 1;
                return Err(Error::Timeout { rank: 0, peer: missing, waited, during: during.into() });
            }
            let mut stream = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                }
                Err(source) => return Err(Error::Io { what: "accept".into(), source }),
            };
            let io = |what: &str| {
                let what = what.to_string();
                move |source| Error::Io { what, source }
            };
            stream.set_nonblocking(false).map_err(io("set_nonblocking"))?;
            let left = timeout.saturating_sub(start.elapsed()).max(Duration::from_millis(10));
            stream.set_read_timeout(Some(left.min(Duration::from_secs(10)))).map_err(io("set_read_timeout"))?;
            stream.set_write_timeout(Some(timeout.max(Duration::from_millis(10)))).map_err(io("set_write_timeout"))?;
            // A connection that does not say hello in time, or belongs to another session,
            // is dropped; the rendezvous goes on.
            let Ok(hello) = read_frame(&mut stream) else { continue };
            if hello.kind != HELLO || hello.payload.len() != 28 || hello.payload[..16] != id.session() {
                continue;
            }
            let word = |o: usize| {
                u32::from_le_bytes([hello.payload[o], hello.payload[o + 1], hello.payload[o + 2], hello.payload[o + 3]])
                    as usize
            };
            let (their_rank, their_world) = (word(16), word(20));
            if their_world != world {
                return Err(Error::Mismatch {
                    rank: 0,
                    peer: their_rank,
                    what: format!("world size: rank 0 has {world}, rank {their_rank} has {their_world}"),
                });
            }
            if their_rank == 0 || their_rank >= world {
                return Err(Error::Protocol {
                    peer: Some(their_rank),
                    what: format!("rank {their_rank} in a world of {world}"),
                });
            }
            if streams[their_rank - 1].is_some() {
                return Err(Error::Protocol { peer: Some(their_rank), what: "two processes claim this rank".into() });
            }
            streams[their_rank - 1] = Some(stream);
        }
        drop(listener); // the name is free again from here on
        let (tx, rx) = channel();
        let mut conns = Vec::with_capacity(world - 1);
        for (k, s) in streams.into_iter().enumerate() {
            let Some(mut s) = s else { continue };
            write_frame(&mut s, WELCOME, 0, &[]).map_err(|_| Error::PeerLost {
                rank: 0,
                peer: k + 1,
                during: "rendezvous: welcome".into(),
            })?;
            conns.push(Conn::start(k + 1, s, tx.clone())?);
        }
        Ok(SocketMember {
            root: Some(conns),
            peer_conn: None,
            events: rx,
            pending: VecDeque::new(),
            op: 0,
            failed: None,
        })
    }

    fn leaf(id: &Id, rank: usize, world: usize, timeout: Duration) -> Result<SocketMember, Error> {
        let start = Instant::now();
        let addr = abstract_addr(id)?;
        let during = "rendezvous: connecting to rank 0";
        let mut stream = loop {
            match UnixStream::connect_addr(&addr) {
                Ok(s) => break s,
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::ConnectionRefused | ErrorKind::NotFound | ErrorKind::Interrupted
                    ) =>
                {
                    let waited = start.elapsed();
                    if waited >= timeout {
                        return Err(Error::Timeout { rank, peer: 0, waited, during: during.into() });
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(source) => return Err(Error::Io { what: format!("connect {}", id.socket_name()), source }),
            }
        };
        let io = |what: &'static str| move |source| Error::Io { what: what.into(), source };
        stream.set_write_timeout(Some(timeout.max(Duration::from_millis(10)))).map_err(io("set_write_timeout"))?;
        write_frame(&mut stream, HELLO, 0, &hello_payload(id, rank, world)).map_err(|_| Error::PeerLost {
            rank,
            peer: 0,
            during: "rendezvous: hello".into(),
        })?;
        let left = (timeout + ROOT_MARGIN).saturating_sub(start.elapsed()).max(Duration::from_millis(10));
        stream.set_read_timeout(Some(left)).map_err(io("set_read_timeout"))?;
        let welcome = read_frame(&mut stream).map_err(|e| {
            if is_timeout(&e) {
                Error::Timeout {
                    rank,
                    peer: 0,
                    waited: start.elapsed(),
                    during: "rendezvous: waiting for the others".into(),
                }
            } else {
                Error::PeerLost { rank, peer: 0, during: "rendezvous: waiting for welcome".into() }
            }
        })?;
        if welcome.kind != WELCOME {
            return Err(Error::Protocol {
                peer: Some(0),
                what: format!("expected welcome, got frame kind {}", welcome.kind),
            });
        }
        let (tx, rx) = channel();
        let conn = Conn::start(0, stream, tx)?;
        Ok(SocketMember {
            root: None,
            peer_conn: Some(conn),
            events: rx,
            pending: VecDeque::new(),
            op: 0,
            failed: None,
        })
    }

    fn next_event(&mut self, timeout: Duration) -> Result<Event, RecvTimeoutError> {
        match self.pending.pop_front() {
            Some(e) => Ok(e),
            None => self.events.recv_timeout(timeout),
        }
    }

    /// Looks, without waiting, for a connection that closed since the last call.
    fn check_peers(&mut self, rank: usize) -> Result<(), Error> {
        if let Some(f) = &self.failed {
            return Err(f.to_error(rank));
        }
        while let Ok(event) = self.events.try_recv() {
            match event {
                (peer, Err(_)) => {
                    let f = Failure::Lost { peer, during: "checking the peers".into() };
                    return Err(self.fail(rank, f));
                }
                (_, Ok(f)) if f.kind == ABORT => return Err(self.fail(rank, Failure::decode(&f.payload))),
                frame => self.pending.push_back(frame),
            }
        }
        if let Some((peer, _)) = self.pending.iter().find(|(_, r)| r.is_err()) {
            let peer = *peer;
            return Err(self.fail(rank, Failure::Lost { peer, during: "checking the peers".into() }));
        }
        Ok(())
    }

    fn fail(&mut self, rank: usize, f: Failure) -> Error {
        // Rank 0 tells every survivor which rank failed, so they all name the same peer.
        if let Some(conns) = &mut self.root {
            let payload = f.encode();
            for c in conns.iter_mut() {
                if !matches!(&f, Failure::Lost { peer, .. } if *peer == c.peer) {
                    let _ = write_frame(&mut c.stream, ABORT, self.op, &payload);
                }
            }
        }
        self.failed = Some(f.clone());
        f.to_error(rank)
    }

    fn all_gather(
        &mut self,
        rank: usize,
        world: usize,
        data: &[u8],
        timeout: Duration,
        during: &str,
    ) -> Result<Vec<Vec<u8>>, Error> {
        if let Some(f) = &self.failed {
            return Err(f.to_error(rank));
        }
        let seq = self.op + 1;
        let start = Instant::now();
        if world == 1 {
            self.op = seq;
            return Ok(vec![data.to_vec()]);
        }
        if self.root.is_some() {
            let mut got: Vec<Option<Vec<u8>>> = vec![None; world];
            got[0] = Some(data.to_vec());
            while got.iter().any(Option::is_none) {
                let waited = start.elapsed();
                let missing = got.iter().position(Option::is_none).unwrap_or(0);
                let event = match self.next_event(timeout.saturating_sub(waited)) {
                    Ok(e) => e,
                    Err(RecvTimeoutError::Timeout) => {
                        return Err(self.fail(rank, Failure::Timeout { peer: missing, waited, during: during.into() }));
                    }
                    Err(RecvTimeoutError::Disconnected) => {
                        return Err(self.fail(rank, Failure::Lost { peer: missing, during: during.into() }));
                    }
                };
                match event {
                    (peer, Ok(f)) if f.kind == DATA && f.seq == seq && got[peer].is_none() => {
                        got[peer] = Some(f.payload)
                    }
                    (peer, Ok(f)) => {
                        let what = format!("unexpected frame kind {} seq {} (expected data seq {seq})", f.kind, f.seq);
                        return Err(self.fail(rank, Failure::Other(format!("rank {peer}: {what}"))));
                    }
                    (peer, Err(_)) => return Err(self.fail(rank, Failure::Lost { peer, during: during.into() })),
                }
            }
            let all: Vec<Vec<u8>> = got.into_iter().map(Option::unwrap_or_default).collect();
            let payload = encode_all(&all);
            let mut lost = None;
            if let Some(conns) = &mut self.root {
                for c in conns.iter_mut() {
                    if write_frame(&mut c.stream, DATA, seq, &payload).is_err() {
                        lost = Some(c.peer);
                        break;
                    }
                }
            }
            if let Some(peer) = lost {
                return Err(self.fail(rank, Failure::Lost { peer, during: during.into() }));
            }
            self.op = seq;
            return Ok(all);
        }
        let Some(conn) = &mut self.peer_conn else {
            return Err(Error::Poisoned("host communicator has no connection".into()));
        };
        if write_frame(&mut conn.stream, DATA, seq, data).is_err() {
            return Err(self.fail(rank, Failure::Lost { peer: 0, during: during.into() }));
        }
        let limit = timeout + ROOT_MARGIN;
        match self.next_event(limit.saturating_sub(start.elapsed())) {
            Ok((_, Ok(f))) if f.kind == DATA && f.seq == seq => match decode_all(&f.payload, world) {
                Some(all) => {
                    self.op = seq;
                    Ok(all)
                }
                None => Err(self.fail(rank, Failure::Other("malformed gather result from rank 0".into()))),
            },
            Ok((_, Ok(f))) if f.kind == ABORT => Err(self.fail(rank, Failure::decode(&f.payload))),
            Ok((_, Ok(f))) => {
                let what = format!("unexpected frame kind {} seq {} from rank 0 (expected seq {seq})", f.kind, f.seq);
                Err(self.fail(rank, Failure::Other(what)))
            }
            Ok((_, Err(_))) | Err(RecvTimeoutError::Disconnected) => {
                Err(self.fail(rank, Failure::Lost { peer: 0, during: during.into() }))
            }
            Err(RecvTimeoutError::Timeout) => {
                Err(self.fail(rank, Failure::Timeout { peer: 0, waited: start.elapsed(), during: during.into() }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_results_round_trip() {
        let all = vec![vec![1, 2, 3], vec![], vec![9]];
        assert_eq!(decode_all(&encode_all(&all), 3), Some(all.clone()));
        assert_eq!(decode_all(&encode_all(&all), 2), None);
        assert_eq!(decode_all(&encode_all(&all)[..7], 3), None);
    }

    #[test]
    fn failures_round_trip() {
        for f in [
            Failure::Lost { peer: 3, during: "x".into() },
            Failure::Timeout { peer: 1, waited: Duration::from_millis(1500), during: "y".into() },
            Failure::Other("z".into()),
        ] {
            assert_eq!(Failure::decode(&f.encode()), f);
        }
    }
}
