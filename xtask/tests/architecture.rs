//! Architecture invariants (ARCHITECTURE.md), checked on the real workspace, and each
//! check shown to fail on a planted violation so none of them passes vacuously.

use std::sync::OnceLock;

use xtask::architecture::*;

fn metadata() -> &'static DepGraph {
    static GRAPH: OnceLock<DepGraph> = OnceLock::new();
    GRAPH.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = std::process::Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--manifest-path"])
            .arg(xtask::workspace_root().join("Cargo.toml"))
            .output()
            .expect("run cargo metadata");
        assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
        DepGraph::from_metadata(&json).expect("dependency graph")
    })
}

fn kernels(dir: &str) -> Vec<SourceFile> {
    let files = read_sources(&xtask::workspace_root(), dir, CUDA_EXTS);
    assert!(!files.is_empty(), "no sources under {dir}");
    files
}

fn file(path: &str, text: &str) -> SourceFile {
    SourceFile { path: path.into(), text: text.into() }
}

#[test]
fn the_graph_is_read_from_cargo_metadata() {
    let g = metadata();
    for member in ["purlin-snac", "purlin-atom", "purlin-topo", "purlin-collectives", "xtask", "purlin-benches"] {
        assert!(g.members.contains(member), "{member} is not a workspace member");
    }
    // Non-vacuity: the graph has the edges the other checks look for.
    assert!(g.normal["purlin-atom"].contains("cudarc"));
    assert!(g.normal["purlin-collectives"].contains("purlin-snac"));
}

#[test]
fn snac_has_no_gpu_dependency() {
    check_snac_has_no_gpu_dependency(metadata()).unwrap();
    let mut planted = metadata().clone();
    planted.add_edge("purlin-snac", "serde", true);
    planted.add_edge("serde", "cudarc", true); // transitively
    assert!(check_snac_has_no_gpu_dependency(&planted).is_err());
    // A dev-dependency does not count: the library itself stays GPU-free.
    let mut dev_only = metadata().clone();
    dev_only.add_edge("purlin-snac", "purlin-collectives", false);
    check_snac_has_no_gpu_dependency(&dev_only).unwrap();
}

#[test]
fn snac_forbids_unsafe_code() {
    let lib = std::fs::read_to_string(xtask::workspace_root().join("crates/purlin-snac/src/lib.rs")).unwrap();
    assert!(lib.contains("#![forbid(unsafe_code)]"));
}

#[test]
fn atom_does_not_depend_on_snac() {
    check_atom_does_not_know_snac(metadata()).unwrap();
    let mut planted = metadata().clone();
    planted.add_edge("purlin-atom", "purlin-snac", false);
    assert!(check_atom_does_not_know_snac(&planted).is_err());
}

#[test]
fn the_library_crates_install_no_log_subscriber() {
    check_libraries_install_no_subscriber(metadata()).unwrap();
    assert!(metadata().normal["purlin-log"].contains("tracing-subscriber"), "the check looks for the right name");
    let mut planted = metadata().clone();
    planted.add_edge("purlin-topo", "purlin-log", true);
    assert!(check_libraries_install_no_subscriber(&planted).is_err());
    // The tests' capturing subscriber is a dev-dependency: allowed.
    let mut dev_only = metadata().clone();
    dev_only.add_edge("purlin-atom", "tracing-subscriber", false);
    check_libraries_install_no_subscriber(&dev_only).unwrap();
}

#[test]
fn only_collectives_depends_on_snac_and_atom() {
    check_only_collectives_joins(metadata()).unwrap();
    let mut planted = metadata().clone();
    planted.add_edge("purlin-topo", "purlin-snac", true);
    planted.add_edge("purlin-topo", "purlin-atom", true);
    assert!(check_only_collectives_joins(&planted).is_err());
}

#[test]
fn snac_kernels_include_only_the_atom_interface() {
    let mut snac = kernels("kernels/snac");
    check_snac_kernels_include_only_atom_interface(&snac).unwrap();
    snac.push(file("kernels/snac/bad.cu", "#include \"atom_hopper.cuh\"\n"));
    assert!(check_snac_kernels_include_only_atom_interface(&snac).is_err());
    snac.pop();
    snac.push(file("kernels/snac/bad.cu", "#include <cuda_bf16.h>\n"));
    assert!(check_snac_kernels_include_only_atom_interface(&snac).is_err());
}

#[test]
fn atom_kernels_do_not_include_snac() {
    let (mut atom, snac) = (kernels("kernels/atom"), kernels("kernels/snac"));
    check_atom_kernels_do_not_include_snac(&atom, &snac).unwrap();
    atom.push(file("kernels/atom/bad.cuh", "#include \"sync.cuh\"\n"));
    assert!(check_atom_kernels_do_not_include_snac(&atom, &snac).is_err());
}

