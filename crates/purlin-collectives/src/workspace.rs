//! The symmetric workspace: one allocation per rank with the same layout on every rank,
//! which every peer can reach. This module holds the layout (sizes configurable and
//! reported) and the backend-independent set-up and teardown protocol; the backends are
//! CUDA IPC between processes and direct peer access inside one process (`device.rs`), and
//! host memory for threads ([`HostBackend`]).
//!
//! Set-up, on every rank, in this order ([`SymmetricWorkspace::establish`]):
//! 1. agree on the layout (every rank's configuration must match; else a [`Error::Mismatch`]
//!    naming the rank);
//! 2. allocate, **zero, and wait for the zeroing to complete** — only then
//! 3. publish the handle (all-gather), so no peer can signal into memory that a late memset
//!    would erase;
//! 4. open every peer's handle, and agree that every rank succeeded (one failed rank fails
//!    all, naming it, and everyone releases what it opened).
//!
//! Teardown ([`SymmetricWorkspace::release`]), after the caller synchronised its device
//! work: meet the peers (nobody's kernels run any more), close the peers' mappings, meet
//! again (nobody maps my memory any more), free my memory. If a peer is lost, its memory is
//! never touched again; if a peer timed out (it may still be alive and mapping my memory),
//! my allocation is leaked rather than freed under it, and the report says so.

use std::fmt::Write as _;

use crate::bootstrap::HostComm;
use crate::error::Error;

/// Alignment of every region (a page: keeps regions apart for the TLB and bulk copies).
pub const REGION_ALIGN: usize = 4096;
/// Flag words past the protocol's `flag_words`, one per source rank: the shard-landed words
/// of fused copy collectives (`purlin_snac::Landed`), which no other plan touches.
pub const LANDED_WORDS: usize = purlin_snac::MAX_WORLD;

/// Bytes per flag word slot (one flag per 128-byte line, no false sharing).
pub const FLAG_STRIDE: usize = 128;
/// Flag-word slots per peer for set-up checks such as the ping-pong (each use takes a fresh
/// slot, since flags are never reset).
pub const FLAG_SLOTS: usize = 16;

/// Words of the call-check region (`kCallWords` in kernels/snac/exec.cuh): word `p` holds
/// rank `p`'s word for its latest call (`number << 32 | call digest`); the rest is spare.
pub const CALL_WORDS: usize = 32;

/// Physical bytes of the packet window per payload byte: both packet formats (4 + 4 and
/// 8 + 8 bytes) carry as many flag bytes as payload bytes.
pub const WINDOW_PHYSICAL_FACTOR: usize = 2;

/// Sizes of the symmetric workspace, in the terms of SNAC's `Resources` (the plan contract
/// in purlin-snac): every plan run on this communicator must fit. Every rank must use the
/// same values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkspaceConfig {
    /// Staging bytes (two sense halves), reachable by every peer (throughput regime).
    pub staging_bytes: usize,
    /// Packet-window payload bytes (two sense halves; the region is
    /// [`WINDOW_PHYSICAL_FACTOR`] times larger), written by peers (latency regime).
    pub window_bytes: usize,
    /// 64-bit flag words (signals and drains, written by peers into the waiter's words).
    pub flag_words: usize,
    /// 64-bit arrival counters (local).
    pub counter_words: usize,
    /// 64-bit per-block epochs: also the most blocks any kernel of this communicator may use,
    /// whatever the co-residency bound.
    pub epoch_words: usize,
}

impl Default for WorkspaceConfig {
    /// 64 MiB staging (two sense halves of one 16 MiB chunk × 2 slots at world 2; larger
    /// worlds get smaller chunks) and 4 MiB of window payload (a sense half holds a world-2
    /// latency call of up to 2 MiB from the peer, as a skewed 2 MiB V-form call may send; the
    /// latency regime serves calls up to 2 MiB per rank, measured faster than staging there
    /// on 2×H200, round 53), with room for every plan up to world 16: about 72 MiB per rank.
    fn default() -> Self {
        Self {
            staging_bytes: 64 << 20,
            window_bytes: 4 << 20,
            flag_words: 4096,
            counter_words: 4096,
            epoch_words: 1024,
        }
    }
}

