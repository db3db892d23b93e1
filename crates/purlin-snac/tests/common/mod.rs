//! Shared generators for the integration tests.
#![allow(dead_code)]

pub mod equivalent;

use proptest::prelude::*;
use purlin_snac::*;

/// A spec of `c` on `world` ranks, with counts drawn from `pick` (0 and skew included).
pub fn spec_of(c: Collective, world: u32, dt: DataType, n: u64, v: Vec<u64>) -> CollectiveSpec {
    let w = world as usize;
    let row = |i: usize| v[i % v.len()];
    match c {
        Collective::AllReduce => CollectiveSpec::all_reduce(world, dt, ReduceOp::Sum, n),
        Collective::AllGather => CollectiveSpec::all_gather(world, dt, n),
        Collective::ReduceScatter => CollectiveSpec::reduce_scatter(world, dt, ReduceOp::Max, n),
        Collective::AllToAll => CollectiveSpec::all_to_all(world, dt, n),
        Collective::AllGatherV => CollectiveSpec::all_gather_v(world, dt, (0..w).map(row).collect()),
        Collective::ReduceScatterV => {
            CollectiveSpec::reduce_scatter_v(world, dt, ReduceOp::Min, (0..w).map(row).collect())
        }
        Collective::AllToAllV => {
            CollectiveSpec::all_to_all_v(world, dt, (0..w).map(|s| (0..w).map(|d| row(s * w + d)).collect()).collect())
        }
    }
}

/// Element counts: zeros, small, and heavy skew.
pub fn count() -> impl Strategy<Value = u64> {
    prop_oneof![3 => Just(0u64), 4 => 0u64..64, 3 => 0u64..5000, 1 => 0u64..2_000_000]
}

pub fn collective() -> impl Strategy<Value = Collective> {
    proptest::sample::select(Collective::ALL.to_vec())
}

pub fn dtype() -> impl Strategy<Value = DataType> {
    proptest::sample::select(DataType::ALL.to_vec())
}

pub fn spec(worlds: std::ops::RangeInclusive<u32>) -> impl Strategy<Value = CollectiveSpec> {
    (collective(), worlds, dtype(), count(), proptest::collection::vec(count(), 1..40))
        .prop_map(|(c, w, dt, n, v)| spec_of(c, w, dt, n, v))
}

pub fn config() -> impl Strategy<Value = PlanConfig> {
    (
        prop_oneof![Just(Regime::Latency), Just(Regime::Throughput)],
        prop_oneof![Just(StagingSide::Own), Just(StagingSide::Peer)],
        prop_oneof![Just(AllReduceAlgo::Auto), Just(AllReduceAlgo::OneShot), Just(AllReduceAlgo::TwoShot)],
        1u32..=4,
        1u64..=64,
        1u32..=8,
        prop_oneof![Just(4096u64), Just(64 << 10), Just(16 << 20)],
        prop_oneof![Just(4096u64), Just(1 << 20), Just(32 << 20)],
        prop_oneof![Just(3u32), Just(8), Just(64)],
        any::<bool>(),
    )
        .prop_map(|(regime, side, ar, blocks, k, slots, staging, window, bound, in_place)| PlanConfig {
            regime,
            staging_side: side,
            allreduce: ar,
            chunk_bytes: 16 * blocks as u64 * k,
            blocks_per_role: blocks,
            slots,
            staging_bytes: staging,
            window_bytes: window,
            max_coresident_blocks: bound,
            packet: PacketFormat::B8,
            in_place,
            ..PlanConfig::default()
        })
}
