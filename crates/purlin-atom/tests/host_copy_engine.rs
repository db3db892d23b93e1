//! The host copy engine against independent references: a thread that waits for a word
//! the engine wrote sees the whole copy ("copy, then write"); copies queued after a wait see
//! what was written before the awaited store ("wait, then copy"); AllGather and AllToAll
//! run as one engine per rank match the test kit's expected outputs byte for byte; property
//! tests over sizes and offsets compare with a byte-by-byte reference; a wait that is never
//! satisfied stops the engine with a typed error instead of hanging.

mod random_data;

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use purlin_atom::host_copy_engine::HostCopyOp;
use purlin_atom::{HostCopyEngine, HostCopyError, HostWord, WaitCondition};
use purlin_testkit::{Case, Collective, Dtype, Op, POISON, check};
use random_data::Rng;

/// Generous: the tests never rely on it expiring, except the one that tests expiry.
const WAIT: Duration = Duration::from_secs(60);

/// A byte buffer the engine writes and another thread reads after an acquire; its address
/// crosses threads, the buffer itself stays owned by the test until every thread is joined.
#[derive(Clone, Copy)]
struct Addr(usize, usize);

impl Addr {
    fn of(v: &mut [u8]) -> Self {
        Addr(v.as_mut_ptr() as usize, v.len())
    }
    fn ptr(self) -> *mut u8 {
        self.0 as *mut u8
    }
    /// # Safety
    /// The buffer is alive and no one writes it during the returned borrow.
    unsafe fn read(self) -> Vec<u8> {
        // SAFETY: forwarded from the caller.
        unsafe { std::slice::from_raw_parts(self.0 as *const u8, self.1) }.to_vec()
    }
}

/// The reference copy: byte by byte, no `ptr::copy`.
fn reference_copy(dst: &mut [u8], dst_off: usize, src: &[u8], src_off: usize, len: usize) {
    for (d, s) in dst[dst_off..dst_off + len].iter_mut().zip(&src[src_off..src_off + len]) {
        *d = *s;
    }
}

#[test]
fn a_thread_that_waits_for_the_word_sees_the_whole_copy() {
    const ROUNDS: u64 = 200;
    const BYTES: usize = 192 * 1024 + 13;
    let mut rng = Rng::new(54);
    let sources: Vec<Vec<u8>> = (0..ROUNDS).map(|_| rng.bytes(BYTES)).collect();
    let expected = sources.clone();
    let mut dst = vec![POISON; BYTES];
    let (ready, ack) = (Arc::new(HostWord::new(0)), Arc::new(HostWord::new(0)));
    let at = Addr::of(&mut dst);
    let consumer = {
        let (ready, ack) = (ready.clone(), ack.clone());
        std::thread::spawn(move || {
            for round in 1..=ROUNDS {
                ready.wait(round, WaitCondition::AtLeast, WAIT).expect("the engine's write");
                // SAFETY: the engine wrote `dst` before `ready` (release/acquire) and writes
                // it again only after `ack` says this read is done.
                let got = unsafe { at.read() };
                assert!(got == expected[round as usize - 1], "round {round}: a torn or stale copy");
                ack.store(round);
            }
        })
    };
    let engine = HostCopyEngine::with_timeout(WAIT);
    for (round, src) in (1..=ROUNDS).zip(&sources) {
        // Copy, then write; the next copy waits until the reader is done (wait, then copy).
        // SAFETY: `src` and `dst` outlive the engine's work (synchronized below); `dst` is
        // read by the consumer only between `ready` and `ack`.
        unsafe { engine.copy(at.ptr(), src.as_ptr(), BYTES) }.unwrap();
        engine.write_value(&ready, round).unwrap();
        engine.wait_value(&ack, round, WaitCondition::AtLeast).unwrap();
    }
    engine.synchronize().unwrap();
    consumer.join().expect("consumer");
    assert_eq!(ack.load(), ROUNDS);
    assert_eq!(dst, sources[ROUNDS as usize - 1]);
}

