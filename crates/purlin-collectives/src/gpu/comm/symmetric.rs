//! Symmetric memory: device buffers that every rank of a communicator allocates together, so
//! that every rank can address every peer's (NCCL's `ncclMemAlloc` + `ncclCommWindowRegister`
//! with symmetric windows, PyTorch's symmetric memory).
//!
//! A collective whose buffers *are* [`SymmetricBuffer`]s (start at their base address) may take
//! the one-copy path instead of staging every byte through the workspace:
//! - AllGather, AllToAll and their V forms with a symmetric output store straight into the
//!   peers' outputs (`purlin_snac` `PlanConfig::peer_outputs`);
//! - ReduceScatter and its V form with a symmetric input reduce their part straight from every
//!   rank's input (`PlanConfig::peer_inputs`);
//! - AllReduce with both symmetric (or in place on one) reduces its shard so and stores it into
//!   every peer's output (two-shot).
//!
//! In place, the one buffer is both. Every rank of such a call must pass symmetric buffers in
//! the same roles; a rank that passes other memory runs the staged plan, whose call digest
//! differs, so with the call check on ([`crate::CommConfig::call_check`], the default) every
//! rank gets [`Error::Mismatch`]; with it off the call ends in a device timeout on every rank
//! (the one-copy plan's flags never meet the staged plan's). Never corrupted memory. Other
//! buffers take the staged path.
//!
//! A symmetric buffer is used from its start: it cannot be sliced ([`SymmetricBuffer::set_len`]
//! shows a prefix, [`SymmetricBuffer::view_as`] another element type), and a buffer that
//! starts *inside* one (a raw pointer at an offset) is refused with
//! [`Error::InvalidArgument`] before anything runs. Taking the one-copy path there would
//! address every peer's buffer at this rank's offset, which no check holds the peers to;
//! taking the staged path silently would hide that the call is not one-copy.
//!
//! Purlin allocates the memory itself (`cuMemAlloc`, shared by CUDA IPC between processes, by
//! address within one): cudarc's allocations come from a stream-ordered pool that legacy IPC
//! cannot export. [`crate::Comm::free_symmetric`] frees a buffer on every rank at once (like
//! `ncclCommWindowDeregister` + `ncclMemFree`); the communicator's teardown frees the rest.
//! Both meet the peers first, and neither frees memory that another handle still shows: a
//! buffer still held at teardown keeps its memory (reported as leaked bytes), so a handle
//! never dangles.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop, sys};

use purlin_snac::CollectiveSpec;

use super::setup::agree;
use super::{Comm, Owner, PeerBuffers, SymmetricRecord};
use crate::call::in_place_layout;
use crate::call::types::NcclType;
use crate::error::{Error, driver};
use crate::gpu::ipc::IpcBackend;
use crate::workspace::SymmetricAlloc;

/// One symmetric allocation as this rank sees it (shared by its buffers and the communicator).
#[derive(Debug)]
pub(crate) struct SymmetricMem {
    /// Bytes per rank.
    pub(crate) bytes: usize,
    /// Every rank's base as mapped here (this rank's own at its index).
    pub(crate) addrs: Vec<u64>,
    pub(crate) rank: usize,
}

/// `len` elements of `T` on this rank's GPU, allocated by every rank of a communicator at
/// once ([`crate::Comm::alloc_symmetric`]) and addressable by every peer.
///
/// It implements cudarc's [`DevicePtr`] and [`DevicePtrMut`], so it goes wherever a
/// `CudaSlice` does (`memcpy_htod`, `memcpy_dtoh`, kernel arguments, collectives). cudarc's
/// event tracking does not cover it: order work on other streams than the communicator's
/// yourself, as with any raw device memory.
#[derive(Debug)]
pub struct SymmetricBuffer<T> {
    mem: Arc<SymmetricMem>,
    stream: Arc<CudaStream>,
    /// Elements the buffer shows (`DeviceSlice::len`).
    len: usize,
    /// Only a label: no `T` lives on the host, so the buffer is `Send` and `Sync` for any `T`.
    _elem: PhantomData<fn() -> T>,
}

