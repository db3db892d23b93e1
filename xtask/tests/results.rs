//! `results/` is the one home of the measurement history (results/INDEX.md): every round the tree
//! cites has a line there, every result folder is listed, and the folder stays small. Each check
//! is a pure function, shown to fail on a planted violation so none of them passes vacuously.

use std::collections::BTreeSet;
use std::path::Path;

/// `results/` must stay under this many bytes (the sum of its files' sizes): raw logs go into
/// each folder's `raw.tar.xz`.
const RESULTS_LIMIT: u64 = 5_000_000;

/// The kinds of tracked file whose round citations must resolve.
const CITING_EXTS: &[&str] = &[".rs", ".cu", ".cuh", ".md", ".toml", ".sh", ".txt", ".py"];

// ---- the checks ----------------------------------------------------------------------------

/// `files` (path, size) sum to less than `limit` bytes.
fn check_size(files: &[(String, u64)], limit: u64) -> Result<(), String> {
    let total: u64 = files.iter().map(|(_, n)| n).sum();
    if total < limit {
        return Ok(());
    }
    let mut big: Vec<_> = files.iter().collect();
    big.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    let top: Vec<String> = big.iter().take(5).map(|(p, n)| format!("{p} ({n} B)")).collect();
    Err(format!("results/ holds {total} bytes, over {limit}; pack raw files into raw.tar.xz. Largest: {top:?}"))
}

