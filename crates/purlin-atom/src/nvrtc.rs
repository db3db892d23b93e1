//! Run-time compilation of CUDA C++ to CUBIN with NVRTC, and an on-disk kernel cache.
//!
//! Only `libnvrtc` is needed, no CUDA headers. The library is found without
//! `LD_LIBRARY_PATH`: [`load`] opens it by absolute path (and its builtins library
//! beside it) before cudarc asks the dynamic loader for `libnvrtc.so.13`, which then
//! resolves to the copy already loaded (the loader matches the SONAME).

use std::ffi::{CStr, CString, c_char, c_int};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Errors of NVRTC discovery, compilation and the kernel cache.
#[derive(Debug, thiserror::Error)]
pub enum NvrtcError {
    /// No `libnvrtc.so.13` in any searched directory.
    #[error(
        "libnvrtc.so.13 not found; searched: {searched:?}. Set PURLIN_NVRTC_DIR or CUDA_HOME, \
         or run `cargo xtask nvrtc` to install the pinned wheel under target/"
    )]
    NotFound {
        /// Directories that were searched, in order.
        searched: Vec<PathBuf>,
    },
    /// The library was found but could not be opened.
    #[error("could not load {path}: {reason}")]
    Load {
        /// The library's path.
        path: PathBuf,
        /// The loader's message.
        reason: String,
    },
    /// NVRTC rejected the translation unit; `log` is its compiler log.
    #[error("NVRTC failed to compile {name} for {arch}: {status}\n{log}")]
    Compile {
        /// The translation unit's name.
        name: String,
        /// Target architecture.
        arch: Arch,
        /// NVRTC's status string.
        status: String,
        /// The compiler log.
        log: String,
    },
    /// An NVRTC API call failed outside compilation.
    #[error("NVRTC call {call} failed: {status}")]
    Api {
        /// The NVRTC function.
        call: &'static str,
        /// NVRTC's status string.
        status: String,
    },
    /// A source, header name or option contained a NUL byte.
    #[error("{0} contains a NUL byte")]
    Nul(&'static str),
    /// The kernel cache directory could not be read or written.
    #[error("kernel cache at {path}: {source}")]
    Cache {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// A GPU architecture NVRTC compiles for (`sm_XY`), from a compute capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Arch {
    /// Compute capability major.
    pub major: u32,
    /// Compute capability minor.
    pub minor: u32,
}

impl Arch {
    /// Ampere A100.
    pub const SM80: Arch = Arch { major: 8, minor: 0 };
    /// Hopper H100/H200.
    pub const SM90: Arch = Arch { major: 9, minor: 0 };
    /// Blackwell B200.
    pub const SM100: Arch = Arch { major: 10, minor: 0 };

    /// The `-arch=` option value, e.g. `sm_90`.
    pub fn sm(self) -> String {
        format!("sm_{}{}", self.major, self.minor)
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.sm())
    }
}

/// One NVRTC translation unit: a main source plus the named headers it may include.
#[derive(Debug, Clone)]
pub struct TranslationUnit {
    /// Program name (shows up in compiler messages).
    pub name: String,
    /// The main source.
    pub source: String,
    /// `(include name, contents)` pairs, resolved by NVRTC without touching the filesystem.
    pub headers: Vec<(String, String)>,
    /// Extra compiler options (`-D...`, `-std=...`); `-arch` is added by the compiler.
    pub options: Vec<String>,
}

/// A compiled CUBIN with the key it was compiled under.
#[derive(Debug, Clone)]
pub struct CompiledKernel {
    /// The CUBIN image, loadable with `cuModuleLoadData` (cudarc: `Ptx::from_binary`).
    pub cubin: Vec<u8>,
    /// The cache key (hex), a hash of sources, headers, options, arch and NVRTC version.
    pub key: String,
    /// Whether it came from the on-disk cache.
    pub from_cache: bool,
    /// What ptxas reported for each function it compiled; `None` when the CUBIN came from
    /// the cache (the report is not stored).
    pub resources: Option<Vec<FunctionResources>>,
}

/// What ptxas reports (`--ptxas-options=-v`) for one function of a CUBIN: its registers,
/// stack frame and register spills. Spills are local-memory traffic the source did not ask
/// for, and on the executor they cost whole microseconds per call (results/INDEX.md, rounds 113
/// and 118), so the compile checks hold the entry points to a spill budget.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FunctionResources {
    /// The function's symbol (an `extern "C"` name or a mangled C++ name).
    pub function: String,
    /// Whether it is a kernel entry point (`__global__`), not an out-of-line device function.
    pub entry: bool,
    /// Registers per thread; ptxas reports them for entry points only.
    pub registers: Option<u32>,
    /// Bytes of stack frame per thread (local arrays, spills, call frames).
    pub stack_frame_bytes: u32,
    /// Bytes of register spill stores per thread.
    pub spill_store_bytes: u32,
    /// Bytes of register spill loads per thread.
    pub spill_load_bytes: u32,
}

