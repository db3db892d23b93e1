//! The host twin of the copy-engine datapath ([`crate::copy_engine`]): a queue of copies,
//! word writes and word waits that one thread of its own runs in order, as a CUDA stream
//! runs them on the copy engines.
//!
//! Words are [`HostWord`]s (atomic 64-bit values): a write is a release store made after
//! every earlier operation of the queue has completed, a wait returns once an acquire load
//! satisfies its [`WaitCondition`], so a thread that waits for a word the engine wrote sees
//! every byte the engine copied before the write ("copy, then write"), and copies queued
//! after a wait see everything written before the awaited store ("wait, then copy").
//!
//! Unlike a stream wait, a host wait is bounded: a wait that times out stops the engine
//! (later operations are skipped, later enqueues refused) and [`HostCopyEngine::synchronize`]
//! reports it, so a host run never hangs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::copy_engine::WaitCondition;

/// The default bound of a host wait (the device executor's bounded-wait default).
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(300);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means a thread panicked while holding it; the data is plain.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A 64-bit word that engines and threads write and wait on (release stores, acquire loads);
/// waiters block instead of spinning.
#[derive(Debug, Default)]
pub struct HostWord {
    value: AtomicU64,
    lock: Mutex<()>,
    changed: Condvar,
}

impl HostWord {
    /// A word holding `value`.
    pub fn new(value: u64) -> Self {
        Self { value: AtomicU64::new(value), lock: Mutex::new(()), changed: Condvar::new() }
    }

    /// The current value (acquire).
    pub fn load(&self) -> u64 {
        self.value.load(Ordering::Acquire)
    }

    /// Stores `value` (release) and wakes the waiters.
    pub fn store(&self, value: u64) {
        self.value.store(value, Ordering::Release);
        // Taking the lock orders this wake-up after any waiter's check-then-sleep.
        drop(lock(&self.lock));
        self.changed.notify_all();
    }

    /// Blocks until the word satisfies `condition` for `target` (acquire) and returns the
    /// value seen; after `timeout`, `Err` with the last value seen.
    pub fn wait(&self, target: u64, condition: WaitCondition, timeout: Duration) -> Result<u64, u64> {
        let deadline = Instant::now() + timeout;
        let mut guard = lock(&self.lock);
        loop {
            let seen = self.load();
            if condition.holds(seen, target) {
                return Ok(seen);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(seen);
            }
            guard = self.changed.wait_timeout(guard, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// Errors of the host copy engine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostCopyError {
    /// Source and destination ranges partially overlap (the device's copies do not order
    /// bytes within one copy, so neither does the twin).
    #[error("copy {index}: destination {dst:#x} and source {src:#x} overlap over {bytes} bytes")]
    Overlap {
        /// The copy's index in its batch (0 for a single copy).
        index: usize,
        /// Destination address.
        dst: usize,
        /// Source address.
        src: usize,
        /// The copy's length.
        bytes: usize,
    },
    /// A range wraps around the address space.
    #[error("copy {index}: {bytes} bytes from {addr:#x} wrap around the address space")]
    AddressOverflow {
        /// The copy's index in its batch.
        index: usize,
        /// The start address.
        addr: usize,
        /// The length.
        bytes: usize,
    },
    /// A wait was not satisfied in time; the engine ran nothing after it.
    #[error("a copy-engine wait for {condition:?} {target} timed out after {timeout:?} (the word held {seen})")]
    WaitTimeout {
        /// The awaited value.
        target: u64,
        /// The comparison.
        condition: WaitCondition,
        /// The last value seen.
        seen: u64,
        /// The bound.
        timeout: Duration,
    },
    /// The engine stopped at an earlier failure and takes no more work.
    #[error("the copy engine stopped at an earlier failure: {0}")]
    Stopped(Box<HostCopyError>),
    /// The engine's thread is gone.
    #[error("the copy engine's thread is gone")]
    WorkerLost,
}

/// One copy of a host batch: `bytes` bytes from `src` to `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostCopyOp {
    /// Destination.
    pub dst: *mut u8,
    /// Source.
    pub src: *const u8,
    /// Bytes to copy.
    pub bytes: usize,
}

enum Op {
    Copy(Vec<HostCopyOp>),
    Write { word: Arc<HostWord>, value: u64 },
    WriteFrom { word: Arc<HostWord>, from: Arc<HostWord> },
    Wait { word: Arc<HostWord>, target: u64, condition: WaitCondition },
    Call(Box<dyn FnOnce() + Send>),
}

// SAFETY: the raw pointers of a queued copy are only dereferenced by the engine's thread,
// under the contract of `HostCopyEngine::copy_batch` (valid and unshared until the copy
// completes, which the caller learns through a later word or `synchronize`).
unsafe impl Send for Op {}

#[derive(Default)]
struct Progress {
    enqueued: u64,
    completed: u64,
    failure: Option<HostCopyError>,
}

#[derive(Default)]
struct Shared {
    progress: Mutex<Progress>,
    done: Condvar,
}

/// The host copy engine: operations run in order on a thread of its own.
pub struct HostCopyEngine {
    queue: Option<mpsc::Sender<Op>>,
    worker: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for HostCopyEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = lock(&self.shared.progress);
        f.debug_struct("HostCopyEngine")
            .field("enqueued", &p.enqueued)
            .field("completed", &p.completed)
            .field("failure", &p.failure)
            .finish()
    }
}

fn check_copy(index: usize, op: &HostCopyOp) -> Result<bool, HostCopyError> {
    let (dst, src) = (op.dst as usize, op.src as usize);
    if op.bytes == 0 || dst == src {
        return Ok(false);
    }
    for addr in [dst, src] {
        if addr.checked_add(op.bytes).is_none() {
            return Err(HostCopyError::AddressOverflow { index, addr, bytes: op.bytes });
        }
    }
    if dst < src + op.bytes && src < dst + op.bytes {
        return Err(HostCopyError::Overlap { index, dst, src, bytes: op.bytes });
    }
    Ok(true)
}

impl HostCopyEngine {
    /// An engine whose waits time out after [`DEFAULT_WAIT_TIMEOUT`].
    pub fn new() -> Self {
        Self::with_timeout(DEFAULT_WAIT_TIMEOUT)
    }

