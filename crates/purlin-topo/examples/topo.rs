//! Prints this machine's topology like `nvidia-smi topo -m` (or a saved one), and
//! optionally saves it as JSON.
//!
//! `cargo run -p purlin-topo --example topo [-- --load FILE] [--save FILE] [--json]`

use anyhow::{Context, Result, bail};
use purlin_topo::Topology;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut load, mut save, mut json) = (None, None, false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--load" => load = Some(it.next().context("--load FILE")?.clone()),
            "--save" => save = Some(it.next().context("--save FILE")?.clone()),
            "--json" => json = true,
            other => bail!("unknown argument {other}; usage: topo [--load FILE] [--save FILE] [--json]"),
        }
    }
    let topo = match load {
        Some(path) => Topology::load(&path)?,
        None => Topology::probe()?,
    };
    print!("{}", topo.matrix());
    let all: Vec<usize> = (0..topo.len()).collect();
    match topo.peer_path(&all) {
        Ok(p) => println!(
            "\nSingle-kernel peer path on all {} GPUs: yes ({}, {:?} Atom, NVLink {}, native atomics {})",
            topo.len(),
            p.compute_capability,
            p.generation,
            p.all_nvlink.map_or("unknown".into(), |b| b.to_string()),
            p.native_atomics
        ),
        Err(e) => println!("\nSingle-kernel peer path on all {} GPUs: no: {e}", topo.len()),
    }
    if json {
        println!("{}", topo.to_json()?);
    }
    if let Some(path) = save {
        topo.save(&path)?;
        println!("saved {path}");
    }
    Ok(())
}
