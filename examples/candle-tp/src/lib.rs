//! A tensor-parallel transformer block on candle whose collectives are Purlin's.
//!
//! The block is one attention layer and one MLP (pre-residual, no norms), in Megatron's
//! layout: the QKV projection and the MLP's up projection are column-parallel (each rank
//! holds its heads' columns, its slice of the hidden units), the attention output and the
//! MLP's down projection are row-parallel (each rank's partial product, summed by an
//! [`AllReduce`]), and a column-parallel head whose slices an [`AllGather`] joins.
//!
//! [`AllReduce`] and [`AllGather`] are candle custom ops ([`candle_core::CustomOp1`]) backed
//! by Purlin: `cpu_fwd` through a [`purlin_collectives::CpuComm`] (the CPU twin, what CI
//! runs) and, with the `cuda` feature, `cuda_fwd` through a [`purlin_collectives::Comm`]
//! made on candle's own stream, so the collective is ordered after the kernels that wrote
//! its input with no extra synchronisation.
//!
//! [`check`] runs the block on every rank and compares it with two references computed on
//! one rank without Purlin: the same shards with their partial products summed in rank
//! order (the collectives must reproduce it bit for bit), and the unsharded block (equal up
//! to the re-association of float sums that sharding implies).

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Result, Shape, Tensor, bail};
use purlin_collectives::{CpuComm, ReduceOp};

/// The block's sizes.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    /// Tokens.
    pub tokens: usize,
    /// Model width.
    pub hidden: usize,
    /// Attention heads (`hidden / heads` each).
    pub heads: usize,
    /// MLP hidden units.
    pub ffn: usize,
    /// Head output width (the gathered projection).
    pub vocab: usize,
}

impl Dims {
    /// A small block whose every sharded dimension divides by `world`.
    pub fn small() -> Dims {
        Dims { tokens: 16, hidden: 128, heads: 8, ffn: 512, vocab: 192 }
    }

    fn check_world(&self, world: usize) -> Result<()> {
        for (what, n) in [("heads", self.heads), ("ffn", self.ffn), ("vocab", self.vocab)] {
            if world == 0 || !n.is_multiple_of(world) {
                bail!("{what} = {n} does not split over {world} ranks");
            }
        }
        if !self.hidden.is_multiple_of(self.heads) {
            bail!("hidden = {} does not split into {} heads", self.hidden, self.heads);
        }
        Ok(())
    }
}

/// The communicator a rank's ops run on.
#[derive(Debug, Clone, Copy)]
pub enum Collectives<'a> {
    /// Host threads (the CPU twin): tensors on `Device::Cpu`.
    Cpu(&'a CpuComm),
    /// GPUs: tensors on the CUDA device whose stream the communicator was made on.
    #[cfg(feature = "cuda")]
    Gpu(&'a purlin_collectives::Comm),
}

impl Collectives<'_> {
    /// This rank.
    pub fn rank(&self) -> usize {
        match self {
            Collectives::Cpu(c) => c.rank(),
            #[cfg(feature = "cuda")]
            Collectives::Gpu(c) => c.rank(),
        }
    }

    /// Ranks in the world.
    pub fn world(&self) -> usize {
        match self {
            Collectives::Cpu(c) => c.world_size(),
            #[cfg(feature = "cuda")]
            Collectives::Gpu(c) => c.world_size(),
        }
    }

    // `op` names the op in the error of the GPU arm.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    fn cpu(&self, op: &str) -> Result<&CpuComm> {
        match self {
            Collectives::Cpu(c) => Ok(c),
            #[cfg(feature = "cuda")]
            Collectives::Gpu(_) => bail!("{op}: a CPU tensor on a GPU communicator"),
        }
    }
}

fn purlin(e: purlin_collectives::Error) -> candle_core::Error {
    candle_core::Error::wrap(e)
}

fn contiguous(op: &str, layout: &Layout) -> Result<(usize, usize)> {
    match layout.contiguous_offsets() {
        Some(o) => Ok(o),
        None => bail!("{op}: the input must be contiguous"),
    }
}

/// Sums a tensor over every rank (Purlin's AllReduce): the output has the input's shape.
#[derive(Debug, Clone, Copy)]
pub struct AllReduce<'a>(pub Collectives<'a>);

