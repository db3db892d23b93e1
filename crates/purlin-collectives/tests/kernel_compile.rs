//! NVRTC compile checks of the translation units the runtime can request, for the
//! architectures it supports (sm_80 → Ampere Atom, sm_90 → Hopper, sm_100 → Blackwell):
//! every unit for sm_90, every dtype and every op for the others.
//! These need libnvrtc (not a GPU) and fail, never skip, without it: `cargo xtask test`
//! installs the pinned NVRTC wheel first.

use purlin_atom::{Arch, Generation, KernelCache, nvrtc};

fn threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

#[test]
fn runtime_units_compile_to_cubin() {
    let dir = nvrtc::load().expect("libnvrtc is required for the kernel compile checks (run `cargo xtask test`)");
    println!("NVRTC from {}", dir.display());
    // A fresh cache: this test must compile, not find old CUBINs.
    let cache_dir = std::env::temp_dir().join(format!("purlin-compile-check-{}", std::process::id()));
    let cache = KernelCache::new(&cache_dir);
    // Hopper (the GPU the runtime runs on here): every unit. Ampere and Blackwell: every
    // dtype and every op once (`sampled_units`), which keeps this test, CI's longest, near
    // ten minutes on CI's two cores (all three in full took 932 s, 2026-12-02).
    let mut jobs = Vec::new();
    let units = [
        (Arch::SM80, purlin_collectives::kernels::sampled_units(Generation::Ampere)),
        (Arch::SM90, purlin_collectives::kernels::all_units(Generation::Hopper)),
        (Arch::SM100, purlin_collectives::kernels::sampled_units(Generation::Blackwell)),
    ];
    for (arch, list) in units {
        for unit in list {
            jobs.push((unit, arch));
        }
    }
    let compiled = cache.get_or_compile_all(&jobs, threads());
    let _ = std::fs::remove_dir_all(&cache_dir);
    let compiled = compiled.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(compiled.len(), jobs.len());
    for (k, (unit, arch)) in compiled.iter().zip(&jobs) {
        assert!(!k.from_cache, "{} came from a cache", unit.name);
        // An ELF image: CUBIN, not PTX.
        assert_eq!(&k.cubin[..4], b"\x7fELF", "{} for {arch} is not a CUBIN", unit.name);
        // Every entry point the launcher looks up (exec_device.rs), by symbol name.
        let entries: &[&[u8]] = if unit.name.starts_with("purlin_exec_") {
            &[b"purlin_snac_exec\0", b"purlin_snac_exec_global\0"]
        } else if unit.name.starts_with("purlin_shaped_") {
            &[b"purlin_snac_shaped\0", b"purlin_snac_shaped_global\0"]
        } else {
            &[]
        };
        for entry in entries {
            assert!(k.cubin.windows(entry.len()).any(|w| w == *entry), "{} lacks an entry point", unit.name);
        }
    }
    println!("{} translation units compiled", jobs.len());
}

#[test]
fn the_parameter_header_and_opcodes_match_purlin_snac() {
    nvrtc::load().expect("libnvrtc is required");
    // NVRTC has no offsetof; every field is a u64, so the layout is the field order: a
    // constant whose fields hold their Rust byte offset / 8, in the CUDA struct's order,
    // must read back each field's Rust offset (and the sizes must agree: no extra fields).
    let fields = purlin_snac::params::header_fields();
    let values: Vec<String> = (0..fields.len()).map(|i| (i * 8).to_string()).collect();
    let mut asserts = format!(
        "#include \"params.cuh\"\nusing purlin::snac::ParamHeader;\nconstexpr ParamHeader probe{{{}}};\n",
        values.join(", ")
    );
    for (name, offset) in &fields {
        asserts += &format!("static_assert(probe.{name} == {offset}, \"ParamHeader::{name} is at byte {offset}\");\n");
    }
    asserts +=
        &format!("static_assert(sizeof(ParamHeader) == {}, \"header size\");\n", purlin_snac::params::HEADER_WORDS * 8);
    asserts += &format!("static_assert(purlin::snac::kParamMagic == {}ull, \"magic\");\n", purlin_snac::params::MAGIC);
    asserts +=
        &format!("static_assert(purlin::snac::kParamVersion == {}ull, \"version\");\n", purlin_snac::params::VERSION);
    for (name, code) in purlin_snac::params::OPCODES {
        asserts += &format!("static_assert(purlin::snac::{name} == {code}, \"opcode {name}\");\n");
    }
    let unit = purlin_atom::TranslationUnit {
        name: "params_layout".into(),
        source: asserts.clone(),
        headers: vec![("params.cuh".into(), purlin_collectives::kernels::PARAMS_CUH.into())],
        options: vec![],
    };
    nvrtc::compile_cubin(&unit, Arch::SM90).unwrap_or_else(|e| panic!("{e}"));
    // And the check is not vacuous: a shifted offset must fail to compile.
    let broken =
        purlin_atom::TranslationUnit { source: asserts.replace("probe.grid == 32", "probe.grid == 40"), ..unit };
    assert_ne!(broken.source, asserts, "the planted error must change the source");
    assert!(nvrtc::compile_cubin(&broken, Arch::SM90).is_err());
    let wrong_opcode = asserts.replace("kLoop == 1,", "kLoop == 2,");
    assert_ne!(wrong_opcode, asserts, "the planted opcode must change the source");
    assert!(
        nvrtc::compile_cubin(&purlin_atom::TranslationUnit { source: wrong_opcode, ..broken }, Arch::SM90).is_err()
    );
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
