//! Communicator settings: what set-up compiles and agrees on, and their `PURLIN_*` variables.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaFunction, CudaModule};

use crate::bootstrap::DEFAULT_TIMEOUT;
use crate::call::tuning::Tuning;
use crate::error::Error;
use crate::workspace::WorkspaceConfig;

/// Communicator settings. [`CommConfig::from_env`] is what the cudarc-shaped constructors use.
#[derive(Debug, Clone)]
pub struct CommConfig {
    /// Bound on every **host** wait for a peer: set-up, barriers, symmetric allocation and
    /// free, teardown ([`Error::Timeout`], "host wait ... timed out"). Not collectives: their
    /// waits run on the device, bounded by [`Self::device_timeout`]. [`Self::with_timeouts`]
    /// and `PURLIN_TIMEOUT_S` set both.
    pub timeout: Duration,
    /// Workspace sizes.
    pub workspace: WorkspaceConfig,
    /// Where compiled kernels are cached (default: [`purlin_atom::KernelCache::default_location`]).
    pub kernel_cache: Option<std::path::PathBuf>,
    /// Kernels to compile and load during set-up, before the final barrier (so a peer
    /// compiling for seconds is not taken for dead later), each with its co-residency bound
    /// agreed across ranks. Every rank must request the same list.
    pub kernels: Vec<KernelRequest>,
    /// Bound on every **device** wait of a collective (default 300 s, like torch's NCCL
    /// timeout): a peer that skips a call, dies or hangs is reported after this long, on every
    /// rank that waits for it ([`Error::DeviceTimeout`], "device wait ... timed out", naming
    /// the peer), and the communicator is poisoned. [`Self::timeout`] does not shorten it:
    /// setting only that one leaves a skipped call waiting this long.
    pub device_timeout: Duration,
    /// How calls are planned ([`Tuning::from_env`] by default).
    pub tuning: Tuning,
    /// Lets several ranks drive one GPU (`PURLIN_SHARED_GPU=1`), so the GPU tests can run on
    /// a machine with one GPU. Off by default, as NCCL refuses it too: ranks on one GPU share
    /// its SMs and memory bandwidth, so nothing measured that way says anything about
    /// NVLink. Each rank's kernels then get its share of the co-resident blocks (they wait
    /// on each other, so all of them must fit on the GPU at once).
    pub shared_gpu: bool,
    /// Verify each plan key's plan set with purlin-snac's verifier before its first launch,
    /// with this budget, as `CpuComm` always does (`PURLIN_VERIFY=1`, budget from
    /// `PURLIN_VERIFY_STATES` and `PURLIN_VERIFY_SCHEDULES`); a rejected plan never runs.
    /// `None` (the default): plans run as derived, the tuning table being verified in CI,
    /// because a key's first verification takes milliseconds at world 2 but seconds to
    /// minutes at worlds 4 and 8 ([`crate::call::verified`]).
    pub verify: Option<purlin_snac::verify::Options>,
    /// The call check (on by default; `PURLIN_CALL_CHECK=0` turns it off): every launch has
    /// one more block that compares a digest of the call with the peers', so ranks that make
    /// different calls all get [`Error::Mismatch`] instead of one finishing on the other's
    /// bytes and the other waiting out the device timeout (ARCHITECTURE.md). Its block cost a
    /// small CUDA-graph call ≈ 0.03 µs on one shared H100 (round 146).
    /// Every rank must agree.
    pub call_check: bool,
}

/// A kernel the communicator compiles, loads and bounds at set-up (see [`CommConfig::kernels`]).
#[derive(Debug, Clone)]
pub struct KernelRequest {
    /// The translation unit (compiled for each rank's exact architecture, through the cache).
    pub unit: purlin_atom::TranslationUnit,
    /// The `extern "C"` function to load from it.
    pub function: String,
    /// Threads per block it will be launched with.
    pub block_size: u32,
    /// Dynamic shared memory per block it will be launched with.
    pub dynamic_smem: usize,
}

impl KernelRequest {
    /// What every rank compares at set-up.
    pub(super) fn digest(&self) -> String {
        format!("{}:{}:{}:{}", self.unit.name, self.function, self.block_size, self.dynamic_smem)
    }
}

