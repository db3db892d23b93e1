//! The latency regime: packets straight into the peers' receive windows (docs/design.md §3.2).
//!
//! Window layout of every rank, per sense half of `window_bytes / 2` bytes: `phases` areas of
//! `world - 1` cells of `A` bytes, one per peer (at receiver `q`, peer `p` has cell `p` if
//! `p < q`, else `p - 1`: a rank sends itself no packets, so it has no cell; `A` is the largest
//! transfer between two ranks, rounded up to 16), then — when the plan has a handshake —
//! `world` 16-byte handshake cells. Block `b` of `B` moves the slice `[b*S, b*S + S)` of every
//! transfer, `S = up16(ceil(A / B))`; a gather's own part (input to output) is copied by
//! further blocks, one per non-empty slice, beside the packet blocks. Every packet of a call
//! carries the flag `E + 1`.

use super::{DeriveError, PlanConfig, add_handshake, empty_non_v, empty_plan, two_shot, up16};
use crate::plan::{Advance, BlockProgram, EpochVal, Guard, Len, Offset, Plan, Region, Role, Step};
use crate::spec::{Collective, CollectiveSpec};
use crate::types::{ConsumeOp, Regime};

pub(super) fn derive(spec: &CollectiveSpec, cfg: &PlanConfig, rank: u32) -> Result<Plan, DeriveError> {
    let world = spec.world;
    let mut plan = empty_plan(spec, cfg, rank, Regime::Latency, None);
    if empty_non_v(spec) {
        return Ok(plan);
    }
    plan.advance = Advance::Fixed(1);
    let nb = cfg.blocks_per_role;
    if nb > cfg.max_coresident_blocks {
        return Err(DeriveError::TooManyBlocks { need: nb as u64, bound: cfg.max_coresident_blocks });
    }
    let ar_two = spec.collective == Collective::AllReduce && two_shot(spec, cfg);
    // Bytes `src` sends `dst` in phase 0 and where they start in `src`'s input.
    let send = |src: u32, dst: u32| -> (u64, u64) {
        match spec.collective {
            Collective::AllReduce if ar_two => (spec.shard(dst).0, spec.shard(dst).1),
            Collective::AllReduce => (0, spec.input_bytes(src)),
            Collective::AllGather | Collective::AllGatherV => (0, spec.pair_bytes(src, dst)),
            _ => (spec.partition_offset(src, dst, true), spec.pair_bytes(src, dst)),
        }
    };
    let pairs = || (0..world).flat_map(|p| (0..world).filter(move |&q| q != p).map(move |q| (p, q)));
    let a = up16(pairs().map(|(p, q)| send(p, q).1).max().unwrap_or(0));
    let needs_handshake = spec.collective.is_v() || pairs().any(|(p, q)| send(p, q).1 == 0);
    let phases: u64 = if ar_two { 2 } else { 1 };
    let half = cfg.window_bytes / 2;
    let peers = world as u64 - 1;
    let hs_base = phases * peers * a;
    let need = hs_base + if needs_handshake { 16 * world as u64 } else { 0 };
    if need > half {
        return Err(DeriveError::WindowTooSmall { have: cfg.window_bytes, need: 2 * need });
    }
    // Block slices cover the largest transfer, the rank's own local copy included.
    let widest = (0..world).map(|p| send(p, p).1).max().unwrap_or(0).max(a);
    let s = up16(widest.div_ceil(nb as u64)).max(16);
    // Where receiver `owner` keeps the packets `src` sends it in `phase`.
    let cell = |phase: u64, owner: u32, src: u32| (phase * peers + (src - u32::from(src > owner)) as u64) * a;
    let flag = EpochVal::at(1);
    let g = Guard::ALWAYS;

    // A rank's own part of a gather (input to output, no peer involved) runs on blocks of its
    // own after the packet blocks: on the packet blocks its load latency came on top of
    // waiting for the peers' packets instead of beside it.
    let mut local_blocks = vec![];
    for b in 0..nb {
        let bs = b as u64 * s;
        let len = |total: u64| Len::slice(s, total, bs, 0);
        let at = |off: u64| Offset::fixed(off + bs);
        let win = |owner: u32, phase: u64, src: u32| {
            Region::window(owner, Offset::fixed(cell(phase, owner, src) + bs).sense(half))
        };
        let mut steps = vec![];
        // Phase 0 puts.
        for q in (0..world).filter(|&q| q != rank) {
            let (off, n) = send(rank, q);
            if len(n).at(0) > 0 {
                steps.push(Step::PutPackets {
                    dst: win(q, 0, rank),
                    src: Region::input(at(off)),
                    len: len(n),
                    flag,
                    guard: g,
                });
            }
        }
        match spec.collective.consume_op() {
            ConsumeOp::Gather => {
                let (off, n) = send(rank, rank);
                let out = spec.partition_offset(rank, rank, false);
                let same_place = cfg.in_place && spec.collective != Collective::AllToAll;
                if len(n).at(0) > 0 && !same_place {
                    local_blocks.push(BlockProgram {
                        role: Role::Packets,
                        steps: vec![Step::Gather {
                            dst: Region::output(at(out)),
                            src: Region::input(at(off)),
                            len: len(n),
                            expect: None,
                            guard: g,
                        }],
                    });
                }
                for p in (0..world).filter(|&p| p != rank) {
                    let n = send(p, rank).1;
                    if len(n).at(0) > 0 {
                        steps.push(Step::Gather {
                            dst: Region::output(at(spec.partition_offset(rank, p, false))),
                            src: win(rank, 0, p),
                            len: len(n),
                            expect: Some(flag),
                            guard: g,
                        });
                    }
                }
            }
            ConsumeOp::Reduce => {
                let (own_off, n) = send(rank, rank);
                let out_off = if ar_two { own_off } else { 0 };
                if len(n).at(0) > 0 {
                    let srcs = (0..world)
                        .map(|p| if p == rank { Region::input(at(own_off)) } else { win(rank, 0, p) })
                        .collect();
                    steps.push(Step::Reduce {
                        dst: Region::output(at(out_off)),
                        srcs,
                        len: len(n),
                        expect: Some(flag),
                        guard: g,
                    });
                }
                if ar_two {
                    // Phase 1: push the reduced shard back out, unpack the peers' shards.
                    for q in (0..world).filter(|&q| q != rank) {
                        if len(n).at(0) > 0 {
                            steps.push(Step::PutPackets {
                                dst: win(q, 1, rank),
                                src: Region::output(at(own_off)),
                                len: len(n),
                                flag,
                                guard: g,
                            });
                        }
                    }
                    for p in (0..world).filter(|&p| p != rank) {
                        let (off, n) = spec.shard(p);
                        if len(n).at(0) > 0 {
                            steps.push(Step::Gather {
                                dst: Region::output(at(off)),
                                src: win(rank, 1, p),
                                len: len(n),
                                expect: Some(flag),
                                guard: g,
                            });
                        }
                    }
                }
            }
        }
        plan.blocks.push(BlockProgram { role: Role::Packets, steps });
    }
    plan.blocks.extend(local_blocks);
    if plan.blocks.len() > cfg.max_coresident_blocks as usize {
        return Err(DeriveError::TooManyBlocks { need: plan.blocks.len() as u64, bound: cfg.max_coresident_blocks });
    }
    if needs_handshake {
        add_handshake(&mut plan, hs_base, half, false);
    }
    Ok(plan)
}