    /// An engine whose waits time out after `timeout`.
    pub fn with_timeout(timeout: Duration) -> Self {
        let (tx, rx) = mpsc::channel::<Op>();
        let shared = Arc::new(Shared::default());
        let worker_shared = shared.clone();
        let worker = std::thread::Builder::new()
            .name("purlin-host-copy-engine".into())
            .spawn(move || run(rx, &worker_shared, timeout))
            .ok();
        Self { queue: worker.is_some().then_some(tx), worker, shared }
    }

    fn enqueue(&self, op: Op) -> Result<(), HostCopyError> {
        let mut p = lock(&self.shared.progress);
        if let Some(failure) = &p.failure {
            return Err(HostCopyError::Stopped(Box::new(failure.clone())));
        }
        let queue = self.queue.as_ref().ok_or(HostCopyError::WorkerLost)?;
        queue.send(op).map_err(|_| HostCopyError::WorkerLost)?;
        p.enqueued += 1;
        Ok(())
    }

    /// Queues a copy of `bytes` bytes from `src` to `dst`.
    ///
    /// # Safety
    /// `src` must be readable and `dst` writable for `bytes` bytes, and nothing else may
    /// write `dst` or `src` (or read `dst`), from this call until the copy completes: until
    /// the caller observes a word this engine writes later, or [`synchronize`](Self::synchronize)
    /// returns.
    pub unsafe fn copy(&self, dst: *mut u8, src: *const u8, bytes: usize) -> Result<(), HostCopyError> {
        // SAFETY: forwarded from the caller.
        unsafe { self.copy_batch(&[HostCopyOp { dst, src, bytes }]) }
    }

    /// Queues a batch of copies, run in no particular order among themselves.
    ///
    /// # Safety
    /// As [`copy`](Self::copy), for every op; no op's destination may overlap another op's
    /// source or destination.
    pub unsafe fn copy_batch(&self, ops: &[HostCopyOp]) -> Result<(), HostCopyError> {
        let mut live = Vec::with_capacity(ops.len());
        for (index, op) in ops.iter().enumerate() {
            if check_copy(index, op)? {
                live.push(*op);
            }
        }
        if live.is_empty() {
            return Ok(());
        }
        self.enqueue(Op::Copy(live))
    }

    /// Queues a write of `value` to `word` (a release store after every earlier operation).
    pub fn write_value(&self, word: &Arc<HostWord>, value: u64) -> Result<(), HostCopyError> {
        self.enqueue(Op::Write { word: word.clone(), value })
    }

