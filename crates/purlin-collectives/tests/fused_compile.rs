//! NVRTC compile checks of the fused-kernel examples (crates/purlin-collectives/examples/fused)
//! with Purlin's device headers, for every architecture the runtime supports. Like
//! kernel_compile.rs, these need libnvrtc (not a GPU) and fail, never skip, without it.

use purlin_atom::{Arch, AtomSpec, DType, Generation, KernelCache, nvrtc};
use purlin_collectives::internal::fused_unit;
use purlin_collectives::internal::kernels::{ExecKey, ExecOp, packet_bytes_for};

const BIAS_GELU: &str = include_str!("../examples/fused/bias_gelu_all_reduce.cu");
const GATHER_CONSUME: &str = include_str!("../examples/fused/gather_consume.cu");

#[test]
fn fused_examples_compile_for_every_generation() {
    nvrtc::load().expect("libnvrtc is required for the kernel compile checks (run `cargo xtask test`)");
    let cache_dir = std::env::temp_dir().join(format!("purlin-fused-check-{}", std::process::id()));
    let cache = KernelCache::new(&cache_dir);
    let mut jobs = Vec::new();
    for (arch, generation) in
        [(Arch::SM80, Generation::Ampere), (Arch::SM90, Generation::Hopper), (Arch::SM100, Generation::Blackwell)]
    {
        let key = |dtype, op| ExecKey {
            atom: AtomSpec::new(generation),
            dtype,
            op,
            packet_bytes: packet_bytes_for(generation),
        };
        jobs.push((fused_unit(&key(DType::F32, ExecOp::Sum), BIAS_GELU, "bias_gelu_all_reduce"), arch));
        jobs.push((fused_unit(&key(DType::U32, ExecOp::Copy), GATHER_CONSUME, "gather_consume"), arch));
    }
    let compiled = cache.get_or_compile_all(&jobs, 2);
    let _ = std::fs::remove_dir_all(&cache_dir);
    let compiled = compiled.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(compiled.len(), jobs.len());
    for (k, (unit, arch)) in compiled.iter().zip(&jobs) {
        assert_eq!(&k.cubin[..4], b"\x7fELF", "{} for {arch} is not a CUBIN", unit.name);
        // The fused kernel and its unfused twin, and no executor entry point (PURLIN_FUSED).
        let has = |symbol: &[u8]| k.cubin.windows(symbol.len()).any(|w| w == symbol);
        let (fused, twin): (&[u8], &[u8]) = if unit.name.ends_with("bias_gelu_all_reduce") {
            (b"bias_gelu_all_reduce\0", b"bias_gelu_only\0")
        } else {
            (b"gather_consume\0", b"consume_all\0")
        };
        assert!(has(fused) && has(twin), "{} for {arch} lacks its kernels", unit.name);
        assert!(!has(b"purlin_snac_exec\0"), "{} for {arch} carries the executor's entry point", unit.name);
    }
}