impl WorkspaceConfig {
    /// The defaults, overridden by `PURLIN_STAGING_BYTES`, `PURLIN_WINDOW_BYTES`,
    /// `PURLIN_FLAG_WORDS`, `PURLIN_COUNTER_WORDS` and `PURLIN_EPOCH_WORDS` where set.
    pub fn from_env() -> Result<Self, Error> {
        let mut c = Self::default();
        for (var, field) in [
            ("PURLIN_STAGING_BYTES", &mut c.staging_bytes),
            ("PURLIN_WINDOW_BYTES", &mut c.window_bytes),
            ("PURLIN_FLAG_WORDS", &mut c.flag_words),
            ("PURLIN_COUNTER_WORDS", &mut c.counter_words),
            ("PURLIN_EPOCH_WORDS", &mut c.epoch_words),
        ] {
            if let Ok(text) = std::env::var(var) {
                *field = text.trim().parse().map_err(|e| Error::Env { var, problem: format!("{text:?}: {e}") })?;
            }
        }
        Ok(c)
    }

    fn check(&self) -> Result<(), Error> {
        let bad = |what: String| Err(Error::InvalidArgument(format!("workspace config: {what}")));
        if self.staging_bytes == 0 || self.staging_bytes % 512 != 0 {
            return bad(format!("staging_bytes {} must be a positive multiple of 512", self.staging_bytes));
        }
        if self.window_bytes == 0 || self.window_bytes % 512 != 0 {
            return bad(format!("window_bytes {} must be a positive multiple of 512", self.window_bytes));
        }
        if self.staging_bytes > 1 << 40 || self.window_bytes > 1 << 36 {
            return bad("staging or window far too large".into());
        }
        for (name, words) in
            [("flag_words", self.flag_words), ("counter_words", self.counter_words), ("epoch_words", self.epoch_words)]
        {
            if !(1..=1 << 20).contains(&words) {
                return bad(format!("{name} {words} must be in 1..=1048576"));
            }
        }
        Ok(())
    }
}

/// One named region of the workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// The region's name.
    pub name: &'static str,
    /// Offset from the workspace base.
    pub offset: usize,
    /// Size in bytes.
    pub bytes: usize,
}

/// Where everything is inside one rank's workspace (identical on every rank).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceLayout {
    /// The configuration it came from.
    pub config: WorkspaceConfig,
    /// The number of ranks.
    pub world: usize,
    /// Poison word (u64 at 0: nonzero once a wait expired) and the failure record
    /// (u64 at 8: peer + 1; u64 at 16: epoch; u64 at 24: block).
    pub control: Region,
    /// Set-up flag words (ping-pong checks): [`FLAG_SLOTS`] per peer, each on its own
    /// 128-byte line, written by that peer.
    pub setup_flags: Region,
    /// Per-block epochs (u64 × epoch_words).
    pub epochs: Region,
    /// The call check's words ([`CALL_WORDS`]), written by every peer's executor at each
    /// call. It ends where `flags` begins, which is how the executors find it from a rank's
    /// flag address (the one invariant between two regions of the layout).
    pub calls: Region,
    /// Protocol flag words: signals and drains (u64 × flag_words), then the
    /// [`LANDED_WORDS`].
    pub flags: Region,
    /// Arrival counters (u64 × counter_words).
    pub counters: Region,
    /// The packet window (`WINDOW_PHYSICAL_FACTOR` × window_bytes).
    pub window: Region,
    /// Staging (staging_bytes, two sense halves).
    pub staging: Region,
    /// Total bytes (a multiple of [`REGION_ALIGN`]).
    pub total_bytes: usize,
}

fn align(n: usize) -> usize {
    n.div_ceil(REGION_ALIGN) * REGION_ALIGN
}

