//! The differential fuzzer's long run: the verifier against the reference checker on randomly
//! edited derived plans (`purlin_snac::fuzz`). `cargo xtask verify --fuzz N` runs it.
//!
//! ```text
//! cargo run -p purlin-snac --release --example fuzz -- N [--seed S] [--save DIR] [--matching TEXT] [--case K]
//! ```
//! Runs `N` cases from seed `S` (default 1), one or two edits each, and prints the tally:
//! cases, agreements (accepted and rejected by both), inconclusive cases (a search over its
//! budget), disagreements, states and time. Each disagreement is printed and, with `--save`,
//! written to `DIR` as a corpus file (`tests/plans/` format) to keep as a regression case;
//! `--matching TEXT` saves every case whose description contains `TEXT` instead; `--case K`
//! draws the first `K` cases but judges (and saves, with `--save`) only case `K`, to reproduce
//! one case of a long run. Exit status 1 when any disagreement was found.
use std::process::ExitCode;
use std::time::Instant;

use purlin_snac::fuzz::{self, Outcome, Rng};
use purlin_snac::verify::Corpus;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut n: u64 = 1000;
    let mut seed = 1u64;
    let mut save: Option<String> = None;
    let mut matching: Option<String> = None;
    let mut only: Option<u64> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seed" => seed = it.next().and_then(|s| s.parse().ok()).unwrap_or(seed),
            "--save" => save = it.next().cloned(),
            "--matching" => matching = it.next().cloned(),
            "--case" => only = it.next().and_then(|s| s.parse().ok()),
            s => match s.parse() {
                Ok(x) => n = x,
                Err(_) => {
                    eprintln!("usage: fuzz N [--seed S] [--save DIR] [--matching TEXT] [--case K]");
                    return ExitCode::from(2);
                }
            },
        }
    }
    let t0 = Instant::now();
    let mut rng = Rng::new(seed);
    let (mut cases, mut accepted, mut rejected, mut inconclusive, mut disagreements) = (0u64, 0, 0, 0, 0);
    while cases < n {
        let edits = 1 + rng.below(2) as u32;
        let Some(case) = fuzz::case(&mut rng, edits) else { continue };
        cases += 1;
        if only.is_some_and(|k| k != cases) {
            continue;
        }
        let outcome = fuzz::compare(&case.calls, 200_000, 100_000);
        let keep = match &outcome {
            Outcome::Agree { accepted: true } => {
                accepted += 1;
                None
            }
            Outcome::Agree { accepted: false } => {
                rejected += 1;
                None
            }
            Outcome::Inconclusive => {
                inconclusive += 1;
                None
            }
            Outcome::VerifierAcceptsBroken(why) => Some(("reference", why.clone())),
            Outcome::VerifierRejectsGood(why) => Some(("verifier", why.clone())),
        };
        if let Some((rejector, why)) = &keep {
            disagreements += 1;
            println!("case {cases}: disagreement, the {rejector} rejects: {why}\n  {}", case.what);
        }
        let wanted =
            keep.is_some() || only.is_some() || matching.as_ref().is_some_and(|m| case.what.contains(m.as_str()));
        if let (Some(dir), true) = (&save, wanted) {
            let expect = match &outcome {
                Outcome::Agree { accepted: true } | Outcome::VerifierRejectsGood(_) => None,
                _ => Some("?".to_string()),
            };
            let corpus = Corpus { description: case.what.clone(), expect, calls: case.calls.clone() };
            let path = format!("{dir}/fuzz-seed{seed}-case{cases}.json");
            let written = std::fs::create_dir_all(dir)
                .and_then(|()| std::fs::write(&path, serde_json::to_vec(&corpus).unwrap_or_default()));
            match written {
                Ok(()) => println!("  saved {path}"),
                Err(e) => eprintln!("  {path}: {e}"),
            }
        }
        if cases % 500 == 0 {
            println!("{cases} cases, {:.0?}", t0.elapsed());
        }
    }
    println!(
        "seed {seed}: {cases} cases in {:.1?}: {accepted} accepted by both, {rejected} rejected by both, {inconclusive} \
         inconclusive, {disagreements} disagreements",
        t0.elapsed()
    );
    if disagreements > 0 { ExitCode::from(1) } else { ExitCode::SUCCESS }
}
