//! Prints the derived plans of one collective: `cargo run -p purlin-snac --example show`.
use purlin_snac::*;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let name = args.get(1).map(String::as_str).unwrap_or("all-reduce");
    let world: u32 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2);
    let count: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(100);
    let regime = if args.get(4).map(String::as_str) == Some("latency") { Regime::Latency } else { Regime::Throughput };
    let side = if args.get(5).map(String::as_str) == Some("own") { StagingSide::Own } else { StagingSide::Peer };
    let c = Collective::from_name(name).expect("collective");
    let dt = DataType::F32;
    let spec = match c {
        Collective::AllReduce => CollectiveSpec::all_reduce(world, dt, ReduceOp::Sum, count),
        Collective::AllGather => CollectiveSpec::all_gather(world, dt, count),
        Collective::ReduceScatter => CollectiveSpec::reduce_scatter(world, dt, ReduceOp::Sum, count),
        Collective::AllToAll => CollectiveSpec::all_to_all(world, dt, count),
        Collective::AllGatherV => {
            CollectiveSpec::all_gather_v(world, dt, (0..world as u64).map(|i| i * count).collect())
        }
        Collective::ReduceScatterV => {
            CollectiveSpec::reduce_scatter_v(world, dt, ReduceOp::Sum, (0..world as u64).map(|i| i * count).collect())
        }
        Collective::AllToAllV => CollectiveSpec::all_to_all_v(
            world,
            dt,
            (0..world as u64).map(|s| (0..world as u64).map(|d| (s + d) * count).collect()).collect(),
        ),
    };
    let cfg = PlanConfig {
        regime,
        staging_side: side,
        chunk_bytes: 64,
        slots: 2,
        staging_bytes: 4096,
        window_bytes: 4096,
        ..Default::default()
    };
    match derive(&spec, &cfg) {
        Ok(plans) => {
            for p in &plans {
                print!("{p}");
            }
            println!("check_set: {:?}", check_set(&plans));
        }
        Err(e) => println!("error: {e}"),
    }
}