impl<T: NcclType> SymmetricBuffer<T> {
    pub(crate) fn new(mem: Arc<SymmetricMem>, stream: Arc<CudaStream>, len: usize) -> Self {
        SymmetricBuffer { mem, stream, len, _elem: PhantomData }
    }

    /// The allocation this handle shares.
    pub(crate) fn mem(&self) -> &Arc<SymmetricMem> {
        &self.mem
    }

    /// Elements of `T` the allocation holds (on every rank alike).
    pub fn capacity(&self) -> usize {
        self.mem.bytes / std::mem::size_of::<T>()
    }

    /// Shows the first `len` elements only (at most [`Self::capacity`]): collectives check
    /// buffer lengths exactly, and an AllToAllV's output differs from rank to rank while
    /// every rank's allocation is the same size.
    pub fn set_len(&mut self, len: usize) -> Result<(), Error> {
        if len > self.capacity() {
            return Err(Error::InvalidArgument(format!("{len} elements in a symmetric buffer of {}", self.capacity())));
        }
        self.len = len;
        Ok(())
    }

    /// Another handle on the same memory as `len` elements of `U` from its start (like
    /// cudarc's `transmute`): the same bytes, so writes through either are seen by both.
    pub fn view_as<U: NcclType>(&self, len: usize) -> Result<SymmetricBuffer<U>, Error> {
        let mut v = SymmetricBuffer::new(self.mem.clone(), self.stream.clone(), 0);
        v.set_len(len)?;
        Ok(v)
    }

    /// This rank's device address of the buffer.
    pub fn device_address(&self) -> sys::CUdeviceptr {
        self.mem.addrs[self.mem.rank]
    }
}

impl<T> DeviceSlice<T> for SymmetricBuffer<T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DevicePtr<T> for SymmetricBuffer<T> {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.mem.addrs[self.mem.rank], SyncOnDrop::Record(None))
    }
}

impl<T> DevicePtrMut<T> for SymmetricBuffer<T> {
    fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.mem.addrs[self.mem.rank], SyncOnDrop::Record(None))
    }
}

// By reference too, so that calls taking buffers by value (a `Group`'s, like
// `cudarc::nccl::Group`'s) borrow a symmetric buffer instead of consuming it.
impl<T> DeviceSlice<T> for &SymmetricBuffer<T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DevicePtr<T> for &SymmetricBuffer<T> {
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (**self).device_ptr(stream)
    }
}

impl<T> DeviceSlice<T> for &mut SymmetricBuffer<T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DevicePtr<T> for &mut SymmetricBuffer<T> {
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (**self).device_ptr(stream)
    }
}

impl<T> DevicePtrMut<T> for &mut SymmetricBuffer<T> {
    fn device_ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (**self).device_ptr_mut(stream)
    }
}