impl CustomOp1 for AllReduce<'_> {
    fn name(&self) -> &'static str {
        "purlin-all-reduce"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let comm = self.0.cpu(self.name())?;
        let (from, to) = contiguous(self.name(), layout)?;
        macro_rules! sum {
            ($v:expr, $t:ty, $variant:ident) => {{
                let mut out = vec![<$t>::default(); to - from];
                comm.all_reduce(&$v[from..to], &mut out, &ReduceOp::Sum).map_err(purlin)?;
                CpuStorage::$variant(out)
            }};
        }
        let out = match storage {
            CpuStorage::F32(v) => sum!(v, f32, F32),
            CpuStorage::BF16(v) => sum!(v, half::bf16, BF16),
            CpuStorage::F16(v) => sum!(v, half::f16, F16),
            other => bail!("{}: {:?} is not reduced by Purlin", self.name(), other.dtype()),
        };
        Ok((out, layout.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        gpu::all_reduce(self.0, storage, layout)
    }
}

/// Joins a tensor from every rank (Purlin's AllGather): shape `[world, ..input]`, rank `r`'s
/// input at index `r`.
#[derive(Debug, Clone, Copy)]
pub struct AllGather<'a>(pub Collectives<'a>);

impl CustomOp1 for AllGather<'_> {
    fn name(&self) -> &'static str {
        "purlin-all-gather"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let comm = self.0.cpu(self.name())?;
        let (from, to) = contiguous(self.name(), layout)?;
        let world = comm.world_size();
        macro_rules! gather {
            ($v:expr, $t:ty, $variant:ident) => {{
                let mut out = vec![<$t>::default(); world * (to - from)];
                comm.all_gather(&$v[from..to], &mut out).map_err(purlin)?;
                CpuStorage::$variant(out)
            }};
        }
        let out = match storage {
            CpuStorage::F32(v) => gather!(v, f32, F32),
            CpuStorage::BF16(v) => gather!(v, half::bf16, BF16),
            CpuStorage::F16(v) => gather!(v, half::f16, F16),
            CpuStorage::U8(v) => gather!(v, u8, U8),
            CpuStorage::U32(v) => gather!(v, u32, U32),
            other => bail!("{}: {:?} is not gathered here", self.name(), other.dtype()),
        };
        Ok((out, gathered_shape(world, layout)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        gpu::all_gather(self.0, storage, layout)
    }
}

fn gathered_shape(world: usize, layout: &Layout) -> Shape {
    let mut dims = vec![world];
    dims.extend_from_slice(layout.dims());
    Shape::from(dims)
}

#[cfg(feature = "cuda")]
mod gpu {
    //! The ops' `cuda_fwd`: Purlin's `Comm` on the storage's own CUDA stream.

    use candle_core::cuda::{CudaStorage, CudaStorageSlice};
    use candle_core::{Layout, Result, Shape, bail};
    use purlin_collectives::{Comm, ReduceOp};

    use super::{Collectives, contiguous, gathered_shape, purlin};

    /// The GPU communicator, which must run on the storage's stream (candle's): Purlin's
    /// kernel is then ordered after the kernels that wrote the input, and before those that
    /// read the output, as candle's own kernels are.
    fn comm<'a>(c: Collectives<'a>, storage: &CudaStorage, op: &str) -> Result<&'a Comm> {
        let Collectives::Gpu(comm) = c else { bail!("{op}: a CUDA tensor on a CPU communicator") };
        if !std::sync::Arc::ptr_eq(&comm.stream(), &storage.device.cuda_stream()) {
            bail!(
                "{op}: the communicator was not made on this tensor's stream (Comm::from_devices with candle's streams)"
            );
        }
        Ok(comm)
    }

    pub(super) fn all_reduce(
        c: Collectives<'_>,
        storage: &CudaStorage,
        layout: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        const OP: &str = "purlin-all-reduce";
        let comm = comm(c, storage, OP)?;
        let (from, to) = contiguous(OP, layout)?;
        let dev = &storage.device;
        macro_rules! sum {
            ($s:expr, $t:ty) => {{
                let input = $s.slice(from..to);
                let mut out = dev.alloc_zeros::<$t>(to - from)?;
                comm.all_reduce(&input, &mut out, &ReduceOp::Sum).map_err(purlin)?;
                CudaStorage::wrap_cuda_slice(out, dev.clone())
            }};
        }
        let out = match &storage.slice {
            CudaStorageSlice::F32(s) => sum!(s, f32),
            CudaStorageSlice::BF16(s) => sum!(s, half::bf16),
            CudaStorageSlice::F16(s) => sum!(s, half::f16),
            _ => bail!("{OP}: only f32, bf16 and f16 are reduced here"),
        };
        Ok((out, layout.shape().clone()))
    }

    pub(super) fn all_gather(
        c: Collectives<'_>,
        storage: &CudaStorage,
        layout: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        const OP: &str = "purlin-all-gather";
        let comm = comm(c, storage, OP)?;
        let (from, to) = contiguous(OP, layout)?;
        let world = comm.world_size();
        let dev = &storage.device;
        macro_rules! gather {
            ($s:expr, $t:ty) => {{
                let input = $s.slice(from..to);
                let mut out = dev.alloc_zeros::<$t>(world * (to - from))?;
                comm.all_gather(&input, &mut out).map_err(purlin)?;
                CudaStorage::wrap_cuda_slice(out, dev.clone())
            }};
        }
        let out = match &storage.slice {
            CudaStorageSlice::F32(s) => gather!(s, f32),
            CudaStorageSlice::BF16(s) => gather!(s, half::bf16),
            CudaStorageSlice::F16(s) => gather!(s, half::f16),
            CudaStorageSlice::U8(s) => gather!(s, u8),
            CudaStorageSlice::U32(s) => gather!(s, u32),
            _ => bail!("{OP}: this element type is not gathered here"),
        };
        Ok((out, gathered_shape(world, layout)))
    }
}

