//! The executor's CUDA sources (`kernels/snac/`) and the translation units the runtime
//! can ask NVRTC for. `cargo xtask gpu-round` prebuilds exactly these; CI compiles them.

use purlin_atom::{AtomSpec, DType, Generation, TranslationUnit};
use purlin_snac::{Plan, Regime, ShapeOp};

/// The memory-ordering primitives of the protocol (docs/design.md §3.6).
pub const SYNC_CUH: &str = include_str!("../../../../kernels/snac/sync.cuh");
/// The device smoke-test kernels.
pub const SMOKE_CU: &str = include_str!("../../../../kernels/snac/smoke.cu");

/// The torn-packet stress test (latency regime's 16-byte packets).
pub const PACKET_STRESS_CU: &str = include_str!("../../../../kernels/snac/packet_stress.cu");

/// The latency-floor experiment (`examples/latency_floor.rs`): launch shapes and the least
/// one-shot exchange, measured beside the executor.
pub const LATENCY_FLOOR_CU: &str = include_str!("../../../../kernels/snac/latency_floor.cu");
/// The payload-alignment probe of the device smoke test.
pub const PAYLOAD_PROBE_CU: &str = include_str!("../../../../kernels/snac/payload_probe.cu");

/// The CUDA side of the parameter block's header (checked against purlin-snac's layout).
pub const PARAMS_CUH: &str = include_str!("../../../../kernels/snac/params.cuh");
/// What both device executors share: per-call pointers, record access, packets, failures.
pub const EXEC_CUH: &str = include_str!("../../../../kernels/snac/exec.cuh");
/// The device executor: interprets a SNAC plan, one kernel per call.
pub const EXECUTOR_CU: &str = include_str!("../../../../kernels/snac/executor.cu");
/// The shaped executor: latency plans of compiled-in shapes, steps unrolled.
pub const SHAPED_CU: &str = include_str!("../../../../kernels/snac/shaped.cu");

/// The reduction an executor kernel is compiled for (gathers use [`ExecOp::Copy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ExecOp {
    /// No reduction (AllGather, AllToAll and their V forms): the key is dtype-agnostic.
    Copy,
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// The sum divided by the world size, rounded once (the Atom's `Mean`).
    Avg,
}

impl ExecOp {
    /// Every reduction a kernel may be compiled for.
    pub const REDUCTIONS: [ExecOp; 5] = [ExecOp::Sum, ExecOp::Prod, ExecOp::Min, ExecOp::Max, ExecOp::Avg];

    fn atom_op(self) -> &'static str {
        match self {
            ExecOp::Copy | ExecOp::Sum => "Sum",
            ExecOp::Avg => "Mean",
            ExecOp::Prod => "Prod",
            ExecOp::Min => "Min",
            ExecOp::Max => "Max",
        }
    }
}

/// Parameter-block capacity (u64 words) of the executor kernel: 31 KiB, inside the
/// 32 764-byte kernel-parameter limit (sm_70+, CUDA 12.1+) beside [`EXEC_RUNTIME_BYTES`];
/// room for 32 blocks per role at world 2.
pub const EXEC_PARAM_WORDS: usize = 3968;

const _: () = assert!(EXEC_PARAM_WORDS * 8 + EXEC_RUNTIME_BYTES <= 32_764);
/// Size of the executor's `Runtime` kernel parameter (`kernels/snac/executor.cu`).
pub const EXEC_RUNTIME_BYTES: usize = 8 * (2 + 5 * 16 + 6);

/// The compile-time part of an executor kernel (the kernel key's datapath half; the plan
/// itself is interpreted from the parameter block).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExecKey {
    /// The Atom build it runs on.
    pub atom: AtomSpec,
    /// Element type (ignored by [`ExecOp::Copy`] kernels, which use u32).
    pub dtype: DType,
    /// The reduction.
    pub op: ExecOp,
    /// Bytes per packet of the latency regime: 8 (4 + 4) or 16 (8 + 8).
    pub packet_bytes: u32,
}

