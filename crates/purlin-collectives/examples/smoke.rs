//! The device smoke test as a program: an NVRTC-compiled kernel on every GPU, peer access
//! both ways, and a flag ping-pong round trip. Without a GPU it compiles the kernels for
//! sm_90 with NVRTC only, and says so.

use purlin_atom::{Arch, KernelCache};

fn main() -> anyhow::Result<()> {
    let cache = KernelCache::default_location();
    if purlin_topo::device_count() == 0 {
        println!("no CUDA GPU here: compiling the executor kernels for sm_90 with NVRTC only");
        let jobs: Vec<_> = purlin_collectives::kernels::all_units(purlin_atom::Generation::Hopper)
            .into_iter()
            .map(|unit| (unit, Arch::SM90))
            .collect();
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        for k in cache.get_or_compile_all(&jobs, threads)? {
            println!("  {} ({} bytes of CUBIN)", k.key, k.cubin.len());
        }
        println!("cached in {}", cache.dir().display());
        return Ok(());
    }
    let report = purlin_collectives::smoke::run(&cache)?;
    for d in &report.devices {
        println!("gpu{} {} {}: kernel ran, {} elements checked", d.ordinal, d.name, d.arch, d.elements_checked);
    }
    for (i, j, ok) in &report.peer_access {
        println!("peer access gpu{i} -> gpu{j}: {}", if *ok { "enabled" } else { "not available" });
    }
    if let Some((rounds, us)) = report.ping_pong {
        println!("flag ping-pong gpu0 <-> gpu1: {rounds} rounds, {us:.2} us round trip");
    }
    Ok(())
}