#[test]
fn memory_ordering_code_lives_only_in_sync_cuh() {
    let mut snac = kernels("kernels/snac");
    check_ordering_only_in_sync(&snac).unwrap();
    // Non-vacuity: sync.cuh itself is full of such code.
    let sync = snac.iter().find(|f| f.path.ends_with("sync.cuh")).expect("sync.cuh");
    assert!(ORDERING_MARKERS.iter().any(|m| strip_comments(&sync.text).contains(m)));
    // Comments may talk about ordering; code outside sync.cuh may not do it.
    snac.push(file("kernels/snac/ok.cu", "// a release store happens in sync.cuh\nint x;\n"));
    snac.push(file("kernels/snac/ok2.cu", "void g(u64* p) { purlin::sync::st_release_sys(p, 1); }\n"));
    check_ordering_only_in_sync(&snac).unwrap();
    snac.push(file("kernels/snac/bad.cu", "__device__ void f() { __threadfence_system(); }\n"));
    assert!(check_ordering_only_in_sync(&snac).is_err());
    snac.pop();
    let inline_ptx = "asm volatile(\"ld.acquire.sys.global.u64 %0, [%1];\" : \"=l\"(v) : \"l\"(p));";
    snac.push(file("kernels/snac/bad.cu", inline_ptx));
    assert!(check_ordering_only_in_sync(&snac).is_err());
}

/// The executor's files that a fused kernel includes with its own block numbering.
const FUSABLE_EXECUTOR: [&str; 2] = ["kernels/snac/exec.cuh", "kernels/snac/executor.cu"];

