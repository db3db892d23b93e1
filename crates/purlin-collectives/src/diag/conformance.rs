//! Test-only conformance hooks for the device executor (docs/design.md §3.4): run a *given* plan —
//! possibly modified, never verified — on this rank's GPU with the executor's trace buffer
//! on, and read back what every block executed.
//!
//! This is not an API for programs. It exists so a test can show that the device executor
//! runs the plan it is handed and nothing else: a plan with one region shifted by one must
//! fail the output check on the GPU, and the (block, step, chunk, epoch) trace the kernel
//! records must equal the host executor's ([`crate::cpu::executor::HostWorld::execute`]) for the
//! same plan. Everything here is `#[doc(hidden)]`.
//!
//! The kernel's trace (`kernels/snac/executor.cu`, `trace`): per block, `capacity` entries of
//! `TRACE_WORDS` `u64` words; entry 0 holds the number of steps the block recorded (first
//! word), the block's end time (second word) and its start time (third word), then one entry per executed step — `(block,
//! word offset of the step's record in the parameter block, chunk, epoch at entry, start time
//! in ns of the GPU's global timer)` — recorded before the step runs, inactive loop iterations
//! included, exactly where the host executor records its [`TraceEntry`]. Here the word offset
//! is mapped back to the host's step identity (top-level step index, loop-body index) by
//! walking the plan's parameter words (layout: [`purlin_snac::params`]).

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use purlin_snac::{CollectiveSpec, Plan, Step};

use crate::call::types::NcclType;
use crate::cpu::executor::TraceEntry;
use crate::error::{Error, driver};
use crate::gpu::comm::Comm;

/// The opcode of a chunk loop record (`purlin_snac::params`, module docs).
const OP_LOOP: u64 = 1;

/// Word offset of each step record → (block, top-level step index, loop-body index).
type StepMap = HashMap<u64, (u32, u32, Option<u32>)>;

/// Most trace words one conformance launch may allocate (256 MiB).
const MAX_TRACE_WORDS: usize = 32 << 20;

/// Words per trace entry (`kTraceWords` in `kernels/snac/executor.cu`).
const TRACE_WORDS: usize = 5;

/// A block's trace with the GPU's global-timer stamps (see [`ConformanceLaunch::timed_trace`]).
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct TimedBlock {
    /// What the block executed, in order, each with its start time (ns).
    pub steps: Vec<(TraceEntry, u64)>,
    /// When the block's last step finished (ns; 0 if it failed).
    pub end_ns: u64,
    /// When the block began, before its entry loads (ns).
    pub begin_ns: u64,
}

/// A conformance launch in flight (see [`Comm::launch_plan_for_conformance`]).
#[doc(hidden)]
#[derive(Debug)]
pub struct ConformanceLaunch<'a> {
    comm: &'a Comm,
    stream: Arc<CudaStream>,
    trace: CudaSlice<u64>,
    capacity: usize,
    steps: StepMap,
    grid: usize,
}

/// Trace entries each block of `plan` records: its top-level steps, loops counted as
/// trips × body steps (the loop record itself is not traced).
#[doc(hidden)]
pub fn trace_entries_per_block(plan: &Plan) -> Vec<u64> {
    plan.blocks
        .iter()
        .map(|b| {
            b.steps
                .iter()
                .map(|s| match s {
                    Step::ChunkLoop { trips, body } => trips.saturating_mul(body.len() as u64),
                    _ => 1,
                })
                .fold(0u64, u64::saturating_add)
        })
        .collect()
}