impl ExecKey {
    /// The key normalised so that copy kernels of every dtype share one binary.
    pub fn normalized(mut self) -> Self {
        if self.op == ExecOp::Copy {
            self.dtype = DType::U32;
        }
        self
    }

    /// The translation unit NVRTC compiles for this key.
    pub fn unit(&self) -> TranslationUnit {
        let k = self.normalized();
        TranslationUnit {
            name: format!("purlin_exec_{}", k.label()),
            source: EXECUTOR_CU.into(),
            headers: k.headers(),
            options: k.options(),
        }
    }

    fn label(&self) -> String {
        format!("{}_{}_{:?}_p{}", self.atom.label(), self.dtype.cuda_tag(), self.op, self.packet_bytes).to_lowercase()
    }

    pub(crate) fn headers(&self) -> Vec<(String, String)> {
        let mut headers = self.atom.headers();
        headers.push(("sync.cuh".into(), SYNC_CUH.into()));
        headers.push(("params.cuh".into(), PARAMS_CUH.into()));
        headers.push(("exec.cuh".into(), EXEC_CUH.into()));
        headers
    }

    pub(crate) fn options(&self) -> Vec<String> {
        vec![
            format!("-DPURLIN_T={}", self.dtype.cuda_tag()),
            format!("-DPURLIN_OP={}", self.op.atom_op()),
            format!("-DPURLIN_PACKET={}", self.packet_bytes),
            format!("-DPURLIN_PARAM_WORDS={EXEC_PARAM_WORDS}"),
        ]
    }
}

/// Most steps one shape of the shaped executor holds (`kMaxShapeSteps` in shaped.cu).
pub const SHAPED_MAX_STEPS: usize = 32;

/// One block shape as the shaped executor compiles it: each step's kind and the words of its
/// record (`Plan::shape_records`).
pub type ShapeRecords = Vec<(ShapeOp, u32)>;

/// Whether the shaped executor runs a step of this kind: puts, packet reduces, gathers and
/// handshakes — the latency regime's steps (no loops, stages or flag waits).
fn shaped_op(op: &ShapeOp) -> bool {
    matches!(
        op,
        ShapeOp::PutPackets
            | ShapeOp::Gather { .. }
            | ShapeOp::Reduce { packets: true, .. }
            | ShapeOp::HandshakeSend
            | ShapeOp::HandshakeWait
    )
}

