//! The launch path of [`Comm`]: a call's plan, derived and verified once per key and kept
//! with its parameter block, its call number, and its one launch on this rank's stream.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use cudarc::driver::{CudaStream, sys};
use purlin_snac::{CollectiveSpec, Plan, Regime};

use super::Comm;
use crate::call::tuning::PlanLimits;
use crate::call::types::Status;
use crate::error::Error;
use crate::flight::Executor;
use crate::gpu::executor::{ExecParams, ExecRuntime};
use crate::observe::{CallSpan, warn_once};

/// Whether `Datapath::Auto` may pick the copy engines on GPUs. Off until the device sequence
/// (`engine.rs`) has passed `gpu_copy_engine_plans` on a GPU: until then only an explicit
/// `PURLIN_DATAPATH=ce` runs copy-engine plans on GPUs (docs/perf/copy-engines.md §3.8).
const DEVICE_AUTO_COPY_ENGINE: bool = false;

/// A plan ready to launch: the plan and its parameter block.
#[derive(Debug)]
pub(crate) struct PreparedPlan {
    pub(crate) plan: Plan,
    /// The plan's parameter block (a copy-engine plan's: its entry kernel's).
    params: ExecParams,
    /// A copy-engine plan's exit kernel and engine work (`engine.rs`).
    pub(crate) ce: Option<super::engine::CeLaunch>,
}

/// Every rank's input and output as mapped here, where a call's are symmetric buffers.
#[derive(Debug, Default)]
pub(crate) struct PeerBuffers {
    pub(crate) inputs: Option<[u64; purlin_snac::MAX_WORLD]>,
    pub(crate) outputs: Option<[u64; purlin_snac::MAX_WORLD]>,
}

impl PeerBuffers {
    /// (inputs symmetric, outputs symmetric).
    pub(crate) fn flags(&self) -> (bool, bool) {
        (self.inputs.is_some(), self.outputs.is_some())
    }

    /// Puts every rank's symmetric input and output, where there are some, into a call's
    /// runtime pointers (one-copy plans read them; other plans never do).
    pub(crate) fn fill(&self, rt: &mut crate::gpu::executor::ExecRuntime) {
        if let Some(p) = self.outputs {
            rt.peer_output = p;
        }
        if let Some(p) = self.inputs {
            rt.peer_input = p;
        }
    }
}

/// What a prepared plan depends on besides the communicator: the spec, in-place-ness,
/// whether the input and the output are symmetric buffers, and whether the plan sets
/// shard-landed words (fused copy collectives).
pub(super) type PlanKey = (CollectiveSpec, bool, bool, bool, bool);

impl Comm {
    /// The plan of a call, derived once per (spec, in place, which buffers are symmetric) and
    /// kept with its parameter block.
    pub(crate) fn prepared(
        &self,
        spec: CollectiveSpec,
        in_place: bool,
        peers: (bool, bool),
    ) -> Result<Arc<PreparedPlan>, Error> {
        self.prepared_landed(spec, in_place, peers, false)
    }

