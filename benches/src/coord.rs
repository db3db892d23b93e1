//! How the ranks of one benchmark meet: a barrier, an exchange of small arrays (times, wrong
//! counts, NCCL ids) and an abort flag, all in one block of shared 64-bit words.
//!
//! - One process, one thread per GPU: the block is ordinary memory shared by the threads.
//! - torchrun, one process per GPU: the block is a file in `/dev/shm` mapped by every rank.
//!   Rank 0 creates it under a name made from `MASTER_PORT`, `TORCHELASTIC_RUN_ID` and the
//!   parent process id (all ranks of one launch are children of the same torchrun agent), and
//!   unlinks it once every rank has mapped it (so a crash leaves nothing stale behind, and a
//!   later launch never meets an old file: its agent has another pid).
//!
//! The barrier spins on an atomic word, so its ranks leave within a microsecond or so of each
//! other: it starts every timed run. Every wait is bounded and watches the abort flag, so a
//! rank that fails stops its peers instead of leaving them hanging.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

const MAGIC: u64 = 0x5055_524c_494e_4231; // "PURLINB1"
/// Largest world the block is laid out for.
pub const MAX_RANKS: usize = 16;
const W_MAGIC: usize = 0;
const W_WORLD: usize = 1;
const W_COUNT: usize = 2;
const W_GEN: usize = 3;
const W_ABORT: usize = 4;
const W_MAPPED: usize = 5;
const W_ABORT_MSG: usize = 8; // 32 words = 256 bytes
const ABORT_MSG_WORDS: usize = 32;
const W_ARRIVED: usize = 64; // one word per rank: its barrier sequence number
const W_SLOTS: usize = 128;
/// Words one rank may send in one exchange round (longer arrays take several rounds).
pub const SLOT_WORDS: usize = 4096;
const TOTAL_WORDS: usize = W_SLOTS + MAX_RANKS * SLOT_WORDS;

enum Backing {
    Local(#[allow(dead_code)] Box<[AtomicU64]>),
    Mapped { ptr: *mut libc::c_void, len: usize },
}

/// The shared block of words.
pub struct Region {
    words: *const AtomicU64,
    backing: Backing,
}

// SAFETY: the region is plain memory accessed only through atomics; the backing stays alive
// (and mapped) as long as the Region.
unsafe impl Send for Region {}
// SAFETY: as above; all access is through `&AtomicU64`.
unsafe impl Sync for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        if let Backing::Mapped { ptr, len } = self.backing {
            // SAFETY: ptr/len are exactly what mmap returned; no reference into the mapping
            // outlives the Region (every accessor borrows self).
            unsafe { libc::munmap(ptr, len) };
        }
    }
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region").field("mapped", &matches!(self.backing, Backing::Mapped { .. })).finish()
    }
}