/// The block shapes compiled into the shaped executor at `world`: every block shape of the
/// latency plans of the collectives that reduce (`reduce`) or only move data, over both
/// ranks' sides, in and out of place, one and four blocks, one-shot and two-shot AllReduce,
/// and the V forms' zero patterns (every pattern where there are at most 9 pairs, else all
/// counts nonzero and each rank sending or receiving nothing). A plan whose blocks all have
/// shapes in the catalog runs shaped; any other runs on the interpreter.
pub fn shape_catalog(world: u32, reduce: bool) -> Vec<ShapeRecords> {
    use purlin_snac::{AllReduceAlgo, Collective, CollectiveSpec, DataType, PlanConfig, ReduceOp};
    let w = world as usize;
    let dt = DataType::F32;
    let sum = ReduceOp::Sum;
    // Zero patterns of a world × world count matrix, as (sender, receiver) -> nonzero.
    let patterns: Vec<Vec<Vec<bool>>> = if w * w <= 9 {
        (0u32..1 << (w * w))
            .map(|bits| (0..w).map(|s| (0..w).map(|d| bits >> (s * w + d) & 1 == 1).collect()).collect())
            .collect()
    } else {
        let mut p = vec![vec![vec![true; w]; w]];
        for r in 0..w {
            p.push((0..w).map(|s| (0..w).map(|_| s != r).collect()).collect());
            p.push((0..w).map(|_| (0..w).map(|d| d != r).collect()).collect());
        }
        p
    };
    let count = |on: bool, r: usize| if on { 1000 + r as u64 } else { 0 };
    let mut specs = vec![];
    for n in [1u64, 1000, 1 << 18] {
        if reduce {
            specs.push(CollectiveSpec::all_reduce(world, dt, sum, n));
            specs.push(CollectiveSpec::reduce_scatter(world, dt, sum, n));
        } else {
            specs.push(CollectiveSpec::all_gather(world, dt, n));
            specs.push(CollectiveSpec::all_to_all(world, dt, n));
        }
    }
    for p in &patterns {
        if reduce {
            // ReduceScatterV: rank d's part has the count of row 0's pattern at d.
            specs.push(CollectiveSpec::reduce_scatter_v(world, dt, sum, (0..w).map(|d| count(p[0][d], d)).collect()));
        } else {
            specs.push(CollectiveSpec::all_gather_v(world, dt, (0..w).map(|s| count(p[s][0], s)).collect()));
            specs.push(CollectiveSpec::all_to_all_v(
                world,
                dt,
                (0..w).map(|s| (0..w).map(|d| count(p[s][d], s + d)).collect()).collect(),
            ));
        }
    }
    let mut shapes: Vec<ShapeRecords> = vec![];
    for spec in &specs {
        let algos: &[AllReduceAlgo] = if spec.collective == Collective::AllReduce {
            &[AllReduceAlgo::OneShot, AllReduceAlgo::TwoShot]
        } else {
            &[AllReduceAlgo::Auto]
        };
        for &allreduce in algos {
            for blocks in [1, 4] {
                for in_place in [false, true] {
                    let cfg = PlanConfig {
                        regime: Regime::Latency,
                        allreduce,
                        blocks_per_role: blocks,
                        window_bytes: 64 << 20,
                        max_coresident_blocks: 64,
                        in_place,
                        ..PlanConfig::default()
                    };
                    for rank in 0..world {
                        let Ok(plan) = purlin_snac::derive_rank(spec, &cfg, rank) else { continue };
                        for shape in plan.shape_records() {
                            let runs = shape.len() <= SHAPED_MAX_STEPS && shape.iter().all(|(op, _)| shaped_op(op));
                            if runs && !shapes.contains(&shape) {
                                shapes.push(shape);
                            }
                        }
                    }
                }
            }
        }
    }
    shapes
}

/// The compile-time part of a shaped executor kernel: the datapath key and the block shapes
/// it runs (its catalog), in the order the block table's shape indices count.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShapedKey {
    /// The datapath half (dtype, reduction, packets, Atom build).
    pub exec: ExecKey,
    /// The block shapes, each with the words of its steps' records.
    pub shapes: Vec<ShapeRecords>,
}

impl ShapedKey {
    /// The shaped kernels of every key in `keys` at `world` (each catalog derived once).
    pub fn catalogs(keys: &[ExecKey], world: u32) -> Vec<Self> {
        let [copy, reduce] = [false, true].map(|r| shape_catalog(world, r));
        keys.iter()
            .map(|k| {
                let exec = k.normalized();
                Self { exec, shapes: if exec.op == ExecOp::Copy { copy.clone() } else { reduce.clone() } }
            })
            .collect()
    }

    /// The catalog index of each of `plan`'s shapes (its kernel key's order), or `None`
    /// where this kernel does not run the plan (not latency, or a shape outside the catalog).
    pub fn indices_for(&self, plan: &Plan) -> Option<Vec<u32>> {
        if plan.regime != Regime::Latency {
            return None;
        }
        plan.shape_records().iter().map(|s| self.shapes.iter().position(|c| c == s).map(|i| i as u32)).collect()
    }

