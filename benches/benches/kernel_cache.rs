//! How long a warm kernel-cache lookup takes (the cost every communicator set-up pays per
//! kernel key). Needs libnvrtc to fill the cache once.

use criterion::{Criterion, criterion_group, criterion_main};
use purlin_atom::{Arch, KernelCache};

fn warm_lookup(c: &mut Criterion) {
    if purlin_atom::nvrtc::load().is_err() {
        eprintln!("libnvrtc not found: run `cargo xtask nvrtc` and set PURLIN_NVRTC_DIR; skipping");
        return;
    }
    let dir = std::env::temp_dir().join(format!("purlin-bench-cache-{}", std::process::id()));
    let cache = KernelCache::new(&dir);
    let unit = purlin_collectives::internal::kernels::smoke_unit();
    cache.get_or_compile(&unit, Arch::SM90).expect("compile once");
    c.bench_function("kernel_cache_warm_lookup_sm90", |b| {
        b.iter(|| cache.get_or_compile(&unit, Arch::SM90).expect("cached"))
    });
    let _ = std::fs::remove_dir_all(dir);
}

criterion_group!(benches, warm_lookup);
criterion_main!(benches);
