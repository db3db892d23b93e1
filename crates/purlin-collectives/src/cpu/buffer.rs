//! Host symmetric memory: the [`crate::CpuComm`] twin of [`crate::SymmetricBuffer`], so the
//! one-copy plans (peers store straight into every rank's output, or reduce straight from
//! every rank's input; [`crate::gpu::comm::symmetric`] says which collectives) run on the host executor
//! through the public API, not only in its tests.
//!
//! Every rank of a world allocates one together ([`crate::CpuComm::alloc_symmetric`]), and
//! peers write into a rank's buffer *during* a collective call. A `&mut [T]` cannot be such a
//! buffer: its borrow promises the call that nobody else touches the memory. So the memory is
//! a [`CpuSymmetricBuffer`] that owns it behind `UnsafeCell`s, and the collectives take any
//! [`CpuBuffer`] / [`CpuBufferMut`]: a slice, a `Vec`, an array, or a symmetric buffer.
//!
//! Who touches a rank's memory when:
//! - outside its calls, only its owner, through [`CpuSymmetricBuffer::copy_from_host`],
//!   [`CpuSymmetricBuffer::copy_to_host`] and [`CpuSymmetricBuffer::to_vec`] (the borrow
//!   checker keeps them out of the owner's own calls that write the buffer);
//! - during a call, the executor threads of every rank, in the order the plan's flags and
//!   counters give (proved race-free by the verifier, as for staging), and a peer only between
//!   this rank's entry into the same call and its exit. On success the plan itself ensures
//!   that; so that a failed call (a wait that expired) ensures it too, every rank leaves a
//!   one-copy call only once every rank's executor threads of it have finished.
//!
//! That last point needs every rank in the *same* call on the *same* allocations: before a
//! one-copy call runs, the ranks meet (the `k`-th such call of every rank meets the others'
//! `k`-th) and compare the call (spec, in place or not) and which allocation each shared
//! role uses; any difference is an [`Error::Mismatch`] on every rank before anything
//! runs. A rank that passes plain memory where the others pass symmetric buffers runs the
//! staged plan and never arrives: the others' meeting expires ([`Error::Timeout`]) and
//! poisons the world, as any missing rank does with NCCL, and no rank's memory is written.
//! Calls that are not one-copy (the latency regime's packets, or a staged plan because the
//! role the one-copy plan needs is plain) share nothing, need no meeting, and mix freely with
//! plain buffers.
//!
//! The memory is freed when the last rank's handle is dropped (there is no separate free:
//! peers' calls reach a rank's memory through their own handles, which keep it alive).

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use purlin_atom::{F8E4M3, F8E5M2};
use purlin_snac::DataType;

use crate::error::Error;

mod sealed {
    pub trait Sealed {}
}

/// The element types host collectives accept: cudarc's NCCL set (`f32`, `f64`, `i8`, `u8`,
/// `i32`, `u32`, `i64`, `u64`, `half::f16`, `half::bf16`) plus the two fp8 formats.
/// Gathers (AllGather, AllToAll and their V forms) move any of them; reductions take only a
/// [`crate::ReduceType`] (f32, f16, bf16, fp8 e4m3/e5m2, i32, u32): another type does not
/// compile (the byte API answers such a spec with [`Error::Unsupported`]).
pub trait CpuType: sealed::Sealed + Copy + Send + Sync + 'static {
    /// The element type of a spec.
    const DATA_TYPE: DataType;
}

macro_rules! cpu_type {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(
            impl sealed::Sealed for $t {}
            impl CpuType for $t {
                const DATA_TYPE: DataType = DataType::$d;
            }
        )*
    };
}
cpu_type!(f32 => F32, f64 => F64, i8 => I8, u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64,
    half::f16 => F16, half::bf16 => Bf16, F8E4M3 => F8E4M3, F8E5M2 => F8E5M2);

/// One rank's bytes of a symmetric allocation.
struct Slot {
    /// `u64` words, so the bytes are 8-aligned (every [`CpuType`] needs at most 8).
    words: Box<[UnsafeCell<u64>]>,
}