/// Runs `case` (a gather collective) with one engine per rank: rank p's engine copies each
/// of its input's pieces into the owning rank's output, then writes `arrived[q][p]`; rank
/// q's reader waits for every `arrived[q][*]` and checks its output against the kit.
fn run_gather_case(case: &Case) {
    let world = case.world;
    let es = case.dtype.size();
    let inputs = case.inputs();
    let mut outputs: Vec<Vec<u8>> = (0..world).map(|q| vec![POISON; case.out_count(q) * es]).collect();
    let addrs: Vec<Addr> = outputs.iter_mut().map(|o| Addr::of(o)).collect();
    let arrived: Vec<Vec<Arc<HostWord>>> =
        (0..world).map(|_| (0..world).map(|_| Arc::new(HostWord::new(0))).collect()).collect();
    let readers: Vec<_> = (0..world)
        .map(|q| {
            let words = arrived[q].clone();
            let at = addrs[q];
            let expected = case.expected(q);
            let (dtype, compare, name) = (case.dtype, case.compare(), case.name());
            std::thread::spawn(move || {
                for w in &words {
                    w.wait(1, WaitCondition::AtLeast, WAIT).expect("every writer's word");
                }
                // SAFETY: every engine that writes this output wrote its word after its
                // copies; nothing writes the output afterwards.
                let got = unsafe { at.read() };
                check(dtype, compare, &got, &expected).unwrap_or_else(|e| panic!("{name}, rank {q}: {e}"));
            })
        })
        .collect();
    let engines: Vec<HostCopyEngine> = (0..world).map(|_| HostCopyEngine::with_timeout(WAIT)).collect();
    for (p, engine) in engines.iter().enumerate() {
        let mut ops = Vec::new();
        for (q, at) in addrs.iter().enumerate() {
            for seg in case.segments(q) {
                let purlin_testkit::Segment::Copy { out, from, input, len } = seg else {
                    panic!("{} is not a gather", case.name());
                };
                if from == p {
                    // SAFETY (of the pointer arithmetic): inside the input and the output.
                    let src = inputs[p][input * es..].as_ptr();
                    ops.push(HostCopyOp { dst: at.ptr().wrapping_add(out * es), src, bytes: len * es });
                }
            }
        }
        // SAFETY: the ranges lie inside live buffers (the kit's layout), the pieces are
        // disjoint, and every buffer outlives the engines (joined below).
        unsafe { engine.copy_batch(&ops) }.unwrap();
        for words in &arrived {
            engine.write_value(&words[p], 1).unwrap();
        }
    }
    for engine in &engines {
        engine.synchronize().unwrap();
    }
    for r in readers {
        r.join().expect("reader");
    }
}

#[test]
fn allgather_and_alltoall_on_one_engine_per_rank_match_the_kit() {
    let mut cases = 0;
    for collective in [Collective::AllGather, Collective::AllGatherV, Collective::AllToAll, Collective::AllToAllV] {
        for world in [2, 3, 4, 8] {
            for bytes in [8, 1000, 24_600, 200_000 + 24] {
                for dtype in [Dtype::U8, Dtype::Bf16, Dtype::F32] {
                    let Some(case) = Case::new(collective, dtype, Op::Sum, world, bytes, 1.1, 7 + bytes as u64) else {
                        continue;
                    };
                    run_gather_case(&case);
                    cases += 1;
                }
            }
        }
    }
    assert!(cases >= 150, "only {cases} cases ran");
}

#[test]
fn a_wait_that_never_comes_stops_the_engine_with_a_typed_error() {
    let engine = HostCopyEngine::with_timeout(Duration::from_millis(50));
    let (never, after) = (Arc::new(HostWord::new(3)), Arc::new(HostWord::new(0)));
    let src = [1u8; 64];
    let mut dst = vec![POISON; 64];
    engine.wait_value(&never, 4, WaitCondition::Equal).unwrap();
    // SAFETY: both buffers outlive the engine's work (synchronized below).
    unsafe { engine.copy(dst.as_mut_ptr(), src.as_ptr(), 64) }.unwrap();
    engine.write_value(&after, 1).unwrap();
    let err = engine.synchronize().unwrap_err();
    assert_eq!(
        err,
        HostCopyError::WaitTimeout {
            target: 4,
            condition: WaitCondition::Equal,
            seen: 3,
            timeout: Duration::from_millis(50)
        }
    );
    assert!(dst.iter().all(|&b| b == POISON), "a copy after the failed wait ran");
    assert_eq!(after.load(), 0, "a write after the failed wait ran");
    let refused = engine.write_value(&after, 2).unwrap_err();
    assert_eq!(refused, HostCopyError::Stopped(Box::new(err)));
}

#[test]
fn write_value_from_writes_the_value_held_when_it_runs() {
    let engine = HostCopyEngine::with_timeout(WAIT);
    let (gate, epoch, word) = (Arc::new(HostWord::new(0)), Arc::new(HostWord::new(1)), Arc::new(HostWord::new(0)));
    engine.wait_value(&gate, 1, WaitCondition::AtLeast).unwrap();
    engine.write_value_from(&word, &epoch).unwrap();
    // Changed after the write was queued, before it ran: the new value is written.
    epoch.store(41);
    gate.store(1);
    engine.synchronize().unwrap();
    assert_eq!(word.load(), 41);
}

