//! Atom generations (one CUDA implementation per GPU generation) and their build
//! parameters: what an executor's translation unit needs to include one.

use std::fmt;
use std::str::FromStr;

use crate::nvrtc::Arch;

/// A CUDA Atom implementation. Every generation runs on every GPU at or above its
/// [`min_arch`](Generation::min_arch), so on a Hopper GPU all but Blackwell can be chosen
/// (and tested).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Generation {
    /// sm_75+: 16-byte vector loads/stores through registers, several loads in flight.
    Generic,
    /// sm_80+: a `cp.async` global→shared pipeline for copy and rank-interleaved reduce.
    Ampere,
    /// sm_90: the Ampere pipeline, sized for Hopper's NVLink.
    Hopper,
    /// sm_100: compile-checked only (no Blackwell GPU to run on).
    Blackwell,
}

/// Environment variable that overrides the generation chosen from the compute capability
/// (`generic`, `ampere`, `hopper`, `blackwell`).
pub const GENERATION_ENV: &str = "PURLIN_ATOM_GENERATION";

/// Errors choosing a generation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GenerationError {
    /// Not a generation's name.
    #[error("unknown Atom generation {0:?} (expected generic, ampere, hopper or blackwell)")]
    Unknown(String),
    /// The generation needs a newer GPU.
    #[error("the {generation} Atom needs {} or newer; this GPU is {arch}", generation.min_arch())]
    Unsupported {
        /// The generation asked for.
        generation: Generation,
        /// The GPU's architecture.
        arch: Arch,
    },
    /// The GPU is older than any Atom (sm_75).
    #[error("no Atom runs on {0} (sm_75 or newer is needed)")]
    TooOld(Arch),
}

impl Generation {
    /// Every generation, oldest first.
    pub const ALL: [Generation; 4] =
        [Generation::Generic, Generation::Ampere, Generation::Hopper, Generation::Blackwell];

    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            Generation::Generic => "generic",
            Generation::Ampere => "ampere",
            Generation::Hopper => "hopper",
            Generation::Blackwell => "blackwell",
        }
    }

    /// The oldest architecture it compiles and runs on.
    pub const fn min_arch(self) -> Arch {
        match self {
            Generation::Generic => Arch { major: 7, minor: 5 },
            Generation::Ampere => Arch::SM80,
            Generation::Hopper => Arch::SM90,
            Generation::Blackwell => Arch::SM100,
        }
    }

    /// Whether it compiles for and runs on `arch`.
    pub fn runs_on(self, arch: Arch) -> bool {
        arch >= self.min_arch()
    }

    /// The generations selectable on `arch`, oldest first.
    pub fn selectable_on(arch: Arch) -> Vec<Generation> {
        Self::ALL.into_iter().filter(|g| g.runs_on(arch)).collect()
    }

    /// The newest generation for `arch`.
    pub fn for_arch(arch: Arch) -> Result<Generation, GenerationError> {
        Self::selectable_on(arch).pop().ok_or(GenerationError::TooOld(arch))
    }

    /// `override_` if given, else `$PURLIN_ATOM_GENERATION` if set, else the newest for
    /// `arch`; an explicit choice must run on `arch`.
    pub fn choose(arch: Arch, override_: Option<Generation>) -> Result<Generation, GenerationError> {
        let chosen = match override_ {
            Some(g) => g,
            None => match std::env::var(GENERATION_ENV) {
                Ok(name) if !name.trim().is_empty() => name.parse()?,
                _ => return Self::for_arch(arch),
            },
        };
        if !chosen.runs_on(arch) {
            return Err(GenerationError::Unsupported { generation: chosen, arch });
        }
        Ok(chosen)
    }

    /// The implementation file under `kernels/atom/`.
    pub const fn impl_file(self) -> &'static str {
        match self {
            Generation::Generic => "atom_generic.cuh",
            Generation::Ampere => "atom_ampere.cuh",
            Generation::Hopper => "atom_hopper.cuh",
            Generation::Blackwell => "atom_blackwell.cuh",
        }
    }

    /// The `kGeneration` constant of its header.
    pub const fn id(self) -> u32 {
        match self {
            Generation::Generic => 1,
            Generation::Ampere => 2,
            Generation::Hopper => 3,
            Generation::Blackwell => 4,
        }
    }

    /// Whether it uses the `cp.async` pipeline (stages × vectors) rather than registers.
    pub const fn pipelined(self) -> bool {
        !matches!(self, Generation::Generic)
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Generation {
    type Err = GenerationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim().to_ascii_lowercase();
        Self::ALL.into_iter().find(|g| g.name() == s).ok_or(GenerationError::Unknown(s))
    }
}

