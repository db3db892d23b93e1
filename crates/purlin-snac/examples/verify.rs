//! The offline verifier CLI.
//!
//! ```text
//! cargo run -p purlin-snac --release --example verify -- <collective> --world N --bytes B
//!     [--regime latency|throughput] [--staging-side own|peer] [--chunk BYTES] [--slots N]
//!     [--staging BYTES] [--blocks N] [--calls N] [--mutate KIND] [--seed S]
//!     [--dtype f32|...] [--in-place] [--max-states N] [--schedules N] [--bound N] [--print]
//! cargo run -p purlin-snac --release --example verify -- --plan FILE
//! ```
//! `--bytes` is per rank (AllReduce, AllGather contribution, ReduceScatter output, AllToAll
//! per pair); V collectives get a skewed split with an empty partition. Exit status: 0 the
//! plan verifies, 1 it does not, 2 usage errors (including a mutation with no site).
use std::process::ExitCode;

use purlin_snac::verify::mutate::{self, Mutation};
use purlin_snac::verify::{self, Corpus, Options};
use purlin_snac::*;

fn usage(msg: &str) -> ExitCode {
    eprintln!("error: {msg}");
    eprintln!(
        "usage: verify <collective> --world N --bytes B [--regime latency|throughput] [--staging-side own|peer] \
         [--chunk BYTES] [--slots N] [--staging BYTES] [--blocks N] [--calls N] [--mutate KIND] [--seed S]\n       \
         verify --plan FILE"
    );
    ExitCode::from(2)
}