    /// The shapes as shaped.cu's `PURLIN_SHAPES` initializer:
    /// `{steps, {{op, count, record_words, packets}, ...}}` per shape.
    pub fn shapes_macro(&self) -> String {
        let shape = |steps: &ShapeRecords| {
            let step = |(op, words): &(ShapeOp, u32)| {
                use purlin_snac::params::opcode;
                let (code, count, packets) = match *op {
                    ShapeOp::PutPackets => (opcode::PUT_PACKETS, 0, false),
                    ShapeOp::Gather { packets } => (opcode::GATHER, 0, packets),
                    ShapeOp::Reduce { srcs, packets } => (opcode::REDUCE, srcs, packets),
                    ShapeOp::HandshakeSend => (opcode::HANDSHAKE_SEND, 0, false),
                    ShapeOp::HandshakeWait => (opcode::HANDSHAKE_WAIT, 0, false),
                    // The catalog holds no other kind; an opcode the kernel rejects at compile time.
                    _ => (0, 0, false),
                };
                format!("{{{code},{count},{words},{}}}", u32::from(packets))
            };
            format!("{{{},{{{}}}}}", steps.len(), steps.iter().map(step).collect::<Vec<_>>().join(","))
        };
        self.shapes.iter().map(shape).collect::<Vec<_>>().join(",")
    }

    /// The translation unit NVRTC compiles for this key.
    pub fn unit(&self) -> TranslationUnit {
        let shapes = self.shapes_macro();
        let digest =
            shapes.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
        let mut options = self.exec.options();
        options.push(format!("-DPURLIN_SHAPES={shapes}"));
        TranslationUnit {
            name: format!("purlin_shaped_{}_{digest:016x}", self.exec.label()),
            source: SHAPED_CU.into(),
            headers: self.exec.headers(),
            options,
        }
    }
}

/// The packet size the runtime uses on a generation: 16-byte packets (8 data + 8 flag, one
/// 16-byte store) on Hopper and later, where the torn-packet stress test found none
/// (2.02e9 packets over NVLink, both directions, 2×H200, 2026-11-30: results/INDEX.md, round 2);
/// 8-byte packets (4 + 4) before sm_90.
pub fn packet_bytes_for(generation: Generation) -> u32 {
    match generation {
        Generation::Generic | Generation::Ampere => 8,
        Generation::Hopper | Generation::Blackwell => 16,
    }
}

/// Every executor key the runtime can request for one Atom build: one copy kernel and
/// each dtype × reduction.
pub fn executor_keys(atom: AtomSpec) -> Vec<ExecKey> {
    let packet_bytes = packet_bytes_for(atom.generation);
    let mut keys = vec![ExecKey { atom, dtype: DType::U32, op: ExecOp::Copy, packet_bytes }];
    for dtype in DType::ALL {
        for op in ExecOp::REDUCTIONS {
            keys.push(ExecKey { atom, dtype, op, packet_bytes });
        }
    }
    keys
}

/// The smoke-test translation unit.
pub fn smoke_unit() -> TranslationUnit {
    TranslationUnit {
        name: "purlin_smoke".into(),
        source: SMOKE_CU.into(),
        headers: vec![("sync.cuh".into(), SYNC_CUH.into())],
        options: vec![],
    }
}

/// The torn-packet stress-test translation unit.
pub fn packet_stress_unit() -> TranslationUnit {
    TranslationUnit {
        name: "purlin_packet_stress".into(),
        source: PACKET_STRESS_CU.into(),
        headers: vec![("sync.cuh".into(), SYNC_CUH.into())],
        options: vec![],
    }
}

/// The latency-floor experiment's translation unit.
pub fn latency_floor_unit() -> TranslationUnit {
    TranslationUnit {
        name: "purlin_latency_floor".into(),
        source: LATENCY_FLOOR_CU.into(),
        headers: vec![("sync.cuh".into(), SYNC_CUH.into())],
        options: vec![],
    }
}

