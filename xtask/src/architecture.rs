//! The architecture invariants of ARCHITECTURE.md, as pure functions over `cargo metadata`
//! and source text, so each check can be shown failing on a planted violation.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Crates that load or bind a GPU driver: none may be a normal dependency of purlin-snac.
pub const GPU_CRATES: &[&str] = &[
    "cudarc",
    "cust",
    "cust_raw",
    "cuda-sys",
    "cuda-runtime-sys",
    "cuda-driver-sys",
    "nvml-wrapper",
    "libloading",
    "purlin-atom",
    "purlin-topo",
    "purlin-collectives",
];

/// The dependency graph of the workspace: package name → direct deps, split by kind.
#[derive(Debug, Default, Clone)]
pub struct DepGraph {
    /// Normal (non-dev, non-build) dependencies.
    pub normal: BTreeMap<String, BTreeSet<String>>,
    /// All dependencies, any kind.
    pub any: BTreeMap<String, BTreeSet<String>>,
    /// Workspace member names.
    pub members: BTreeSet<String>,
}

impl DepGraph {
    /// Builds the graph from `cargo metadata --format-version 1` JSON.
    pub fn from_metadata(meta: &Value) -> Result<Self, String> {
        let mut names = BTreeMap::new();
        for p in meta["packages"].as_array().ok_or("no packages")? {
            names.insert(
                p["id"].as_str().unwrap_or_default().to_string(),
                p["name"].as_str().unwrap_or_default().to_string(),
            );
        }
        let mut g = DepGraph::default();
        for id in meta["workspace_members"].as_array().ok_or("no workspace_members")? {
            g.members.insert(names[id.as_str().unwrap_or_default()].clone());
        }
        for node in meta["resolve"]["nodes"].as_array().ok_or("no resolve graph")? {
            let from = names[node["id"].as_str().unwrap_or_default()].clone();
            for dep in node["deps"].as_array().into_iter().flatten() {
                let to = names[dep["pkg"].as_str().unwrap_or_default()].clone();
                let kinds = dep["dep_kinds"].as_array().cloned().unwrap_or_default();
                if kinds.iter().any(|k| k["kind"].is_null()) {
                    g.normal.entry(from.clone()).or_default().insert(to.clone());
                }
                g.any.entry(from.clone()).or_default().insert(to);
            }
        }
        Ok(g)
    }

    /// Adds an edge of the given kind (for planting violations in tests).
    pub fn add_edge(&mut self, from: &str, to: &str, normal: bool) {
        if normal {
            self.normal.entry(from.into()).or_default().insert(to.into());
        }
        self.any.entry(from.into()).or_default().insert(to.into());
    }

    fn closure(edges: &BTreeMap<String, BTreeSet<String>>, root: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![root.to_string()];
        while let Some(n) = stack.pop() {
            for d in edges.get(&n).into_iter().flatten() {
                if seen.insert(d.clone()) {
                    stack.push(d.clone());
                }
            }
        }
        seen
    }
}

/// purlin-snac has no GPU crate among its normal dependencies, transitively.
pub fn check_snac_has_no_gpu_dependency(g: &DepGraph) -> Result<(), String> {
    let deps = DepGraph::closure(&g.normal, "purlin-snac");
    let bad: Vec<_> = deps.iter().filter(|d| GPU_CRATES.contains(&d.as_str())).collect();
    if bad.is_empty() { Ok(()) } else { Err(format!("purlin-snac depends (transitively) on GPU crates: {bad:?}")) }
}

/// The library crates only emit logs: none has a log subscriber (`tracing-subscriber`) among
/// its normal dependencies, transitively, so embedding Purlin never installs or links one;
/// programs install `purlin-log`'s.
pub fn check_libraries_install_no_subscriber(g: &DepGraph) -> Result<(), String> {
    const LIBRARIES: &[&str] = &["purlin-snac", "purlin-atom", "purlin-topo", "purlin-collectives"];
    let bad: Vec<&str> =
        LIBRARIES.iter().copied().filter(|l| DepGraph::closure(&g.normal, l).contains("tracing-subscriber")).collect();
    if bad.is_empty() { Ok(()) } else { Err(format!("library crates that depend on a log subscriber: {bad:?}")) }
}

/// purlin-atom does not depend on purlin-snac, by any kind of edge, transitively.
pub fn check_atom_does_not_know_snac(g: &DepGraph) -> Result<(), String> {
    if DepGraph::closure(&g.any, "purlin-atom").contains("purlin-snac") {
        Err("purlin-atom depends on purlin-snac".into())
    } else {
        Ok(())
    }
}