/// Maps every step record's word offset in `words` (the plan's parameter block) to (block,
/// top-level step index, loop-body index), checking the walk against the plan's structure.
fn step_offsets(plan: &Plan, words: &[u64]) -> Result<StepMap, Error> {
    let bad = |what: String| Error::InvalidArgument(format!("conformance: parameter block of the plan: {what}"));
    let table = purlin_snac::params::header_fields()
        .into_iter()
        .find(|(name, _)| *name == "block_table")
        .map(|(_, byte)| byte / 8)
        .ok_or_else(|| bad("no block_table field in the header".into()))?;
    let word = |i: usize| words.get(i).copied().ok_or_else(|| bad(format!("word {i} past the end ({})", words.len())));
    let table = word(table)? as usize;
    let record_words = |tag: u64| ((tag >> 8) & 0xffff) as usize;
    let mut map = HashMap::new();
    for (b, block) in plan.blocks.iter().enumerate() {
        let mut at = word(table + 3 * b + 1)? as usize;
        let steps = word(table + 3 * b + 2)? as usize;
        if steps != block.steps.len() {
            return Err(bad(format!("block {b} has {steps} steps in its table, {} in the plan", block.steps.len())));
        }
        for (i, step) in block.steps.iter().enumerate() {
            let tag = word(at)?;
            let len = record_words(tag);
            if len == 0 {
                return Err(bad(format!("an empty record at word {at}")));
            }
            match step {
                Step::ChunkLoop { body, .. } => {
                    if tag & 0xff != OP_LOOP || (tag >> 24) as usize != body.len() {
                        return Err(bad(format!("block {b} step {i}: the record at word {at} is not its loop")));
                    }
                    let mut b_at = at + len;
                    for j in 0..body.len() {
                        map.insert(b_at as u64, (b as u32, i as u32, Some(j as u32)));
                        let l = record_words(word(b_at)?);
                        if l == 0 {
                            return Err(bad(format!("an empty record at word {b_at}")));
                        }
                        b_at += l;
                    }
                    at = b_at;
                }
                _ => {
                    map.insert(at as u64, (b as u32, i as u32, None));
                    at += len;
                }
            }
        }
    }
    Ok(map)
}

impl Comm {
    /// The plan this rank would run for `spec` (derived and cached exactly as a call does).
    /// Conformance tests only.
    #[doc(hidden)]
    pub fn plan_for_conformance(&self, spec: CollectiveSpec, in_place: bool) -> Result<Plan, Error> {
        spec.validate()?;
        Ok(self.prepared(spec, in_place, (false, false))?.plan.clone())
    }

    /// The plan this rank runs for `spec` on buffers at these device addresses (in place:
    /// `output` is the one buffer): one-copy where they are symmetric buffers of this
    /// communicator (resolved exactly as a call does). Tests only.
    #[doc(hidden)]
    pub fn plan_for_buffers(
        &self,
        spec: CollectiveSpec,
        in_place: bool,
        input: u64,
        output: u64,
    ) -> Result<Plan, Error> {
        spec.validate()?;
        let peers = self.peer_buffers(&spec, in_place, input, output)?;
        Ok(self.prepared(spec, in_place, peers.flags())?.plan.clone())
    }

