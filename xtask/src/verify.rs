//! `cargo xtask verify --fuzz N [--seed S] [--save DIR]`: the differential fuzzer's long run,
//! the verifier against the reference checker on `N` randomly edited derived plan sets
//! (purlin-snac's `examples/fuzz.rs`, in release). Any disagreement fails the command; with
//! `--save`, each is written to `DIR` as a corpus file to keep under
//! `crates/purlin-snac/tests/plans/`.

use anyhow::{Result, bail};

/// Runs the fuzzer when `args` ask for it (`--fuzz N ...`); `Ok(false)` when they do not.
pub fn fuzz(args: &[String]) -> Result<bool> {
    let Some((first, rest)) = args.split_first() else { return Ok(false) };
    if first != "--fuzz" {
        return Ok(false);
    }
    let Some(n) = rest.first().filter(|n| n.parse::<u64>().is_ok()) else {
        bail!("usage: cargo xtask verify --fuzz N [--seed S] [--save DIR]");
    };
    let mut cmd = super::cargo();
    cmd.args(["run", "--release", "-p", "purlin-snac", "--example", "fuzz", "--", n]).args(&rest[1..]);
    super::run(&mut cmd)?;
    Ok(true)
}
