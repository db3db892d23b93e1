//! Writes the copy-engine entries of the verifier's corpora, `tests/plans/{accept,reject}/ce-*.json`
//! (docs/perf/copy-engines.md §3.4): derived copy-engine plans, alone and back to back with SM
//! calls, and one mutant per copy-engine mutation operator, each with the property the
//! verifier rejects it for; the AllReduce whose gather half runs on the copy engines and its
//! mutant that copies the shard before it is reduced. Re-run after a plan format change:
//! `cargo run -p purlin-snac --example make_engine_corpus`.
use purlin_snac::verify::engine::engine_mutants;
use purlin_snac::verify::{Corpus, Options, verify};
use purlin_snac::*;

fn cfg(copy_engine: bool) -> PlanConfig {
    PlanConfig {
        chunk_bytes: 32,
        blocks_per_role: 1,
        slots: 2,
        staging_bytes: 2048,
        window_bytes: 4096,
        max_coresident_blocks: 8,
        flag_words: 64,
        peer_outputs: true,
        peer_inputs: true,
        copy_engine,
        ..PlanConfig::default()
    }
}

fn write(dir: &str, name: &str, description: &str, calls: Vec<Vec<Plan>>) {
    let r = verify(&calls, &Options::default());
    let expect = r.property().map(|p| p.to_string());
    assert_eq!(expect.is_none(), dir == "accept", "{name}: {:?}", r.result);
    let c = Corpus { description: description.into(), expect, calls };
    let path = format!("{}/tests/plans/{dir}/{name}.json", env!("CARGO_MANIFEST_DIR"));
    std::fs::write(&path, serde_json::to_string(&c).expect("json") + "\n").expect("write");
    println!("wrote {path} ({:?})", c.expect);
}

fn main() {
    let dt = DataType::U8;
    let d = |s: &CollectiveSpec, ce: bool| derive(s, &cfg(ce)).expect("derive");
    let ag = CollectiveSpec::all_gather(2, dt, 40);
    write("accept", "ce-all-gather", "AllGather w2 on the copy engines, three calls", vec![d(&ag, true); 3]);
    let ar = CollectiveSpec::all_reduce(2, DataType::F32, ReduceOp::Sum, 24);
    let a2av = CollectiveSpec::all_to_all_v(2, dt, vec![vec![8, 16], vec![0, 24]]);
    write(
        "accept",
        "ce-and-sm-calls-on-the-same-flags",
        "CE AllGather, SM AllReduce, CE AllToAllV, SM AllGather: the datapath changes between calls on the same flags",
        vec![d(&ag, true), d(&ar, false), d(&a2av, true), d(&ag, false)],
    );
    let mutants = engine_mutants(&d(&ag, true));
    for (kind, name) in [
        ("dropped", "ce-engine-notify-dropped"),
        ("moved before", "ce-notify-before-its-copy"),
        ("destination shifted", "ce-engine-region-shifted-by-one"),
        ("wait", "ce-entry-wait-dropped"),
        ("forked", "ce-engine-forked-before-the-entry-wait"),
    ] {
        let (what, set) = mutants.iter().find(|(w, _)| w.contains(kind)).expect("a mutant of each kind");
        write("reject", name, &format!("AllGather w2 on the copy engines, {what}"), vec![set.clone(); 2]);
    }
    // The AllReduce's gather half on the copy engines (37 elements: shards of unequal size).
    let ar_ce = CollectiveSpec::all_reduce(2, DataType::F32, ReduceOp::Sum, 37);
    write(
        "accept",
        "ce-all-reduce",
        "AllReduce w2: SM blocks reduce the shard, the copy engines push it; CE, SM, CE calls on the same flags",
        vec![d(&ar_ce, true), d(&ar, false), d(&ar_ce, true)],
    );
    let mutants = engine_mutants(&d(&ar_ce, true));
    let (what, set) =
        mutants.iter().find(|(w, _)| w.contains("forked beside the reduce")).expect("the copy-before-reduce mutant");
    write("reject", "ce-all-reduce-copies-before-the-reduce", &format!("AllReduce w2, {what}"), vec![set.clone(); 2]);
}