    /// Enqueues one launch of the device executor running `plan` — as given: it is neither
    /// derived nor verified here — on this rank's stream, with the trace buffer on, reading
    /// `input` and writing `output`. Every rank of the communicator must launch a plan of the
    /// same call (their plans' epochs advance together), then collect with
    /// [`ConformanceLaunch::trace`]. Conformance tests only.
    ///
    /// Checked before the launch: the plan is for this rank and world, has no in-place alias
    /// (not supported here), fits the workspace, the co-residency bound and the parameter
    /// block, the buffers (on this GPU) hold the plan's input and output bytes, and where the
    /// plan is one-copy they are symmetric buffers of this communicator. A plan that passes
    /// these checks but is otherwise wrong (a shifted region) runs: reading or writing past
    /// the buffers is the caller's to prevent (give the buffers slack).
    #[doc(hidden)]
    pub fn launch_plan_for_conformance<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        plan: &Plan,
        input: &S,
        output: &mut R,
    ) -> Result<ConformanceLaunch<'_>, Error> {
        if let Some(why) = self.poison.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Err(Error::Poisoned(why));
        }
        if plan.rank as usize != self.rank || plan.spec.world as usize != self.world {
            return Err(Error::InvalidArgument(format!(
                "conformance: a plan for rank {} of world {} given to rank {} of world {}",
                plan.rank, plan.spec.world, self.rank, self.world
            )));
        }
        if plan.resources.alias.is_some() {
            return Err(Error::Unsupported("conformance runs of in-place plans".into()));
        }
        let grid = plan.grid();
        let bound = (self.exec_bound as usize).min(self.layout.config.epoch_words);
        if grid == 0 || grid > bound {
            return Err(Error::InvalidArgument(format!(
                "conformance: a plan of {grid} blocks (this communicator runs 1..={bound})"
            )));
        }
        self.layout.check_resources(&plan.resources)?;
        let elem = std::mem::size_of::<T>() as u64;
        let (in_bytes, out_bytes) = (input.len() as u64 * elem, output.len() as u64 * elem);
        if in_bytes < plan.resources.input_bytes || out_bytes < plan.resources.output_bytes {
            return Err(Error::InvalidArgument(format!(
                "conformance: buffers of {in_bytes} / {out_bytes} bytes for a plan of {} / {}",
                plan.resources.input_bytes, plan.resources.output_bytes
            )));
        }
        self.check_device(input)?;
        self.check_device(output)?;
        self.exec.check_supported(plan)?;
        let words = purlin_snac::params::encode(plan);
        let params = self.exec.params(plan, false)?;
        let steps = step_offsets(plan, &words)?;
        let most = trace_entries_per_block(plan).into_iter().max().unwrap_or(0);
        let capacity = usize::try_from(most.saturating_add(1)).unwrap_or(usize::MAX);
        let trace_words =
            capacity.checked_mul(TRACE_WORDS * grid).filter(|&w| w <= MAX_TRACE_WORDS).ok_or_else(|| {
                Error::Unsupported(format!("conformance: a trace of {most} steps per block × {grid} blocks"))
            })?;
        let stream = self.stream.clone();
        let trace = stream.alloc_zeros::<u64>(trace_words).map_err(driver("cuMemAllocAsync"))?;
        {
            let (trace_ptr, _record_trace) = trace.device_ptr(&stream);
            let (in_ptr, _record_in) = input.device_ptr(&stream);
            let (out_ptr, _record_out) = output.device_ptr_mut(&stream);
            // A one-copy plan addresses every rank's input or output: those must be symmetric
            // buffers of this communicator, resolved as a call resolves them.
            let peers = self.peer_buffers(&plan.spec, false, in_ptr, out_ptr)?;
            let (need_inputs, need_outputs) = plan.peer_spaces();
            if (need_inputs && peers.inputs.is_none()) || (need_outputs && peers.outputs.is_none()) {
                return Err(Error::InvalidArgument(format!(
                    "conformance: a one-copy plan (peer inputs {need_inputs}, peer outputs {need_outputs}) on buffers \
                     that are not symmetric buffers of this communicator"
                )));
            }
            let mut rt = self.runtime(in_ptr, out_ptr);
            peers.fill(&mut rt);
            rt.call_number = self.next_call_number();
            rt.trace = trace_ptr;
            // Below 2^32: capacity × TRACE_WORDS × grid is at most MAX_TRACE_WORDS (checked above).
            rt.trace_capacity = u32::try_from(capacity)
                .map_err(|_| Error::Unsupported(format!("conformance: a trace of {capacity} entries per block")))?;
            // SAFETY: `in_ptr`/`out_ptr` come from cudarc buffers on this GPU holding at least
            // the plan's input and output bytes (checked above), alive while the caller's
            // borrows last and ordered by cudarc's stream events; the trace buffer holds
            // `capacity` entries of TRACE_WORDS words for each of the `grid` blocks and every block
            // records at most `capacity - 1` entries (the kernel also bounds its index by
            // `trace_capacity`); the workspace addresses are every rank's live workspace,
            // mapped until teardown, which synchronises first; the plan fits the workspace
            // (checked above); a one-copy plan's peer inputs and outputs are every rank's
            // symmetric buffers, checked by `peer_buffers` to hold what the spec has each rank
            // access there and mapped here until teardown; every device wait is bounded by the
            // communicator's timeout.
            // A plan with a shifted region may touch bytes past its buffers' plan sizes:
            // the caller gives them slack (see the method's docs).
            unsafe { self.exec.launch(&stream, plan, &params, &rt) }?;
        }
        Ok(ConformanceLaunch { comm: self, stream, trace, capacity, steps, grid })
    }
}