/// A kernel loaded at set-up, with its co-residency bound.
#[derive(Debug, Clone)]
pub struct LoadedKernel {
    /// The request it came from.
    pub request: KernelRequest,
    /// Its module (kept loaded for the communicator's life).
    pub module: Arc<CudaModule>,
    /// The function.
    pub function: CudaFunction,
    /// Most blocks resident at once on this rank's GPU (occupancy × SMs).
    pub coresident_local: u32,
    /// The minimum of that across ranks: plans for this kernel never use more blocks.
    pub coresident: u32,
}

impl Default for CommConfig {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_TIMEOUT,
            workspace: WorkspaceConfig::default(),
            kernel_cache: None,
            kernels: Vec::new(),
            device_timeout: DEFAULT_TIMEOUT,
            tuning: Tuning::default(),
            shared_gpu: false,
            verify: None,
            call_check: true,
        }
    }
}

/// An on/off variable: `1` is on; unset, empty or `0` is off; anything else an error.
pub(super) fn switch_from_env(var: &'static str) -> Result<bool, Error> {
    match std::env::var(var).as_deref().map(str::trim) {
        Err(_) | Ok("" | "0") => Ok(false),
        Ok("1") => Ok(true),
        Ok(other) => Err(Error::Env { var, problem: format!("{other:?} is not 0 or 1") }),
    }
}

impl CommConfig {
    /// Sets both bounds, [`Self::timeout`] (host waits) and [`Self::device_timeout`] (device
    /// waits, which is what bounds a skipped or failed call), to `timeout`, as
    /// `PURLIN_TIMEOUT_S` does.
    pub fn with_timeouts(self, timeout: Duration) -> Self {
        Self { timeout, device_timeout: timeout, ..self }
    }

    /// `PURLIN_SHARED_GPU`: `1` lets ranks share a GPU ([`CommConfig::shared_gpu`]); unset,
    /// empty or `0` does not.
    pub fn shared_gpu_from_env() -> Result<bool, Error> {
        switch_from_env("PURLIN_SHARED_GPU")
    }

    /// Defaults overridden by `PURLIN_TIMEOUT_S` (seconds, may be fractional; both
    /// [`Self::timeout`] and [`Self::device_timeout`]),
    /// `PURLIN_SHARED_GPU` (`1` or `0`), `PURLIN_CALL_CHECK` (`0` or `1`), `PURLIN_VERIFY`
    /// (`1` or `0`, with `PURLIN_VERIFY_STATES` and `PURLIN_VERIFY_SCHEDULES`) and the workspace and tuning
    /// variables ([`WorkspaceConfig::from_env`], [`Tuning::from_env`]).
    pub fn from_env() -> Result<Self, Error> {
        let mut c = Self { workspace: WorkspaceConfig::from_env()?, tuning: Tuning::from_env()?, ..Self::default() };
        c.shared_gpu = Self::shared_gpu_from_env()?;
        // On unless set to 0.
        c.call_check = std::env::var_os("PURLIN_CALL_CHECK").is_none() || switch_from_env("PURLIN_CALL_CHECK")?;
        if switch_from_env("PURLIN_VERIFY")? {
            c.verify = Some(crate::call::verified::budget_from_env(crate::call::verified::default_budget())?);
        }
        if let Ok(text) = std::env::var("PURLIN_TIMEOUT_S") {
            let secs: f64 = text
                .trim()
                .parse()
                .map_err(|e| Error::Env { var: "PURLIN_TIMEOUT_S", problem: format!("{text:?}: {e}") })?;
            if !(secs > 0.0 && secs < 1e7) {
                return Err(Error::Env {
                    var: "PURLIN_TIMEOUT_S",
                    problem: format!("{secs} is not a positive duration"),
                });
            }
            c.timeout = Duration::from_secs_f64(secs);
            c.device_timeout = c.timeout;
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_timeouts_bounds_host_and_device_waits_alike() {
        let d = Duration::from_millis(1500);
        let c = CommConfig::default().with_timeouts(d);
        assert_eq!((c.timeout, c.device_timeout), (d, d));
        assert_eq!(CommConfig::default().device_timeout, DEFAULT_TIMEOUT, "the default is unchanged");
    }
}