/// The full (unsharded) weights, drawn from a seed: every rank draws the same and keeps its
/// shards, as a checkpoint loader would.
#[derive(Debug, Clone)]
pub struct Weights {
    /// `[hidden, 3 × hidden]`: Q, K, V columns, head-major within each.
    pub qkv: Tensor,
    /// `[hidden, hidden]`: the attention output projection.
    pub out: Tensor,
    /// `[hidden, ffn]`.
    pub up: Tensor,
    /// `[ffn, hidden]`.
    pub down: Tensor,
    /// `[hidden, vocab]`.
    pub head: Tensor,
}

/// A small deterministic generator (splitmix64): the same weights on every rank and run.
fn uniform(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            // 24 random bits → [-1, 1).
            ((z >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * scale
        })
        .collect()
}

impl Weights {
    /// Random weights (scaled by `1/√fan_in`) on `device`.
    pub fn random(d: Dims, seed: u64, device: &Device) -> Result<Weights> {
        let w = |k: u64, rows: usize, cols: usize| {
            let scale = 1.0 / (rows as f32).sqrt();
            Tensor::from_vec(uniform(seed ^ (k << 56), rows * cols, scale), (rows, cols), device)
        };
        Ok(Weights {
            qkv: w(1, d.hidden, 3 * d.hidden)?,
            out: w(2, d.hidden, d.hidden)?,
            up: w(3, d.hidden, d.ffn)?,
            down: w(4, d.ffn, d.hidden)?,
            head: w(5, d.hidden, d.vocab)?,
        })
    }

    /// The input tokens' activations, `[tokens, hidden]`.
    pub fn input(d: Dims, seed: u64, device: &Device) -> Result<Tensor> {
        Tensor::from_vec(uniform(seed ^ 0xA11CE, d.tokens * d.hidden, 1.0), (d.tokens, d.hidden), device)
    }

    /// Rank `rank`'s shards of `world`: column-parallel QKV (its heads' Q, K and V columns),
    /// row-parallel output projection, column-parallel up, row-parallel down, and
    /// column-parallel head.
    pub fn shard(&self, d: Dims, rank: usize, world: usize) -> Result<Weights> {
        d.check_world(world)?;
        let h = d.hidden / world;
        let qkv = Tensor::cat(
            &[
                self.qkv.narrow(1, rank * h, h)?,
                self.qkv.narrow(1, d.hidden + rank * h, h)?,
                self.qkv.narrow(1, 2 * d.hidden + rank * h, h)?,
            ],
            1,
        )?;
        let f = d.ffn / world;
        let v = d.vocab / world;
        Ok(Weights {
            qkv: qkv.contiguous()?,
            out: self.out.narrow(0, rank * h, h)?.contiguous()?,
            up: self.up.narrow(1, rank * f, f)?.contiguous()?,
            down: self.down.narrow(0, rank * f, f)?.contiguous()?,
            head: self.head.narrow(1, rank * v, v)?.contiguous()?,
        })
    }
}