impl Slot {
    fn ptr(&self) -> *mut u8 {
        // `UnsafeCell<u64>` has the layout of `u64` and the slice is contiguous, so the cell
        // pointer of the first word addresses all of them.
        UnsafeCell::raw_get(self.words.as_ptr()).cast::<u8>()
    }
}

/// One symmetric allocation: every rank's bytes, shared by every rank's handle.
pub(crate) struct SymmetricAlloc {
    /// The world that made it (compared by address with the communicator's own token).
    world: Arc<()>,
    /// Bytes per rank.
    bytes: usize,
    slots: Box<[Slot]>,
}

// SAFETY: the words are only reached through raw pointers: by the owner's copies, which
// borrow its handle (so never during its own calls that write the buffer), and by the
// executor threads of calls that every rank entered with the same spec and allocations
// (checked by the call meeting), in the order the plan gives with release/acquire atomics,
// a peer only while the owner is in that call (the verifier proves both, as for staging).
unsafe impl Sync for SymmetricAlloc {}
// SAFETY: the allocation owns plain words; no thread identity is tied to them.
unsafe impl Send for SymmetricAlloc {}

impl std::fmt::Debug for SymmetricAlloc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymmetricAlloc").field("bytes", &self.bytes).field("ranks", &self.slots.len()).finish()
    }
}

impl SymmetricAlloc {
    /// Zeroed memory of `bytes` per rank for `world` ranks; an allocation the process cannot
    /// make is an error, not an abort.
    pub(crate) fn zeroed(world_token: Arc<()>, world: usize, bytes: usize) -> Result<Self, Error> {
        let words = bytes.div_ceil(8);
        let too_big = || Error::InvalidArgument(format!("cannot allocate {world} symmetric buffers of {bytes} bytes"));
        if words.checked_mul(world).and_then(|w| w.checked_mul(8)).is_none_or(|b| b > isize::MAX as usize) {
            return Err(too_big());
        }
        let mut slots = Vec::with_capacity(world);
        for _ in 0..world {
            let mut v: Vec<UnsafeCell<u64>> = Vec::new();
            v.try_reserve_exact(words).map_err(|_| too_big())?;
            v.resize_with(words, || UnsafeCell::new(0));
            slots.push(Slot { words: v.into_boxed_slice() });
        }
        Ok(Self { world: world_token, bytes, slots: slots.into_boxed_slice() })
    }

    /// Bytes per rank.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether `token` is the world that made this allocation.
    pub(crate) fn belongs_to(&self, token: &Arc<()>) -> bool {
        Arc::ptr_eq(&self.world, token)
    }

    /// Rank `rank`'s bytes (`rank` < world).
    pub(crate) fn base(&self, rank: usize) -> *mut u8 {
        self.slots[rank].ptr()
    }

    /// An identity for comparing allocations across ranks (valid while a handle is held).
    pub(crate) fn id(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }
}

/// `len` elements of `T` of one rank, allocated by every rank of a [`crate::CpuComm`] world
/// at once ([`crate::CpuComm::alloc_symmetric`]) and written by peers during collective calls
/// that take the one-copy path. Pass it wherever a collective takes a buffer; read and write
/// it between calls with [`Self::copy_from_host`], [`Self::copy_to_host`] and
/// [`Self::to_vec`] (like `cudarc`'s `memcpy_htod` / `memcpy_dtoh` for a
/// [`crate::SymmetricBuffer`]).
pub struct CpuSymmetricBuffer<T> {
    alloc: Arc<SymmetricAlloc>,
    rank: usize,
    len: usize,
    /// Only a label: the elements live in `alloc` as words.
    _elem: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for CpuSymmetricBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuSymmetricBuffer")
            .field("rank", &self.rank)
            .field("len", &self.len)
            .field("elem", &std::any::type_name::<T>())
            .finish()
    }
}

impl<T: CpuType> CpuSymmetricBuffer<T> {
    pub(crate) fn new(alloc: Arc<SymmetricAlloc>, rank: usize, len: usize) -> Self {
        Self { alloc, rank, len, _elem: PhantomData }
    }