impl Comm {
    /// Which of a call's buffers are symmetric (the one-copy path), with every rank's as
    /// mapped here: out of place, `input` and `output` each; in place, the one buffer at
    /// `output`, which holds every rank's input and output at the offsets of NCCL's convention.
    /// Every call asks, so a communicator without symmetric buffers answers after one lock.
    pub(crate) fn peer_buffers(
        &self,
        spec: &CollectiveSpec,
        in_place: bool,
        input: u64,
        output: u64,
    ) -> Result<PeerBuffers, Error> {
        let records = self.symmetric.lock().unwrap_or_else(|e| e.into_inner());
        if records.is_empty() {
            return Ok(PeerBuffers::default());
        }
        // Every rank's base of the symmetric buffer at `ptr`, each of which must hold
        // `need(rank)` bytes (peers access every rank's), shifted by `shift(rank)`.
        let at = |ptr: u64, need: &dyn Fn(u32) -> u64, shift: &dyn Fn(u32) -> u64, what: &str| {
            let inside = |m: &&SymmetricMem| (m.addrs[self.rank]..m.addrs[self.rank] + m.bytes as u64).contains(&ptr);
            let Some(m) = records.iter().map(|r| &*r.mem).find(inside) else { return Ok(None) };
            let offset = ptr - m.addrs[self.rank];
            if offset != 0 {
                // The one-copy plan would address every peer's buffer at this rank's offset,
                // which nothing checks the peers agree on.
                return Err(Error::InvalidArgument(format!(
                    "the {what} starts {offset} bytes into a symmetric buffer of {} bytes: collectives take symmetric \
                     buffers from their start only (SymmetricBuffer::set_len shows a prefix, view_as another type; \
                     for a part further in, use a symmetric buffer of its own)",
                    m.bytes
                )));
            }
            if let Some(q) = (0..self.world as u32).find(|&q| need(q) > m.bytes as u64) {
                return Err(Error::InvalidArgument(format!(
                    "a symmetric buffer of {} bytes as the {what}: rank {q}'s needs {} bytes, and peers access every \
                     rank's buffer",
                    m.bytes,
                    need(q)
                )));
            }
            let mut bases = [0; purlin_snac::MAX_WORLD];
            for (q, (b, a)) in bases.iter_mut().zip(&m.addrs).enumerate() {
                *b = a + shift(q as u32);
            }
            Ok(Some(bases))
        };
        if !in_place {
            return Ok(PeerBuffers {
                inputs: at(input, &|q| spec.input_bytes(q), &|_| 0, "input")?,
                outputs: at(output, &|q| spec.output_bytes(q), &|_| 0, "output")?,
            });
        }
        let layout = |q: u32| in_place_layout(spec, q);
        Ok(PeerBuffers {
            inputs: at(output, &|q| layout(q).2, &|q| layout(q).0, "buffer")?,
            outputs: at(output, &|q| layout(q).2, &|q| layout(q).1, "buffer")?,
        })
    }