fn dtype(s: &str) -> Option<DataType> {
    DataType::ALL.into_iter().find(|d| format!("{d:?}").eq_ignore_ascii_case(s))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut opts = Options::default();
    let mut cfg = PlanConfig::default();
    let (mut world, mut bytes, mut calls, mut collective, mut plan_file) = (2u32, 1024u64, 3usize, None, None);
    let (mut mutation, mut print, mut dt) = (None, false, DataType::F32);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().unwrap_or_default();
        let num = |s: String| s.parse::<u64>().ok();
        match a.as_str() {
            "--world" => match num(val()) {
                Some(v) => world = v as u32,
                None => return usage("--world takes a number"),
            },
            "--bytes" => match num(val()) {
                Some(v) => bytes = v,
                None => return usage("--bytes takes a number"),
            },
            "--regime" => match val().as_str() {
                "latency" => cfg.regime = Regime::Latency,
                "throughput" => cfg.regime = Regime::Throughput,
                _ => return usage("--regime is latency or throughput"),
            },
            "--staging-side" => match val().as_str() {
                "own" => cfg.staging_side = StagingSide::Own,
                "peer" => cfg.staging_side = StagingSide::Peer,
                _ => return usage("--staging-side is own or peer"),
            },
            "--chunk" => match num(val()) {
                Some(v) => cfg.chunk_bytes = v,
                None => return usage("--chunk takes a number"),
            },
            "--slots" => match num(val()) {
                Some(v) => cfg.slots = v as u32,
                None => return usage("--slots takes a number"),
            },
            "--staging" => match num(val()) {
                Some(v) => cfg.staging_bytes = v,
                None => return usage("--staging takes a number"),
            },
            "--window" => match num(val()) {
                Some(v) => cfg.window_bytes = v,
                None => return usage("--window takes a number"),
            },
            "--blocks" => match num(val()) {
                Some(v) => cfg.blocks_per_role = v as u32,
                None => return usage("--blocks takes a number"),
            },
            "--bound" => match num(val()) {
                Some(v) => {
                    cfg.max_coresident_blocks = v as u32;
                    opts.max_coresident_blocks = Some(v as u32);
                }
                None => return usage("--bound takes a number"),
            },
            "--calls" => match num(val()) {
                Some(v) if v >= 1 => calls = v as usize,
                _ => return usage("--calls takes a positive number"),
            },
            "--seed" => match num(val()) {
                Some(v) => opts.seed = v,
                None => return usage("--seed takes a number"),
            },
            "--max-states" => match num(val()) {
                Some(v) => opts.max_states = v,
                None => return usage("--max-states takes a number"),
            },
            "--schedules" => match num(val()) {
                Some(v) => opts.schedules = v,
                None => return usage("--schedules takes a number"),
            },
            "--mutate" => match Mutation::from_name(&val()) {
                Some(m) => mutation = Some(m),
                None => return usage("unknown --mutate kind"),
            },
            "--dtype" => match dtype(&val()) {
                Some(d) => dt = d,
                None => return usage("unknown --dtype"),
            },
            "--reduction" => match val().as_str() {
                "reach" => opts.reduction = verify::Reduction::Reach,
                "footprint" => opts.reduction = verify::Reduction::Footprint,
                "off" => opts.reduction = verify::Reduction::Off,
                _ => return usage("--reduction is reach, footprint or off"),
            },
            "--exhaustive" => opts.mode = verify::Mode::Exhaustive,
            "--sampled" => opts.mode = verify::Mode::Sampled,
            "--in-place" => cfg.in_place = true,
            "--print" => print = true,
            "--plan" => plan_file = Some(val()),
            s if !s.starts_with("--") && collective.is_none() => match Collective::from_name(s) {
                Some(c) => collective = Some(c),
                None => return usage(&format!("unknown collective {s}")),
            },
            s => return usage(&format!("unknown argument {s}")),
        }
    }
    let scenario: Vec<Vec<Plan>> = if let Some(f) = plan_file {
        let data = match std::fs::read(&f) {
            Ok(d) => d,
            Err(e) => return usage(&format!("reading {f}: {e}")),
        };
        let parsed = if f.ends_with(".json") {
            serde_json::from_slice::<Corpus>(&data)
                .or_else(|_| {
                    serde_json::from_slice::<Vec<Plan>>(&data).map(|p| Corpus {
                        description: "one call".into(),
                        expect: None,
                        calls: vec![p],
                    })
                })
                .map_err(|e| e.to_string())
        } else {
            Corpus::from_bytes(&data)
        };
        match parsed {
            Ok(c) => {
                println!("{f}: {}", c.description);
                c.calls
            }
            Err(e) => return usage(&format!("{f}: {e}")),
        }
    } else {
        let Some(c) = collective else { return usage("name a collective or --plan FILE") };
        let es = dt.size();
        let n = bytes / es;
        let w = world as u64;
        let skew = |i: u64| if i == 1 { 0 } else { n * (i % 3 + 1) / 2 };
        let op = ReduceOp::Sum;
        let spec = match c {
            Collective::AllReduce => CollectiveSpec::all_reduce(world, dt, op, n),
            Collective::AllGather => CollectiveSpec::all_gather(world, dt, n),
            Collective::ReduceScatter => CollectiveSpec::reduce_scatter(world, dt, op, n),
            Collective::AllToAll => CollectiveSpec::all_to_all(world, dt, n),
            Collective::AllGatherV => CollectiveSpec::all_gather_v(world, dt, (0..w).map(skew).collect()),
            Collective::ReduceScatterV => CollectiveSpec::reduce_scatter_v(world, dt, op, (0..w).map(skew).collect()),
            Collective::AllToAllV => CollectiveSpec::all_to_all_v(
                world,
                dt,
                (0..w).map(|s| (0..w).map(|d| if s == d + 1 { 0 } else { skew(s * w + d) }).collect()).collect(),
            ),
        };
        // The full plan: `verify` applies the chunk cutoff itself.
        match derive(&spec, &cfg) {
            Ok(p) => vec![p; calls],
            Err(e) => return usage(&format!("cannot derive: {e}")),
        }
    };
    let mut scenario = scenario;
    if let Some(m) = mutation {
        let sites = mutate::sites(&scenario[0], m);
        let Some(&site) = sites.get((opts.seed as usize) % sites.len().max(1)) else {
            eprintln!("error: mutation {} has no site in this plan", m.name());
            return ExitCode::from(2);
        };
        println!("mutation {} at {site} ({} sites)", m.name(), sites.len());
        let mutated = mutate::apply(&scenario[0], m, site);
        for call in &mut scenario {
            *call = mutated.clone();
        }
    }
    for (k, call) in scenario.iter().enumerate() {
        if let Some(p) = call.first() {
            println!(
                "call {k}: {} world {} {:?}{} {:?}, grids {:?}, {} steps on rank 0, advance {:?}",
                p.spec.collective.name(),
                p.spec.world,
                p.regime,
                p.staging_side.map(|s| format!("/{s:?}")).unwrap_or_default(),
                p.spec.dtype,
                call.iter().map(|p| p.grid()).collect::<Vec<_>>(),
                p.step_count(),
                p.advance
            );
        }
        if print {
            call.iter().for_each(|p| print!("{p}"));
        }
    }
    let report = verify::verify(&scenario, &opts);
    if let Some(t) = report.cutoff {
        println!(
            "checked through the twin: each stretch of a chunk loop between two step ends cut to at most slots + 2 = {t} chunks"
        );
    }
    match &report.result {
        Ok(()) => println!("verified: {} ({:.3?})", report.coverage, report.elapsed),
        Err(v) => println!("FAILED: {} ({:.3?})\n{v}", report.coverage, report.elapsed),
    }
    if report.ok() { ExitCode::SUCCESS } else { ExitCode::from(1) }
}