    /// Elements the buffer shows (what a collective checks against the call).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Elements of `T` the allocation holds (on every rank alike).
    pub fn capacity(&self) -> usize {
        self.alloc.bytes / size_of::<T>()
    }

    /// Shows the first `len` elements only (at most [`Self::capacity`]), like
    /// `SymmetricBuffer::set_len`: collectives check buffer lengths exactly, and a V form's
    /// buffers differ from rank to rank while every rank's allocation is the same size.
    pub fn set_len(&mut self, len: usize) -> Result<(), Error> {
        if len > self.capacity() {
            return Err(Error::InvalidArgument(format!("{len} elements in a symmetric buffer of {}", self.capacity())));
        }
        self.len = len;
        Ok(())
    }

    /// This rank's memory (for code that moves bytes itself, like a benchmark filling its
    /// buffers between calls; peers write it only during this rank's calls).
    pub fn as_ptr(&self) -> *const T {
        self.alloc.base(self.rank).cast::<T>().cast_const()
    }

    /// [`Self::as_ptr`], mutable.
    pub fn as_mut_ptr(&mut self) -> *mut T {
        self.alloc.base(self.rank).cast::<T>()
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The rank whose memory this is.
    pub fn rank(&self) -> usize {
        self.rank
    }

    fn check_len(&self, other: usize, what: &str) -> Result<(), Error> {
        if other != self.len {
            return Err(Error::InvalidArgument(format!(
                "{what}: a host slice of {other} elements for a symmetric buffer of {}",
                self.len
            )));
        }
        Ok(())
    }

    /// Writes `src` (exactly [`Self::len`] elements) into this rank's memory.
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<(), Error> {
        self.check_len(src.len(), "copy_from_host")?;
        let slot = &self.alloc.slots[self.rank];
        // SAFETY: the slot holds at least `len × size_of::<T>()` bytes (allocated for this
        // length), 8-aligned; this rank is in no call (`&mut self`), so no peer touches its
        // bytes (module docs); `src` is a distinct host slice, so the ranges do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().cast::<u8>(), slot.ptr(), std::mem::size_of_val(src)) };
        Ok(())
    }

    /// Reads this rank's memory into `dst` (exactly [`Self::len`] elements).
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<(), Error> {
        self.check_len(dst.len(), "copy_to_host")?;
        let slot = &self.alloc.slots[self.rank];
        // SAFETY: as in `copy_from_host`, but with `&self` a call of this rank may be running
        // with this buffer as its input, which every rank only reads; every byte pattern is a
        // valid `CpuType` value.
        unsafe { std::ptr::copy_nonoverlapping(slot.ptr(), dst.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(dst)) };
        Ok(())
    }

    /// This rank's memory as a vector.
    pub fn to_vec(&self) -> Vec<T> {
        let mut out: Vec<T> = Vec::with_capacity(self.len);
        let slot = &self.alloc.slots[self.rank];
        // SAFETY: `out` has capacity for `len` elements; the slot holds their bytes and is
        // only read concurrently (as in `copy_to_host`); every byte pattern is a valid
        // `CpuType`, so after the copy the first `len` elements are initialized.
        unsafe {
            std::ptr::copy_nonoverlapping(slot.ptr(), out.as_mut_ptr().cast::<u8>(), self.len * size_of::<T>());
            out.set_len(self.len);
        }
        out
    }
}

/// Where a call's buffer lies, as the host communicator needs it.
pub(crate) mod region {
    use super::SymmetricAlloc;

    /// A buffer's bytes, and its allocation and rank where it is a symmetric buffer.
    #[derive(Debug, Clone, Copy)]
    pub struct HostRegion<'a> {
        pub(crate) ptr: *mut u8,
        pub(crate) bytes: usize,
        pub(crate) symmetric: Option<(&'a SymmetricAlloc, usize)>,
    }

    impl HostRegion<'_> {
        /// No bytes (a side of a call that moves none: a Broadcast peer's input, a Reduce
        /// peer's output); the pointer is dangling and never dereferenced.
        pub(crate) fn empty() -> Self {
            HostRegion { ptr: std::ptr::NonNull::<u64>::dangling().as_ptr().cast(), bytes: 0, symmetric: None }
        }

