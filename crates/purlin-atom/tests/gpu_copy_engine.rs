//! Device tests of the copy-engine datapath on one GPU, two ranks sharing it (one stream
//! each, as two processes on one GPU would have): a two-rank AllGather made of copies, word
//! writes and word waits, eager and captured in CUDA graphs, checked byte for byte against
//! the test kit.
//!
//! Each rank, on its own stream: copies its input into its own output and into the peer's
//! (one batch: "copy"), writes the peer's arrival word ("then notify"), waits for its own
//! arrival word ("wait"), then copies its whole output into a check buffer ("then copy"):
//! the check buffer holds the peer's part only if the wait really ordered the copy after
//! the peer's copy.
//!
//! `#[ignore]`d: run on the GPU machine with
//! `gpu_copy_engine-test --ignored --test-threads=1 --nocapture` (a full GPU round runs every
//! test executable). Each test prints one `CE-GPU` line per part it checked.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, sys};
use purlin_atom::device::{DeviceBuffer, driver_present};
use purlin_atom::{CopyEngine, CopyOp, WaitCondition};
use purlin_testkit::{Case, Collective, Dtype, Op, POISON, check};

const WORLD: usize = 2;
/// Per-rank input sizes: below a word, odd, a few MiB, and large enough that a copy takes
/// long compared with a stream switch.
const SIZES: [usize; 5] = [1, 4097, 3 << 20, (32 << 20) + 5, 96 << 20];

/// One GPU, its copy engine and one stream per rank. Panics without a GPU: an ignored test
/// that is run must not pass vacuously.
fn setup() -> (Arc<CudaContext>, CopyEngine, Vec<Arc<CudaStream>>) {
    assert!(driver_present(), "no CUDA driver: these tests need a GPU");
    let ctx = CudaContext::new(0).expect("context");
    let engine = CopyEngine::new(&ctx).expect("copy engine");
    let streams = (0..WORLD).map(|_| ctx.new_stream().expect("stream")).collect();
    println!(
        "CE-GPU setup: device 0 ({}), flush on waits: {}",
        ctx.name().unwrap_or_default(),
        engine.flushes_remote_writes()
    );
    (ctx, engine, streams)
}

/// The buffers of one size: per rank an input, an output of `WORLD` parts and a check
/// buffer; one arrival word per rank.
struct Ranks {
    case: Case,
    inputs: Vec<DeviceBuffer>,
    outputs: Vec<DeviceBuffer>,
    checks: Vec<DeviceBuffer>,
    words: DeviceBuffer,
}

impl Ranks {
    fn new(ctx: &Arc<CudaContext>, part: usize, seed: u64) -> Self {
        let case = Case::new(Collective::AllGather, Dtype::U8, Op::Sum, WORLD, WORLD * part, 0.0, seed)
            .expect("an AllGather case");
        let buffer = |bytes| DeviceBuffer::new(ctx, bytes).expect("device memory");
        let inputs = (0..WORLD).map(|_| buffer(part)).collect();
        let outputs = (0..WORLD).map(|_| buffer(WORLD * part)).collect();
        let checks = (0..WORLD).map(|_| buffer(WORLD * part)).collect();
        let words = buffer(8 * WORLD);
        words.fill(0).expect("zero words");
        let ranks = Self { case, inputs, outputs, checks, words };
        ranks.refill(seed);
        ranks
    }

    /// Fresh inputs for `seed`; outputs and check buffers poisoned.
    fn refill(&self, seed: u64) {
        let case = self.case.clone().seeded(seed);
        for (buf, data) in self.inputs.iter().zip(case.inputs()) {
            buf.upload(0, &data).expect("upload input");
        }
        for buf in self.outputs.iter().chain(&self.checks) {
            buf.fill(POISON).expect("poison");
        }
    }

    fn part(&self) -> usize {
        self.inputs[0].len()
    }

    fn word(&self, rank: usize) -> u64 {
        self.words.ptr() + 8 * rank as u64
    }

    /// Enqueues rank `rank`'s AllGather on `stream`: arrival words are written with
    /// `notify`, awaited for `arrive` with `condition`, and reset to `reset` after the wait
    /// where given.
    fn enqueue(
        &self,
        engine: &CopyEngine,
        stream: &CudaStream,
        rank: usize,
        arrive: u64,
        condition: WaitCondition,
        reset: Option<u64>,
    ) {
        let part = self.part();
        let at = (rank * part) as u64;
        let ops: Vec<CopyOp> = self
            .outputs
            .iter()
            .map(|out| CopyOp { dst: out.ptr() + at, src: self.inputs[rank].ptr(), bytes: part })
            .collect();
        // SAFETY: every range lies inside a live allocation of this device (the buffers
        // outlive the streams' work: the tests synchronize before dropping them); the ops'
        // destinations are disjoint parts, and nothing else writes them during the call.
        unsafe {
            engine.copy_batch(stream, &ops).expect("copies");
            for peer in (0..WORLD).filter(|&p| p != rank) {
                engine.write_value(stream, self.word(peer), arrive).expect("notify");
            }
            engine.wait_value(stream, self.word(rank), arrive, condition).expect("wait");
            if let Some(reset) = reset {
                engine.write_value(stream, self.word(rank), reset).expect("reset");
            }
            engine
                .copy(stream, self.checks[rank].ptr(), self.outputs[rank].ptr(), WORLD * part)
                .expect("consumer copy");
        }
    }

