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
