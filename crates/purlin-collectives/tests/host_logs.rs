//! The logs of the host executor, as a test subscriber sees them: a `call` span at debug per
//! call with its fields, info at set-up, a warning on a fallback (staged instead of one-copy),
//! an error when a rank's failure poisons the world, nothing above debug for a plain call.
//!
//! One test: the subscriber is the process's global one (ranks run on their own threads).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use purlin_collectives::{CpuComm, CpuConfig, CpuSymmetricBuffer, Error, ReduceOp};
use purlin_snac::Regime;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{Layer, Registry};

/// A span (when it closed) or an event, with its fields as text.
#[derive(Debug, Clone)]
struct Rec {
    span: bool,
    level: Level,
    name: String,
    message: String,
    fields: BTreeMap<String, String>,
}

impl Visit for Rec {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.fields.insert(field.name().into(), value.into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.fields.insert(field.name().into(), format!("{value:?}"));
        }
    }
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Rec>>>);

impl Capture {
    fn take(&self) -> Vec<Rec> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let m = attrs.metadata();
        let mut rec = Rec {
            span: true,
            level: *m.level(),
            name: m.name().into(),
            message: String::new(),
            fields: BTreeMap::new(),
        };
        attrs.record(&mut rec);
        ctx.span(id).expect("new span").extensions_mut().insert(rec);
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(rec) = ctx.span(id).expect("span").extensions_mut().get_mut::<Rec>() {
            values.record(rec);
        }
    }
    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(rec) = ctx.span(&id).expect("span").extensions_mut().remove::<Rec>() {
            self.0.lock().unwrap().push(rec);
        }
    }
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let m = event.metadata();
        let mut rec = Rec {
            span: false,
            level: *m.level(),
            name: m.name().into(),
            message: String::new(),
            fields: BTreeMap::new(),
        };
        event.record(&mut rec);
        self.0.lock().unwrap().push(rec);
    }
}

fn on_every_rank<R: Send>(comms: &[CpuComm], f: impl Fn(usize, &CpuComm) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = comms.iter().enumerate().map(|(r, c)| s.spawn(move || f(r, c))).collect();
        hs.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
    })
}

fn throughput(world: usize, timeout: Duration) -> Vec<CpuComm> {
    let mut config = CpuConfig { timeout, ..CpuConfig::default() };
    config.tuning.regime = Some(Regime::Throughput);
    CpuComm::threads_with_config(world, config).expect("host communicators")
}

#[test]
fn host_logs_have_their_levels_and_fields() {
    let capture = Capture::default();
    tracing::subscriber::set_global_default(Registry::default().with(capture.clone())).expect("one subscriber");

    // Set-up: info.
    let comms = CpuComm::threads(3).expect("host communicators");
    let setup = capture.take();
    assert!(
        setup
            .iter()
            .any(|r| !r.span && r.level == Level::INFO && r.fields.get("world").map(String::as_str) == Some("3")),
        "{setup:#?}"
    );

    // A plain call: one debug span per rank with every field, nothing above debug.
    on_every_rank(&comms, |_, c| c.all_reduce(&[1.0f32; 100], &mut [0f32; 100], &ReduceOp::Sum).expect("call"));
    let call = capture.take();
    let spans: Vec<&Rec> = call.iter().filter(|r| r.span && r.name == "call").collect();
    assert_eq!(spans.len(), 3, "{call:#?}");
    for s in &spans {
        assert_eq!(s.level, Level::DEBUG);
        let f = |k: &str| s.fields.get(k).cloned().unwrap_or_else(|| panic!("span field {k} missing: {s:?}"));
        assert_eq!(
            (f("collective"), f("dtype"), f("count"), f("bytes")),
            ("all-reduce".into(), "F32".into(), "100".into(), "400".into())
        );
        assert_eq!(
            (f("executor"), f("placement"), f("captured"), f("call")),
            ("host".into(), "staged".into(), "false".into(), "1".into())
        );
        assert!(["Latency", "Throughput"].contains(&f("regime").as_str()), "{s:?}");
        assert!(f("blocks").parse::<u32>().expect("blocks") > 0);
        assert_eq!(f("plan_key").len(), 16, "{s:?}");
        assert_eq!(f("op"), "Some(Sum)");
    }
    let mut ranks: Vec<String> = spans.iter().map(|s| s.fields["rank"].clone()).collect();
    ranks.sort();
    assert_eq!(ranks, ["0", "1", "2"]);
    assert!(call.iter().all(|r| r.level >= Level::DEBUG), "nothing above debug: {call:#?}");

    // A fallback: symmetric inputs, plain outputs: the staged plan, and one warning.
    let comms = throughput(2, Duration::from_secs(30));
    capture.take();
    on_every_rank(&comms, |_, c| {
        let input: CpuSymmetricBuffer<f32> = c.alloc_symmetric(20_000).expect("symmetric input");
        let mut output = vec![0f32; 20_000];
        for _ in 0..2 {
            c.all_reduce(&input, &mut output, &ReduceOp::Sum).expect("call");
        }
        assert!(!c.last_call().expect("ran").one_copy);
    });
    let fallback = capture.take();
    let warns: Vec<&Rec> = fallback.iter().filter(|r| !r.span && r.level == Level::WARN).collect();
    assert_eq!(warns.len(), 1, "one warning per process for one kind of call: {fallback:#?}");
    assert!(warns[0].message.contains("staged instead of one-copy"), "{:?}", warns[0]);
    assert_eq!(warns[0].fields.get("collective").map(String::as_str), Some("all-reduce"));
    assert!(fallback.iter().any(|r| r.span && r.fields.get("placement").map(String::as_str) == Some("staged")));

    // A rank that stops: every survivor logs an error naming it before returning.
    let comms = throughput(3, Duration::from_secs(1));
    capture.take();
    let results = on_every_rank(&comms, |r, c| {
        let calls = if r == 1 { 1 } else { 2 };
        let mut last = c.all_reduce(&[1u32; 9000], &mut [0u32; 9000], &ReduceOp::Sum);
        for _ in 1..calls {
            last = c.all_reduce(&[1u32; 9000], &mut [0u32; 9000], &ReduceOp::Sum);
        }
        last
    });
    assert!(results[1].is_ok());
    for r in [0, 2] {
        assert!(matches!(&results[r], Err(Error::Timeout { peer: 1, .. } | Error::Poisoned(_))), "{:?}", results[r]);
    }
    let failed = capture.take();
    let errors: Vec<&Rec> = failed.iter().filter(|r| !r.span && r.level == Level::ERROR).collect();
    assert!(!errors.is_empty(), "{failed:#?}");
    for e in &errors {
        assert!(e.message.contains("poisoned"), "{e:?}");
        assert_eq!(e.fields["peer"], "Some(1)", "{e:?}");
        assert!(e.fields["error"].contains("rank 1 is 1 call behind"), "{e:?}");
        assert!(["0", "2"].contains(&e.fields["rank"].as_str()), "{e:?}");
    }
}