impl WorkspaceLayout {
    /// The layout for `world` ranks.
    pub fn new(config: WorkspaceConfig, world: usize) -> Result<Self, Error> {
        config.check()?;
        if world == 0 || world > purlin_topo::MAX_WORLD {
            return Err(Error::InvalidArgument(format!(
                "world size {world} is outside 1..={}",
                purlin_topo::MAX_WORLD
            )));
        }
        let mut at = 0usize;
        let mut region = |name, bytes: usize| {
            let r = Region { name, offset: at, bytes };
            at += align(bytes);
            r
        };
        let control = region("control", 256);
        let setup_flags = region("setup", world * FLAG_SLOTS * FLAG_STRIDE);
        let epochs = region("epochs", config.epoch_words * 8);
        // The call words share the flags' page, just before them (`calls`).
        let flag_words = config.flag_words + LANDED_WORDS;
        let calls_and_flags = region("flags", CALL_WORDS * 8 + flag_words * 8);
        let calls = Region { name: "calls", offset: calls_and_flags.offset, bytes: CALL_WORDS * 8 };
        let flags = Region { name: "flags", offset: calls.offset + calls.bytes, bytes: flag_words * 8 };
        let counters = region("counters", config.counter_words * 8);
        let window = region("window", WINDOW_PHYSICAL_FACTOR * config.window_bytes);
        let staging = region("staging", config.staging_bytes);
        Ok(Self {
            config,
            world,
            control,
            setup_flags,
            epochs,
            calls,
            flags,
            counters,
            window,
            staging,
            total_bytes: at,
        })
    }

    /// All regions in address order.
    pub fn regions(&self) -> [Region; 8] {
        [self.control, self.setup_flags, self.epochs, self.calls, self.flags, self.counters, self.window, self.staging]
    }

    /// Offset of the set-up flag word that `writer` sets in this rank's workspace, in slot `slot`.
    pub fn flag_offset(&self, writer: usize, slot: usize) -> usize {
        self.setup_flags.offset + (writer * FLAG_SLOTS + slot) * FLAG_STRIDE
    }

    /// Checks that a SNAC plan's resources fit this workspace (the executor asks before it
    /// runs a plan); the error says which one does not.
    pub fn check_resources(&self, r: &purlin_snac::Resources) -> Result<(), Error> {
        let c = &self.config;
        let checks = [
            ("staging_bytes", r.staging_bytes, c.staging_bytes as u64),
            ("window_bytes", r.window_bytes, c.window_bytes as u64),
            ("flag_words", u64::from(r.flag_words), (c.flag_words + LANDED_WORDS) as u64),
            ("counter_words", u64::from(r.counter_words), c.counter_words as u64),
            ("epoch_words", u64::from(r.epoch_words), c.epoch_words as u64),
        ];
        for (what, need, have) in checks {
            if need > have {
                return Err(Error::InvalidArgument(format!(
                    "the plan needs {what} = {need}, the workspace has {have} (raise it in WorkspaceConfig)"
                )));
            }
        }
        Ok(())
    }

    /// A table of the regions and their sizes.
    pub fn report(&self) -> String {
        let mut s = format!("symmetric workspace per rank (world {}):\n", self.world);
        for r in self.regions() {
            let _ = writeln!(s, "  {:<9} offset {:>10}  {:>10} bytes", r.name, r.offset, r.bytes);
        }
        let mib = self.total_bytes as f64 / (1 << 20) as f64;
        let _ = write!(s, "  total     {:>10} bytes ({mib:.2} MiB)", self.total_bytes);
        s
    }

    /// The bytes every rank compares at set-up.
    fn digest(&self) -> Vec<u8> {
        let c = &self.config;
        [self.world, c.staging_bytes, c.window_bytes, c.flag_words, c.counter_words, c.epoch_words, self.total_bytes]
            .iter()
            .flat_map(|v| (*v as u64).to_le_bytes())
            .collect()
    }
}