/// The payload-alignment probe (`kernels/snac/payload_probe.cu`) for packets of
/// `packet_bytes` (8 or 16), built with the executor's headers and options for `generation`.
pub fn payload_probe_unit(generation: Generation, packet_bytes: u32) -> TranslationUnit {
    let key = ExecKey { atom: AtomSpec::new(generation), dtype: DType::U32, op: ExecOp::Copy, packet_bytes };
    TranslationUnit {
        name: format!("purlin_payload_probe_{}_p{packet_bytes}", key.atom.label().to_lowercase()),
        source: PAYLOAD_PROBE_CU.into(),
        headers: key.headers(),
        options: key.options(),
    }
}

/// The translation units the CI compile checks and `cargo xtask gpu-round` build ahead for
/// `generation`: the fixed kernels, the interpreter for every key, and the shaped executor at
/// world 2 for its copy key and f32 sums. The shaped kernels of the other keys differ from
/// those only in the element type and operator of the packet reduce, code they share with the
/// interpreter (`exec.cuh`), which is compiled for every key; at ~4 s of NVRTC each they
/// compile at a GPU's first set-up instead (cached on disk afterwards).
pub fn all_units(generation: Generation) -> Vec<TranslationUnit> {
    units_of(generation, |_| true)
}

/// [`all_units`] with the interpreter's keys sampled: every dtype with `Sum`, every op with
/// `F32`, and the copy kernel. Each dtype's and each op's code is then compiled once for the
/// generation; the other combinations only instantiate the same templates again.
pub fn sampled_units(generation: Generation) -> Vec<TranslationUnit> {
    units_of(generation, |k| k.op == ExecOp::Copy || k.op == ExecOp::Sum || k.dtype == DType::F32)
}

fn units_of(generation: Generation, keep: impl Fn(&ExecKey) -> bool) -> Vec<TranslationUnit> {
    let mut units = vec![
        smoke_unit(),
        packet_stress_unit(),
        latency_floor_unit(),
        payload_probe_unit(generation, 8),
        payload_probe_unit(generation, 16),
    ];
    let keys = executor_keys(AtomSpec::new(generation));
    units.extend(keys.iter().filter(|k| keep(k)).map(ExecKey::unit));
    let sampled: Vec<ExecKey> = keys
        .iter()
        .copied()
        .filter(|k| k.op == ExecOp::Copy || (k.op == ExecOp::Sum && k.dtype == DType::F32))
        .collect();
    units.extend(ShapedKey::catalogs(&sampled, 2).iter().map(ShapedKey::unit));
    units
}

#[cfg(test)]
mod tests {
    use super::*;
    use purlin_snac::{CollectiveSpec, DataType, PacketFormat, PlanConfig, ReduceOp};

    fn exec() -> ExecKey {
        ExecKey { atom: AtomSpec::new(Generation::Hopper), dtype: DType::F32, op: ExecOp::Sum, packet_bytes: 16 }
    }

    fn plan(regime: Regime, blocks: u32) -> Plan {
        let spec = CollectiveSpec::all_reduce(2, DataType::F32, ReduceOp::Sum, 1000);
        let cfg = PlanConfig {
            regime,
            blocks_per_role: blocks,
            chunk_bytes: 4096,
            staging_bytes: 1 << 20,
            window_bytes: 1 << 20,
            max_coresident_blocks: 64,
            packet: PacketFormat::B16,
            ..PlanConfig::default()
        };
        purlin_snac::derive_rank(&spec, &cfg, 0).expect("plan")
    }