impl Region {
    /// A block in this process's memory (the ranks are threads).
    pub fn local(world: usize) -> Arc<Region> {
        let b: Box<[AtomicU64]> = (0..TOTAL_WORDS).map(|_| AtomicU64::new(0)).collect();
        let words = b.as_ptr();
        let r = Region { words, backing: Backing::Local(b) };
        r.word(W_WORLD).store(world as u64, Ordering::Relaxed);
        r.word(W_MAGIC).store(MAGIC, Ordering::Release);
        Arc::new(r)
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < TOTAL_WORDS);
        // SAFETY: i is in bounds of the TOTAL_WORDS words the backing holds, which live as
        // long as &self.
        unsafe { &*self.words.add(i) }
    }

    /// The file-backed block of a torchrun launch (see the module docs). Rank 0 creates it;
    /// the others wait for it up to `timeout`.
    pub fn shared(key: &str, rank: usize, world: usize, timeout: Duration) -> Result<Region> {
        let dir =
            if std::path::Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
        let path = dir.join(format!("purlin-bench-{key}"));
        let bytes = TOTAL_WORDS * 8;
        let file = if rank == 0 {
            let tmp = dir.join(format!("purlin-bench-{key}.{}.tmp", std::process::id()));
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)
                .with_context(|| format!("create {}", tmp.display()))?;
            f.set_len(bytes as u64)?;
            let r = Region::map(&f, bytes)?;
            r.word(W_WORLD).store(world as u64, Ordering::Relaxed);
            r.word(W_MAGIC).store(MAGIC, Ordering::Release);
            drop(r);
            std::fs::rename(&tmp, &path).with_context(|| format!("publish {}", path.display()))?;
            f
        } else {
            let deadline = Instant::now() + timeout;
            loop {
                match std::fs::OpenOptions::new().read(true).write(true).open(&path) {
                    Ok(f) if f.metadata().map(|m| m.len() as usize == bytes).unwrap_or(false) => break f,
                    _ if Instant::now() > deadline => {
                        bail!("rank {rank}: rank 0 did not create {} within {timeout:?}", path.display())
                    }
                    _ => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        };
        let r = Region::map(&file, bytes)?;
        if r.word(W_MAGIC).load(Ordering::Acquire) != MAGIC || r.word(W_WORLD).load(Ordering::Relaxed) != world as u64 {
            bail!("{}: not a purlin-bench block for world {world}", path.display());
        }
        // Once every rank has mapped it, rank 0 unlinks the file.
        let mapped = r.word(W_MAPPED).fetch_add(1, Ordering::AcqRel) + 1;
        if rank == 0 {
            let deadline = Instant::now() + timeout;
            while r.word(W_MAPPED).load(Ordering::Acquire) < world as u64 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            let _ = std::fs::remove_file(&path);
        }
        let _ = mapped;
        Ok(r)
    }

    fn map(file: &std::fs::File, bytes: usize) -> Result<Region> {
        use std::os::fd::AsRawFd;
        // SAFETY: mapping `bytes` of a file we hold open and sized to at least `bytes`;
        // MAP_SHARED so every process sees the same words. The result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            bail!("mmap of the shared block failed: {}", std::io::Error::last_os_error());
        }
        Ok(Region { words: ptr as *const AtomicU64, backing: Backing::Mapped { ptr, len: bytes } })
    }
}

/// One rank's handle on the shared block.
#[derive(Debug)]
pub struct Coord {
    region: Arc<Region>,
    rank: usize,
    world: usize,
    seq: std::cell::Cell<u64>,
    timeout: Duration,
}

