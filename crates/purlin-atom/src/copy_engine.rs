//! The copy-engine datapath: bulk copies that use no SMs, ordered with the rest of the work
//! through 64-bit words in device memory.
//!
//! A [`CopyEngine`] enqueues work on a CUDA stream; the GPU's copy engines (DMA) move the
//! bytes. Three kinds of operation, all stream-ordered and all capturable in CUDA graphs:
//! - **copies**: [`CopyEngine::copy`] and [`CopyEngine::copy_batch`] (`cuMemcpyAsync`; a batch
//!   takes `cuMemcpyBatchAsync` when the stream is not capturing, which graphs cannot hold);
//! - **word writes**: [`CopyEngine::write_value`] (`cuStreamWriteValue64`, default flags: the
//!   write is preceded by a memory barrier, so every earlier operation of the stream, copies
//!   included, is complete and its writes visible before the word changes: "copy, then
//!   write") and [`CopyEngine::write_value_from`] (an 8-byte copy-engine copy of a word whose
//!   value a kernel computed, so a graph replay writes the current value, not a frozen one);
//! - **word waits**: [`CopyEngine::wait_value`] (`cuStreamWaitValue64`, [`WaitCondition`]):
//!   later operations of the stream start only once the word satisfies the condition ("wait,
//!   then copy"); with the flush flag where the device supports it
//!   (`CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES`).
//!
//! Values given to `write_value`/`wait_value` are frozen into a captured graph: a replay
//! writes and waits for the same values again, so a protocol that replays either compares
//! with [`WaitCondition::Equal`] and resets the word after the wait (the waiter owns the
//! reset), or takes its values from device memory ([`CopyEngine::write_value_from`]).
//! A stream wait is not bounded: the caller makes sure the word is written (or that a
//! watchdog releases it). docs/perf/copy-engines.md is the contract in full.
//!
//! The words are plain device memory (`cuMemAlloc`, 8-byte aligned, not managed memory), on
//! this device or a peer's. This module knows nothing about what the words mean.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, DriverError, sys};

/// How a stream wait compares the word with its target value (the device's and the host
/// twin's semantics are the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WaitCondition {
    /// `(word - target) as i64 >= 0`: the cyclic "at least" of `CU_STREAM_WAIT_VALUE_GEQ`,
    /// for counters that only grow.
    AtLeast,
    /// `word == target` (`CU_STREAM_WAIT_VALUE_EQ`).
    Equal,
}

impl WaitCondition {
    /// Whether `current` satisfies the condition for `target`.
    pub fn holds(self, current: u64, target: u64) -> bool {
        match self {
            WaitCondition::AtLeast => current.wrapping_sub(target) as i64 >= 0,
            WaitCondition::Equal => current == target,
        }
    }

    fn flag(self) -> u32 {
        match self {
            WaitCondition::AtLeast => sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
            WaitCondition::Equal => sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ as u32,
        }
    }
}

/// One copy of a batch: `bytes` bytes from device address `src` to `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CopyOp {
    /// Destination address (this device or a peer's).
    pub dst: u64,
    /// Source address (this device or a peer's).
    pub src: u64,
    /// Bytes to copy.
    pub bytes: usize,
}

/// Errors of the copy-engine datapath.
#[derive(Debug, thiserror::Error)]
pub enum CopyEngineError {
    /// No CUDA driver library on this machine.
    #[error("no CUDA driver (libcuda) on this machine")]
    NoDriver,
    /// A driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(#[from] DriverError),
    /// The device cannot run 64-bit stream memory operations.
    #[error("device {device} does not support 64-bit stream memory operations (cuStreamWaitValue64)")]
    NoStreamMemOps {
        /// The device ordinal.
        device: usize,
    },
    /// The stream belongs to another context than the engine's.
    #[error("the stream belongs to device {stream_device}, the copy engine to device {engine_device}")]
    WrongContext {
        /// The stream's device ordinal.
        stream_device: usize,
        /// The engine's device ordinal.
        engine_device: usize,
    },
    /// A word address is not 8-byte aligned (or is null).
    #[error("word address {addr:#x} is not a non-null 8-byte-aligned device address")]
    MisalignedWord {
        /// The address.
        addr: u64,
    },
    /// Source and destination ranges partially overlap (copy engines do not order bytes
    /// within one copy).
    #[error("copy {index}: destination {dst:#x} and source {src:#x} overlap over {bytes} bytes")]
    Overlap {
        /// The copy's index in its batch (0 for a single copy).
        index: usize,
        /// Destination address.
        dst: u64,
        /// Source address.
        src: u64,
        /// The copy's length.
        bytes: usize,
    },
    /// A range wraps around the address space.
    #[error("copy {index}: {bytes} bytes from {addr:#x} wrap around the address space")]
    AddressOverflow {
        /// The copy's index in its batch.
        index: usize,
        /// The start address.
        addr: u64,
        /// The length.
        bytes: usize,
    },
}

