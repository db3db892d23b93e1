//! The CPU twin of the example (what CI runs): the tensor-parallel block over `CpuComm`
//! threads matches the rank-order sharded reference bit for bit and the unsharded block to
//! float re-association, on every rank.

use purlin_candle_tp::{Dims, UNSHARDED_REL_BOUND, run_cpu};

#[test]
fn the_tensor_parallel_block_matches_its_references_on_every_rank() {
    for world in [2, 4] {
        let reports = run_cpu(Dims::small(), 0x5EED, world).expect("the CPU twin runs");
        assert_eq!(reports.len(), world);
        for r in &reports {
            assert!(r.exact, "world {world} rank {}: differs from the rank-order reference", r.rank);
            assert!(
                r.unsharded_rel <= UNSHARDED_REL_BOUND,
                "world {world} rank {}: {:.2e} from the unsharded block",
                r.rank,
                r.unsharded_rel
            );
            // Sharding re-associates sums: a zero difference would mean the comparison saw
            // nothing of it (or compared a tensor with itself).
            assert!(r.unsharded_rel > 0.0, "world {world} rank {}: not a sharded computation", r.rank);
        }
    }
}

#[test]
fn a_wrong_world_is_an_error_not_a_hang() {
    // 3 does not divide the heads: refused on every rank before any collective.
    let e = run_cpu(Dims::small(), 1, 3).unwrap_err();
    assert!(e.to_string().contains("does not split over 3 ranks"), "{e}");
}
