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
        (Arch::SM80, purlin_collectives::internal::kernels::sampled_units(Generation::Ampere)),
        (Arch::SM90, purlin_collectives::internal::kernels::all_units(Generation::Hopper)),
        (Arch::SM100, purlin_collectives::internal::kernels::sampled_units(Generation::Blackwell)),
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
        // No user constant bank (a `__constant__` variable): one in the module, read or not,
        // cost every graph-captured call 0.4-1.7 us (round 141).
        let sections = purlin_atom::cubin::sections(&k.cubin).unwrap_or_else(|e| panic!("{}: {e}", unit.name));
        assert!(
            !sections.iter().any(|s| s.name == ".nv.constant3"),
            "{} for {arch} declares a __constant__ variable (section .nv.constant3)",
            unit.name
        );
        // Not vacuous: the section names were read (every CUBIN has its kernels' parameter banks).
        assert!(sections.iter().any(|s| s.name.starts_with(".nv.constant0.")), "{}: {sections:?}", unit.name);
    }
    println!("{} translation units compiled", jobs.len());
    check_spill_ceilings(&compiled, &jobs);
}

/// Register spills of the executor's entry points on sm_90, bytes stored / loaded per thread,
/// at most, by element type (every op, both entry points). A spill on the interpreter's path
/// costs whole microseconds per call (round 113: its by-value spill made every
/// graph call ~1 µs slower; round 118's `Ctx` in local memory 0.4–1.5 µs), and NVRTC says so
/// at compile time: a change that spills more fails here, before any device time is spent.
/// The ceilings are what main compiles to (NVRTC 13.0.88, 2026-12-04, after two sources in
/// flight for sub-32-bit lanes in `reduce_vectors_direct` and the executor's reduce sources
/// written one per thread into the Atom's shared table, fp8 packed by the hardware, and two
/// sources of a bf16/fp8 sum added in a 16-bit format, which raised the fp8 ceilings with
/// every fp8 call measured faster, rounds 127–128; 2026-12-05, round 133: the cp.async
/// engine's copy loop rolled and its two-source reduce, which took most 16-bit spills out and
/// moved e4m3's stores 214 -> 218 B with its loads 604 -> 464 B and every e4m3 call measured
/// faster; round 138: Avg fused into the reduce as the Atom's Mean, with f16 sums of two
/// sources on the two-source pipeline, f16 48/36 -> 36/28 B and e4m3 stores 218 -> 202 B;
/// 2026-12-06, round 140: fp8 Avg as the Atom's Mean with two sources halved in f16x2,
/// which raised e4m3 to 214/488 B with every e4m3 Avg call measured 2-38% faster; round
/// 142: fp8 Mean's RN(1/n) by `rcp.rn` rather than a `__constant__` table, e4m3 202/404 B;
/// 2026-12-07: the call check's block in both entry points moved the e4m3 Avg
/// device-memory entry to 206/436 B, its other entries unchanged (round 145);
/// [`CEILINGS_NVRTC`]):
/// lower them as spills are taken out, never raise them without a measurement that says the
/// spill is cheaper.
/// The last column: the by-value entry point (the graph path) spills nothing at all.
const SPILL_CEILINGS_SM90: &[(&str, u32, u32, bool)] = &[
    ("u32", 0, 0, true),
    ("i32", 0, 0, true),
    ("f32", 8, 4, true),
    ("bf16", 16, 12, true),
    ("f16", 36, 28, true),
    ("e4m3", 206, 436, false),
    ("e5m2", 222, 472, false),
];

/// The NVRTC the ceilings were measured with (`cargo xtask nvrtc`'s pinned wheel, which CI
/// uses). Another compiler allocates registers its own way: its spills are printed, not held.
const CEILINGS_NVRTC: (i32, i32) = (13, 0);

