//! The kernel key: the compile-time part of a plan (docs/design.md §3.4).
//!
//! Everything here becomes template arguments of the device executor: element type, reduce
//! op and mode, regime, packet format, world (the peer loops' unroll) and the plan's *shape* —
//! for each distinct block program, its sequence of step kinds (with source counts and whether
//! a source is packets). Numbers that vary per call (sizes, offsets, strides, trip counts,
//! flag indices, epoch offsets) are not in the key: they travel in the parameter block
//! ([`crate::params`]). The Atom generation is not known to this crate; the runtime pairs
//! the key with it.

use serde::{Deserialize, Serialize};

use crate::plan::{NotifyKind, Plan, Role, Space, Step};
use crate::types::{DataType, PacketFormat, ReduceOp, ReductionMode, Regime};

/// One step kind of a shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ShapeOp {
    /// A chunk loop over the next `body` ops.
    Loop {
        body: u32,
    },
    Stage,
    Gather {
        packets: bool,
    },
    Reduce {
        srcs: u32,
        packets: bool,
    },
    PutPackets,
    Signal,
    Drain,
    Wait,
    Arrive {
        notifies: u32,
    },
    HandshakeSend,
    HandshakeWait,
}

/// The shape of one kind of block program.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BlockShape {
    pub role: Role,
    pub ops: Vec<ShapeOp>,
}

/// The compile-time part of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KernelKey {
    pub dtype: DataType,
    pub op: Option<ReduceOp>,
    pub mode: ReductionMode,
    pub regime: Regime,
    pub packet: PacketFormat,
    pub world: u32,
    /// Distinct block shapes, in order of first appearance.
    pub shapes: Vec<BlockShape>,
}

fn shape_op(s: &Step) -> ShapeOp {
    let win = |r: &crate::plan::Region| matches!(r.space, Space::Window(_));
    match s {
        Step::ChunkLoop { body, .. } => ShapeOp::Loop { body: body.len() as u32 },
        Step::Stage { .. } => ShapeOp::Stage,
        Step::Gather { src, .. } => ShapeOp::Gather { packets: win(src) },
        Step::Reduce { srcs, .. } => ShapeOp::Reduce { srcs: srcs.len() as u32, packets: srcs.iter().any(win) },
        Step::PutPackets { .. } => ShapeOp::PutPackets,
        Step::Signal { notify, .. } => match notify.kind {
            NotifyKind::Ready => ShapeOp::Signal,
            NotifyKind::Drain => ShapeOp::Drain,
        },
        Step::Wait { .. } => ShapeOp::Wait,
        Step::Arrive { then, .. } => ShapeOp::Arrive { notifies: then.len() as u32 },
        Step::HandshakeSend { .. } => ShapeOp::HandshakeSend,
        Step::HandshakeWait { .. } => ShapeOp::HandshakeWait,
    }
}

impl Plan {
    /// The shape of block `b`'s program.
    pub fn block_shape(&self, b: usize) -> BlockShape {
        let block = &self.blocks[b];
        let mut ops = vec![];
        for s in &block.steps {
            ops.push(shape_op(s));
            if let Step::ChunkLoop { body, .. } = s {
                ops.extend(body.iter().map(shape_op));
            }
        }
        BlockShape { role: block.role, ops }
    }

    /// Index of each block's shape in [`KernelKey::shapes`].
    pub fn block_shape_ids(&self) -> Vec<u32> {
        let mut shapes: Vec<BlockShape> = vec![];
        (0..self.blocks.len())
            .map(|b| {
                let s = self.block_shape(b);
                match shapes.iter().position(|x| *x == s) {
                    Some(i) => i as u32,
                    None => {
                        shapes.push(s);
                        shapes.len() as u32 - 1
                    }
                }
            })
            .collect()
    }

    /// For each of [`KernelKey::shapes`], its ops with the words of each op's record (in
    /// [`crate::params`]), in the same order: what a shaped executor needs to find every
    /// record of a block at a constant offset from its first.
    pub fn shape_records(&self) -> Vec<Vec<(ShapeOp, u32)>> {
        let ids = self.block_shape_ids();
        let count = ids.iter().map(|&i| i as usize + 1).max().unwrap_or(0);
        (0..count)
            .map(|id| {
                let b = ids.iter().position(|&i| i as usize == id).unwrap_or(0);
                let mut ops = vec![];
                for s in &self.blocks[b].steps {
                    ops.push((shape_op(s), crate::params::record_words(s)));
                    if let Step::ChunkLoop { body, .. } = s {
                        ops.extend(body.iter().map(|t| (shape_op(t), crate::params::record_words(t))));
                    }
                }
                ops
            })
            .collect()
    }

    /// The compile-time part of this plan.
    pub fn kernel_key(&self) -> KernelKey {
        let mut shapes: Vec<BlockShape> = vec![];
        for b in 0..self.blocks.len() {
            let s = self.block_shape(b);
            if !shapes.contains(&s) {
                shapes.push(s);
            }
        }
        KernelKey {
            dtype: self.spec.dtype,
            op: self.spec.op,
            mode: self.spec.mode,
            regime: self.regime,
            packet: self.packet,
            world: self.spec.world,
            shapes,
        }
    }
}

impl KernelKey {
    /// A stable 64-bit digest (FNV-1a over the bincode encoding), for cache file names.
    pub fn digest(&self) -> u64 {
        fnv1a(&bincode::serde::encode_to_vec(self, bincode::config::standard()).unwrap_or_default())
    }
}

/// 64-bit FNV-1a of `bytes`: the digests of purlin-snac (kernel keys, calls).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}
