//! NVRTC compile checks of every executor translation unit, for each architecture the
//! runtime supports. These need libnvrtc (not a GPU) and fail, never skip, without it:
//! `cargo xtask test` installs the pinned NVRTC wheel first.

use purlin_atom::{Arch, nvrtc};

#[test]
fn every_executor_unit_compiles_to_cubin() {
    let dir = nvrtc::load().expect("libnvrtc is required for the kernel compile checks (run `cargo xtask test`)");
    println!("NVRTC from {}", dir.display());
    for unit in purlin_collectives::kernels::all_units() {
        for arch in [Arch::SM80, Arch::SM90, Arch::SM100] {
            let cubin = nvrtc::compile_cubin(&unit, arch).unwrap_or_else(|e| panic!("{e}"));
            // An ELF image: CUBIN, not PTX.
            assert_eq!(&cubin[..4], b"\x7fELF", "{} for {arch} is not a CUBIN", unit.name);
        }
    }
}

#[test]
fn compile_errors_carry_the_log() {
    nvrtc::load().expect("libnvrtc is required");
    let unit = purlin_atom::TranslationUnit {
        name: "broken".into(),
        source: "extern \"C\" __global__ void k() { undefined_symbol(); }".into(),
        headers: vec![],
        options: vec![],
    };
    let err = nvrtc::compile_cubin(&unit, Arch::SM90).expect_err("must not compile");
    assert!(err.to_string().contains("undefined_symbol"), "{err}");
}