impl Coord {
    /// Rank `rank`'s handle.
    pub fn new(region: Arc<Region>, rank: usize, world: usize, timeout: Duration) -> Coord {
        Coord { region, rank, world, seq: std::cell::Cell::new(0), timeout }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Stops every rank: their waits return an error naming this rank and `why`.
    pub fn abort(&self, why: &str) {
        let r = &self.region;
        if r.word(W_ABORT).compare_exchange(0, self.rank as u64 + 1, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            let bytes = why.as_bytes();
            for i in 0..ABORT_MSG_WORDS {
                let mut w = [0u8; 8];
                for (j, b) in w.iter_mut().enumerate() {
                    *b = bytes.get(i * 8 + j).copied().unwrap_or(0);
                }
                r.word(W_ABORT_MSG + i).store(u64::from_le_bytes(w), Ordering::Relaxed);
            }
            r.word(W_ABORT).store(self.rank as u64 + 1 + (1 << 32), Ordering::Release);
        }
    }

    /// `Some((rank, why))` once any rank aborted.
    pub fn aborted(&self) -> Option<(usize, String)> {
        let mut a = self.region.word(W_ABORT).load(Ordering::Acquire);
        if a == 0 {
            return None;
        }
        // The aborting rank writes its message right after claiming the flag.
        let deadline = Instant::now() + Duration::from_millis(200);
        while a >> 32 == 0 && Instant::now() < deadline {
            std::thread::yield_now();
            a = self.region.word(W_ABORT).load(Ordering::Acquire);
        }
        let rank = (a & 0xffff_ffff) as usize - 1;
        if a >> 32 == 0 {
            return Some((rank, "(no message)".into()));
        }
        let mut bytes = Vec::new();
        for i in 0..ABORT_MSG_WORDS {
            bytes.extend_from_slice(&self.region.word(W_ABORT_MSG + i).load(Ordering::Relaxed).to_le_bytes());
        }
        let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
        Some((rank, String::from_utf8_lossy(&bytes[..end]).into_owned()))
    }

    /// An error if a peer aborted.
    pub fn check(&self) -> Result<()> {
        match self.aborted() {
            Some((r, why)) if r != self.rank => bail!("rank {r} stopped the run: {why}"),
            Some((_, why)) => bail!("stopped: {why}"),
            None => Ok(()),
        }
    }

    /// Waits until every rank arrives (bounded by the timeout; stops on abort).
    pub fn barrier(&self) -> Result<()> {
        let r = &self.region;
        let seq = self.seq.get() + 1;
        self.seq.set(seq);
        r.word(W_ARRIVED + self.rank).store(seq, Ordering::Release);
        let generation = r.word(W_GEN).load(Ordering::Acquire);
        if r.word(W_COUNT).fetch_add(1, Ordering::AcqRel) + 1 == self.world as u64 {
            r.word(W_COUNT).store(0, Ordering::Relaxed);
            r.word(W_GEN).fetch_add(1, Ordering::AcqRel);
            return Ok(());
        }
        let start = Instant::now();
        let mut spins = 0u64;
        while r.word(W_GEN).load(Ordering::Acquire) == generation {
            spins += 1;
            if spins < 20_000 {
                std::hint::spin_loop();
                continue;
            }
            if spins.is_multiple_of(64) {
                self.check()?;
                if start.elapsed() > self.timeout {
                    let missing: Vec<usize> =
                        (0..self.world).filter(|p| r.word(W_ARRIVED + p).load(Ordering::Acquire) < seq).collect();
                    let why = format!(
                        "rank {}: barrier timed out after {:?} waiting for ranks {missing:?}",
                        self.rank, self.timeout
                    );
                    self.abort(&why);
                    bail!(why);
                }
            }
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Every rank's `mine`, in rank order (all ranks must call it with arrays they agree to
    /// exchange; lengths may differ).
    pub fn exchange(&self, mine: &[u64]) -> Result<Vec<Vec<u64>>> {
        let mut all = vec![Vec::new(); self.world];
        let mut sent = 0;
        loop {
            let chunk = &mine[sent.min(mine.len())..(sent + SLOT_WORDS - 2).min(mine.len())];
            let more = sent + chunk.len() < mine.len();
            let base = W_SLOTS + self.rank * SLOT_WORDS;
            self.barrier()?;
            self.region.word(base).store(chunk.len() as u64, Ordering::Relaxed);
            self.region.word(base + 1).store(more as u64, Ordering::Relaxed);
            for (i, v) in chunk.iter().enumerate() {
                self.region.word(base + 2 + i).store(*v, Ordering::Relaxed);
            }
            self.barrier()?;
            let mut any_more = false;
            for (p, out) in all.iter_mut().enumerate() {
                let b = W_SLOTS + p * SLOT_WORDS;
                let n = self.region.word(b).load(Ordering::Relaxed) as usize;
                any_more |= self.region.word(b + 1).load(Ordering::Relaxed) != 0;
                out.extend((0..n.min(SLOT_WORDS - 2)).map(|i| self.region.word(b + 2 + i).load(Ordering::Relaxed)));
            }
            sent += chunk.len();
            if !any_more {
                break;
            }
        }
        Ok(all)
    }

    /// Element-wise maximum over ranks of equally long arrays.
    pub fn max_f64(&self, mine: &[f64]) -> Result<Vec<f64>> {
        let all = self.exchange(&mine.iter().map(|v| v.to_bits()).collect::<Vec<_>>())?;
        Ok((0..mine.len())
            .map(|i| all.iter().map(|a| a.get(i).map_or(f64::NAN, |b| f64::from_bits(*b))).fold(f64::MIN, f64::max))
            .collect())
    }

    /// Sum over ranks.
    pub fn sum_u64(&self, mine: u64) -> Result<u64> {
        Ok(self.exchange(&[mine])?.iter().map(|a| a.first().copied().unwrap_or(0)).sum())
    }

    /// Every rank's string, in rank order.
    pub fn all_strings(&self, mine: &str) -> Result<Vec<String>> {
        let b = mine.as_bytes();
        let words: Vec<u64> = std::iter::once(b.len() as u64)
            .chain(b.chunks(8).map(|c| {
                let mut w = [0u8; 8];
                w[..c.len()].copy_from_slice(c);
                u64::from_le_bytes(w)
            }))
            .collect();
        Ok(self
            .exchange(&words)?
            .iter()
            .map(|w| {
                let len = w.first().copied().unwrap_or(0) as usize;
                let mut bytes: Vec<u8> = w.iter().skip(1).flat_map(|x| x.to_le_bytes()).collect();
                bytes.truncate(len);
                String::from_utf8_lossy(&bytes).into_owned()
            })
            .collect())
    }

    /// Rank 0's bytes, on every rank.
    pub fn broadcast_bytes(&self, mine: &[u8]) -> Result<Vec<u8>> {
        let words: Vec<u64> = if self.rank == 0 {
            std::iter::once(mine.len() as u64)
                .chain(mine.chunks(8).map(|c| {
                    let mut w = [0u8; 8];
                    w[..c.len()].copy_from_slice(c);
                    u64::from_le_bytes(w)
                }))
                .collect()
        } else {
            Vec::new()
        };
        let all = self.exchange(&words)?;
        let w = &all[0];
        let len = w.first().copied().unwrap_or(0) as usize;
        let mut out: Vec<u8> = w.iter().skip(1).flat_map(|x| x.to_le_bytes()).collect();
        out.truncate(len);
        Ok(out)
    }
}

/// The key naming a torchrun launch's shared block (see the module docs).
pub fn torchrun_key() -> String {
    let port = std::env::var("MASTER_PORT").unwrap_or_else(|_| "0".into());
    let run = std::env::var("TORCHELASTIC_RUN_ID").unwrap_or_default();
    let run: String = run.chars().filter(|c| c.is_ascii_alphanumeric()).take(24).collect();
    let restart = std::env::var("TORCHELASTIC_RESTART_COUNT").unwrap_or_else(|_| "0".into());
    format!("{port}-{}-{run}-{restart}", std::os::unix::process::parent_id())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn threads<T: Send + 'static>(world: usize, f: impl Fn(Coord) -> T + Send + Sync + 'static) -> Vec<T> {
        let region = Region::local(world);
        let f = Arc::new(f);
        let hs: Vec<_> = (0..world)
            .map(|r| {
                let (region, f) = (region.clone(), f.clone());
                std::thread::spawn(move || f(Coord::new(region, r, world, Duration::from_secs(20))))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn exchange_max_sum_broadcast() {
        let out = threads(3, |c| {
            for _ in 0..50 {
                c.barrier().unwrap();
            }
            let r = c.rank() as f64;
            let m = c.max_f64(&[r, 10.0 - r, 5.0]).unwrap();
            let s = c.sum_u64(c.rank() as u64 + 1).unwrap();
            let long: Vec<u64> = (0..10_000).map(|i| i + c.rank() as u64).collect();
            let all = c.exchange(&long).unwrap();
            let b = c.broadcast_bytes(if c.rank() == 0 { b"hello, ranks" } else { b"" }).unwrap();
            (m, s, all.iter().map(|a| a.len()).sum::<usize>(), all[2][9999], b)
        });
        for (m, s, total, last, b) in out {
            assert_eq!(m, vec![2.0, 10.0, 5.0]);
            assert_eq!(s, 6);
            assert_eq!(total, 30_000);
            assert_eq!(last, 10_001);
            assert_eq!(b, b"hello, ranks");
        }
    }

    #[test]
    fn abort_stops_waiting_peers() {
        let out = threads(2, |c| {
            if c.rank() == 1 {
                c.abort("planted failure");
                return String::new();
            }
            format!("{:#}", c.barrier().unwrap_err())
        });
        assert!(out[0].contains("rank 1 stopped the run: planted failure"), "{}", out[0]);
    }

    #[test]
    fn barrier_times_out_naming_the_missing_rank() {
        let region = Region::local(2);
        let c = Coord::new(region, 0, 2, Duration::from_millis(200));
        let e = format!("{:#}", c.barrier().unwrap_err());
        assert!(e.contains("waiting for ranks [1]"), "{e}");
    }

    #[test]
    fn file_backed_block_is_shared_and_unlinked() {
        let key = format!("test-{}", std::process::id());
        let k2 = key.clone();
        let h = std::thread::spawn(move || {
            let r = Region::shared(&k2, 1, 2, Duration::from_secs(20)).unwrap();
            let c = Coord::new(Arc::new(r), 1, 2, Duration::from_secs(20));
            c.sum_u64(5).unwrap()
        });
        let r = Region::shared(&key, 0, 2, Duration::from_secs(20)).unwrap();
        let c = Coord::new(Arc::new(r), 0, 2, Duration::from_secs(20));
        assert_eq!(c.sum_u64(1).unwrap(), 6);
        assert_eq!(h.join().unwrap(), 6);
        assert!(!std::path::Path::new(&format!("/dev/shm/purlin-bench-{key}")).exists());
    }
}