    /// [`Comm::prepared`], with shard-landed words where `landed` (a fused copy collective's:
    /// its plan then runs on SM blocks, the copy engines never write its shards).
    pub(crate) fn prepared_landed(
        &self,
        spec: CollectiveSpec,
        in_place: bool,
        (peer_inputs, peer_outputs): (bool, bool),
        landed: bool,
    ) -> Result<Arc<PreparedPlan>, Error> {
        let key = (spec, in_place, peer_inputs, peer_outputs, landed);
        if let Some(p) = self.plans.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(p.clone());
        }
        let mut limits = PlanLimits::of_workspace(
            &self.layout.config,
            self.exec_bound.min(self.layout.config.epoch_words as u32),
            self.exec.packet(),
            peer_outputs,
            peer_inputs,
        );
        limits.copy_engine = self.copy_engine.is_some()
            && !landed
            && (self.tuning.datapath == crate::call::tuning::Datapath::CopyEngine || DEVICE_AUTO_COPY_ENGINE);
        limits.landed = landed;
        let fits = |p: &Plan| purlin_snac::params::encode(p).len() <= crate::gpu::kernels::EXEC_PARAM_WORDS;
        let (plan, cfg) =
            crate::call::tuning::plan_fitting(&key.0, self.rank as u32, in_place, &self.tuning, &limits, fits)?;
        if let Some(budget) = &self.verify {
            let budget =
                purlin_snac::verify::Options { max_coresident_blocks: Some(limits.max_coresident_blocks), ..*budget };
            let verdict = crate::call::verified::verified(&key.0, &cfg, &budget)?;
            verdict.covers(&plan)?;
            if verdict.coverage.starts_with("sampled") {
                tracing::warn!(
                    rank = self.rank,
                    collective = key.0.collective.name(),
                    coverage = %verdict.coverage,
                    "verification budget reached: the plan key was checked on sampled schedules, not exhaustively"
                );
            }
        }
        if (peer_inputs || peer_outputs) && !plan.one_copy && plan.regime == Regime::Throughput {
            warn_once(format!("staged {} {}", key.0.collective.name(), key.0.world), || {
                tracing::warn!(
                    rank = self.rank,
                    collective = key.0.collective.name(),
                    "staged instead of one-copy: the call's buffers are not symmetric in every role the one-copy plan shares"
                )
            });
        }
        self.layout.check_resources(&plan.resources)?;
        let call_bytes = plan.spec.input_bytes(plan.rank).max(plan.spec.output_bytes(plan.rank));
        let from_device = call_bytes <= self.tuning.device_params_max_bytes;
        let (params, ce) = if plan.engine.is_some() {
            let (ce, entry) = super::engine::CeLaunch::new(&self.exec, &plan)?;
            (self.exec.params(&entry, from_device)?, Some(ce))
        } else {
            self.exec.check_supported(&plan)?;
            (self.exec.params(&plan, from_device)?, None)
        };
        let prepared = Arc::new(PreparedPlan { plan, params, ce });
        self.plans.lock().unwrap_or_else(|e| e.into_inner()).insert(key, prepared.clone());
        Ok(prepared)
    }

    /// The call check's number for the next launch (`Runtime::call_number`): every rank
    /// counts its launches, so ranks that make the same calls number them alike; 0 (no
    /// check block) where the check is off.
    pub(crate) fn next_call_number(&self) -> u32 {
        if !self.call_check {
            return 0;
        }
        // 1..=u32::MAX, cycling: the remainder fits a u32, and the +1 keeps 0 for "off".
        let launched = self.calls_launched.fetch_add(1, Ordering::Relaxed);
        (launched % u64::from(u32::MAX)) as u32 + 1
    }

    /// The pointers of one call.
    pub(crate) fn runtime(&self, input: u64, output: u64) -> ExecRuntime {
        let mut rt = ExecRuntime {
            input,
            output,
            counters: self.addrs[self.rank] + self.layout.counters.offset as u64,
            epochs: self.addrs[self.rank] + self.layout.epochs.offset as u64,
            control: self.addrs[self.rank] + self.layout.control.offset as u64,
            timeout_ns: u64::try_from(self.device_timeout.as_nanos()).unwrap_or(u64::MAX),
            ..ExecRuntime::default()
        };
        for (r, base) in self.addrs.iter().enumerate() {
            rt.staging[r] = base + self.layout.staging.offset as u64;
            rt.window[r] = base + self.layout.window.offset as u64;
            rt.flags[r] = base + self.layout.flags.offset as u64;
        }
        rt
    }

    /// Launches a prepared plan on `input` and `output`, device pointers of this GPU that the
    /// caller checked hold the plan's input and output bytes; `peers`: every rank's
    /// symmetric input and output as mapped here, for one-copy plans.
    pub(super) fn launch_prepared(
        &self,
        prepared: &PreparedPlan,
        input: u64,
        output: u64,
        peers: &PeerBuffers,
    ) -> Result<Status, Error> {
        let plan = &prepared.plan;
        let span = CallSpan::enter(self.rank, &plan.spec, "gpu");
        if let Some(why) = self.poison.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            tracing::debug!(rank = self.rank, error = %why, "call refused: the communicator is poisoned");
            return Err(self.reported(Error::Poisoned(why)));
        }
        // The stream first: a call that cannot be ordered takes no call number.
        let (stream, _in_order) = self.launch_stream()?;
        span.planned(plan, plan.one_copy, plan.resources.alias.is_some(), || is_capturing(&stream));
        let mut rt = self.runtime(input, output);
        peers.fill(&mut rt);
        // An empty call launches the call check's block alone (so a rank whose call is empty
        // while its peers' is not fails with them); with the check off, nothing.
        rt.call_number = self.next_call_number();
        let number = {
            let mut flight = self.flight.lock().unwrap_or_else(|e| e.into_inner());
            let n = flight.start(&plan.spec, self.rank as u32, plan.call_digest(), Executor::Gpu);
            span.numbered(n);
            Some(n)
        };
        // SAFETY: `input`/`output` come from cudarc buffers on this GPU whose lengths the spec
        // checked (in place: one buffer that holds the plan's input and output at their alias
        // offsets, checked by `collective_in_place`; 0 for a side of no bytes, which no step
        // touches), kept alive by the caller's borrow until the launch
        // is enqueued and ordered by cudarc's stream events; the workspace addresses are
        // every rank's live workspace, mapped here until teardown, which synchronises first;
        // peer inputs and outputs are symmetric allocations of this communicator, mapped here
        // until teardown, each holding what the spec has every rank read or write there
        // (`peer_buffers`), accessed by the plan only between the peer's entry and exit. Raw
        // buffers carry the same promises from their maker (`RawBuffer::from_raw`).
        let launched = match (&prepared.ce, &self.copy_engine) {
            // SAFETY: as above; the engine's copies and notifies touch the same buffers, the
            // peers' flag words and this rank's epoch words.
            (Some(ce), Some(engine)) => unsafe {
                self.exec
                    .launch(&stream, &ce.entry, &prepared.params, &rt)
                    .and_then(|()| ce.launch_rest(engine, &self.exec, &stream, &rt))
            },
            (Some(_), None) => Err(Error::Unsupported("a copy-engine plan on a GPU without a copy engine".into())),
            // SAFETY: as above.
            (None, _) => unsafe { self.exec.launch(&stream, &prepared.plan, &prepared.params, &rt) },
        };
        if let (Err(_), Some(n)) = (&launched, number) {
            self.flight.lock().unwrap_or_else(|e| e.into_inner()).finish(n, false);
        }
        launched?;
        Ok(Status::Success)
    }
}

/// Whether `stream` is capturing a CUDA graph (the call then runs when the graph is launched).
fn is_capturing(stream: &CudaStream) -> bool {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a live stream of this communicator; out-pointer valid.
    let asked = unsafe { sys::cuStreamIsCapturing(stream.cu_stream(), &mut status) };
    asked.result().is_ok() && status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
}
