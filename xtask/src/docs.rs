//! Checks that keep the docs honest: relative links resolve, and nothing in the repository
//! points at files outside it.

use std::path::Path;

use crate::architecture::SourceFile;

/// The relative link targets of a Markdown text (`[text](target)`), without their `#anchor`;
/// web, mail and same-page links are not files.
pub fn relative_links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = rest[..end].trim();
            rest = &rest[end..];
            let path = target.split('#').next().unwrap_or("");
            if path.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            out.push(path.to_string());
        }
    }
    out
}

/// Every relative link of every Markdown file in `files` names a file or folder under `root`.
pub fn check_links_resolve(root: &Path, files: &[SourceFile]) -> Result<(), String> {
    let mut broken = Vec::new();
    for f in files.iter().filter(|f| f.path.ends_with(".md")) {
        let dir = Path::new(&f.path).parent().unwrap_or(Path::new(""));
        for link in relative_links(&f.text) {
            if !root.join(dir).join(&link).exists() {
                broken.push(format!("{}: {link}", f.path));
            }
        }
    }
    if broken.is_empty() { Ok(()) } else { Err(format!("links that resolve to nothing: {broken:?}")) }
}

/// What only the team's machines have: the design notes and device log beside the checkout.
// Spelled in pieces, so that this file does not trip its own check.
pub const OUTSIDE: &[&str] = &[concat!("..", "/shared"), concat!("DESIGN", ".md"), concat!("DEVICE", ".md")];

/// No file names a path outside the repository (users have only the repository).
pub fn check_self_contained(files: &[SourceFile]) -> Result<(), String> {
    let bad: Vec<String> = files
        .iter()
        .flat_map(|f| {
            f.text
                .lines()
                .enumerate()
                .filter(|(_, l)| OUTSIDE.iter().any(|o| l.contains(o)))
                .map(move |(i, _)| format!("{}:{}", f.path, i + 1))
        })
        .collect();
    if bad.is_empty() { Ok(()) } else { Err(format!("lines that point outside the repository: {bad:?}")) }
}
