//! The kit stays independent of the library, and the GPU tests carry one `#[ignore]` reason.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The reference must not share code with what it checks: no Purlin crate among the kit's
/// dependencies of any kind.
#[test]
fn the_kit_depends_on_no_purlin_crate() {
    let manifest = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    let deps: Vec<&str> = manifest
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with('[') && !l.starts_with("name"))
        .filter(|l| l.starts_with("purlin"))
        .collect();
    assert!(deps.is_empty(), "the test kit depends on {deps:?}");
    for f in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("src")).unwrap() {
        let path = f.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for krate in ["purlin_collectives", "purlin_snac", "purlin_atom", "purlin_topo"] {
            assert!(!text.contains(&format!("{krate}::")), "{} uses {krate}", path.display());
        }
    }
}

/// Every `#[ignore]` in a `gpu_*.rs` test file is `#[ignore = "<purlin_testkit::GPU_IGNORE>"]`,
/// and an ignored GPU test elsewhere carries the same reason.
#[test]
fn gpu_tests_carry_the_one_ignore_reason() {
    let want = format!("#[ignore = \"{}\"]", purlin_testkit::GPU_IGNORE);
    let mut dirs = vec![root().join("benches/tests")];
    for c in std::fs::read_dir(root().join("crates")).unwrap() {
        dirs.push(c.unwrap().path().join("tests"));
    }
    let mut gpu_ignores = 0;
    for dir in dirs.iter().filter(|d| d.is_dir()) {
        for f in std::fs::read_dir(dir).unwrap() {
            let path = f.unwrap().path();
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&path).unwrap();
            let ignores: Vec<&str> = text.lines().map(str::trim).filter(|l| l.starts_with("#[ignore")).collect();
            if name.starts_with("gpu_") {
                assert!(!ignores.is_empty(), "{}: a GPU test file with no ignored test", path.display());
                for l in &ignores {
                    assert_eq!(*l, want, "{}", path.display());
                }
                gpu_ignores += ignores.len();
            } else {
                let other = ignores.iter().find(|l| l.contains("GPU") && **l != want);
                assert!(other.is_none(), "{}: {other:?}: a GPU test's reason is {want}", path.display());
            }
        }
    }
    assert!(gpu_ignores >= 30, "only {gpu_ignores} GPU tests found");
}