    /// Allocates `len` elements of `T` on every rank at once (a collective call: every rank
    /// calls it, in the same order, with the same `len`) and maps every peer's, like NCCL's
    /// `ncclMemAlloc` + `ncclCommWindowRegister`. Collectives on such buffers take the
    /// one-copy path ([`SymmetricBuffer`]). The memory is zeroed, and released with the
    /// communicator (unless a buffer is still held then).
    pub fn alloc_symmetric<T: NcclType>(&self, len: usize) -> Result<SymmetricBuffer<T>, Error> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).filter(|&b| b > 0).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "a symmetric buffer of {len} elements of {} bytes",
                std::mem::size_of::<T>()
            ))
        })?;
        let mut backend = IpcBackend::new(self.context().clone());
        let alloc = SymmetricAlloc::establish(&self.host, &mut backend, bytes, "symmetric buffer")?;
        let mem = Arc::new(SymmetricMem { bytes, addrs: alloc.addrs().to_vec(), rank: self.rank });
        let alloc = match &self.owner {
            Owner::Group(group) => {
                group.symmetric.lock().unwrap_or_else(|e| e.into_inner()).push((alloc, backend, mem.clone()));
                None
            }
            _ => Some((alloc, backend)),
        };
        self.symmetric.lock().unwrap_or_else(|e| e.into_inner()).push(SymmetricRecord { mem: mem.clone(), alloc });
        Ok(SymmetricBuffer::new(mem, self.stream.clone(), len))
    }

    /// Frees a symmetric buffer on every rank at once, like NCCL's `ncclCommWindowDeregister`
    /// followed by `ncclMemFree`: a collective call (every rank calls it, in the same order,
    /// with its handle of the same allocation). It waits for this rank's work on the
    /// communicator's stream and meets the peers, so no rank's collective still reads or
    /// writes the memory when it is freed. Work on other streams is the caller's to finish
    /// first, and a CUDA graph that captured calls on the buffer must not be launched again.
    ///
    /// Refused on every rank, freeing nothing, where a rank's buffer is not one of this
    /// communicator's, is not the allocation its peers free, or is still shown by another
    /// handle there ([`SymmetricBuffer::view_as`]); the memory then stays with the
    /// communicator until its teardown, and the other handles keep working.
    pub fn free_symmetric<T: NcclType>(&self, buffer: SymmetricBuffer<T>) -> Result<(), Error> {
        const DURING: &str = "freeing a symmetric buffer";
        let mem = buffer.mem().clone();
        drop(buffer);
        // This rank's records and, in a single-process group, the group's list hold it too.
        let bookkeeping = 2 + usize::from(matches!(self.owner, Owner::Group(_)));
        let index = {
            let records = self.symmetric.lock().unwrap_or_else(|e| e.into_inner());
            records.iter().position(|r| Arc::ptr_eq(&r.mem, &mem))
        };
        let mine = match index {
            None => Err(Error::InvalidArgument("not a symmetric buffer of this communicator".into())),
            Some(_) if Arc::strong_count(&mem) > bookkeeping => Err(Error::InvalidArgument(format!(
                "{} other handles still show this symmetric buffer",
                Arc::strong_count(&mem) - bookkeeping
            ))),
            Some(i) => Ok(i),
        };
        // Allocations are listed in the same order on every rank: the same index is the same
        // allocation.
        let wire = index.map_or(u64::MAX, |i| i as u64).to_le_bytes();
        let indices = self.host.all_gather(&wire, &format!("{DURING}: which one"))?;
        let mine = mine.and_then(|i| match indices.iter().position(|w| *w != wire) {
            Some(peer) => Err(Error::Mismatch {
                rank: self.rank,
                peer,
                what: format!("which symmetric buffer to free (this rank: allocation {i})"),
            }),
            None => Ok(i),
        });
        let index = agree(&self.host, mine, DURING)?;
        let record = self.symmetric.lock().unwrap_or_else(|e| e.into_inner()).remove(index);
        drop(mem);
        // Every rank's kernels on it end before any rank frees it: each waits for its own,
        // then meets the others.
        let synced =
            self.join_launches().and_then(|()| self.stream.synchronize().map_err(driver("cuStreamSynchronize")));
        match (&self.owner, record.alloc) {
            (_, Some((alloc, mut backend))) => {
                if let Err(e) = synced {
                    alloc.abandon(&mut backend);
                    return Err(e);
                }
                let (_, error) = alloc.meet_and_free(&self.host, &mut backend, false, DURING);
                error.map_or(Ok(()), Err)
            }
            (Owner::Group(group), None) => {
                // Left in the group's list on failure: the group frees it once every GPU of
                // the group is synchronised.
                synced?;
                self.host.barrier(&format!("{DURING}: device work done"))?;
                let mut list = group.symmetric.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(at) = list.iter().position(|(_, _, m)| Arc::ptr_eq(m, &record.mem)) {
                    let (alloc, mut backend, _) = list.remove(at);
                    drop(list);
                    alloc.discard_now(&mut backend, false);
                }
                Ok(())
            }
            // Only a group's communicators leave the allocation to their owner.
            (_, None) => Ok(()),
        }
    }

    /// [`Comm::free_symmetric`] on every communicator of a single-process group at once (one
    /// thread per rank): `buffers[r]` is rank `r`'s handle.
    pub fn free_symmetric_group<T: NcclType>(comms: &[Comm], buffers: Vec<SymmetricBuffer<T>>) -> Result<(), Error> {
        if buffers.len() != comms.len() {
            return Err(Error::InvalidArgument(format!(
                "{} symmetric buffers for {} communicators",
                buffers.len(),
                comms.len()
            )));
        }
        std::thread::scope(|s| {
            let handles: Vec<_> =
                comms.iter().zip(buffers).map(|(c, b)| s.spawn(move || c.free_symmetric(b))).collect();
            handles.into_iter().try_for_each(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::Protocol { peer: None, what: "symmetric free thread panicked".into() })
                })
            })
        })
    }

    /// [`Comm::alloc_symmetric`] on every communicator of a single-process group at once
    /// (one thread per rank), for the communicators of [`Comm::from_devices`].
    pub fn alloc_symmetric_group<T: NcclType>(comms: &[Comm], len: usize) -> Result<Vec<SymmetricBuffer<T>>, Error> {
        std::thread::scope(|s| {
            let handles: Vec<_> = comms.iter().map(|c| s.spawn(move || c.alloc_symmetric::<T>(len))).collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::Protocol { peer: None, what: "symmetric allocation thread panicked".into() })
                    })
                })
                .collect()
        })
    }
}