#[test]
fn a_queued_call_runs_after_the_copies_before_it() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let engine = HostCopyEngine::with_timeout(WAIT);
    let src = Rng::new(3).bytes(100_003);
    let mut dst = vec![POISON; src.len()];
    let at = Addr::of(&mut dst);
    let flag = Arc::new(AtomicU64::new(0));
    let seen = Arc::new(std::sync::Mutex::new(None));
    // SAFETY: both buffers outlive the engine's work (synchronized below); the call reads
    // `dst` on the engine's own thread, after the copy.
    unsafe { engine.copy(at.ptr(), src.as_ptr(), src.len()) }.unwrap();
    let (f, s) = (flag.clone(), seen.clone());
    engine
        .call(move || {
            // SAFETY: the copy before this call has completed; nothing else writes `dst`.
            *s.lock().unwrap() = Some(unsafe { at.read() });
            f.store(9, Ordering::Release);
        })
        .unwrap();
    engine.synchronize().unwrap();
    assert_eq!(flag.load(Ordering::Acquire), 9);
    assert!(seen.lock().unwrap().as_deref() == Some(&src[..]), "the call ran before the copy completed");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Copy then write on engine A; engine B waits for A's word, copies A's destination on,
    /// and writes its own word; a reader waits for B's word. Both destinations match the
    /// byte-by-byte reference, poison outside the copied range included.
    #[test]
    fn chained_copies_match_the_reference(
        src_len in 1usize..20_000,
        src_off_frac in 0.0f64..1.0,
        len_frac in 0.0f64..=1.0,
        dst_off in 0usize..4096,
        dst2_off in 0usize..64,
        seed in any::<u64>(),
    ) {
        let src = Rng::new(seed).bytes(src_len);
        let src_off = ((src_len as f64) * src_off_frac) as usize % src_len;
        let len = ((src_len - src_off) as f64 * len_frac) as usize;
        let mut dst = vec![POISON; dst_off + len + 7];
        let mut dst2 = vec![POISON; dst2_off + len + 3];
        let mut want = dst.clone();
        reference_copy(&mut want, dst_off, &src, src_off, len);
        let mut want2 = dst2.clone();
        reference_copy(&mut want2, dst2_off, &want, dst_off, len);

        let (a_done, b_done) = (Arc::new(HostWord::new(0)), Arc::new(HostWord::new(0)));
        let (a, b) = (HostCopyEngine::with_timeout(WAIT), HostCopyEngine::with_timeout(WAIT));
        let (d1, d2) = (Addr::of(&mut dst), Addr::of(&mut dst2));
        // Queue B first: its wait must hold its copy back until A has written.
        b.wait_value(&a_done, 1, WaitCondition::AtLeast).unwrap();
        // SAFETY: all buffers outlive both engines' work (synchronized below); A writes
        // `dst` before `a_done`, B reads it only after.
        unsafe { b.copy(d2.ptr().wrapping_add(dst2_off), d1.ptr().wrapping_add(dst_off), len) }.unwrap();
        b.write_value(&b_done, 1).unwrap();
        // SAFETY: as above; `dst` and `src` outlive A's work.
        unsafe { a.copy(d1.ptr().wrapping_add(dst_off), src.as_ptr().wrapping_add(src_off), len) }.unwrap();
        a.write_value(&a_done, 1).unwrap();
        let reader = std::thread::spawn(move || {
            b_done.wait(1, WaitCondition::AtLeast, WAIT).expect("B's word");
            // SAFETY: B wrote `dst2` before `b_done`; nothing writes it afterwards.
            unsafe { d2.read() }
        });
        let seen = reader.join().expect("reader");
        a.synchronize().unwrap();
        b.synchronize().unwrap();
        prop_assert!(seen == want2, "the reader's view of the second destination");
        prop_assert!(dst == want, "first destination");
        prop_assert!(dst2 == want2, "second destination");
    }

    /// Batches of disjoint pieces of one buffer, in any order, land exactly.
    #[test]
    fn batches_of_disjoint_pieces_match_the_reference(
        cuts in proptest::collection::vec(1usize..3000, 1..12),
        gap in 0usize..40,
        seed in any::<u64>(),
    ) {
        let total: usize = cuts.iter().sum();
        let src = Rng::new(seed).bytes(total);
        let mut dst = vec![POISON; total + gap * cuts.len()];
        let mut want = dst.clone();
        let (mut s, mut d, mut pieces) = (0, 0, Vec::new());
        for &c in &cuts {
            reference_copy(&mut want, d, &src, s, c);
            pieces.push((d, s, c));
            s += c;
            d += c + gap;
        }
        let engine = HostCopyEngine::with_timeout(WAIT);
        let base = dst.as_mut_ptr();
        let ops: Vec<HostCopyOp> = pieces
            .iter()
            .rev()
            .map(|&(d, s, c)| HostCopyOp { dst: base.wrapping_add(d), src: src.as_ptr().wrapping_add(s), bytes: c })
            .collect();
        // SAFETY: disjoint pieces inside both live buffers, which outlive the engine's work.
        unsafe { engine.copy_batch(&ops) }.unwrap();
        engine.synchronize().unwrap();
        prop_assert!(dst == want);
    }
}