/// Checks one copy's ranges; `Ok(false)` where it has nothing to do (empty, or in place).
fn check_copy(index: usize, op: &CopyOp) -> Result<bool, CopyEngineError> {
    if op.bytes == 0 || op.dst == op.src {
        return Ok(false);
    }
    let len = op.bytes as u64;
    for addr in [op.dst, op.src] {
        if addr.checked_add(len).is_none() {
            return Err(CopyEngineError::AddressOverflow { index, addr, bytes: op.bytes });
        }
    }
    if op.dst < op.src + len && op.src < op.dst + len {
        return Err(CopyEngineError::Overlap { index, dst: op.dst, src: op.src, bytes: op.bytes });
    }
    Ok(true)
}

fn check_word(addr: u64) -> Result<(), CopyEngineError> {
    if addr == 0 || addr % 8 != 0 {
        return Err(CopyEngineError::MisalignedWord { addr });
    }
    Ok(())
}

/// The copy-engine datapath of one device (its context).
#[derive(Debug, Clone)]
pub struct CopyEngine {
    ctx: Arc<CudaContext>,
    flush_remote_writes: bool,
}

impl CopyEngine {
    /// The copy engine of `ctx`'s device. Errors where the device has no 64-bit stream
    /// memory operations.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self, CopyEngineError> {
        if !crate::device::driver_present() {
            return Err(CopyEngineError::NoDriver);
        }
        let mem_ops = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS)?;
        if mem_ops != 1 {
            return Err(CopyEngineError::NoStreamMemOps { device: ctx.ordinal() });
        }
        let flush = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES)?;
        Ok(Self { ctx: ctx.clone(), flush_remote_writes: flush == 1 })
    }

    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Whether waits flush outstanding remote writes (`CU_STREAM_WAIT_VALUE_FLUSH`).
    pub fn flushes_remote_writes(&self) -> bool {
        self.flush_remote_writes
    }

    fn check_stream(&self, stream: &CudaStream) -> Result<(), CopyEngineError> {
        if stream.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(CopyEngineError::WrongContext {
                stream_device: stream.context().ordinal(),
                engine_device: self.ctx.ordinal(),
            });
        }
        self.ctx.bind_to_thread()?;
        Ok(())
    }

    /// Copies `bytes` bytes from `src` to `dst` on `stream`: it starts after the stream's
    /// earlier operations and completes before its later ones. Graph-capturable.
    ///
    /// # Safety
    /// `src` must be readable and `dst` writable for `bytes` bytes (device memory of this
    /// device or a peer's) until the copy completes; nothing else may write `dst` or `src`
    /// meanwhile.
    pub unsafe fn copy(&self, stream: &CudaStream, dst: u64, src: u64, bytes: usize) -> Result<(), CopyEngineError> {
        // SAFETY: forwarded from the caller.
        unsafe { self.copy_batch(stream, &[CopyOp { dst, src, bytes }]) }
    }

    /// Copies every op of `ops` on `stream`, in no particular order among themselves: the
    /// batch starts after the stream's earlier operations and completes before its later
    /// ones. Outside graph capture a batch of several copies is one `cuMemcpyBatchAsync`
    /// (the driver spreads it over the copy engines); while capturing, one copy node each.
    ///
    /// # Safety
    /// As [`copy`](Self::copy), for every op; no op's destination may overlap another op's
    /// source or destination.
    pub unsafe fn copy_batch(&self, stream: &CudaStream, ops: &[CopyOp]) -> Result<(), CopyEngineError> {
        self.check_stream(stream)?;
        let mut live = Vec::with_capacity(ops.len());
        for (index, op) in ops.iter().enumerate() {
            if check_copy(index, op)? {
                live.push(*op);
            }
        }
        let capturing = stream.capture_status()? != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        if live.len() > 1 && !capturing {
            let mut dsts: Vec<sys::CUdeviceptr> = live.iter().map(|o| o.dst).collect();
            let mut srcs: Vec<sys::CUdeviceptr> = live.iter().map(|o| o.src).collect();
            let mut sizes: Vec<usize> = live.iter().map(|o| o.bytes).collect();
            let mut attrs = [sys::CUmemcpyAttributes {
                srcAccessOrder: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
                srcLocHint: sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_INVALID, id: 0 },
                dstLocHint: sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_INVALID, id: 0 },
                // Copies within one GPU may otherwise run on SMs; peer copies take the
                // copy engines anyway.
                flags: sys::CUmemcpyFlags::CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE as u32,
            }];
            let mut attr_index = [0usize];
            // SAFETY: the three arrays hold `live.len()` entries each; one attribute applies
            // from copy 0 (stream-ordered source access, no location hints, copy engines
            // preferred); the stream is
            // live and of this context (bound above); the caller vouches for the ranges.
            let status = unsafe {
                sys::cuMemcpyBatchAsync_v2(
                    dsts.as_mut_ptr(),
                    srcs.as_mut_ptr(),
                    sizes.as_mut_ptr(),
                    live.len(),
                    attrs.as_mut_ptr(),
                    attr_index.as_mut_ptr(),
                    1,
                    stream.cu_stream(),
                )
            };
            // A driver without batched copies takes the copies one by one, below.
            if status != sys::CUresult::CUDA_ERROR_NOT_SUPPORTED {
                return Ok(status.result()?);
            }
        }
        for op in &live {
            // SAFETY: the stream is live and of this context (bound above); the caller
            // vouches for the ranges, which were checked not to wrap or overlap.
            unsafe { sys::cuMemcpyAsync(op.dst, op.src, op.bytes, stream.cu_stream()) }.result()?;
        }
        Ok(())
    }

    /// Writes `value` to the 8-byte word at `word` on `stream`, after a memory barrier: every
    /// earlier operation of the stream is complete and its writes are visible before the word
    /// changes. Graph-capturable; a captured value is replayed as it is.
    ///
    /// # Safety
    /// `word` must be device memory (this device's or a peer's, not managed) that stays
    /// allocated until the write is performed.
    pub unsafe fn write_value(&self, stream: &CudaStream, word: u64, value: u64) -> Result<(), CopyEngineError> {
        self.check_stream(stream)?;
        check_word(word)?;
        let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
        // SAFETY: an aligned device word the caller vouches for; a live stream of this
        // context (bound above); default flags keep the memory barrier.
        unsafe { sys::cuStreamWriteValue64_v2(stream.cu_stream(), word, value, flags) }.result()?;
        Ok(())
    }

    /// Copies the 8-byte value at `value_src` to the word at `word` on `stream`, after the
    /// stream's earlier operations complete: a write whose value is read when it runs (a
    /// kernel's epoch, say), so a graph replay writes the current value.
    ///
    /// # Safety
    /// Both addresses must be device memory (this device's or a peer's) that stays allocated
    /// until the copy is performed.
    pub unsafe fn write_value_from(
        &self,
        stream: &CudaStream,
        word: u64,
        value_src: u64,
    ) -> Result<(), CopyEngineError> {
        check_word(word)?;
        check_word(value_src)?;
        // SAFETY: forwarded from the caller; two aligned 8-byte words.
        unsafe { self.copy(stream, word, value_src, 8) }
    }

    /// Makes the later operations of `stream` wait until the word at `word` satisfies
    /// `condition` for `value` (flushing outstanding remote writes where the device can, so
    /// writes that reached the device before the word did are visible to what follows).
    /// Graph-capturable; a captured value is replayed as it is. Unbounded: nothing times out.
    ///
    /// # Safety
    /// `word` must be device memory (this device's or a peer's, not managed) that stays
    /// allocated until the wait is satisfied, and something must eventually satisfy it, or
    /// the stream (and everything ordered after it) never proceeds.
    pub unsafe fn wait_value(
        &self,
        stream: &CudaStream,
        word: u64,
        value: u64,
        condition: WaitCondition,
    ) -> Result<(), CopyEngineError> {
        self.check_stream(stream)?;
        check_word(word)?;
        let mut flags = condition.flag();
        if self.flush_remote_writes {
            flags |= sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_FLUSH as u32;
        }
        // SAFETY: an aligned device word the caller vouches for; a live stream of this
        // context (bound above); a comparison flag, plus the flush the device supports.
        unsafe { sys::cuStreamWaitValue64_v2(stream.cu_stream(), word, value, flags) }.result()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_least_is_cyclic_like_the_driver() {
        assert!(WaitCondition::AtLeast.holds(5, 5));
        assert!(WaitCondition::AtLeast.holds(6, 5));
        assert!(!WaitCondition::AtLeast.holds(4, 5));
        // Past the wrap, a grown counter still counts as larger.
        assert!(WaitCondition::AtLeast.holds(1, u64::MAX));
        assert!(!WaitCondition::AtLeast.holds(u64::MAX, 1));
        assert!(WaitCondition::Equal.holds(7, 7));
        assert!(!WaitCondition::Equal.holds(8, 7));
    }

    #[test]
    fn copies_are_checked_before_anything_is_enqueued() {
        let op = |dst, src, bytes| CopyOp { dst, src, bytes };
        assert!(!check_copy(0, &op(0x1000, 0x2000, 0)).unwrap());
        assert!(!check_copy(0, &op(0x1000, 0x1000, 64)).unwrap());
        assert!(check_copy(0, &op(0x1000, 0x1040, 64)).unwrap());
        assert!(matches!(check_copy(3, &op(0x1000, 0x1020, 64)), Err(CopyEngineError::Overlap { index: 3, .. })));
        assert!(matches!(check_copy(1, &op(0x1020, 0x1000, 64)), Err(CopyEngineError::Overlap { index: 1, .. })));
        assert!(matches!(check_copy(0, &op(u64::MAX - 8, 0x10, 64)), Err(CopyEngineError::AddressOverflow { .. })));
        assert!(check_word(0x1008).is_ok());
        assert!(matches!(check_word(0x1004), Err(CopyEngineError::MisalignedWord { addr: 0x1004 })));
        assert!(matches!(check_word(0), Err(CopyEngineError::MisalignedWord { addr: 0 })));
    }

    #[test]
    fn the_engine_can_be_shared_across_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<CopyEngine>();
    }
}