fn check_spill_ceilings(compiled: &[purlin_atom::CompiledKernel], jobs: &[(purlin_atom::TranslationUnit, Arch)]) {
    let version = nvrtc::version().unwrap_or_else(|e| panic!("{e}"));
    let hold = version == CEILINGS_NVRTC;
    if !hold {
        println!(
            "NVRTC {version:?}: the spill ceilings are for {CEILINGS_NVRTC:?}; spills are reported, not held to them"
        );
    }
    let mut checked = 0;
    for (kernel, (unit, arch)) in compiled.iter().zip(jobs) {
        let resources = kernel.resources.as_ref().unwrap_or_else(|| panic!("{}: no ptxas report", unit.name));
        for f in resources.iter().filter(|f| f.entry && f.spills()) {
            println!(
                "{arch} {}: {} spills {} B stored, {} B loaded",
                unit.name, f.function, f.spill_store_bytes, f.spill_load_bytes
            );
        }
        if *arch != Arch::SM90 {
            continue;
        }
        let entries: Vec<_> = resources.iter().filter(|f| f.entry).collect();
        // Every entry ptxas reported has its machine code in the CUBIN's ELF, whole
        // instructions of it (the code size `cargo xtask resources` prints).
        let code = purlin_atom::cubin::function_code(&kernel.cubin).unwrap_or_else(|e| panic!("{}: {e}", unit.name));
        for f in &entries {
            let c = code
                .iter()
                .find(|c| c.function == f.function)
                .unwrap_or_else(|| panic!("{}: no code section for {}: {code:?}", unit.name, f.function));
            assert!(c.bytes > 0 && c.bytes % purlin_atom::cubin::INSTRUCTION_BYTES == 0, "{}: {c:?}", unit.name);
        }
        // The call check stays out of line: inlined, its code lay between the entry's test and
        // the plan's first step, and every plan block jumped over it (round 146).
        let executor = unit.name.starts_with("purlin_shaped_") || unit.name.starts_with("purlin_exec_");
        assert!(
            !executor || resources.iter().any(|f| !f.entry && f.function.contains("run_call_check")),
            "{}: run_call_check is not a function of its own: {resources:?}",
            unit.name
        );
        if unit.name.starts_with("purlin_shaped_") {
            // The shaped executor's record offsets are literals: nothing long-lived to spill.
            assert_eq!(entries.len(), 2, "{}: {entries:?}", unit.name);
            for f in &entries {
                assert!(!hold || !f.spills(), "{}: {} spills: {f:?}", unit.name, f.function);
            }
            checked += 1;
        } else if let Some(key) = unit.name.strip_prefix("purlin_exec_") {
            // purlin_exec_<atom>_<dtype>_<op>_p<bytes>
            let dtype = key.split('_').nth(1).unwrap_or_else(|| panic!("{}: no dtype in the name", unit.name));
            let &(_, stores, loads, by_value_spill_free) = SPILL_CEILINGS_SM90
                .iter()
                .find(|(tag, ..)| *tag == dtype)
                .unwrap_or_else(|| panic!("{}: no spill ceiling for {dtype}", unit.name));
            assert_eq!(entries.len(), 2, "{}: {entries:?}", unit.name);
            for f in &entries {
                assert!(f.registers.is_some_and(|r| r > 0), "{}: {f:?}", unit.name);
                assert!(
                    !hold || (f.spill_store_bytes <= stores && f.spill_load_bytes <= loads),
                    "{}: {} spills {} B stored / {} B loaded, over the ceiling {stores} / {loads}: {f:?}",
                    unit.name,
                    f.function,
                    f.spill_store_bytes,
                    f.spill_load_bytes
                );
                // Round 113's regression was a spill in the by-value entry alone.
                if hold && f.function == "purlin_snac_exec" && by_value_spill_free {
                    assert!(!f.spills(), "{}: the by-value entry spills: {f:?}", unit.name);
                }
            }
            checked += 1;
        }
    }
    // Not vacuous: every sm_90 executor and shaped unit was held to its ceiling.
    let expected = jobs
        .iter()
        .filter(|(u, a)| {
            *a == Arch::SM90 && (u.name.starts_with("purlin_exec_") || u.name.starts_with("purlin_shaped_"))
        })
        .count();
    assert!(expected > 0);
    assert_eq!(checked, expected);
}

#[test]
fn ptxas_reports_a_spill_it_was_forced_into() {
    nvrtc::load().expect("libnvrtc is required");
    // 64 live floats in a kernel capped at 32 registers per thread (1024 threads, 2 blocks
    // per SM on 64K registers) must spill; the same body without the cap must not.
    let body = "{ float v[64];\n#pragma unroll\nfor (int i = 0; i < 64; ++i) v[i] = p[i * n];\n\
                float s = 0.f;\n#pragma unroll\nfor (int i = 0; i < 64; ++i) s += v[i] * v[63 - i];\n\
                #pragma unroll\nfor (int i = 0; i < 64; ++i) p[i * n + 1] = v[i] + s; }";
    let source = format!(
        "extern \"C\" __global__ void __launch_bounds__(1024, 2) capped(float* p, int n) {body}\n\
         extern \"C\" __global__ void uncapped(float* p, int n) {body}\n"
    );
    let unit = purlin_atom::TranslationUnit { name: "spill_probe".into(), source, headers: vec![], options: vec![] };
    let (cubin, resources) = nvrtc::compile_with_resources(&unit, Arch::SM90).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&cubin[..4], b"\x7fELF");
    let find = |name: &str| {
        resources.iter().find(|f| f.function == name).unwrap_or_else(|| panic!("no report for {name}: {resources:?}"))
    };
    let (capped, uncapped) = (find("capped"), find("uncapped"));
    assert!(capped.entry && uncapped.entry);
    assert!(capped.registers.is_some_and(|r| r <= 32), "{capped:?}");
    assert!(capped.spill_store_bytes > 0 && capped.spill_load_bytes > 0, "{capped:?}");
    assert!(uncapped.registers.is_some_and(|r| r > 32), "{uncapped:?}");
    assert!(!uncapped.spills(), "{uncapped:?}");
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
        headers: vec![("params.cuh".into(), purlin_collectives::internal::kernels::PARAMS_CUH.into())],
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
