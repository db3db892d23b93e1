//! The executor's CUDA sources (`kernels/snac/`) and the translation units the runtime
//! can ask NVRTC for. `cargo xtask gpu-round` prebuilds exactly these; CI compiles them.

use purlin_atom::{AtomSpec, DType, Generation, TranslationUnit};

/// The memory-ordering primitives of the protocol (DESIGN.md §3.6).
pub const SYNC_CUH: &str = include_str!("../../../kernels/snac/sync.cuh");
/// The device smoke-test kernels.
pub const SMOKE_CU: &str = include_str!("../../../kernels/snac/smoke.cu");

/// The torn-packet stress test (latency regime's 16-byte packets).
pub const PACKET_STRESS_CU: &str = include_str!("../../../kernels/snac/packet_stress.cu");

/// The latency-floor experiment (`examples/latency_floor.rs`): launch shapes and the least
/// one-shot exchange, measured beside the executor.
pub const LATENCY_FLOOR_CU: &str = include_str!("../../../kernels/snac/latency_floor.cu");

/// The CUDA side of the parameter block's header (checked against purlin-snac's layout).
pub const PARAMS_CUH: &str = include_str!("../../../kernels/snac/params.cuh");
/// The device executor: interprets a SNAC plan, one kernel per call.
pub const EXECUTOR_CU: &str = include_str!("../../../kernels/snac/executor.cu");

/// The reduction an executor kernel is compiled for (gathers use [`ExecOp::Copy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ExecOp {
    /// No reduction (AllGather, AllToAll and their V forms): the key is dtype-agnostic.
    Copy,
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Sum, then divided by the world size.
    Avg,
}

impl ExecOp {
    /// Every reduction a kernel may be compiled for.
    pub const REDUCTIONS: [ExecOp; 5] = [ExecOp::Sum, ExecOp::Prod, ExecOp::Min, ExecOp::Max, ExecOp::Avg];

    fn atom_op(self) -> &'static str {
        match self {
            ExecOp::Copy | ExecOp::Sum | ExecOp::Avg => "Sum",
            ExecOp::Prod => "Prod",
            ExecOp::Min => "Min",
            ExecOp::Max => "Max",
        }
    }
}

/// Parameter-block capacity (u64 words) of the executor kernel: 31 KiB, inside the
/// 32 764-byte kernel-parameter limit (sm_70+, CUDA 12.1+) beside [`EXEC_RUNTIME_BYTES`];
/// room for 32 blocks per role at world 2.
pub const EXEC_PARAM_WORDS: usize = 3968;

/// Parameter-block capacity of the executor's second entry point, `purlin_snac_exec_small`
/// (same code, same module), for plans that fit: every eager launch uploads its whole
/// parameter block, and 31 KiB cost 2.4 µs more per launch than 8 bytes (empty kernels
/// launched back to back, 2×H200, round 49). In a CUDA graph the size made no difference.
pub const EXEC_SMALL_PARAM_WORDS: usize = 512;

const _: () = assert!(EXEC_PARAM_WORDS * 8 + EXEC_RUNTIME_BYTES <= 32_764);
/// Size of the executor's `Runtime` kernel parameter (`kernels/snac/executor.cu`).
pub const EXEC_RUNTIME_BYTES: usize = 8 * (2 + 3 * 16 + 6);

/// The compile-time part of an executor kernel (the kernel key's datapath half; the plan
/// itself is interpreted from the parameter block).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExecKey {
    /// The Atom build it runs on.
    pub atom: AtomSpec,
    /// Element type (ignored by [`ExecOp::Copy`] kernels, which use u32).
    pub dtype: DType,
    /// The reduction.
    pub op: ExecOp,
    /// Bytes per packet of the latency regime: 8 (4 + 4) or 16 (8 + 8).
    pub packet_bytes: u32,
}

