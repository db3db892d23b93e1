//! Builds Purlin beside a cudarc with `dynamic-linking` (candle-core's choice), the way a
//! candle application does; `cargo check` only (linking would need the CUDA libraries).

fn main() {
    // Both crates' device calls in one program: a CUDA context from cudarc, Purlin's driver
    // check (linked libcuda: always present once the program runs).
    if purlin_collectives::driver_present() && purlin_collectives::device_count() > 0 {
        let ctx = cudarc::driver::CudaContext::new(0).expect("CUDA context");
        println!("device 0: {:?}", ctx.name());
    }
}