impl FunctionResources {
    /// Whether ptxas spilled registers in this function.
    pub fn spills(&self) -> bool {
        self.spill_store_bytes > 0 || self.spill_load_bytes > 0
    }
}

/// Parses ptxas's verbose report (NVRTC's program log under `--ptxas-options=-v`) into one
/// record per function, in the order ptxas lists them. Lines it does not know are skipped:
/// the report is informational and its wording may grow.
pub fn parse_ptxas_report(log: &str) -> Vec<FunctionResources> {
    let mut functions: Vec<FunctionResources> = Vec::new();
    let mut entries: Vec<String> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            if let Some(name) = rest.split('\'').next() {
                entries.push(name.to_string());
            }
        } else if let Some(name) = line.split("Function properties for ").nth(1) {
            let function = name.trim().to_string();
            let entry = entries.contains(&function);
            functions.push(FunctionResources { function, entry, ..FunctionResources::default() });
        } else if line.contains("bytes stack frame") {
            let Some(current) = functions.last_mut() else { continue };
            for part in line.split(',') {
                let value = part.split_whitespace().find_map(|w| w.parse::<u32>().ok()).unwrap_or(0);
                if part.contains("stack frame") {
                    current.stack_frame_bytes = value;
                } else if part.contains("spill stores") {
                    current.spill_store_bytes = value;
                } else if part.contains("spill loads") {
                    current.spill_load_bytes = value;
                }
            }
        } else if let Some(rest) = line.split("Used ").nth(1) {
            // "Used 32 registers, ..." closes the report of the entry being compiled, after
            // the properties of the entry and of any function it calls.
            let mut words = rest.split_whitespace();
            let (Some(count), Some("registers,") | Some("registers")) = (words.next(), words.next()) else { continue };
            let (Ok(count), Some(entry)) = (count.parse::<u32>(), entries.last()) else { continue };
            match functions.iter_mut().rev().find(|f| &f.function == entry) {
                Some(function) => function.registers = Some(count),
                None => functions.push(FunctionResources {
                    function: entry.clone(),
                    entry: true,
                    registers: Some(count),
                    ..FunctionResources::default()
                }),
            }
        }
    }
    functions
}

/// Environment variable naming a directory that holds `libnvrtc.so.13` (searched first).
pub const NVRTC_DIR_ENV: &str = "PURLIN_NVRTC_DIR";

/// The directories searched for `libnvrtc.so.13`, in order.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(dir) = std::env::var_os(NVRTC_DIR_ENV) {
        dirs.push(PathBuf::from(dir));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = std::env::var_os(var) {
            dirs.push(Path::new(&home).join("lib64"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    // Python wheels (`pip install nvidia-cuda-nvrtc`): site-packages/nvidia/cu13/lib.
    let mut site_roots: Vec<PathBuf> = Vec::new();
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
        site_roots.push(Path::new(&venv).join("lib"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        site_roots.push(Path::new(&home).join(".local/lib"));
    }
    for root in ["/usr/local/lib", "/usr/lib", "/opt/conda/lib"] {
        site_roots.push(PathBuf::from(root));
    }
    for root in site_roots {
        let Ok(entries) = std::fs::read_dir(&root) else { continue };
        let mut pythons: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("python3")))
            .collect();
        pythons.sort();
        for py in pythons {
            for site in ["site-packages", "dist-packages"] {
                dirs.push(py.join(site).join("nvidia/cu13/lib"));
            }
        }
    }
    dirs
}

/// Finds and loads libnvrtc once per process; returns the directory it came from.
///
/// After this returns `Ok`, cudarc's NVRTC bindings resolve to the loaded library. Without
/// this crate's `dynamic-loading` feature NVRTC is linked into the program: a directory found
/// is still loaded from, and none found is `Ok` with an empty path.
pub fn load() -> Result<&'static Path, NvrtcError> {
    static LOADED: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let loaded = LOADED.get_or_init(|| load_uncached().map_err(|e| e.to_string()));
    match loaded {
        Ok(dir) => Ok(dir.as_path()),
        Err(reason) => Err(NvrtcError::Load { path: PathBuf::from("libnvrtc.so.13"), reason: reason.clone() }),
    }
}

