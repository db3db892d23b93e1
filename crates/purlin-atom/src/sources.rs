//! The CUDA sources the Atom exports to the executors.
//!
//! An executor and its Atom form one NVRTC translation unit: the executor includes only
//! [`ATOM_INTERFACE_NAME`]; [`crate::AtomSpec::headers`] supplies the interface, the chosen
//! generation's implementation under [`ATOM_IMPL_NAME`], the files it includes and the
//! generated [`ATOM_CONFIG_NAME`].

use crate::dtype::DType;
use crate::generation::{AtomSpec, Generation};
use crate::nvrtc::TranslationUnit;

/// The name under which the Atom interface header is included by executors.
pub const ATOM_INTERFACE_NAME: &str = "atom.cuh";
/// The include name of the chosen generation's implementation (included by the interface).
pub const ATOM_IMPL_NAME: &str = "atom_impl.cuh";
/// The include name of the generated sizing header.
pub const ATOM_CONFIG_NAME: &str = "atom_config.cuh";

/// The Atom interface header (docs/design.md §4): the device contract of `copy` and `reduce`.
pub const ATOM_INTERFACE: &str = include_str!("../../../kernels/atom/atom.cuh");
/// Element types, conversions, operators and the block-share driver, shared by all generations.
pub const ATOM_COMMON: &str = include_str!("../../../kernels/atom/atom_common.cuh");
/// The device API over a generation's engine.
pub const ATOM_API: &str = include_str!("../../../kernels/atom/atom_api.cuh");
/// The register engine (generic).
pub const ENGINE_REGS: &str = include_str!("../../../kernels/atom/engine_regs.cuh");
/// The `cp.async` pipeline engine (Ampere and newer).
pub const ENGINE_CP_ASYNC: &str = include_str!("../../../kernels/atom/engine_cp_async.cuh");
/// The bulk-copy (TMA) engine (opt-in on Hopper and Blackwell).
pub const ENGINE_BULK: &str = include_str!("../../../kernels/atom/engine_bulk.cuh");
/// The standalone whole-grid kernels of [`crate::DeviceAtom`].
pub const STANDALONE_CU: &str = include_str!("../../../kernels/atom/standalone.cu");

/// Each generation's implementation file.
pub fn impl_source(generation: Generation) -> &'static str {
    match generation {
        Generation::Generic => include_str!("../../../kernels/atom/atom_generic.cuh"),
        Generation::Ampere => include_str!("../../../kernels/atom/atom_ampere.cuh"),
        Generation::Hopper => include_str!("../../../kernels/atom/atom_hopper.cuh"),
        Generation::Blackwell => include_str!("../../../kernels/atom/atom_blackwell.cuh"),
    }
}

/// The headers every generation's translation unit gets (without the implementation
/// and the generated config).
pub(crate) fn shared_headers() -> Vec<(String, String)> {
    [
        (ATOM_INTERFACE_NAME, ATOM_INTERFACE),
        ("atom_common.cuh", ATOM_COMMON),
        ("atom_api.cuh", ATOM_API),
        ("engine_regs.cuh", ENGINE_REGS),
        ("engine_cp_async.cuh", ENGINE_CP_ASYNC),
        ("engine_bulk.cuh", ENGINE_BULK),
    ]
    .into_iter()
    .map(|(n, t)| (n.to_string(), t.to_string()))
    .collect()
}

/// The standalone kernels of one Atom build: the copy kernel, and with `dtype` also its
/// four reduce kernels (and, for 8- and 16-bit floats, the conversion kernels).
pub fn standalone_unit(spec: &AtomSpec, dtype: Option<DType>) -> TranslationUnit {
    let (suffix, options) = match dtype {
        Some(d) => (d.name().to_string(), vec![format!("-DPURLIN_ATOM_WITH_{}", d.cuda_tag())]),
        None => ("copy".to_string(), vec![]),
    };
    TranslationUnit {
        name: format!("purlin_atom_{}_{suffix}", spec.label().replace('-', "_")),
        source: STANDALONE_CU.into(),
        headers: spec.headers(),
        options,
    }
}

/// Every standalone unit of `spec`: copy, then one per element type.
pub fn standalone_units(spec: &AtomSpec) -> Vec<TranslationUnit> {
    std::iter::once(None).chain(DType::ALL.into_iter().map(Some)).map(|d| standalone_unit(spec, d)).collect()
}