/// Only purlin-collectives, xtask and the benches depend directly on both purlin-snac and purlin-atom.
pub fn check_only_collectives_joins(g: &DepGraph) -> Result<(), String> {
    const ALLOWED: &[&str] = &["purlin-collectives", "xtask", "purlin-benches"];
    let joiners: Vec<_> = g
        .members
        .iter()
        .filter(|m| {
            let d = g.any.get(*m);
            d.is_some_and(|d| d.contains("purlin-snac") && d.contains("purlin-atom"))
        })
        .filter(|m| !ALLOWED.contains(&m.as_str()))
        .collect();
    if joiners.is_empty() {
        Ok(())
    } else {
        Err(format!("only purlin-collectives may join snac and atom; also: {joiners:?}"))
    }
}

/// A source file: its path relative to the workspace root, and its text.
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// Relative path, with `/` separators.
    pub path: String,
    /// Contents.
    pub text: String,
}

/// Reads every file under `dir` (relative to `root`) with one of `exts`, recursively.
pub fn read_sources(root: &Path, dir: &str, exts: &[&str]) -> Vec<SourceFile> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = vec![root.join(dir)];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if p.is_dir() {
                if !matches!(name.as_str(), "target" | ".git" | "gpu-round" | ".whl") {
                    stack.push(p);
                }
            } else if exts.iter().any(|x| name.ends_with(x))
                && let Ok(text) = std::fs::read_to_string(&p)
            {
                let rel = p.strip_prefix(root).unwrap_or(&p).to_string_lossy().replace('\\', "/");
                out.push(SourceFile { path: rel, text });
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// CUDA sources (the file kinds under `kernels/`).
pub const CUDA_EXTS: &[&str] = &[".cu", ".cuh", ".h", ".hpp"];

/// Removes `//` and `/* */` comments, keeping line structure (so comments may explain
/// the rules without tripping them). String literals in kernels are rare and kept.
pub fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '/' && chars.peek() == Some(&'/') {
            for c in chars.by_ref() {
                if c == '\n' {
                    out.push('\n');
                    break;
                }
            }
        } else if c == '/' && chars.peek() == Some(&'*') {
            chars.next();
            let mut prev = ' ';
            for c in chars.by_ref() {
                if c == '\n' {
                    out.push('\n');
                }
                if prev == '*' && c == '/' {
                    break;
                }
                prev = c;
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The targets of `#include "..."` / `#include <...>` lines.
pub fn includes(text: &str) -> Vec<String> {
    strip_comments(text)
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix('#').map(str::trim_start))
        .filter_map(|l| l.strip_prefix("include"))
        .filter_map(|l| {
            let l = l.trim();
            let (open, close) = match l.chars().next()? {
                '"' => ('"', '"'),
                '<' => ('<', '>'),
                _ => return None,
            };
            let rest = l.strip_prefix(open)?;
            rest.find(close).map(|end| rest[..end].to_string())
        })
        .collect()
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// kernels/snac/ includes, from the Atom, only its interface header; everything else it
/// includes is its own file. No system or CUDA headers.
pub fn check_snac_kernels_include_only_atom_interface(snac: &[SourceFile]) -> Result<(), String> {
    let own: BTreeSet<&str> = snac.iter().map(|f| file_name(&f.path)).collect();
    let mut bad = Vec::new();
    for f in snac {
        for inc in includes(&f.text) {
            if inc != "atom.cuh" && !own.contains(inc.as_str()) {
                bad.push(format!("{}: #include {inc:?}", f.path));
            }
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!("kernels/snac may include only atom.cuh and its own files: {bad:?}"))
    }
}

/// kernels/atom/ includes nothing from kernels/snac/.
pub fn check_atom_kernels_do_not_include_snac(atom: &[SourceFile], snac: &[SourceFile]) -> Result<(), String> {
    let snac_names: BTreeSet<&str> = snac.iter().map(|f| file_name(&f.path)).collect();
    let mut bad = Vec::new();
    for f in atom {
        for inc in includes(&f.text) {
            if inc.contains("snac/") || snac_names.contains(file_name(&inc)) {
                bad.push(format!("{}: #include {inc:?}", f.path));
            }
        }
    }
    if bad.is_empty() { Ok(()) } else { Err(format!("kernels/atom must not include kernels/snac: {bad:?}")) }
}

/// Words that mark memory-ordering code: PTX ordering qualifiers, fences, volatile
/// accesses, atomics and CUDA's fence/atomic intrinsics.
pub const ORDERING_MARKERS: &[&str] =
    &["volatile", "acquire", "release", "acq_rel", "fence", "membar", "__threadfence", "atom.", "atomic", "red."];

/// Removes calls into sync.cuh (`sync::name`): using the primitives is what other files
/// should do; only their definitions must stay in sync.cuh.
fn strip_sync_calls(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(i) = rest.find("sync::") {
        out.push_str(&rest[..i]);
        rest = rest[i + "sync::".len()..].trim_start_matches(|c: char| c.is_ascii_alphanumeric() || c == '_');
    }
    out.push_str(rest);
    out
}

/// Within kernels/snac/, only sync.cuh contains memory-ordering code. Calls of its
/// primitives (`purlin::sync::st_release_sys(...)`) are allowed elsewhere.
pub fn check_ordering_only_in_sync(snac: &[SourceFile]) -> Result<(), String> {
    let mut bad = Vec::new();
    for f in snac.iter().filter(|f| file_name(&f.path) != "sync.cuh") {
        // Include lines name files (`atom.cuh`), not instructions.
        let code: String = strip_sync_calls(&strip_comments(&f.text))
            .lines()
            .map(|l| if l.trim_start().starts_with("#include") { "" } else { l })
            .collect::<Vec<_>>()
            .join("\n");
        for (n, line) in code.lines().enumerate() {
            if let Some(m) = ORDERING_MARKERS.iter().find(|m| line.contains(*m)) {
                bad.push(format!("{}:{}: {m:?}", f.path, n + 1));
            }
        }
    }
    if bad.is_empty() { Ok(()) } else { Err(format!("memory-ordering code outside kernels/snac/sync.cuh: {bad:?}")) }
}

/// No NVLink multicast anywhere: no driver multicast call in Rust or C++, no `multimem`
/// PTX instruction. The patterns are assembled at run time so this file does not match.
pub fn check_no_multicast(files: &[SourceFile]) -> Result<(), String> {
    let call = ["cu", "Multicast"].concat();
    let insn = ["multi", "mem."].concat();
    let mut bad = Vec::new();
    for f in files {
        let code = if f.path.ends_with(".rs") || CUDA_EXTS.iter().any(|x| f.path.ends_with(x)) {
            strip_comments(&f.text)
        } else {
            f.text.clone()
        };
        for (n, line) in code.lines().enumerate() {
            if line.contains(&insn) || line.match_indices(&call).any(|(i, _)| is_call(&line[i..])) {
                bad.push(format!("{}:{}: {}", f.path, n + 1, line.trim()));
            }
        }
    }
    if bad.is_empty() { Ok(()) } else { Err(format!("NVLink multicast is banned on these machines: {bad:?}")) }
}

/// `cuMulticastXxx(` — an identifier followed by an opening parenthesis.
fn is_call(s: &str) -> bool {
    let rest = s.trim_start_matches(|c: char| c.is_ascii_alphanumeric() || c == '_');
    rest.trim_start().starts_with('(')
}

/// The code of a Rust file that the library builds: comments removed, and everything from
/// the first `#[cfg(test)]` on dropped (unit tests sit at the end of a file and may reach
/// anywhere).
pub fn library_code(text: &str) -> String {
    let code = strip_comments(text);
    match code.find("#[cfg(test)]") {
        Some(at) => code[..at].to_string(),
        None => code,
    }
}

/// The top-level module of a file under `src` (`src/gpu/comm/mod.rs` → `gpu`,
/// `src/workspace.rs` → `workspace`); `None` for the crate root and files elsewhere.
pub fn top_module(path: &str, src: &str) -> Option<String> {
    let rest = path.strip_prefix(src)?.strip_prefix('/')?;
    let first = rest.split('/').next()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib" && name != "main").then(|| name.to_string())
}

/// The modules a piece of code names through `crate::NAME` paths.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        // `crate::` inside `purlin_crate::` or the like is not a crate path.
        if code[..at].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let name: String =
            code[at + "crate::".len()..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if !name.is_empty() {
            out.insert(name);
        }
    }
    out
}

/// The crate's top-level modules and the ones each names (`crate::` paths in library code).
pub fn module_graph(files: &[SourceFile], src: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let Some(from) = top_module(&f.path, src) else { continue };
        let names = crate_paths(&library_code(&f.text));
        graph.entry(from.clone()).or_default().extend(names.into_iter().filter(|n| *n != from));
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    // Items re-exported at the crate root (`crate::Error`) are not modules.
    for names in graph.values_mut() {
        names.retain(|n| modules.contains(n));
    }
    graph
}

/// No cycle among the crate's top-level modules: each names only modules below it.
pub fn check_no_module_cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Result<(), String> {
    // Depth-first search for a back edge, reporting the cycle it closes.
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Result<(), String> {
        if let Some(at) = path.iter().position(|p| p == n) {
            let mut cycle = path[at..].to_vec();
            cycle.push(n.to_string());
            return Err(format!("module cycle: {}", cycle.join(" → ")));
        }
        if done.contains(n) {
            return Ok(());
        }
        path.push(n.to_string());
        for m in graph.get(n).into_iter().flatten() {
            visit(m, graph, path, done)?;
        }
        path.pop();
        done.insert(n.to_string());
        Ok(())
    }
    let mut done = BTreeSet::new();
    for n in graph.keys() {
        visit(n, graph, &mut Vec::new(), &mut done)?;
    }
    Ok(())
}

/// The backend-neutral modules (`neutral`) name no module in `forbidden` (the GPU backend)
/// and never cudarc, in library code.
pub fn check_neutral_modules_know_no_gpu(
    files: &[SourceFile],
    src: &str,
    neutral: &[&str],
    forbidden: &[&str],
) -> Result<(), String> {
    let graph = module_graph(files, src);
    let mut bad = Vec::new();
    for n in neutral {
        for f in graph.get(*n).into_iter().flatten().filter(|m| forbidden.contains(&m.as_str())) {
            bad.push(format!("{n} names crate::{f}"));
        }
    }
    for f in files.iter().filter(|f| top_module(&f.path, src).is_some_and(|m| neutral.contains(&m.as_str()))) {
        if library_code(&f.text).contains("cudarc") {
            bad.push(format!("{} names cudarc", f.path));
        }
    }
    if bad.is_empty() { Ok(()) } else { Err(bad.join("; ")) }
}

/// `const MAX_WORLD` is defined once, in purlin-snac (library code of every crate).
pub fn check_one_max_world(files: &[SourceFile]) -> Result<(), String> {
    let defs: Vec<&str> = files
        .iter()
        .filter(|f| f.path.ends_with(".rs") && library_code(&f.text).contains("const MAX_WORLD"))
        .map(|f| f.path.as_str())
        .collect();
    match defs[..] {
        [one] if one.starts_with("crates/purlin-snac/src/") => Ok(()),
        _ => Err(format!("MAX_WORLD is defined in {defs:?}; it must be defined once, in purlin-snac")),
    }
}

/// kernels' `kMaxWorld` is purlin-snac's `MAX_WORLD`.
pub fn check_kernels_max_world(kernels: &[SourceFile], max_world: usize) -> Result<(), String> {
    let want = format!("kMaxWorld = {max_world};");
    let defs: Vec<&SourceFile> = kernels.iter().filter(|f| strip_comments(&f.text).contains("kMaxWorld =")).collect();
    if defs.is_empty() {
        return Err("no kMaxWorld definition under kernels/".into());
    }
    match defs.iter().find(|f| !strip_comments(&f.text).contains(&want)) {
        Some(f) => Err(format!("{}: kMaxWorld is not {max_world} (purlin-snac's MAX_WORLD)", f.path)),
        None => Ok(()),
    }
}

/// `Comm`'s diagnostics: behind `Comm::diag()`, never beside the collectives.
pub const COMM_DIAGNOSTICS: &[&str] = &[
    "host",
    "workspace_layout",
    "workspace_addrs",
    "kernels",
    "kernel",
    "read_own_workspace",
    "coresidency",
    "module",
    "generation",
    "launch_ping_pong",
    "ping_pong",
];

/// No file of `comm_dir` but its `diag.rs` defines a public diagnostic method: `Comm`'s
/// surface is cudarc's shape plus Purlin's additions.
pub fn check_comm_has_no_public_diagnostics(files: &[SourceFile], comm_dir: &str) -> Result<(), String> {
    let mut bad = Vec::new();
    for f in files.iter().filter(|f| f.path.starts_with(comm_dir) && !f.path.ends_with("/diag.rs")) {
        let code = library_code(&f.text);
        for name in COMM_DIAGNOSTICS {
            if code.contains(&format!("pub fn {name}(")) || code.contains(&format!("pub fn {name}<")) {
                bad.push(format!("{}: pub fn {name}", f.path));
            }
        }
    }
    if bad.is_empty() { Ok(()) } else { Err(format!("diagnostics on Comm's public surface: {bad:?}")) }
}