/// Where symmetric memory comes from and how peers reach it.
pub trait SymmetricBackend {
    /// This rank's allocation.
    type Local;
    /// A peer's allocation as mapped here.
    type Remote;

    /// Allocates `bytes`, zeroes them and returns only once the zeroing has completed.
    fn alloc_zeroed(&mut self, bytes: usize) -> Result<Self::Local, Error>;
    /// The handle peers open (e.g. a CUDA IPC handle).
    fn export(&mut self, local: &Self::Local) -> Result<Vec<u8>, Error>;
    /// Opens `peer`'s handle.
    fn import(&mut self, peer: usize, handle: &[u8], bytes: usize) -> Result<Self::Remote, Error>;
    /// The address of this rank's allocation.
    fn local_addr(&self, local: &Self::Local) -> u64;
    /// The address of a peer's allocation as mapped here.
    fn remote_addr(&self, remote: &Self::Remote) -> u64;
    /// Unmaps a peer's allocation (never touches its memory).
    fn close(&mut self, remote: Self::Remote);
    /// Frees this rank's allocation.
    fn free(&mut self, local: Self::Local);
}

/// One rank's share of a symmetric allocation: its own memory and every peer's as mapped
/// here. Made by the set-up protocol above (every rank allocates the same number of bytes,
/// publishes a handle once the memory is zeroed, maps every peer's) and released by the
/// teardown protocol; the workspace and [`crate::SymmetricBuffer`]s are both made this way.
pub struct SymmetricAlloc<B: SymmetricBackend> {
    bytes: usize,
    rank: usize,
    local: Option<B::Local>,
    remotes: Vec<Option<B::Remote>>,
    addrs: Vec<u64>,
}

impl<B: SymmetricBackend> std::fmt::Debug for SymmetricAlloc<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymmetricAlloc")
            .field("rank", &self.rank)
            .field("bytes", &self.bytes)
            .field("addrs", &self.addrs)
            .finish()
    }
}

/// One rank's view of the symmetric workspace: its own allocation and every peer's.
pub struct SymmetricWorkspace<B: SymmetricBackend> {
    layout: WorkspaceLayout,
    alloc: SymmetricAlloc<B>,
}

impl<B: SymmetricBackend> std::fmt::Debug for SymmetricWorkspace<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymmetricWorkspace")
            .field("rank", &self.alloc.rank)
            .field("total_bytes", &self.layout.total_bytes)
            .field("addrs", &self.alloc.addrs)
            .finish()
    }
}

/// What teardown did.
#[derive(Debug, Default)]
pub struct TeardownReport {
    /// Both meetings with the peers succeeded.
    pub met_peers: bool,
    /// Peer mappings closed.
    pub closed: usize,
    /// Bytes of this rank's allocation left allocated because a peer might still map them.
    pub leaked_bytes: usize,
    /// The failure that made teardown unclean, if any.
    pub error: Option<String>,
}

