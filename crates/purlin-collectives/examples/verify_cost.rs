//! What a plan key's first verification costs under `PURLIN_VERIFY=1`: the plans `Comm`
//! would run (GPU tuning table, the workspace's default sizes, 264 co-resident blocks),
//! verified with the default budget, at a world and a size per line.
//!
//! ```text
//! cargo run -p purlin-collectives --release --example verify_cost -- [--world N]... [--bytes B]...
//! ```
//! Without arguments: worlds 2, 4 and 8, AllReduce, AllGather, ReduceScatter and AllToAll at
//! 64 KiB and 1 MiB (bf16), each on plain buffers (staged plans) and on symmetric ones
//! (one-copy plans). A key already verified (the same verification twin) shows ~0 s.
use std::time::Instant;

use anyhow::{Context, bail};
use purlin_collectives::internal::kernels::EXEC_PARAM_WORDS;
use purlin_collectives::internal::tuning::{PlanLimits, Tuning, plan_fitting};
use purlin_collectives::internal::verified::{default_budget, verified};
use purlin_collectives::internal::workspace::WorkspaceConfig;
use purlin_snac::verify::Options;
use purlin_snac::{CollectiveSpec, DataType, PacketFormat, ReduceOp};

fn main() -> anyhow::Result<()> {
    purlin_log::init()?;
    let (mut worlds, mut sizes) = (vec![], vec![]);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v: u64 = args.next().with_context(|| format!("{a} takes a number"))?.parse()?;
        match a.as_str() {
            "--world" => worlds.push(v as u32),
            "--bytes" => sizes.push(v),
            _ => bail!("unknown argument {a}"),
        }
    }
    if worlds.is_empty() {
        worlds = vec![2, 4, 8];
    }
    if sizes.is_empty() {
        sizes = vec![64 << 10, 1 << 20];
    }
    let fits = |p: &purlin_snac::Plan| purlin_snac::params::encode(p).len() <= EXEC_PARAM_WORDS;
    println!(
        "{:>5} {:>10} {:>15} {:>10} {:>6} {:>10}  coverage",
        "world", "bytes", "collective", "buffers", "grid", "seconds"
    );
    for &world in &worlds {
        for &bytes in &sizes {
            let n = bytes / 2;
            let w = world as u64;
            for spec in [
                CollectiveSpec::all_reduce(world, DataType::Bf16, ReduceOp::Sum, n),
                CollectiveSpec::all_gather(world, DataType::Bf16, n / w),
                CollectiveSpec::reduce_scatter(world, DataType::Bf16, ReduceOp::Sum, n / w),
                CollectiveSpec::all_to_all(world, DataType::Bf16, n / w),
            ] {
                // Plain buffers (staged plans), then symmetric ones (one-copy plans).
                for symmetric in [false, true] {
                    let limits = PlanLimits::of_workspace(
                        &WorkspaceConfig::default(),
                        264,
                        PacketFormat::B16,
                        symmetric,
                        symmetric,
                    );
                    let budget =
                        Options { max_coresident_blocks: Some(limits.max_coresident_blocks), ..default_budget() };
                    let (plan, cfg) = plan_fitting(&spec, 0, false, &Tuning::default(), &limits, fits)?;
                    let t = Instant::now();
                    let verdict = verified(&spec, &cfg, &budget)?;
                    println!(
                        "{world:>5} {bytes:>10} {:>15} {:>10} {:>6} {:>10.3}  {}",
                        spec.collective.name(),
                        if symmetric { "symmetric" } else { "plain" },
                        plan.grid(),
                        t.elapsed().as_secs_f64(),
                        verdict.coverage
                    );
                }
            }
        }
    }
    Ok(())
}