impl ConformanceLaunch<'_> {
    /// Waits for the kernel (every device wait is bounded) and returns the trace, every
    /// block's entries in the order it executed them, blocks in order; an error if the
    /// communicator was poisoned (a wait expired) or an entry names no step record.
    #[doc(hidden)]
    pub fn trace(self) -> Result<Vec<TraceEntry>, Error> {
        Ok(self.timed_trace()?.into_iter().flat_map(|b| b.steps.into_iter().map(|(e, _)| e)).collect())
    }

    /// [`ConformanceLaunch::trace`] per block, with every step's start time and the block's
    /// end time (the GPU's global timer, ns): where a call's time goes, step by step.
    #[doc(hidden)]
    pub fn timed_trace(self) -> Result<Vec<TimedBlock>, Error> {
        let words = self.stream.clone_dtoh(&self.trace).map_err(driver("cuMemcpyDtoH"))?;
        self.comm.async_error()?;
        let per_block = TRACE_WORDS * self.capacity;
        let mut blocks = Vec::new();
        for b in 0..self.grid {
            let t = &words[b * per_block..(b + 1) * per_block];
            let count = t[0] as usize;
            if count >= self.capacity {
                return Err(Error::InvalidArgument(format!(
                    "conformance: block {b} recorded {count} steps, more than the {} its plan runs",
                    self.capacity - 1
                )));
            }
            let mut steps = Vec::with_capacity(count);
            for e in t[TRACE_WORDS..TRACE_WORDS * (count + 1)].chunks_exact(TRACE_WORDS) {
                let &(block, step, body) = self.steps.get(&e[1]).ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "conformance: block {b} traced parameter word {}, which starts no step record",
                        e[1]
                    ))
                })?;
                if u64::from(block) != e[0] || block as usize != b {
                    return Err(Error::InvalidArgument(format!(
                        "conformance: block {b}'s trace holds an entry of block {} at a step of block {block}",
                        e[0]
                    )));
                }
                steps.push((TraceEntry { block, step, body, chunk: e[2], epoch: e[3] }, e[4]));
            }
            blocks.push(TimedBlock { steps, end_ns: t[1], begin_ns: t[2] });
        }
        Ok(blocks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use purlin_snac::{DataType, PacketFormat, PlanConfig, ReduceOp, Regime, StagingSide, derive};

    /// Every step of every derived plan gets exactly one record offset, and the offsets are
    /// where the executor's walk finds them (distinct, inside the block, past the table).
    #[test]
    fn every_step_maps_to_one_record_offset() {
        let specs = [
            CollectiveSpec::all_gather(2, DataType::U8, 30_003),
            CollectiveSpec::all_reduce(2, DataType::F32, ReduceOp::Sum, 30_001),
            CollectiveSpec::reduce_scatter(3, DataType::Bf16, ReduceOp::Max, 4099),
            CollectiveSpec::all_to_all_v(2, DataType::U8, vec![vec![3, 0], vec![0, 5]]),
        ];
        for spec in &specs {
            for (regime, side) in [
                (Regime::Latency, StagingSide::Peer),
                (Regime::Throughput, StagingSide::Peer),
                (Regime::Throughput, StagingSide::Own),
            ] {
                let cfg = PlanConfig {
                    regime,
                    staging_side: side,
                    chunk_bytes: 16 << 10,
                    blocks_per_role: 2,
                    slots: 2,
                    staging_bytes: 4 << 20,
                    window_bytes: 4 << 20,
                    packet: PacketFormat::B16,
                    ..PlanConfig::default()
                };
                for plan in derive(spec, &cfg).expect("derive") {
                    let words = purlin_snac::params::encode(&plan);
                    let map = step_offsets(&plan, &words).expect("walk");
                    let mut paths = 0;
                    plan.for_each_step(|_, _, _| paths += 1);
                    assert_eq!(map.len(), paths, "{spec:?} {regime:?}: one offset per step");
                    let mut inverse: Vec<_> = map.values().copied().collect();
                    inverse.sort();
                    inverse.dedup();
                    assert_eq!(inverse.len(), paths, "distinct steps");
                    assert!(map.keys().all(|&at| (at as usize) < words.len() && words[at as usize] & 0xff != OP_LOOP));
                    let entries: u64 = trace_entries_per_block(&plan).iter().sum();
                    assert!(entries > 0);
                }
            }
        }
    }
}