/// Round numbers cited in `text`, with their line numbers (1-based):
/// - `round 149`, `Rounds 147 and 148`, `rounds 103, 105 and 111`, `round 135/136`, and the two
///   ends of a range, `rounds 30–33` or `30-33` (a comma list counts only when it ends in `and N`,
///   so `round 5, 2026-11-30` cites 5 alone; `7.30` is a figure, not a round);
/// - `r149`: `r` and at least two digits, not inside a word nor after `%` or `.` (a folder
///   `…-shared-r149/`, a file `sweeps-r150.txt`, a link `results/INDEX.md#r149`).
fn cited_rounds(text: &str) -> Vec<(usize, u32)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        // ASCII lowercasing keeps every byte offset.
        let lower = line.to_ascii_lowercase();
        let b = lower.as_bytes();
        let mut from = 0;
        while let Some(k) = lower[from..].find("round") {
            let start = from + k;
            from = start + "round".len();
            if start > 0 && is_word(b[start - 1]) {
                continue; // "around"
            }
            let mut j = from;
            if b.get(j) == Some(&b's') {
                j += 1;
            }
            if b.get(j) != Some(&b' ') {
                continue; // "rounded", "round-trip"
            }
            while b.get(j) == Some(&b' ') {
                j += 1;
            }
            out.extend(round_list(&lower[j..]).into_iter().map(|r| (n + 1, r)));
        }
        for (i, &c) in b.iter().enumerate() {
            let before_ok = i == 0 || !(is_word(b[i - 1]) || b[i - 1] == b'%' || b[i - 1] == b'.');
            if c == b'r'
                && before_ok
                && let Some((r, len)) = number(&lower[i + 1..])
                && len >= 2
            {
                out.push((n + 1, r));
            }
        }
    }
    out
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// A round number at the start of `s`: digits and at most one letter (`145a`), not followed by
/// a word character or by `.` and a digit. Returns the number and the digits' length.
fn number(s: &str) -> Option<(u32, usize)> {
    let b = s.as_bytes();
    let digits = b.iter().take_while(|c| c.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    let mut end = digits;
    if b.get(end).is_some_and(|c| c.is_ascii_lowercase()) {
        end += 1;
    }
    if b.get(end).is_some_and(|&c| is_word(c)) {
        return None;
    }
    if b.get(end) == Some(&b'.') && b.get(end + 1).is_some_and(u8::is_ascii_digit) {
        return None;
    }
    Some((s[..digits].parse().ok()?, end))
}

/// One item of a round list: a number or a range (`30–33`, `30-33`; both ends count).
fn item(s: &str) -> Option<(Vec<u32>, usize)> {
    let (a, mut len) = number(s)?;
    for dash in ["–", "-"] {
        if let Some(rest) = s[len..].strip_prefix(dash)
            && let Some((b, blen)) = number(rest)
        {
            len += dash.len() + blen;
            return Some((vec![a, b], len));
        }
    }
    Some((vec![a], len))
}

/// The rounds a list after "round(s) " names: `N`, `N–M`, `N/M`, `N and M`, `N, M and K`.
fn round_list(s: &str) -> Vec<u32> {
    let Some((mut cited, mut at)) = item(s) else { return Vec::new() };
    let mut pending = Vec::new();
    loop {
        let rest = &s[at..];
        if let Some(r) = rest.strip_prefix(", ")
            && let Some((more, len)) = item(r)
        {
            pending.extend(more);
            at += 2 + len;
        } else if let Some(r) = rest.strip_prefix(" and ").or_else(|| rest.strip_prefix('/'))
            && let Some((more, _)) = item(r)
        {
            cited.extend(pending);
            cited.extend(more);
            return cited;
        } else {
            return cited; // a comma list without "and N" is not a list of rounds
        }
    }
}

/// The rounds INDEX.md has an anchor for: `<a id="r149"></a>`.
fn index_anchors(index: &str) -> BTreeSet<u32> {
    index.match_indices("<a id=\"r").filter_map(|(i, m)| number(&index[i + m.len()..]).map(|(r, _)| r)).collect()
}

/// Every round cited in `files` (path, text) has an anchor in INDEX.md.
fn check_citations(files: &[(String, String)], anchors: &BTreeSet<u32>) -> Result<(), String> {
    let bad: Vec<String> = files
        .iter()
        .flat_map(|(path, text)| {
            cited_rounds(text)
                .into_iter()
                .filter(|(_, r)| !anchors.contains(r))
                .map(move |(n, r)| format!("{path}:{n}: round {r}"))
        })
        .collect();
    if bad.is_empty() { Ok(()) } else { Err(format!("rounds cited with no line in results/INDEX.md: {bad:?}")) }
}

/// Every result folder is named in INDEX.md (as `FOLDER/`, so a folder whose name is a prefix
/// of another's is not taken for it).
fn check_folders_listed(folders: &[String], index: &str) -> Result<(), String> {
    let bad: Vec<&String> = folders.iter().filter(|f| !index.contains(&format!("{f}/"))).collect();
    if bad.is_empty() { Ok(()) } else { Err(format!("result folders missing from results/INDEX.md: {bad:?}")) }
}

/// Every relative link of INDEX.md (`](path)` or `](path#anchor)`) names a file that `exists`.
fn check_links(index: &str, exists: impl Fn(&str) -> bool) -> Result<(), String> {
    let bad: Vec<&str> = index
        .match_indices("](")
        .filter_map(|(i, m)| index[i + m.len()..].split(')').next())
        .map(|link| link.split('#').next().unwrap_or(link))
        .filter(|path| !path.is_empty() && !path.contains("://") && !exists(path))
        .collect();
    if bad.is_empty() { Ok(()) } else { Err(format!("results/INDEX.md links to missing files: {bad:?}")) }
}

// ---- the real tree -------------------------------------------------------------------------

fn read_index() -> String {
    std::fs::read_to_string(xtask::workspace_root().join("results/INDEX.md")).expect("read results/INDEX.md")
}

/// (path relative to the root, size) of every file under `dir`.
fn files_under(root: &Path, dir: &Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("read {}: {e}", d.display())).flatten() {
            let p = e.path();
            let meta = e.metadata().expect("metadata");
            if meta.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(root).unwrap_or(&p).to_string_lossy().replace('\\', "/");
                out.push((rel, meta.len()));
            }
        }
    }
    out
}

/// The folders of `results/`, less `notes/` (the records of rounds that kept no folder).
fn result_folders() -> Vec<String> {
    let dir = xtask::workspace_root().join("results");
    let mut out: Vec<String> = std::fs::read_dir(&dir)
        .expect("read results/")
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "notes")
        .collect();
    out.sort();
    out
}

/// Tracked source and documentation files outside `results/` (git's list; the working tree's
/// text), of the kinds in [`CITING_EXTS`].
fn citing_files() -> Vec<(String, String)> {
    let root = xtask::workspace_root();
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["ls-files", "-z"])
        .output()
        .expect("run git ls-files");
    assert!(out.status.success(), "git ls-files: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .split('\0')
        .filter(|p| !p.is_empty() && !p.starts_with("results/") && !p.starts_with("target/"))
        .filter(|p| CITING_EXTS.iter().any(|x| p.ends_with(x)))
        // A file deleted in the working tree but not yet from the index has nothing to cite.
        .filter_map(|p| std::fs::read_to_string(root.join(p)).ok().map(|text| (p.to_string(), text)))
        .collect()
}

