//! The executor's CUDA sources (`kernels/snac/`) and the translation units the runtime
//! can ask NVRTC for. `cargo xtask gpu-round` prebuilds exactly these; CI compiles them.

use purlin_atom::TranslationUnit;

/// The memory-ordering primitives of the protocol (DESIGN.md §3.6).
pub const SYNC_CUH: &str = include_str!("../../../kernels/snac/sync.cuh");
/// The device smoke-test kernels.
pub const SMOKE_CU: &str = include_str!("../../../kernels/snac/smoke.cu");

/// The torn-packet stress test (latency regime's 16-byte packets).
pub const PACKET_STRESS_CU: &str = include_str!("../../../kernels/snac/packet_stress.cu");

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

/// Every translation unit the runtime can request, for prebuilding and compile checks.
pub fn all_units() -> Vec<TranslationUnit> {
    vec![smoke_unit(), packet_stress_unit()]
}