impl ExecKey {
    /// The key normalised so that copy kernels of every dtype share one binary.
    pub fn normalized(mut self) -> Self {
        if self.op == ExecOp::Copy {
            self.dtype = DType::U32;
        }
        self
    }

    /// The translation unit NVRTC compiles for this key.
    pub fn unit(&self) -> TranslationUnit {
        let k = self.normalized();
        let mut headers = k.atom.headers();
        headers.push(("sync.cuh".into(), SYNC_CUH.into()));
        headers.push(("params.cuh".into(), PARAMS_CUH.into()));
        TranslationUnit {
            name: format!("purlin_exec_{}_{}_{:?}_p{}", k.atom.label(), k.dtype.cuda_tag(), k.op, k.packet_bytes)
                .to_lowercase(),
            source: EXECUTOR_CU.into(),
            headers,
            options: vec![
                format!("-DPURLIN_T={}", k.dtype.cuda_tag()),
                format!("-DPURLIN_OP={}", k.op.atom_op()),
                format!("-DPURLIN_AVG={}", u32::from(k.op == ExecOp::Avg)),
                format!("-DPURLIN_PACKET={}", k.packet_bytes),
                format!("-DPURLIN_PARAM_WORDS={EXEC_PARAM_WORDS}"),
                format!("-DPURLIN_SMALL_PARAM_WORDS={EXEC_SMALL_PARAM_WORDS}"),
            ],
        }
    }
}

/// The packet size the runtime uses on a generation: 16-byte packets (8 data + 8 flag, one
/// 16-byte store) on Hopper and later, where the torn-packet stress test found none
/// (2.02e9 packets over NVLink, both directions, 2×H200, 2026-11-30: PERFORMANCE.md);
/// 8-byte packets (4 + 4) before sm_90.
pub fn packet_bytes_for(generation: Generation) -> u32 {
    match generation {
        Generation::Generic | Generation::Ampere => 8,
        Generation::Hopper | Generation::Blackwell => 16,
    }
}

/// Every executor key the runtime can request for one Atom build: one copy kernel and
/// each dtype × reduction.
pub fn executor_keys(atom: AtomSpec) -> Vec<ExecKey> {
    let packet_bytes = packet_bytes_for(atom.generation);
    let mut keys = vec![ExecKey { atom, dtype: DType::U32, op: ExecOp::Copy, packet_bytes }];
    for dtype in DType::ALL {
        for op in ExecOp::REDUCTIONS {
            keys.push(ExecKey { atom, dtype, op, packet_bytes });
        }
    }
    keys
}

/// The smoke-test translation unit.
pub fn smoke_unit() -> TranslationUnit {
    TranslationUnit {
        name: "purlin_smoke".into(),
        source: SMOKE_CU.into(),
        headers: vec![("sync.cuh".into(), SYNC_CUH.into())],
        options: vec![],
    }
}

/// The torn-packet stress-test translation unit.
pub fn packet_stress_unit() -> TranslationUnit {
    TranslationUnit {
        name: "purlin_packet_stress".into(),
        source: PACKET_STRESS_CU.into(),
        headers: vec![("sync.cuh".into(), SYNC_CUH.into())],
        options: vec![],
    }
}

/// The latency-floor experiment's translation unit.
pub fn latency_floor_unit() -> TranslationUnit {
    TranslationUnit {
        name: "purlin_latency_floor".into(),
        source: LATENCY_FLOOR_CU.into(),
        headers: vec![("sync.cuh".into(), SYNC_CUH.into())],
        options: vec![],
    }
}

/// Every translation unit the runtime can request on `generation` at its default sizing,
/// for prebuilding (`cargo xtask gpu-round`) and the CI compile checks.
pub fn all_units(generation: Generation) -> Vec<TranslationUnit> {
    let mut units = vec![smoke_unit(), packet_stress_unit(), latency_floor_unit()];
    units.extend(executor_keys(AtomSpec::new(generation)).iter().map(ExecKey::unit));
    units
}