// ---- tests ---------------------------------------------------------------------------------

#[test]
fn results_stay_under_the_size_limit() {
    let root = xtask::workspace_root();
    let files = files_under(&root, &root.join("results"));
    assert!(files.len() > 100, "too few files under results/: {}", files.len());
    check_size(&files, RESULTS_LIMIT).unwrap();
    let mut planted = files.clone();
    planted.push(("results/x/cmd-1.log".into(), RESULTS_LIMIT));
    assert!(check_size(&planted, RESULTS_LIMIT).is_err());
}

#[test]
fn round_citations_are_read_as_written() {
    let rounds = |s: &str| cited_rounds(s).into_iter().map(|(_, r)| r).collect::<Vec<_>>();
    assert_eq!(rounds("as round 149 showed"), [149]);
    assert_eq!(rounds("Round 8, latency"), [8]);
    assert_eq!(rounds("rounds 147 and 148"), [147, 148]);
    assert_eq!(rounds("rounds 30–33 and rounds 25-26"), [30, 33, 25, 26]);
    assert_eq!(rounds("rounds 20, 38–41 and 78 before it"), [20, 38, 41, 78]);
    assert_eq!(rounds("round 135/136 again"), [135, 136]);
    assert_eq!(rounds("rounds 107 and 110, a"), [107, 110]);
    // Figures, dates and sizes after a round are not rounds.
    assert_eq!(rounds("5.57 µs in round 45 and 7.30 here"), [45]);
    assert_eq!(rounds("(round 5, 2026-11-30)"), [5]);
    assert_eq!(rounds("(rounds 69–70, 256 MiB)"), [69, 70]);
    // Not citations: other words, other rounds, registers and variables.
    assert_eq!(rounds("around 5 µs, a round trip, 20 000 rounds, round-robin, rounded 4"), Vec::<u32>::new());
    assert_eq!(rounds("asm(\"mov %r10\"); let r1 = x.r12;"), Vec::<u32>::new());
    // Folder, file and anchor names.
    assert_eq!(rounds("results/2026-12-07-1xh100-shared-r149/, sweeps-r150.txt"), [149, 150]);
    assert_eq!(rounds("[r149](results/INDEX.md#r149) and …-r145a/"), [149, 149, 145]);
    assert_eq!(cited_rounds("x\nround 4\n"), [(2, 4)]);
}

#[test]
fn every_cited_round_has_an_index_line() {
    let anchors = index_anchors(&read_index());
    assert!(anchors.len() > 100, "too few anchors in results/INDEX.md: {}", anchors.len());
    let files = citing_files();
    assert!(files.len() > 50, "too few tracked files scanned: {}", files.len());
    assert!(files.iter().map(|(_, t)| cited_rounds(t).len()).sum::<usize>() > 50, "too few citations found");
    check_citations(&files, &anchors).unwrap();
    let mut planted = files.clone();
    // Planted numbers are built at run time: this file is scanned too.
    let missing = 9000 + anchors.len() as u32;
    assert!(!anchors.contains(&missing));
    planted.push(("crates/x/src/lib.rs".into(), format!("// Rolled (round {missing}).\n")));
    assert!(check_citations(&planted, &anchors).is_err());
    planted.pop();
    planted.push(("docs/x.md".into(), format!("[why](results/INDEX.md#r{missing})\n")));
    assert!(check_citations(&planted, &anchors).is_err());
}

#[test]
fn every_result_folder_is_listed_in_the_index() {
    let index = read_index();
    let folders = result_folders();
    assert!(folders.len() > 50, "too few result folders: {}", folders.len());
    check_folders_listed(&folders, &index).unwrap();
    let mut planted = folders.clone();
    planted.push(format!("2026-12-31-1xh100-shared-r{}", 9000 + folders.len()));
    assert!(check_folders_listed(&planted, &index).is_err());
    // A folder whose name is a prefix of a listed one's is not listed by it.
    assert!(check_folders_listed(&["2026-11-30-2xh200-r1".into()], "[x](2026-11-30-2xh200-r13/NOTES.md)").is_err());
}

#[test]
fn index_links_resolve() {
    let index = read_index();
    let dir = xtask::workspace_root().join("results");
    check_links(&index, |p| dir.join(p).exists()).unwrap();
    assert!(check_links("[x](gone/NOTES.md#r1)", |p| dir.join(p).exists()).is_err());
}