fn load_uncached() -> Result<PathBuf, NvrtcError> {
    let searched = search_dirs();
    let Some(dir) = searched.iter().find(|d| d.join("libnvrtc.so.13").is_file()).cloned() else {
        #[cfg(not(feature = "dynamic-loading"))]
        return Ok(PathBuf::new());
        #[cfg(feature = "dynamic-loading")]
        return Err(NvrtcError::NotFound { searched });
    };
    // The builtins library first: libnvrtc dlopens it by SONAME on first compile.
    for lib in ["libnvrtc-builtins.so.13.0", "libnvrtc.so.13"] {
        let path = dir.join(lib);
        if !path.is_file() && lib != "libnvrtc.so.13" {
            continue;
        }
        // SAFETY: loading NVRTC runs only its ELF initialisers, which have no preconditions;
        // the handle is leaked on purpose so the library stays mapped for the process's life
        // (cudarc keeps its own handle to the same mapping).
        let library = unsafe { libloading::os::unix::Library::open(Some(&path), libc_flags()) }
            .map_err(|e| NvrtcError::Load { path: path.clone(), reason: e.to_string() })?;
        std::mem::forget(library);
    }
    // Linked NVRTC (cudarc's `dynamic-linking`) is bound by the loader; nothing to ask.
    #[cfg(feature = "dynamic-loading")]
    // SAFETY: `is_culib_present` only attempts to dlopen the library by name; it now
    // resolves to the copy loaded above.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(NvrtcError::Load {
            path: dir.join("libnvrtc.so.13"),
            reason: "cudarc could not bind the loaded library".into(),
        });
    }
    Ok(dir)
}

fn libc_flags() -> std::os::raw::c_int {
    libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL
}

fn status_string(status: cudarc::nvrtc::sys::nvrtcResult) -> String {
    // SAFETY: nvrtcGetErrorString returns a pointer to a static NUL-terminated string.
    let ptr = unsafe { cudarc::nvrtc::sys::nvrtcGetErrorString(status) };
    if ptr.is_null() {
        return format!("{status:?}");
    }
    // SAFETY: non-null, static, NUL-terminated (NVRTC's contract).
    unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
}

fn check(call: &'static str, status: cudarc::nvrtc::sys::nvrtcResult) -> Result<(), NvrtcError> {
    if status == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(NvrtcError::Api { call, status: status_string(status) })
    }
}

/// The loaded NVRTC's version `(major, minor)`.
pub fn version() -> Result<(i32, i32), NvrtcError> {
    load()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both out-pointers are valid for writes.
    check("nvrtcVersion", unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) })?;
    Ok((major, minor))
}

/// Compiles a translation unit to CUBIN for `arch`, without the cache.
pub fn compile_cubin(unit: &TranslationUnit, arch: Arch) -> Result<Vec<u8>, NvrtcError> {
    compile_with_resources(unit, arch).map(|(cubin, _)| cubin)
}

/// [`compile_cubin`], with what ptxas reported for each function it compiled.
pub fn compile_with_resources(
    unit: &TranslationUnit,
    arch: Arch,
) -> Result<(Vec<u8>, Vec<FunctionResources>), NvrtcError> {
    use cudarc::nvrtc::sys;
    load()?;
    let nul = |what| move |_| NvrtcError::Nul(what);
    let source = CString::new(unit.source.as_str()).map_err(nul("source"))?;
    let name = CString::new(unit.name.as_str()).map_err(nul("program name"))?;
    let header_names: Vec<CString> = unit
        .headers
        .iter()
        .map(|(n, _)| CString::new(n.as_str()))
        .collect::<Result<_, _>>()
        .map_err(nul("header name"))?;
    let header_texts: Vec<CString> =
        unit.headers.iter().map(|(_, t)| CString::new(t.as_str())).collect::<Result<_, _>>().map_err(nul("header"))?;
    let mut options: Vec<CString> = vec![
        CString::new(format!("-arch={}", arch.sm())).map_err(nul("option"))?,
        CString::new("-std=c++17").map_err(nul("option"))?,
        // The resource report only: ptxas's code is the same with or without it.
        CString::new("--ptxas-options=-v").map_err(nul("option"))?,
    ];
    for opt in &unit.options {
        options.push(CString::new(opt.as_str()).map_err(nul("option"))?);
    }
    let header_ptrs: Vec<*const c_char> = header_texts.iter().map(|s| s.as_ptr()).collect();
    let name_ptrs: Vec<*const c_char> = header_names.iter().map(|s| s.as_ptr()).collect();
    let option_ptrs: Vec<*const c_char> = options.iter().map(|s| s.as_ptr()).collect();

    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer refers to a live NUL-terminated CString owned by this frame;
    // the arrays have `headers.len()` entries, matching the count passed.
    check("nvrtcCreateProgram", unsafe {
        sys::nvrtcCreateProgram(
            &mut prog,
            source.as_ptr(),
            name.as_ptr(),
            header_ptrs.len() as c_int,
            header_ptrs.as_ptr(),
            name_ptrs.as_ptr(),
        )
    })?;
    let result = compile_program(prog, &option_ptrs, unit, arch);
    // SAFETY: `prog` was created above and is destroyed exactly once.
    unsafe { sys::nvrtcDestroyProgram(&mut prog) };
    result
}