        /// The same bytes as plain memory, for a call that must not take the one-copy path
        /// (a point-to-point call: the sender cannot see the receiver's buffer). Peers then
        /// touch only the workspace, never these bytes.
        pub(crate) fn plain(self) -> Self {
            HostRegion { symmetric: None, ..self }
        }
    }

    /// Sealed: what makes a type a [`super::CpuBuffer`].
    pub trait Readable<T> {
        /// The bytes a call may read for as long as `self` is borrowed.
        fn host_region(&self) -> HostRegion<'_>;
    }

    /// Sealed: what makes a type a [`super::CpuBufferMut`].
    pub trait Writable<T> {
        /// The bytes a call may write for as long as `self` is borrowed mutably.
        fn host_region_mut(&mut self) -> HostRegion<'_>;
    }
}
use region::{HostRegion, Readable, Writable};

/// A buffer a host collective reads: `[T]`, `Vec<T>`, `[T; N]` or a [`CpuSymmetricBuffer`]
/// (the host twin of cudarc's `DevicePtr`). Sealed.
pub trait CpuBuffer<T: CpuType>: Readable<T> {}

/// A buffer a host collective writes (the host twin of cudarc's `DevicePtrMut`). Sealed.
pub trait CpuBufferMut<T: CpuType>: CpuBuffer<T> + Writable<T> {}

fn plain<T>(s: &[T]) -> HostRegion<'_> {
    HostRegion { ptr: s.as_ptr().cast::<u8>().cast_mut(), bytes: std::mem::size_of_val(s), symmetric: None }
}

fn plain_mut<T>(s: &mut [T]) -> HostRegion<'_> {
    HostRegion { ptr: s.as_mut_ptr().cast::<u8>(), bytes: std::mem::size_of_val(s), symmetric: None }
}

impl<T: CpuType> Readable<T> for [T] {
    fn host_region(&self) -> HostRegion<'_> {
        plain(self)
    }
}
impl<T: CpuType> Writable<T> for [T] {
    fn host_region_mut(&mut self) -> HostRegion<'_> {
        plain_mut(self)
    }
}
impl<T: CpuType> CpuBuffer<T> for [T] {}
impl<T: CpuType> CpuBufferMut<T> for [T] {}

impl<T: CpuType> Readable<T> for Vec<T> {
    fn host_region(&self) -> HostRegion<'_> {
        plain(self)
    }
}
impl<T: CpuType> Writable<T> for Vec<T> {
    fn host_region_mut(&mut self) -> HostRegion<'_> {
        plain_mut(self)
    }
}
impl<T: CpuType> CpuBuffer<T> for Vec<T> {}
impl<T: CpuType> CpuBufferMut<T> for Vec<T> {}

impl<T: CpuType, const N: usize> Readable<T> for [T; N] {
    fn host_region(&self) -> HostRegion<'_> {
        plain(self)
    }
}
impl<T: CpuType, const N: usize> Writable<T> for [T; N] {
    fn host_region_mut(&mut self) -> HostRegion<'_> {
        plain_mut(self)
    }
}
impl<T: CpuType, const N: usize> CpuBuffer<T> for [T; N] {}
impl<T: CpuType, const N: usize> CpuBufferMut<T> for [T; N] {}

impl<T: CpuType> Readable<T> for CpuSymmetricBuffer<T> {
    fn host_region(&self) -> HostRegion<'_> {
        let bytes = self.len * size_of::<T>();
        HostRegion { ptr: self.alloc.base(self.rank), bytes, symmetric: Some((&self.alloc, self.rank)) }
    }
}
impl<T: CpuType> Writable<T> for CpuSymmetricBuffer<T> {
    fn host_region_mut(&mut self) -> HostRegion<'_> {
        self.host_region()
    }
}
impl<T: CpuType> CpuBuffer<T> for CpuSymmetricBuffer<T> {}
impl<T: CpuType> CpuBufferMut<T> for CpuSymmetricBuffer<T> {}