/// Attention over `heads` heads of `x @ qkv` (`qkv`: Q, K and V columns of those heads).
fn attention(x: &Tensor, qkv: &Tensor, heads: usize, head_dim: usize) -> Result<Tensor> {
    let tokens = x.dim(0)?;
    let width = heads * head_dim;
    let qkv = x.matmul(qkv)?;
    let split = |i: usize| -> Result<Tensor> {
        qkv.narrow(1, i * width, width)?.reshape((tokens, heads, head_dim))?.transpose(0, 1)?.contiguous()
    };
    let (q, k, v) = (split(0)?, split(1)?, split(2)?);
    let scores = (q.matmul(&k.transpose(1, 2)?.contiguous()?)? / (head_dim as f64).sqrt())?;
    let scores = scores.broadcast_sub(&scores.max_keepdim(2)?)?.exp()?;
    let probs = scores.broadcast_div(&scores.sum_keepdim(2)?)?;
    probs.matmul(&v)?.transpose(0, 1)?.reshape((tokens, width))
}

/// The outputs of a block: the hidden state and the head's projection.
#[derive(Debug)]
pub struct Outputs {
    /// `[tokens, hidden]`.
    pub hidden: Tensor,
    /// `[tokens, vocab]`.
    pub logits: Tensor,
}

/// The unsharded block on one device.
pub fn forward_full(d: Dims, w: &Weights, x: &Tensor) -> Result<Outputs> {
    let head_dim = d.hidden / d.heads;
    let h = (x + attention(x, &w.qkv, d.heads, head_dim)?.matmul(&w.out)?)?;
    let y = (&h + h.matmul(&w.up)?.silu()?.matmul(&w.down)?)?;
    let logits = y.matmul(&w.head)?;
    Ok(Outputs { hidden: y, logits })
}

/// The row-parallel partial products of rank `rank`'s shards, and the function that joins
/// them: the one body both the tensor-parallel block and its one-rank reference run.
fn forward_sharded(
    d: Dims,
    shard: &Weights,
    x: &Tensor,
    world: usize,
    sum: &mut dyn FnMut(&Tensor) -> Result<Tensor>,
    gather: &mut dyn FnMut(&Tensor) -> Result<Tensor>,
) -> Result<Outputs> {
    let head_dim = d.hidden / d.heads;
    let attn = attention(x, &shard.qkv, d.heads / world, head_dim)?.matmul(&shard.out)?;
    let h = (x + sum(&attn)?)?;
    let mlp = h.matmul(&shard.up)?.silu()?.matmul(&shard.down)?;
    let y = (&h + sum(&mlp)?)?;
    let logits = y.matmul(&shard.head)?.contiguous()?;
    // `[world, tokens, vocab / world]` → `[tokens, vocab]`.
    let logits = gather(&logits)?.transpose(0, 1)?.reshape((d.tokens, d.vocab))?;
    Ok(Outputs { hidden: y, logits })
}

/// The tensor-parallel block on this rank: its shards, Purlin's AllReduce after each
/// row-parallel projection and AllGather after the head.
pub fn forward_tp(d: Dims, shard: &Weights, x: &Tensor, comm: Collectives<'_>) -> Result<Outputs> {
    let world = comm.world();
    forward_sharded(d, shard, x, world, &mut |t| t.contiguous()?.apply_op1_no_bwd(&AllReduce(comm)), &mut |t| {
        t.contiguous()?.apply_op1_no_bwd(&AllGather(comm))
    })
}

/// What [`forward_tp`] must give, computed on one device without Purlin: every rank's shards
/// in turn, the partial products summed in rank order, the head's slices concatenated.
pub fn forward_sharded_reference(d: Dims, full: &Weights, x: &Tensor, world: usize) -> Result<Outputs> {
    let shards: Vec<Weights> = (0..world).map(|r| full.shard(d, r, world)).collect::<Result<_>>()?;
    let head_dim = d.hidden / d.heads;
    let rank_order_sum = |parts: Vec<Tensor>| -> Result<Tensor> {
        let mut it = parts.into_iter();
        let first = it.next().expect("world >= 1");
        it.try_fold(first, |acc, p| &acc + &p)
    };
    let attn = rank_order_sum(
        shards
            .iter()
            .map(|s| attention(x, &s.qkv, d.heads / world, head_dim)?.matmul(&s.out))
            .collect::<Result<_>>()?,
    )?;
    let h = (x + attn)?;
    let mlp = rank_order_sum(shards.iter().map(|s| h.matmul(&s.up)?.silu()?.matmul(&s.down)).collect::<Result<_>>()?)?;
    let y = (&h + mlp)?;
    let logits = Tensor::cat(&shards.iter().map(|s| y.matmul(&s.head)).collect::<Result<Vec<_>>>()?, 1)?;
    Ok(Outputs { hidden: y, logits })
}