fn compile_program(
    prog: cudarc::nvrtc::sys::nvrtcProgram,
    options: &[*const c_char],
    unit: &TranslationUnit,
    arch: Arch,
) -> Result<(Vec<u8>, Vec<FunctionResources>), NvrtcError> {
    use cudarc::nvrtc::sys;
    // SAFETY: `prog` is a live program; `options` points to live C strings.
    let status = unsafe { sys::nvrtcCompileProgram(prog, options.len() as c_int, options.as_ptr()) };
    if status != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(NvrtcError::Compile {
            name: unit.name.clone(),
            arch,
            status: status_string(status),
            log: program_log(prog).unwrap_or_default(),
        });
    }
    let mut size = 0usize;
    // SAFETY: `prog` compiled successfully; `size` is a valid out-pointer.
    check("nvrtcGetCUBINSize", unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) })?;
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` has exactly the size NVRTC reported.
    check("nvrtcGetCUBIN", unsafe { sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()) })?;
    // The report is informational: a log that cannot be read leaves it empty, not the
    // compile failed.
    let resources = program_log(prog).map(|log| parse_ptxas_report(&log)).unwrap_or_default();
    Ok((cubin, resources))
}

fn program_log(prog: cudarc::nvrtc::sys::nvrtcProgram) -> Result<String, NvrtcError> {
    use cudarc::nvrtc::sys;
    let mut size = 0usize;
    // SAFETY: `prog` is live; `size` is a valid out-pointer.
    check("nvrtcGetProgramLogSize", unsafe { sys::nvrtcGetProgramLogSize(prog, &mut size) })?;
    let mut log = vec![0u8; size.max(1)];
    // SAFETY: `log` holds at least the reported size.
    check("nvrtcGetProgramLog", unsafe { sys::nvrtcGetProgramLog(prog, log.as_mut_ptr().cast()) })?;
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    Ok(String::from_utf8_lossy(&log[..end]).into_owned())
}

/// 64-bit FNV-1a, stable across Rust versions (the cache may be built by another binary).
fn fnv1a(mut hash: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// An on-disk CUBIN cache, keyed by sources, headers, options, arch and NVRTC version.
///
/// The driver version is deliberately *not* in the key: a CUBIN for an exact `sm_XY` does
/// not depend on the driver, which lets the cache be built ahead on a machine without a
/// GPU (`cargo xtask gpu-round`). A driver too old for the CUBIN fails at module load.
#[derive(Debug, Clone)]
pub struct KernelCache {
    dir: PathBuf,
}

/// Environment variable naming the kernel cache directory.
pub const CACHE_DIR_ENV: &str = "PURLIN_KERNEL_CACHE";

impl KernelCache {
    /// A cache in `dir` (created on first store).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The default cache: `$PURLIN_KERNEL_CACHE`, else `$XDG_CACHE_HOME/purlin/kernels`,
    /// else `~/.cache/purlin/kernels`, else a directory under the system temp dir.
    pub fn default_location() -> Self {
        if let Some(dir) = std::env::var_os(CACHE_DIR_ENV) {
            return Self::new(dir);
        }
        if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
            return Self::new(Path::new(&dir).join("purlin/kernels"));
        }
        if let Some(home) = std::env::var_os("HOME") {
            return Self::new(Path::new(&home).join(".cache/purlin/kernels"));
        }
        Self::new(std::env::temp_dir().join("purlin-kernels"))
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The key of `unit` compiled for `arch` with the loaded NVRTC.
    pub fn key(unit: &TranslationUnit, arch: Arch) -> Result<String, NvrtcError> {
        let (major, minor) = version()?;
        let mut h = fnv1a(0xcbf2_9ce4_8422_2325, format!("nvrtc {major}.{minor} {arch}\0").as_bytes());
        h = fnv1a(h, unit.source.as_bytes());
        for (name, text) in &unit.headers {
            h = fnv1a(h, &[0]);
            h = fnv1a(h, name.as_bytes());
            h = fnv1a(h, &[0]);
            h = fnv1a(h, text.as_bytes());
        }
        for opt in &unit.options {
            h = fnv1a(h, &[1]);
            h = fnv1a(h, opt.as_bytes());
        }
        Ok(format!("{}-{arch}-{h:016x}", unit.name))
    }

    /// [`get_or_compile`](Self::get_or_compile) for many units on up to `threads` threads
    /// (NVRTC compiles independent programs concurrently); results in input order.
    pub fn get_or_compile_all(
        &self,
        jobs: &[(TranslationUnit, Arch)],
        threads: usize,
    ) -> Result<Vec<CompiledKernel>, NvrtcError> {
        load()?;
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results: Vec<std::sync::Mutex<Option<Result<CompiledKernel, NvrtcError>>>> =
            jobs.iter().map(|_| std::sync::Mutex::new(None)).collect();
        std::thread::scope(|scope| {
            for _ in 0..threads.clamp(1, jobs.len().max(1)) {
                scope.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((unit, arch)) = jobs.get(i) else { break };
                        let r = self.get_or_compile(unit, *arch);
                        *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                    }
                });
            }
        });
        results
            .into_iter()
            .map(|m| {
                m.into_inner().unwrap_or_else(|e| e.into_inner()).unwrap_or_else(|| {
                    Err(NvrtcError::Api { call: "get_or_compile_all", status: "a worker did not finish".into() })
                })
            })
            .collect()
    }

    /// Returns the cached CUBIN for `unit` on `arch`, compiling and storing it if absent.
    pub fn get_or_compile(&self, unit: &TranslationUnit, arch: Arch) -> Result<CompiledKernel, NvrtcError> {
        let key = Self::key(unit, arch)?;
        let path = self.dir.join(format!("{key}.cubin"));
        if let Ok(cubin) = std::fs::read(&path) {
            if !cubin.is_empty() {
                return Ok(CompiledKernel { cubin, key, from_cache: true, resources: None });
            }
        }
        let (cubin, resources) = compile_with_resources(unit, arch)?;
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| NvrtcError::Cache { path, source }
        };
        std::fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
        // Write then rename, so a concurrent reader never sees a partial CUBIN.
        // Unique per process and call, so concurrent compiles of one key never share a file.
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = self.dir.join(format!("{key}.cubin.{}-{seq}.tmp", std::process::id()));
        std::fs::write(&tmp, &cubin).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        Ok(CompiledKernel { cubin, key, from_cache: false, resources: Some(resources) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // ptxas's report of the f32 sum executor (NVRTC 13.0.88, 2026-12-03), trimmed: two entry
    // points, each followed by the out-of-line functions it calls.
    const REPORT: &str = "\
ptxas info    : 145 bytes gmem
ptxas info    : Compiling entry function 'purlin_snac_exec_global' for 'sm_90'
ptxas info    : Function properties for purlin_snac_exec_global
ptxas         .     272 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 272 bytes cumulative stack size, 4352 bytes smem
ptxas info    : Compile time = 1562.844 ms
ptxas info    : Function properties for _ZN6purlin4snac17chunk_slot_divideEyy
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'purlin_snac_exec' for 'sm_90'
ptxas info    : Function properties for purlin_snac_exec
ptxas         .     256 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 126 registers, used 1 barriers, 256 bytes cumulative stack size, 256 bytes smem
ptxas info    : Compile time = 1401.549 ms
";

    #[test]
    fn the_ptxas_report_parses_into_one_record_per_function() {
        let functions = parse_ptxas_report(REPORT);
        let expected = [
            ("purlin_snac_exec_global", true, Some(128), 272, 8, 4),
            ("_ZN6purlin4snac17chunk_slot_divideEyy", false, None, 0, 0, 0),
            ("purlin_snac_exec", true, Some(126), 256, 0, 0),
        ];
        assert_eq!(functions.len(), expected.len(), "{functions:?}");
        for (f, (name, entry, registers, stack, stores, loads)) in functions.iter().zip(expected) {
            assert_eq!(
                (
                    f.function.as_str(),
                    f.entry,
                    f.registers,
                    f.stack_frame_bytes,
                    f.spill_store_bytes,
                    f.spill_load_bytes
                ),
                (name, entry, registers, stack, stores, loads)
            );
        }
        assert!(functions[0].spills() && !functions[2].spills());
    }

    #[test]
    fn an_empty_or_foreign_log_parses_to_nothing() {
        assert!(parse_ptxas_report("").is_empty());
        assert!(parse_ptxas_report("warning: something else\nUsed 3 registers").is_empty());
    }
}