    /// Checks every rank's output and check buffer against the kit's AllGather of `seed`.
    fn check(&self, seed: u64, what: &str) {
        let case = self.case.clone().seeded(seed);
        for rank in 0..WORLD {
            let expected = case.expected(rank);
            for (name, buf) in [("output", &self.outputs[rank]), ("check", &self.checks[rank])] {
                let got = buf.download(0, buf.len()).expect("download");
                if let Err(e) = check(case.dtype, case.compare(), &got, &expected) {
                    panic!("{what}: rank {rank}'s {name}: {e}");
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_copy_engine_allgather_eager_is_exact() {
    let (ctx, engine, streams) = setup();
    for (i, &part) in SIZES.iter().enumerate() {
        let ranks = Ranks::new(&ctx, part, 100 + i as u64);
        let mut epoch = 0;
        for call in 0..3u64 {
            let seed = 1000 * i as u64 + call;
            ranks.refill(seed);
            // Words only grow: each call waits for at least its own epoch, nothing resets.
            epoch += 1;
            // The second rank first, so its wait is enqueued before the peer's notify.
            for rank in (0..WORLD).rev() {
                ranks.enqueue(&engine, &streams[rank], rank, epoch, WaitCondition::AtLeast, None);
            }
            for s in &streams {
                s.synchronize().expect("stream");
            }
            ranks.check(seed, &format!("eager, {part} bytes per rank, call {call}"));
        }
        println!("CE-GPU eager: {part} bytes per rank, 3 calls exact");
    }
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_copy_engine_allgather_in_cuda_graphs_is_exact() {
    let (ctx, engine, streams) = setup();
    for (i, &part) in SIZES.iter().enumerate() {
        let ranks = Ranks::new(&ctx, part, 200 + i as u64);
        // One graph per rank, as each process would capture its own. Captured values are
        // replayed as they are, so the words use the equal-then-reset form: the waiter
        // resets its own word after the wait.
        let graphs: Vec<_> = (0..WORLD)
            .map(|rank| {
                let stream = &streams[rank];
                stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).expect("capture");
                ranks.enqueue(&engine, stream, rank, 1, WaitCondition::Equal, Some(0));
                stream.end_capture(sys::CUgraphInstantiate_flags(0)).expect("end capture").expect("a graph")
            })
            .collect();
        for replay in 0..4u64 {
            let seed = 5000 + 1000 * i as u64 + replay;
            ranks.refill(seed);
            for g in graphs.iter().rev() {
                g.launch().expect("graph launch");
            }
            for s in &streams {
                s.synchronize().expect("stream");
            }
            ranks.check(seed, &format!("graph, {part} bytes per rank, replay {replay}"));
            let words = ranks.words.download(0, 8 * WORLD).expect("words");
            assert!(words.iter().all(|&b| b == 0), "replay {replay}: a waiter did not reset its word");
        }
        println!("CE-GPU graph: {part} bytes per rank, 4 replays exact");
    }
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_copy_engine_write_value_from_reads_its_value_when_it_runs() {
    let (ctx, engine, streams) = setup();
    let words = DeviceBuffer::new(&ctx, 24).expect("words");
    words.fill(0).expect("zero");
    let (gate, value, target) = (words.ptr(), words.ptr() + 8, words.ptr() + 16);
    let stream = &streams[0];
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).expect("capture");
    // SAFETY: three words of a live allocation, synchronized before it is dropped.
    unsafe {
        engine.wait_value(stream, gate, 1, WaitCondition::Equal).expect("wait");
        engine.write_value(stream, gate, 0).expect("reset");
        engine.write_value_from(stream, target, value).expect("write from");
    }
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0)).expect("end capture").expect("a graph");
    for epoch in [7u64, 8, 1 << 40] {
        words.upload(8, &epoch.to_le_bytes()).expect("value");
        graph.launch().expect("launch");
        // SAFETY: as above.
        unsafe { engine.write_value(&streams[1], gate, 1) }.expect("open the gate");
        for s in &streams {
            s.synchronize().expect("stream");
        }
        let got = words.download(16, 8).expect("target");
        assert_eq!(u64::from_le_bytes(got.try_into().expect("8 bytes")), epoch, "replay of epoch {epoch}");
    }
    println!("CE-GPU write_value_from: 3 replays wrote the value current at run time");
}