    /// Queues a write to `word` of the value `from` holds when the write runs.
    pub fn write_value_from(&self, word: &Arc<HostWord>, from: &Arc<HostWord>) -> Result<(), HostCopyError> {
        self.enqueue(Op::WriteFrom { word: word.clone(), from: from.clone() })
    }

    /// Queues a wait: later operations run once `word` satisfies `condition` for `target`.
    pub fn wait_value(&self, word: &Arc<HostWord>, target: u64, condition: WaitCondition) -> Result<(), HostCopyError> {
        self.enqueue(Op::Wait { word: word.clone(), target, condition })
    }

    /// Queues `f`, run on the engine's thread once every earlier operation has completed
    /// (the twin of `cuLaunchHostFunc`): the copies before it happen-before whatever `f`
    /// does, so an executor can publish its own flag words (a release store and a wake-up)
    /// as a copy's completion.
    pub fn call(&self, f: impl FnOnce() + Send + 'static) -> Result<(), HostCopyError> {
        self.enqueue(Op::Call(Box::new(f)))
    }

    /// Blocks until every queued operation has run (or been skipped after a failure);
    /// returns the failure if there was one.
    pub fn synchronize(&self) -> Result<(), HostCopyError> {
        let mut p = lock(&self.shared.progress);
        while p.completed < p.enqueued {
            if self.worker.as_ref().is_none_or(|w| w.is_finished()) {
                return Err(HostCopyError::WorkerLost);
            }
            p = self.shared.done.wait_timeout(p, Duration::from_millis(100)).unwrap_or_else(|e| e.into_inner()).0;
        }
        match &p.failure {
            Some(failure) => Err(failure.clone()),
            None => Ok(()),
        }
    }
}

impl Default for HostCopyEngine {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for HostCopyEngine {
    /// Lets the queued operations finish (every wait is bounded), then joins the thread.
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

/// The engine's thread: runs each operation in order, skipping all after a failure.
fn run(rx: mpsc::Receiver<Op>, shared: &Shared, timeout: Duration) {
    for op in rx {
        let stopped = lock(&shared.progress).failure.is_some();
        let failure = if stopped { None } else { execute(op, timeout) };
        let mut p = lock(&shared.progress);
        if p.failure.is_none() {
            p.failure = failure;
        }
        p.completed += 1;
        drop(p);
        shared.done.notify_all();
    }
}

fn execute(op: Op, timeout: Duration) -> Option<HostCopyError> {
    match op {
        Op::Copy(ops) => {
            for op in ops {
                // SAFETY: the ranges were checked not to wrap or overlap; the caller of
                // `copy_batch` vouched that they stay valid and unshared until this copy
                // completes.
                unsafe { std::ptr::copy_nonoverlapping(op.src, op.dst, op.bytes) };
            }
            None
        }
        Op::Write { word, value } => {
            word.store(value);
            None
        }
        Op::WriteFrom { word, from } => {
            word.store(from.load());
            None
        }
        Op::Call(f) => {
            f();
            None
        }
        Op::Wait { word, target, condition } => match word.wait(target, condition, timeout) {
            Ok(_) => None,
            Err(seen) => Some(HostCopyError::WaitTimeout { target, condition, seen, timeout }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_overlap_and_wrapping_are_refused() {
        let engine = HostCopyEngine::new();
        let mut buf = vec![0u8; 64];
        let p = buf.as_mut_ptr();
        // SAFETY: the checks refuse these copies before anything is queued.
        let err = unsafe { engine.copy(p.wrapping_add(8), p, 16) }.unwrap_err();
        assert!(matches!(err, HostCopyError::Overlap { index: 0, bytes: 16, .. }), "{err}");
        let far = usize::MAX - 4;
        // SAFETY: refused before anything is queued.
        let err = unsafe { engine.copy(p, far as *const u8, 16) }.unwrap_err();
        assert!(matches!(err, HostCopyError::AddressOverflow { .. }), "{err}");
        // In place and empty copies have nothing to do.
        // SAFETY: nothing is queued.
        unsafe { engine.copy(p, p, 64) }.unwrap();
        // SAFETY: nothing is queued.
        unsafe { engine.copy(p, p.wrapping_add(8), 0) }.unwrap();
        engine.synchronize().unwrap();
        assert!(buf.iter().all(|&b| b == 0));
    }

    #[test]
    fn the_engine_and_its_words_can_be_shared_across_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<HostWord>();
        fn send<T: Send>() {}
        send::<HostCopyEngine>();
    }
}
