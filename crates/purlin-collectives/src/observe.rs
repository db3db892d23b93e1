//! What a call tells the outside: its `tracing` span and, with the `nvtx` feature, its NVTX
//! range. Backend-neutral; both communicators open a [`CallSpan`] per call.
//!
//! Levels (docs/observability.md): a span per call at debug; set-up at info; fallbacks at
//! warn (once per cause where a cause repeats every call); an error event before a call
//! returns an error that poisons the communicator. The crate installs no subscriber.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use purlin_snac::{CollectiveSpec, Plan};

/// A call's span, entered for the call's duration (and its NVTX range, with the feature).
pub(crate) struct CallSpan {
    span: tracing::span::EnteredSpan,
    #[cfg(feature = "nvtx")]
    _range: crate::nvtx::Range,
}

impl std::fmt::Debug for CallSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallSpan").field("span", &*self.span).finish()
    }
}

/// `all-reduce` → `all_reduce`: the NVTX range's name is `purlin::all_reduce`.
#[cfg(any(feature = "nvtx", test))]
pub(crate) fn snake(collective: &str) -> String {
    collective.replace('-', "_")
}

/// A rank's bytes in a call: the larger of its input and output.
pub(crate) fn call_bytes(spec: &CollectiveSpec, rank: u32) -> u64 {
    spec.input_bytes(rank).max(spec.output_bytes(rank))
}

impl CallSpan {
    /// Opens and enters the span of `rank`'s call of `spec` (fields the plan decides are
    /// recorded by [`CallSpan::planned`]).
    pub(crate) fn enter(rank: usize, spec: &CollectiveSpec, executor: &'static str) -> Self {
        let bytes = call_bytes(spec, rank as u32);
        let count = bytes / spec.dtype.size().max(1);
        // Target `purlin::call`: `PURLIN_LOG=purlin::call=debug` shows the calls alone.
        let span = tracing::debug_span!(
            target: "purlin::call",
            "call",
            rank,
            collective = spec.collective.name(),
            dtype = ?spec.dtype,
            op = ?spec.op,
            count,
            bytes,
            executor,
            call = tracing::field::Empty,
            regime = tracing::field::Empty,
            blocks = tracing::field::Empty,
            placement = tracing::field::Empty,
            plan_key = tracing::field::Empty,
            captured = tracing::field::Empty,
        );
        CallSpan {
            #[cfg(feature = "nvtx")]
            _range: nvtx_range(spec.collective.name(), bytes),
            span: span.entered(),
        }
    }

    /// Records what the plan decided: regime, blocks, placement (`staged`, `one-copy`, with
    /// `in-place`), plan key (the kernel key's hash) and whether a graph captures the call.
    /// `captured` is asked only where the span is enabled (a driver call on GPUs).
    pub(crate) fn planned(&self, plan: &Plan, one_copy: bool, in_place: bool, captured: impl FnOnce() -> bool) {
        if self.span.is_disabled() {
            return;
        }
        let placement = match (one_copy, in_place) {
            (true, true) => "one-copy in-place",
            (true, false) => "one-copy",
            (false, true) => "staged in-place",
            (false, false) => "staged",
        };
        self.span.record("regime", tracing::field::debug(plan.regime));
        self.span.record("blocks", plan.grid());
        self.span.record("placement", placement);
        self.span.record("plan_key", tracing::field::display(format_args!("{:016x}", plan_key(plan))));
        self.span.record("captured", captured());
    }

    /// Records the call's number (the flight recorder's and the call check's).
    pub(crate) fn numbered(&self, number: u64) {
        self.span.record("call", number);
    }
}

/// The hash of a plan's kernel key (FNV-1a of its `Debug` text): what a log line can carry.
pub(crate) fn plan_key(plan: &Plan) -> u64 {
    format!("{:?}", plan.kernel_key())
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// Emits `warn` once per `key` in this process (a fallback that every call of a kind would
/// repeat is reported at its first call).
pub(crate) fn warn_once(key: String, warn: impl FnOnce()) {
    static SEEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let first = SEEN.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner()).insert(key);
    if first {
        warn();
    }
}

/// The "Purlin" NVTX domain's range `purlin::<collective>` with the call's bytes as payload
/// (a no-op unless a profiler injected NVTX).
#[cfg(feature = "nvtx")]
fn nvtx_range(collective: &str, bytes: u64) -> crate::nvtx::Range {
    crate::nvtx::Range::push(|| format!("purlin::{}", snake(collective)), bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_names_are_the_collectives_in_snake_case() {
        assert_eq!(format!("purlin::{}", snake("all-gather-v")), "purlin::all_gather_v");
        assert_eq!(snake("all-reduce"), "all_reduce");
    }
}