/// The compile-time sizing of an Atom: threads per block and how much is in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomParams {
    /// Threads per block (a multiple of 32, at most 1024).
    pub threads: u32,
    /// Generic: 16-byte loads in flight per thread. Pipelined: pipeline stages (≥ 2).
    pub depth: u32,
    /// Pipelined: 16-byte vectors per thread per stage (unused by the generic Atom).
    pub vecs: u32,
    /// Hopper and Blackwell: copy through the bulk-copy (TMA) engine instead of `cp.async`
    /// (opt-in, for measuring; reduce stays on `cp.async`).
    pub bulk: bool,
    /// Encode bf16 with the integer recipe instead of sm_80+'s paired hardware conversion
    /// (`PURLIN_ATOM_SOFT_CONVERT 1`; opt-in, for measuring what the conversions cost; the
    /// results are bit-identical either way). Below sm_80 the software path is the only one.
    pub soft_convert: bool,
}

/// Errors in [`AtomParams`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid Atom parameters {params:?} for {generation}: {why}")]
pub struct ParamsError {
    /// The generation.
    pub generation: Generation,
    /// The parameters.
    pub params: AtomParams,
    /// What is wrong.
    pub why: &'static str,
}

impl AtomParams {
    /// The defaults of `generation` (the same as its header's).
    pub const fn default_for(generation: Generation) -> AtomParams {
        match generation {
            Generation::Generic => AtomParams { threads: 512, depth: 8, vecs: 1, bulk: false, soft_convert: false },
            Generation::Ampere => AtomParams { threads: 512, depth: 4, vecs: 2, bulk: false, soft_convert: false },
            Generation::Hopper | Generation::Blackwell => {
                AtomParams { threads: 512, depth: 5, vecs: 2, bulk: false, soft_convert: false }
            }
        }
    }
}

/// One Atom build: a generation and its sizing. What an executor's translation unit
/// includes ([`AtomSpec::headers`]) and what its launch must provide (threads, workspace).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomSpec {
    /// The generation.
    pub generation: Generation,
    /// Its sizing.
    pub params: AtomParams,
}

impl AtomSpec {
    /// `generation` with its default sizing.
    pub const fn new(generation: Generation) -> Self {
        Self { generation, params: AtomParams::default_for(generation) }
    }

    /// `generation` with the given sizing, validated.
    pub fn with_params(generation: Generation, params: AtomParams) -> Result<Self, ParamsError> {
        let bad = |why| Err(ParamsError { generation, params, why });
        if params.threads == 0 || params.threads > 1024 || params.threads % 32 != 0 {
            return bad("threads must be a multiple of 32 in 32..=1024");
        }
        if generation.pipelined() {
            if !(2..=16).contains(&params.depth) {
                return bad("stages must be in 2..=16");
            }
            if !(1..=8).contains(&params.vecs) {
                return bad("vectors per stage must be in 1..=8");
            }
        } else if !(1..=16).contains(&params.depth) {
            return bad("loads in flight must be in 1..=16");
        }
        if params.bulk && generation < Generation::Hopper {
            return bad("the bulk-copy engine needs the Hopper or Blackwell Atom");
        }
        let spec = Self { generation, params };
        if spec.smem_bytes() > 227 * 1024 {
            return bad("the workspace exceeds 227 KiB of shared memory");
        }
        Ok(spec)
    }

    /// Threads per block (`kThreads`).
    pub const fn threads(&self) -> u32 {
        self.params.threads
    }

    /// Workspace bytes per thread (`kSmemPerThread`).
    pub const fn smem_per_thread(&self) -> u32 {
        if self.generation.pipelined() { self.params.depth * self.params.vecs * 16 } else { 0 }
    }

    /// Dynamic shared memory a block of [`threads`](Self::threads) needs (`kSmemBytes`).
    pub const fn smem_bytes(&self) -> u32 {
        self.smem_per_thread() * self.params.threads
    }

    /// Bytes of loads one block keeps in flight (`kBytesInFlight`).
    pub const fn bytes_in_flight(&self) -> u32 {
        let per_thread = if self.generation.pipelined() {
            (self.params.depth - 1) * self.params.vecs * 16
        } else {
            self.params.depth * 16
        };
        per_thread * self.params.threads
    }

    /// The generated `atom_config.cuh`: the sizing as macros the implementation reads.
    pub fn config_header(&self) -> String {
        let p = &self.params;
        let mut s = format!(
            "// Generated by purlin-atom: the {} Atom's sizing.\n#pragma once\n#define PURLIN_ATOM_THREADS {}\n",
            self.generation, p.threads
        );
        if self.generation.pipelined() {
            s += &format!("#define PURLIN_ATOM_STAGES {}\n#define PURLIN_ATOM_VECS {}\n", p.depth, p.vecs);
            if p.bulk {
                s += "#define PURLIN_ATOM_BULK 1\n";
            }
        } else {
            s += &format!("#define PURLIN_ATOM_UNROLL {}\n", p.depth);
        }
        if p.soft_convert {
            s += "#define PURLIN_ATOM_SOFT_CONVERT 1\n";
        }
        s
    }

    /// The named headers an executor's translation unit gets: the interface
    /// (`atom.cuh`), this generation's file as `atom_impl.cuh`, everything it includes,
    /// and the generated `atom_config.cuh`.
    pub fn headers(&self) -> Vec<(String, String)> {
        let mut h = crate::sources::shared_headers();
        h.push((crate::sources::ATOM_IMPL_NAME.into(), crate::sources::impl_source(self.generation).into()));
        h.push((crate::sources::ATOM_CONFIG_NAME.into(), self.config_header()));
        h
    }

