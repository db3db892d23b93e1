//! The docs: the README is a front door whose links resolve, and nothing in the repository
//! points outside it. Each check is also shown failing on a planted violation.

use xtask::architecture::{SourceFile, read_sources};
use xtask::docs::*;

const TEXT_EXTS: &[&str] = &[".md", ".rs", ".toml", ".cu", ".cuh", ".h", ".sh", ".py", ".txt", ".json", ".csv"];

fn repository_files(exts: &[&str]) -> Vec<SourceFile> {
    let files = read_sources(&xtask::workspace_root(), ".", exts);
    assert!(files.iter().any(|f| f.path.ends_with("README.md")), "the repository's files were not found");
    files.into_iter().map(|f| SourceFile { path: f.path.trim_start_matches("./").to_string(), text: f.text }).collect()
}

fn file(path: &str, text: &str) -> SourceFile {
    SourceFile { path: path.into(), text: text.into() }
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = xtask::workspace_root();
    let docs = repository_files(&[".md"]);
    let readme = docs.iter().find(|f| f.path == "README.md").expect("README.md");
    // Non-vacuity: the README links the docs it promises.
    let links = relative_links(&readme.text);
    for must in ["ARCHITECTURE.md", "benches/README.md", "docs/design.md", "results/INDEX.md"] {
        assert!(links.iter().any(|l| l == must), "README.md does not link {must}: {links:?}");
    }
    check_links_resolve(&root, &docs).unwrap();
    let planted = [file("docs/planted.md", "See [the notes](notes/missing.md#top) and [a site](https://x.org).")];
    let err = check_links_resolve(&root, &planted).unwrap_err();
    assert!(err.contains("notes/missing.md") && !err.contains("x.org"), "{err}");
    // Links inside code blocks are code, not links.
    check_links_resolve(&root, &[file("docs/planted.md", "```rust\nlet v = a[0](b);\n```\n")]).unwrap();
}

#[test]
fn the_readme_is_a_front_door() {
    let readme = std::fs::read_to_string(xtask::workspace_root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 160, "README.md has {lines} lines: manuals go beside their code, history to results/INDEX.md");
    // The two commands and a compiled example.
    assert!(readme.contains("cargo xtask test") && readme.contains("--example quickstart"));
    assert!(readme.contains("```rust\n"), "README.md has no compiled example");
}

#[test]
fn nothing_points_outside_the_repository() {
    let files: Vec<SourceFile> =
        repository_files(TEXT_EXTS).into_iter().filter(|f| !f.path.starts_with("results/")).collect();
    assert!(files.len() > 100, "too few files read: {}", files.len());
    check_self_contained(&files).unwrap();
    let notes = repository_files(&[".md"]).into_iter().filter(|f| f.path.starts_with("results/")).collect::<Vec<_>>();
    check_self_contained(&notes).unwrap();
    for text in [concat!("see ../", "shared/x"), concat!("(DESIGN", ".md §4)"), concat!("DEVICE", ".md")] {
        assert!(check_self_contained(&[file("kernels/planted.cuh", text)]).is_err(), "{text}");
    }
}