impl<B: SymmetricBackend> SymmetricAlloc<B> {
    /// Runs the set-up protocol for `bytes` bytes on every rank of `host`; `what` names the
    /// allocation in errors. Every rank must ask for the same size (else `Error::Mismatch`).
    pub fn establish(host: &HostComm, backend: &mut B, bytes: usize, what: &str) -> Result<Self, Error> {
        let (rank, world) = (host.rank(), host.world());
        let sizes = host.all_gather(&(bytes as u64).to_le_bytes(), &format!("set-up: {what} size"))?;
        if let Some(peer) = sizes.iter().position(|d| *d != (bytes as u64).to_le_bytes()) {
            return Err(Error::Mismatch { rank, peer, what: format!("{what} size (this rank: {bytes} bytes)") });
        }
        let local = backend.alloc_zeroed(bytes)?;
        let handle = match backend.export(&local) {
            Ok(h) => h,
            Err(e) => {
                backend.free(local);
                return Err(e);
            }
        };
        // Published only now: the memory is zero and the zeroing has completed.
        let handles = match host.all_gather(&handle, &format!("set-up: publish {what} handles")) {
            Ok(h) => h,
            Err(e) => {
                backend.free(local);
                return Err(e);
            }
        };
        let mut a =
            Self { bytes, rank, remotes: (0..world).map(|_| None).collect(), addrs: vec![0; world], local: None };
        a.addrs[rank] = backend.local_addr(&local);
        a.local = Some(local);
        let mut failure = None;
        for (peer, h) in handles.iter().enumerate() {
            if peer == rank {
                continue;
            }
            match backend.import(peer, h, bytes) {
                Ok(r) => {
                    a.addrs[peer] = backend.remote_addr(&r);
                    a.remotes[peer] = Some(r);
                }
                Err(e) => {
                    failure = Some(format!("opening rank {peer}'s {what}: {e}"));
                    break;
                }
            }
        }
        let status = failure.clone().unwrap_or_default();
        let verdicts = match host.all_gather(status.as_bytes(), &format!("set-up: {what} mapped")) {
            Ok(v) => v,
            Err(e) => {
                a.discard(backend);
                return Err(e);
            }
        };
        if let Some((peer, why)) = verdicts.iter().enumerate().find(|(_, v)| !v.is_empty()) {
            a.discard(backend);
            let why = String::from_utf8_lossy(why).into_owned();
            return Err(if peer == rank {
                Error::Protocol { peer: None, what: why }
            } else {
                Error::PeerFailed { rank, peer, during: format!("set-up: mapping the {what}"), error: why }
            });
        }
        Ok(a)
    }

    /// Closes and frees everything at once, without meeting the peers (set-up failures,
    /// where no kernel ever ran).
    fn discard(&mut self, backend: &mut B) {
        for r in self.remotes.iter_mut().filter_map(Option::take) {
            backend.close(r);
        }
        if let Some(l) = self.local.take() {
            backend.free(l);
        }
    }

    /// [`Self::discard`] for owners that know no kernel runs and no peer maps this memory
    /// (a single process whose GPUs were all synchronised); `keep_local`: unmap the peers but
    /// leave this rank's memory allocated (a handle to it is still held).
    pub(crate) fn discard_now(mut self, backend: &mut B, keep_local: bool) {
        if keep_local {
            std::mem::forget(self.local.take());
        }
        self.discard(backend);
    }

    /// Gives up on meeting the peers (an earlier teardown meeting failed): unmaps their
    /// memory, which never touches it, and leaves this rank's allocated, since a peer may
    /// still map it. Returns the bytes left allocated.
    pub(crate) fn abandon(mut self, backend: &mut B) -> usize {
        for r in self.remotes.iter_mut().filter_map(Option::take) {
            backend.close(r);
        }
        std::mem::forget(self.local.take());
        self.bytes
    }

    /// Bytes per rank.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Every rank's base address as seen from this rank (own at the rank's index).
    pub fn addrs(&self) -> &[u64] {
        &self.addrs
    }

    /// The teardown protocol above. Call only after this rank's kernels have completed.
    /// `keep_local`: leave this rank's memory allocated (a handle to it is still held; counted
    /// in `leaked_bytes`).
    pub fn release(self, host: &HostComm, backend: &mut B, keep_local: bool) -> TeardownReport {
        let (mut report, error) = self.meet_and_free(host, backend, keep_local, "teardown");
        report.error = error.map(|e| e.to_string());
        report
    }