    /// A world-2 one-shot AllReduce in the latency regime is a put and a two-source packet
    /// reduce per block, with the record sizes of the parameter block; the catalog holds it,
    /// and the macro lists it in shaped.cu's initializer form.
    #[test]
    fn the_catalog_holds_the_latency_allreduce_with_its_record_sizes() {
        let p = plan(Regime::Latency, 1);
        let key = ShapedKey::catalogs(&[exec()], 2).remove(0);
        let words = purlin_snac::params::encode(&p);
        let first = words[purlin_snac::params::HEADER_WORDS + 1] as usize;
        let put_words = ((words[first] >> 8) & 0xffff) as u32;
        let reduce_words = ((words[first + put_words as usize] >> 8) & 0xffff) as u32;
        let shape = vec![(ShapeOp::PutPackets, put_words), (ShapeOp::Reduce { srcs: 2, packets: true }, reduce_words)];
        let at = key.indices_for(&p).expect("the plan runs shaped");
        assert_eq!(key.shapes[at[0] as usize], shape);
        assert!(key.shapes_macro().contains(&format!("{{2,{{{{5,0,{put_words},0}},{{4,2,{reduce_words},1}}}}}}")));
        // The block table names each block's shape (the plan's own index) above its role.
        assert_eq!(words[purlin_snac::params::HEADER_WORDS] >> 32, 0);
    }

    /// Throughput plans (loops, stages, flag waits) stay with the interpreter; so do latency
    /// plans with a shape outside the catalog.
    #[test]
    fn plans_outside_the_catalog_are_interpreted() {
        let key = ShapedKey::catalogs(&[exec()], 2).remove(0);
        assert!(key.indices_for(&plan(Regime::Throughput, 2)).is_none());
        let other = ShapedKey { exec: exec(), shapes: vec![] };
        assert!(other.indices_for(&plan(Regime::Latency, 1)).is_none());
    }

    /// Every latency plan the runtime derives at world 2 — any collective, size and block
    /// count, V forms with zero counts — has its shapes in the catalog of its kind.
    #[test]
    fn world_2_latency_plans_are_in_the_catalog() {
        use purlin_snac::Collective;
        let reduce = ShapedKey::catalogs(&[exec()], 2).remove(0);
        let copy = ShapedKey::catalogs(&[ExecKey { op: ExecOp::Copy, ..exec() }], 2).remove(0);
        let mut plans = 0;
        for collective in Collective::ALL {
            for counts in [[0u64, 7], [5, 0], [33, 1], [4099, 100_003], [1, 1]] {
                let spec = match collective {
                    Collective::AllReduce => CollectiveSpec::all_reduce(2, DataType::Bf16, ReduceOp::Max, counts[1]),
                    Collective::ReduceScatter => {
                        CollectiveSpec::reduce_scatter(2, DataType::F16, ReduceOp::Sum, counts[0])
                    }
                    Collective::AllGather => CollectiveSpec::all_gather(2, DataType::U8, counts[1]),
                    Collective::AllToAll => CollectiveSpec::all_to_all(2, DataType::I32, counts[0]),
                    Collective::AllGatherV => CollectiveSpec::all_gather_v(2, DataType::F32, counts.to_vec()),
                    Collective::ReduceScatterV => {
                        CollectiveSpec::reduce_scatter_v(2, DataType::F32, ReduceOp::Sum, counts.to_vec())
                    }
                    Collective::AllToAllV => CollectiveSpec::all_to_all_v(
                        2,
                        DataType::F32,
                        vec![counts.to_vec(), counts.iter().rev().copied().collect()],
                    ),
                };
                let key = if spec.op.is_some() { &reduce } else { &copy };
                for blocks in [1, 3, 64] {
                    for in_place in [false, true] {
                        let cfg = PlanConfig {
                            regime: Regime::Latency,
                            blocks_per_role: blocks,
                            window_bytes: 4 << 20,
                            max_coresident_blocks: 132,
                            packet: PacketFormat::B16,
                            in_place,
                            ..PlanConfig::default()
                        };
                        for rank in 0..2 {
                            let Ok(p) = purlin_snac::derive_rank(&spec, &cfg, rank) else { continue };
                            if p.blocks.is_empty() {
                                continue;
                            }
                            assert!(
                                key.indices_for(&p).is_some(),
                                "{collective:?} {counts:?} blocks {blocks} rank {rank}"
                            );
                            plans += 1;
                        }
                    }
                }
            }
        }
        assert!(plans > 300, "{plans} plans checked");
    }
}