    /// A short label, e.g. `hopper-t512-s5v2` (`-bulk`, `-soft` for the opt-in variants).
    pub fn label(&self) -> String {
        let p = &self.params;
        let soft = if p.soft_convert { "-soft" } else { "" };
        if self.generation.pipelined() {
            let bulk = if p.bulk { "-bulk" } else { "" };
            format!("{}-t{}-s{}v{}{bulk}{soft}", self.generation, p.threads, p.depth, p.vecs)
        } else {
            format!("{}-t{}-u{}{soft}", self.generation, p.threads, p.depth)
        }
    }
}

/// The headers for `generation` at its default sizing (see [`AtomSpec::headers`]).
pub fn atom_headers(generation: Generation) -> Vec<(String, String)> {
    AtomSpec::new(generation).headers()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_follow_the_compute_capability() {
        let hopper = Arch::SM90;
        assert_eq!(Generation::for_arch(hopper), Ok(Generation::Hopper));
        assert_eq!(
            Generation::selectable_on(hopper),
            vec![Generation::Generic, Generation::Ampere, Generation::Hopper]
        );
        assert_eq!(Generation::for_arch(Arch::SM100), Ok(Generation::Blackwell));
        assert_eq!(Generation::for_arch(Arch { major: 8, minor: 9 }), Ok(Generation::Ampere));
        assert_eq!(Generation::for_arch(Arch { major: 7, minor: 5 }), Ok(Generation::Generic));
        assert_eq!(
            Generation::for_arch(Arch { major: 7, minor: 0 }),
            Err(GenerationError::TooOld(Arch { major: 7, minor: 0 }))
        );
        assert_eq!(Generation::choose(hopper, Some(Generation::Generic)), Ok(Generation::Generic));
        assert!(matches!(
            Generation::choose(hopper, Some(Generation::Blackwell)),
            Err(GenerationError::Unsupported { generation: Generation::Blackwell, .. })
        ));
        for g in Generation::ALL {
            assert_eq!(g.name().parse::<Generation>(), Ok(g));
        }
        assert!(matches!("volta".parse::<Generation>(), Err(GenerationError::Unknown(_))));
    }

    #[test]
    fn params_are_validated_and_sized() {
        let spec = AtomSpec::new(Generation::Hopper);
        assert_eq!(spec.smem_bytes(), 5 * 2 * 16 * 512);
        assert_eq!(spec.bytes_in_flight(), 4 * 2 * 16 * 512);
        assert_eq!(AtomSpec::new(Generation::Generic).smem_bytes(), 0);
        assert_eq!(AtomSpec::new(Generation::Generic).bytes_in_flight(), 8 * 16 * 512);
        let bad = AtomParams { threads: 100, depth: 4, vecs: 2, bulk: false, soft_convert: false };
        assert!(AtomSpec::with_params(Generation::Ampere, bad).is_err());
        let huge = AtomParams { threads: 1024, depth: 16, vecs: 8, bulk: false, soft_convert: false };
        assert!(AtomSpec::with_params(Generation::Hopper, huge).is_err());
        let one_stage = AtomParams { threads: 256, depth: 1, vecs: 2, bulk: false, soft_convert: false };
        assert!(AtomSpec::with_params(Generation::Hopper, one_stage).is_err());
        let bulk = AtomParams { bulk: true, ..AtomParams::default_for(Generation::Ampere) };
        assert!(AtomSpec::with_params(Generation::Ampere, bulk).is_err());
        let bulk = AtomSpec::with_params(Generation::Hopper, AtomParams { bulk: true, ..spec.params }).unwrap();
        assert!(bulk.config_header().contains("PURLIN_ATOM_BULK 1") && bulk.label().ends_with("-bulk"));
        // The software-conversion variant: a define and a label of its own; the defaults
        // keep their labels (kernel cache names, bench rows).
        assert_eq!(spec.label(), "hopper-t512-s5v2");
        assert_eq!(AtomSpec::new(Generation::Generic).label(), "generic-t512-u8");
        assert!(!spec.config_header().contains("SOFT_CONVERT"));
        for g in Generation::ALL {
            let soft =
                AtomSpec::with_params(g, AtomParams { soft_convert: true, ..AtomParams::default_for(g) }).unwrap();
            assert!(soft.config_header().contains("#define PURLIN_ATOM_SOFT_CONVERT 1"), "{g}");
            assert_eq!(soft.label(), format!("{}-soft", AtomSpec::new(g).label()));
            assert_eq!(soft.smem_bytes(), AtomSpec::new(g).smem_bytes());
        }
        let h = spec.headers();
        for name in ["atom.cuh", "atom_impl.cuh", "atom_config.cuh", "atom_common.cuh"] {
            assert!(h.iter().any(|(n, _)| n == name), "{name} missing");
        }
        let imp = &h.iter().find(|(n, _)| n == "atom_impl.cuh").unwrap().1;
        assert!(imp.contains("The Hopper Atom"));
    }
}