/// Where the ranks of one world meet: each rank's `k`-th meeting meets every other rank's
/// `k`-th, exchanging a payload `P`; the first rank to see every payload decides the outcome
/// `O` that every rank returns. Used to allocate symmetric buffers and to check that a call
/// with symmetric buffers is the same call on every rank.
pub(crate) struct Meetings<P, O> {
    state: Mutex<MeetingsState<P, O>>,
    arrived: Condvar,
}

struct MeetingsState<P, O> {
    /// Per rank: the index of its next meeting.
    next: Vec<u64>,
    open: HashMap<u64, Meeting<P, O>>,
}

struct Meeting<P, O> {
    /// Per rank: its payload, once it arrived.
    payloads: Vec<Option<P>>,
    outcome: Option<O>,
    /// The rank whose wait expired before every rank arrived, what it reported, and the
    /// ranks missing then.
    abandoned: Option<(usize, String, Vec<usize>)>,
    /// Ranks that have left (the meeting is dropped when all have).
    left: usize,
}

impl<P, O: Clone> Meetings<P, O> {
    pub(crate) fn new(world: usize) -> Self {
        Self {
            state: Mutex::new(MeetingsState { next: vec![0; world], open: HashMap::new() }),
            arrived: Condvar::new(),
        }
    }

    /// Rank `rank`'s next meeting: waits up to `timeout` for every rank's payload, then
    /// returns the outcome `decide` made of them (in rank order). A rank whose wait expires
    /// returns [`Error::Timeout`] naming the first rank missing; so does every rank that was
    /// waiting with it, while a rank that was missing and comes later gets
    /// [`Error::PeerFailed`] naming the rank that gave up.
    pub(crate) fn meet(
        &self,
        rank: usize,
        payload: P,
        timeout: Duration,
        during: &str,
        decide: impl FnOnce(&[P]) -> O,
    ) -> Result<O, Error> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let world = state.next.len();
        let index = state.next[rank];
        state.next[rank] += 1;
        let meeting = state.open.entry(index).or_insert_with(|| Meeting {
            payloads: (0..world).map(|_| None).collect(),
            outcome: None,
            abandoned: None,
            left: 0,
        });
        meeting.payloads[rank] = Some(payload);
        self.arrived.notify_all();
        let deadline = Instant::now() + timeout;
        let mut decide = Some(decide);
        let result = loop {
            let Some(meeting) = state.open.get_mut(&index) else {
                break Err(Error::Protocol { peer: None, what: format!("meeting {index} vanished ({during})") });
            };
            if let Some((gave_up, error, missing)) = &meeting.abandoned {
                // A rank that was missing hears of the rank that gave up; one that was there
                // waited for the same missing rank, which its error names (not the live
                // rank whose wait expired first).
                break Err(match missing.iter().find(|&&m| m != rank) {
                    Some(&peer) if !missing.contains(&rank) => Error::Timeout {
                        rank,
                        peer,
                        waited: timeout,
                        during: format!("{during}; rank {gave_up}'s wait expired first"),
                    },
                    _ => Error::PeerFailed { rank, peer: *gave_up, during: during.into(), error: error.clone() },
                });
            }
            if meeting.outcome.is_none() && meeting.payloads.iter().all(Option::is_some) {
                let all: Vec<P> = std::mem::take(&mut meeting.payloads).into_iter().flatten().collect();
                let decide =
                    decide.take().ok_or_else(|| Error::Protocol { peer: None, what: "decided twice".into() })?;
                meeting.outcome = Some(decide(&all));
                self.arrived.notify_all();
            }
            if let Some(outcome) = &meeting.outcome {
                break Ok(outcome.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> =
                    meeting.payloads.iter().enumerate().filter(|(_, p)| p.is_none()).map(|(r, _)| r).collect();
                let peer = missing.first().copied().unwrap_or((rank + 1) % world);
                let error = Error::Timeout { rank, peer, waited: timeout, during: during.into() };
                meeting.abandoned = Some((rank, error.to_string(), missing));
                self.arrived.notify_all();
                break Err(error);
            }
            state = self.arrived.wait_timeout(state, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        };
        if let Some(meeting) = state.open.get_mut(&index) {
            meeting.left += 1;
            if meeting.left == world {
                state.open.remove(&index);
            }
        }
        result
    }
}