/// The largest absolute difference between two tensors, and the largest absolute value of
/// the second.
pub fn max_diff(got: &Tensor, want: &Tensor) -> Result<(f32, f32)> {
    let got = got.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let want = want.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    if got.len() != want.len() {
        bail!("{} elements against {}", got.len(), want.len());
    }
    let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    let scale = want.iter().map(|b| b.abs()).fold(0f32, f32::max);
    Ok((diff, scale))
}

/// Whether two tensors hold the same bits.
pub fn bitwise_equal(got: &Tensor, want: &Tensor) -> Result<bool> {
    let got = got.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let want = want.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    Ok(got.len() == want.len() && got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()))
}

/// How one rank's block compared.
#[derive(Debug, Clone, Copy)]
pub struct Report {
    /// The rank.
    pub rank: usize,
    /// Hidden state and logits bit for bit equal to the rank-order sharded reference.
    pub exact: bool,
    /// Largest difference from the unsharded block, relative to its largest value.
    pub unsharded_rel: f32,
}

/// Relative bound on the difference from the unsharded block: sharding re-associates each
/// row-parallel sum (two per block) and the head's inputs inherit it; f32 keeps that to a
/// few ulps of the largest value.
pub const UNSHARDED_REL_BOUND: f32 = 1e-4;

/// Runs rank `comm.rank()`'s tensor-parallel block on `device` and compares it with both
/// references, computed on the same device.
pub fn check(d: Dims, seed: u64, device: &Device, comm: Collectives<'_>) -> Result<Report> {
    let (rank, world) = (comm.rank(), comm.world());
    let full = Weights::random(d, seed, device)?;
    let x = Weights::input(d, seed, device)?;
    let tp = forward_tp(d, &full.shard(d, rank, world)?, &x, comm)?;
    let sharded = forward_sharded_reference(d, &full, &x, world)?;
    let unsharded = forward_full(d, &full, &x)?;
    let exact = bitwise_equal(&tp.hidden, &sharded.hidden)? && bitwise_equal(&tp.logits, &sharded.logits)?;
    let mut rel = 0f32;
    for (got, want) in [(&tp.hidden, &unsharded.hidden), (&tp.logits, &unsharded.logits)] {
        let (diff, scale) = max_diff(got, want)?;
        rel = rel.max(diff / scale.max(f32::MIN_POSITIVE));
    }
    Ok(Report { rank, exact, unsharded_rel: rel })
}

/// The CPU twin: `world` ranks on host threads (`CpuComm::threads`), each running [`check`].
pub fn run_cpu(d: Dims, seed: u64, world: usize) -> anyhow::Result<Vec<Report>> {
    let comms = CpuComm::threads(world)?;
    std::thread::scope(|s| {
        let handles: Vec<_> =
            comms.iter().map(|c| s.spawn(move || check(d, seed, &Device::Cpu, Collectives::Cpu(c)))).collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| anyhow::anyhow!("a rank panicked"))?.map_err(anyhow::Error::from))
            .collect()
    })
}

/// The GPU variant: `streams.len()` ranks, rank `r` on candle device `devices[r]`, each on
/// its own thread, their communicators made on candle's streams
/// (`Comm::from_devices_with_config`; `PURLIN_SHARED_GPU=1` lets them share one GPU).
#[cfg(feature = "cuda")]
pub fn run_gpu(d: Dims, seed: u64, devices: Vec<Device>) -> anyhow::Result<Vec<Report>> {
    use purlin_collectives::{Comm, CommConfig};
    let streams = devices.iter().map(|dev| Ok(dev.as_cuda_device()?.cuda_stream())).collect::<Result<Vec<_>>>()?;
    let comms = Comm::from_devices_with_config(streams, CommConfig::from_env()?)?;
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .zip(&devices)
            .map(|(c, dev)| s.spawn(move || check(d, seed, dev, Collectives::Gpu(c))))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| anyhow::anyhow!("a rank panicked"))?.map_err(anyhow::Error::from))
            .collect()
    })
}