    /// [`Self::release`] with the failure typed; `during` names the step in errors.
    pub(crate) fn meet_and_free(
        mut self,
        host: &HostComm,
        backend: &mut B,
        keep_local: bool,
        during: &str,
    ) -> (TeardownReport, Option<Error>) {
        let mut report = TeardownReport::default();
        let first = host.barrier(&format!("{during}: device work done"));
        // Closing a mapping never touches the peer's memory: always safe, even if it died.
        for r in self.remotes.iter_mut().filter_map(Option::take) {
            backend.close(r);
            report.closed += 1;
        }
        let second = first.and_then(|()| host.barrier(&format!("{during}: peer mappings closed")));
        report.met_peers = second.is_ok();
        // A lost peer maps nothing any more; one that timed out may still.
        let free = !matches!(second, Err(Error::Timeout { .. } | Error::Poisoned(_)));
        if let Some(l) = self.local.take() {
            if free && !keep_local {
                backend.free(l);
            } else {
                report.leaked_bytes = self.bytes;
                std::mem::forget(l);
            }
        }
        (report, second.err())
    }
}

impl<B: SymmetricBackend> SymmetricWorkspace<B> {
    /// Runs the set-up protocol above with every other rank of `host`.
    pub fn establish(host: &HostComm, backend: &mut B, layout: WorkspaceLayout) -> Result<Self, Error> {
        let (rank, world) = (host.rank(), host.world());
        if layout.world != world {
            return Err(Error::InvalidArgument(format!("layout for world {} used in world {world}", layout.world)));
        }
        let digests = host.all_gather(&layout.digest(), "set-up: workspace layout")?;
        if let Some(peer) = digests.iter().position(|d| *d != layout.digest()) {
            return Err(Error::Mismatch {
                rank,
                peer,
                what: format!("workspace configuration (this rank: {:?}, world {world})", layout.config),
            });
        }
        let alloc = SymmetricAlloc::establish(host, backend, layout.total_bytes, "workspace")?;
        Ok(Self { layout, alloc })
    }

    /// [`SymmetricAlloc::discard_now`].
    pub(crate) fn discard_now(self, backend: &mut B) {
        self.alloc.discard_now(backend, false);
    }

    /// The layout.
    pub fn layout(&self) -> &WorkspaceLayout {
        &self.layout
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.alloc.rank
    }

    /// Every rank's workspace base address as seen from this rank (own at `rank()`).
    pub fn addrs(&self) -> &[u64] {
        self.alloc.addrs()
    }

    /// The teardown protocol above. Call only after this rank's kernels have completed.
    pub fn release(self, host: &HostComm, backend: &mut B) -> TeardownReport {
        self.alloc.release(host, backend, false)
    }
}

/// Symmetric host memory for threads of one process (the host executor's workspace):
/// every rank's allocation is a zeroed `u64` buffer that the others address directly.
#[derive(Debug, Default)]
pub struct HostBackend;

/// A [`HostBackend`] allocation.
#[derive(Debug)]
pub struct HostAlloc {
    buf: Box<[std::sync::atomic::AtomicU64]>,
}

impl SymmetricBackend for HostBackend {
    type Local = HostAlloc;
    type Remote = u64;

    fn alloc_zeroed(&mut self, bytes: usize) -> Result<HostAlloc, Error> {
        let words = bytes.div_ceil(8);
        Ok(HostAlloc { buf: (0..words).map(|_| std::sync::atomic::AtomicU64::new(0)).collect() })
    }

    fn export(&mut self, local: &HostAlloc) -> Result<Vec<u8>, Error> {
        let mut h = (local.buf.as_ptr() as u64).to_le_bytes().to_vec();
        h.extend_from_slice(&std::process::id().to_le_bytes());
        Ok(h)
    }

    fn import(&mut self, peer: usize, handle: &[u8], _bytes: usize) -> Result<u64, Error> {
        let bad = || Error::Protocol { peer: Some(peer), what: "host workspace handle".into() };
        let addr: [u8; 8] = handle.get(..8).and_then(|a| a.try_into().ok()).ok_or_else(bad)?;
        let pid: [u8; 4] = handle.get(8..12).and_then(|a| a.try_into().ok()).ok_or_else(bad)?;
        if u32::from_le_bytes(pid) != std::process::id() {
            return Err(Error::Unsupported("host symmetric memory across processes (threads only for now)".into()));
        }
        Ok(u64::from_le_bytes(addr))
    }

