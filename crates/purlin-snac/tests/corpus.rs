//! The verifier's own tests: hand-edited plans that must be accepted, and plans that must be
//! rejected with the right property (`tests/plans/`, written by `examples/make_corpus.rs`).

use purlin_snac::verify::{Corpus, Options, verify};

fn cases(dir: &str) -> Vec<(String, Corpus)> {
    let path = format!("{}/tests/plans/{dir}", env!("CARGO_MANIFEST_DIR"));
    let mut v: Vec<(String, Corpus)> = std::fs::read_dir(&path)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let c: Corpus = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
            (p.file_name().unwrap().to_string_lossy().into_owned(), c)
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[test]
fn accept_corpus_verifies() {
    let cases = cases("accept");
    assert!(cases.len() >= 4);
    for (name, c) in cases {
        assert!(c.expect.is_none(), "{name}");
        let r = verify(&c.calls, &Options::default());
        println!("accept/{name}: {} in {:.2?}", r.coverage, r.elapsed);
        if let Err(v) = &r.result {
            panic!("accept/{name} ({}) rejected: {v}", c.description);
        }
    }
}

#[test]
fn reject_corpus_is_rejected_with_the_right_property() {
    let cases = cases("reject");
    assert!(cases.len() >= 6);
    for (name, c) in cases {
        let want = c.expect.clone().unwrap_or_else(|| panic!("{name} names no property"));
        let r = verify(&c.calls, &Options::default());
        match &r.result {
            Ok(()) => panic!("reject/{name} ({}) verified: {}", c.description, r.coverage),
            Err(v) => {
                println!("reject/{name}: {} ({})", v.property, r.coverage);
                assert_eq!(v.property.to_string(), want, "reject/{name}: {v}");
            }
        }
    }
}

#[test]
fn corpus_round_trips_through_bincode() {
    for (name, c) in cases("accept").into_iter().chain(cases("reject")) {
        assert_eq!(Corpus::from_bytes(&c.to_bytes()).unwrap(), c, "{name}");
    }
}