/// Lines of `files` (those in [`FUSABLE_EXECUTOR`]) that read the launch's block index or grid
/// directly, outside the `PURLIN_CALL_BLOCK`/`PURLIN_CALL_GRID` defaults.
fn launch_numbering_outside_the_macros(files: &[SourceFile]) -> Vec<String> {
    files
        .iter()
        .filter(|f| FUSABLE_EXECUTOR.iter().any(|p| f.path.ends_with(p)))
        .flat_map(|f| {
            strip_comments(&f.text)
                .lines()
                .filter(|l| l.contains("blockIdx") || l.contains("gridDim"))
                .filter(|l| !l.trim_start().starts_with("#define PURLIN_CALL_"))
                .map(|l| format!("{}: {}", f.path, l.trim()))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn the_executor_numbers_its_blocks_only_through_purlin_call_block() {
    let mut snac = kernels("kernels/snac");
    assert_eq!(launch_numbering_outside_the_macros(&snac), Vec::<String>::new());
    // Non-vacuity: both files are read, and the defaults are where the launch's numbering enters.
    for p in FUSABLE_EXECUTOR {
        let f = snac.iter().find(|f| f.path.ends_with(p)).unwrap_or_else(|| panic!("{p} not read"));
        assert!(f.text.contains("PURLIN_CALL_BLOCK"), "{p} does not use PURLIN_CALL_BLOCK");
    }
    snac.push(file("kernels/snac/executor.cu", "__device__ void f() { u64 b = blockIdx.x; }\n"));
    assert_eq!(launch_numbering_outside_the_macros(&snac).len(), 1);
}

#[test]
fn no_nvlink_multicast_anywhere() {
    let root = xtask::workspace_root();
    let mut files = Vec::new();
    for dir in ["crates", "kernels", "xtask", "benches", ".ci"] {
        files.extend(read_sources(&root, dir, &[".rs", ".cu", ".cuh", ".h", ".py", ".sh", ".toml", "run"]));
    }
    assert!(files.len() > 10, "too few files scanned: {}", files.len());
    check_no_multicast(&files).unwrap();
    let call = ["sys::cu", "MulticastCreate(&mut handle, &prop)"].concat();
    assert!(check_no_multicast(&[file("crates/x.rs", &call)]).is_err());
    let insn = ["asm(\"multi", "mem.ld_reduce.global.add.f32 %0, [%1];\")"].concat();
    assert!(check_no_multicast(&[file("kernels/atom/x.cuh", &insn)]).is_err());
}

#[test]
fn clippy_bans_the_multicast_driver_calls() {
    let toml = std::fs::read_to_string(xtask::workspace_root().join("clippy.toml")).unwrap();
    for f in ["Create", "AddDevice", "BindMem", "BindAddr"] {
        let path = format!("cudarc::driver::sys::cuMulticast{f}");
        assert!(toml.contains(&format!("\"{path}\"")), "{path} is not in clippy.toml's disallowed-methods");
    }
}

const COLLECTIVES_SRC: &str = "crates/purlin-collectives/src";

fn collectives_sources() -> Vec<SourceFile> {
    let files = read_sources(&xtask::workspace_root(), COLLECTIVES_SRC, &[".rs"]);
    assert!(files.len() > 10, "purlin-collectives' sources were not found");
    files
}

#[test]
fn the_join_crate_has_no_module_cycles() {
    let graph = module_graph(&collectives_sources(), COLLECTIVES_SRC);
    // Non-vacuity: the graph holds the modules and the edges the rules are about.
    for m in ["call", "bootstrap", "cpu", "gpu", "diag", "workspace"] {
        assert!(graph.contains_key(m), "no module {m}: {graph:?}");
    }
    assert!(graph["gpu"].contains("call") && graph["cpu"].contains("call"), "{graph:?}");
    check_no_module_cycles(&graph).unwrap();
    // Planted: `call` reaching back into `cpu`, which names `call`.
    let mut planted = collectives_sources();
    planted.push(file(&format!("{COLLECTIVES_SRC}/call/planted.rs"), "use crate::cpu::CpuComm;"));
    let err = check_no_module_cycles(&module_graph(&planted, COLLECTIVES_SRC)).unwrap_err();
    assert!(err.contains("call") && err.contains("cpu"), "{err}");
    // A test module may reach anywhere; a comment is no edge.
    let mut in_tests = collectives_sources();
    in_tests.push(file(
        &format!("{COLLECTIVES_SRC}/call/planted.rs"),
        "// crate::cpu\nfn f() {}\n#[cfg(test)]\nmod tests { use crate::cpu::CpuComm; }",
    ));
    check_no_module_cycles(&module_graph(&in_tests, COLLECTIVES_SRC)).unwrap();
}

#[test]
fn backend_neutral_modules_never_name_the_gpu_backend() {
    const NEUTRAL: &[&str] = &["call", "cpu", "bootstrap", "workspace", "flight", "observe", "nvtx", "hier"];
    const GPU: &[&str] = &["gpu", "diag"];
    check_neutral_modules_know_no_gpu(&collectives_sources(), COLLECTIVES_SRC, NEUTRAL, GPU).unwrap();
    for (path, text) in [
        ("cpu/planted.rs", "fn f() -> usize { crate::gpu::kernels::EXEC_PARAM_WORDS }"),
        ("call/planted.rs", "use cudarc::driver::CudaStream;"),
        ("bootstrap/planted.rs", "use crate::diag::smoke;"),
        ("flight/planted.rs", "use crate::gpu::comm::Comm;"),
        ("hier/planted.rs", "use crate::gpu::comm::Comm;"),
    ] {
        let mut planted = collectives_sources();
        planted.push(file(&format!("{COLLECTIVES_SRC}/{path}"), text));
        assert!(check_neutral_modules_know_no_gpu(&planted, COLLECTIVES_SRC, NEUTRAL, GPU).is_err(), "{path}");
    }
    // `call` does not depend on a backend either.
    check_neutral_modules_know_no_gpu(&collectives_sources(), COLLECTIVES_SRC, &["call"], &["cpu"]).unwrap();
}

#[test]
fn max_world_is_defined_once_in_snac() {
    let root = xtask::workspace_root();
    let mut rust = read_sources(&root, "crates", &[".rs"]);
    rust.extend(read_sources(&root, "benches", &[".rs"]));
    check_one_max_world(&rust).unwrap();
    let mut planted = rust.clone();
    planted.push(file("crates/purlin-collectives/src/gpu/planted.rs", "pub const MAX_WORLD: usize = 16;"));
    assert!(check_one_max_world(&planted).is_err());
    check_kernels_max_world(&kernels("kernels"), purlin_collectives::MAX_WORLD).unwrap();
    assert!(check_kernels_max_world(&[file("kernels/x.cuh", "constexpr u32 kMaxWorld = 8;")], 16).is_err());
}

#[test]
fn comm_keeps_its_diagnostics_behind_diag() {
    const COMM_DIR: &str = "crates/purlin-collectives/src/gpu/comm/";
    let files = collectives_sources();
    check_comm_has_no_public_diagnostics(&files, COMM_DIR).unwrap();
    // Non-vacuity: the diagnostics exist, in diag.rs.
    let diag = files.iter().find(|f| f.path == format!("{COMM_DIR}diag.rs")).expect("gpu/comm/diag.rs");
    assert!(COMM_DIAGNOSTICS.iter().all(|n| diag.text.contains(&format!("pub fn {n}("))));
    let mut planted = files.clone();
    planted.push(file(&format!("{COMM_DIR}planted.rs"), "impl Comm { pub fn ping_pong(&self) {} }"));
    assert!(check_comm_has_no_public_diagnostics(&planted, COMM_DIR).is_err());
}