    fn local_addr(&self, local: &HostAlloc) -> u64 {
        local.buf.as_ptr() as u64
    }

    fn remote_addr(&self, remote: &u64) -> u64 {
        *remote
    }

    fn close(&mut self, _remote: u64) {}

    fn free(&mut self, local: HostAlloc) {
        drop(local);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_aligned_disjoint_and_reported() {
        for world in [1, 2, 8, 16] {
            let l = WorkspaceLayout::new(WorkspaceConfig::default(), world).unwrap();
            let regions = l.regions();
            for w in regions.windows(2) {
                assert!(w[0].offset + w[0].bytes <= w[1].offset, "{:?} overlaps {:?}", w[0], w[1]);
            }
            for r in regions {
                // Every region starts a page but the flags, which follow the call words.
                assert_eq!(r.offset % REGION_ALIGN, if r.name == "flags" { l.calls.bytes } else { 0 }, "{r:?}");
            }
            assert_eq!(l.calls.offset + l.calls.bytes, l.flags.offset, "the executors find the calls before the flags");
            assert!(world <= CALL_WORDS);
            assert_eq!(l.total_bytes % REGION_ALIGN, 0);
            assert!(l.total_bytes < 74 << 20, "default workspace too big at world {world}: {}", l.total_bytes);
            assert!(l.flag_offset(world - 1, FLAG_SLOTS - 1) + 8 <= l.setup_flags.offset + l.setup_flags.bytes);
            assert!(l.report().contains("staging"));
        }
        let l2 = WorkspaceLayout::new(WorkspaceConfig::default(), 2).unwrap();
        assert_eq!(l2.staging.bytes, 64 << 20);
        assert_eq!(l2.window.bytes, 8 << 20);
    }

    #[test]
    fn bad_configs_are_refused() {
        let d = WorkspaceConfig::default();
        for c in [
            WorkspaceConfig { staging_bytes: 0, ..d },
            WorkspaceConfig { staging_bytes: 1000, ..d },
            WorkspaceConfig { window_bytes: 17, ..d },
            WorkspaceConfig { flag_words: 0, ..d },
            WorkspaceConfig { epoch_words: 0, ..d },
            WorkspaceConfig { counter_words: 1 << 21, ..d },
        ] {
            assert!(matches!(WorkspaceLayout::new(c, 2), Err(Error::InvalidArgument(_))), "{c:?}");
        }
        assert!(WorkspaceLayout::new(d, 0).is_err());
        assert!(WorkspaceLayout::new(d, 17).is_err());
    }

    #[test]
    fn snac_default_plans_fit_the_default_workspace() {
        use purlin_snac::{CollectiveSpec, PlanConfig, Regime, derive};
        let layout = WorkspaceLayout::new(WorkspaceConfig::default(), 16).unwrap();
        let mut checked = 0;
        for world in [2u32, 4, 8, 16] {
            for regime in [Regime::Throughput, Regime::Latency] {
                let cfg = PlanConfig { regime, ..PlanConfig::default() };
                let spec =
                    CollectiveSpec::all_reduce(world, purlin_snac::DataType::F32, purlin_snac::ReduceOp::Sum, 1 << 16);
                let Ok(plans) = derive(&spec, &cfg) else { continue };
                for p in &plans {
                    layout.check_resources(&p.resources).unwrap();
                    checked += 1;
                }
            }
        }
        assert!(checked > 0);
        let mut too_big = purlin_snac::Resources {
            input_bytes: 0,
            output_bytes: 0,
            alias: None,
            staging_bytes: 1 << 30,
            window_bytes: 0,
            flag_words: 0,
            counter_words: 0,
            epoch_words: 0,
            ce_value_words: 0,
        };
        assert!(layout.check_resources(&too_big).unwrap_err().to_string().contains("staging_bytes"));
        too_big.staging_bytes = 0;
        too_big.epoch_words = 1 << 20;
        assert!(layout.check_resources(&too_big).unwrap_err().to_string().contains("epoch_words"));
    }
}
