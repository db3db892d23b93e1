//! NVTX ranges without libnvToolsExt (the `nvtx` feature): NVTX3's injection protocol, the
//! part of its header-only C implementation that a profiler talks to, in Rust.
//!
//! NVTX3 has no library to link: a program's first NVTX call reads `NVTX_INJECTION64_PATH`
//! (set by `nsys`, `ncu`), opens that library and calls its `InitializeInjectionNvtx2` with
//! an export-table getter; the tool then writes its function pointers into the program's
//! slots (one table per module, indexed by callback id). Without the variable every range
//! is a no-op, and CUDA 13 ships no libnvToolsExt, so nothing else is needed at run time.
//! The constants and layouts are NVTX3's (`nvtxDetail/nvtxTypes.h`, `nvtxImpl.h`,
//! `nvToolsExt.h`, NVTX_VERSION 3).

use std::ffi::{CString, c_char, c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Slots per module (`NVTX_CBID_<MODULE>_SIZE`): CORE, CUDA, OPENCL, CUDART, CORE2, SYNC.
const MODULE_SIZES: [usize; 6] = [16, 9, 15, 7, 16, 7];
/// `NVTX_CB_MODULE_CORE2`'s index in [`MODULE_SIZES`] (module ids start at 1).
const CORE2: usize = 4;
/// `NVTX_CBID_CORE2_*`.
const DOMAIN_RANGE_PUSH_EX: usize = 4;
const DOMAIN_RANGE_POP: usize = 5;
const DOMAIN_CREATE_A: usize = 12;
/// `NVTX_ETID_CALLBACKS`, `NVTX_ETID_VERSIONINFO`.
const ETID_CALLBACKS: u32 = 1;
const ETID_VERSIONINFO: u32 = 3;
const NVTX_VERSION: u16 = 3;
const PAYLOAD_TYPE_UNSIGNED_INT64: i32 = 1;
const MESSAGE_TYPE_ASCII: i32 = 1;
const COLOR_ARGB: i32 = 1;

/// Every module's slots, which the tool fills (`NvtxFunctionPointer` variables).
struct Slots {
    modules: Vec<Box<[AtomicUsize]>>,
    /// Per module: the table the tool reads, a pointer to each slot (entry 0 and one past
    /// the last null, as NVTX3's own tables).
    tables: Vec<Box<[*mut c_void]>>,
}

// SAFETY: the table pointers point into `modules`, which live as long as the process (the
// `Slots` is leaked in a `OnceLock`) and are only written by the tool during initialisation;
// the slots themselves are atomics.
unsafe impl Sync for Slots {}
// SAFETY: as above.
unsafe impl Send for Slots {}

fn slots() -> &'static Slots {
    static SLOTS: OnceLock<Slots> = OnceLock::new();
    SLOTS.get_or_init(|| {
        let modules: Vec<Box<[AtomicUsize]>> =
            MODULE_SIZES.iter().map(|&n| (0..n).map(|_| AtomicUsize::new(0)).collect()).collect();
        let tables = modules
            .iter()
            .map(|m| {
                let mut t: Vec<*mut c_void> =
                    m.iter().map(|s| s as *const AtomicUsize as *mut c_void).chain([std::ptr::null_mut()]).collect();
                t[0] = std::ptr::null_mut(); // callback id 0 is invalid
                t.into_boxed_slice()
            })
            .collect();
        Slots { modules, tables }
    })
}

/// `nvtxEtiGetModuleFunctionTable`: the table of `module` and its size (entries less one).
extern "C" fn get_module_function_table(module: c_int, out_table: *mut *mut *mut c_void, out_size: *mut u32) -> c_int {
    let Some(table) = usize::try_from(module).ok().and_then(|m| m.checked_sub(1)).and_then(|m| slots().tables.get(m))
    else {
        return 0;
    };
    if !out_size.is_null() {
        // SAFETY: the tool passes a valid out-pointer or null (checked).
        unsafe { *out_size = (table.len() - 1) as u32 };
    }
    if !out_table.is_null() {
        // SAFETY: as above; the table lives for the process (leaked in a OnceLock).
        unsafe { *out_table = table.as_ptr() as *mut *mut c_void };
    }
    1
}

/// `nvtxEtiSetInjectionNvtxVersion`: reserved, ignored (as NVTX3 does).
extern "C" fn set_injection_nvtx_version(_version: u32) {}

/// `NvtxExportTableCallbacks`.
#[repr(C)]
struct ExportCallbacks {
    struct_size: usize,
    get_module_function_table: extern "C" fn(c_int, *mut *mut *mut c_void, *mut u32) -> c_int,
}

/// `NvtxExportTableVersionInfo`.
#[repr(C)]
struct ExportVersionInfo {
    struct_size: usize,
    version: u32,
    reserved0: u32,
    set_injection_nvtx_version: extern "C" fn(u32),
}

static CALLBACKS: ExportCallbacks =
    ExportCallbacks { struct_size: size_of::<ExportCallbacks>(), get_module_function_table };
static VERSION_INFO: ExportVersionInfo = ExportVersionInfo {
    struct_size: size_of::<ExportVersionInfo>(),
    version: NVTX_VERSION as u32,
    reserved0: 0,
    set_injection_nvtx_version,
};

/// `nvtxGetExportTable`.
extern "C" fn get_export_table(id: u32) -> *const c_void {
    match id {
        ETID_CALLBACKS => &CALLBACKS as *const ExportCallbacks as *const c_void,
        ETID_VERSIONINFO => &VERSION_INFO as *const ExportVersionInfo as *const c_void,
        _ => std::ptr::null(),
    }
}

/// `nvtxEventAttributes_t` (v2, 48 bytes).
#[repr(C)]
struct EventAttributes {
    version: u16,
    size: u16,
    category: u32,
    color_type: i32,
    color: u32,
    payload_type: i32,
    reserved0: i32,
    payload: u64,
    message_type: i32,
    message: *const c_char,
}

/// Loads the profiler's injection library once; whether a tool is attached.
fn injected() -> bool {
    static INJECTED: OnceLock<bool> = OnceLock::new();
    *INJECTED.get_or_init(|| {
        let Some(path) = std::env::var_os("NVTX_INJECTION64_PATH") else { return false };
        slots();
        // SAFETY: the library is the profiler's NVTX injection library, which the user's
        // environment names; loading it runs its initialisers, as NVTX3's own loader does.
        let Ok(library) = (unsafe { libloading::Library::new(&path) }) else { return false };
        type Init = extern "C" fn(extern "C" fn(u32) -> *const c_void) -> c_int;
        // SAFETY: `InitializeInjectionNvtx2` has this signature (NVTX3's
        // NvtxInitializeInjectionNvtxFunc_t).
        let Ok(init) = (unsafe { library.get::<Init>(b"InitializeInjectionNvtx2\0") }) else { return false };
        let ok = init(get_export_table) != 0;
        // The tool's functions stay in our slots: the library is never unloaded.
        std::mem::forget(library);
        ok
    })
}

/// A filled slot of CORE2 as a function of type `F`.
fn core2<F: Copy>(id: usize) -> Option<F> {
    let raw = slots().modules[CORE2][id].load(Ordering::Acquire);
    // SAFETY: the tool wrote the function of callback `id` (whose type the caller names from
    // nvtxTypes.h) into this slot; a function pointer and a usize have the same size.
    (raw != 0).then(|| unsafe { std::mem::transmute_copy::<usize, F>(&raw) })
}

/// The "Purlin" domain's handle, created at the first range (null without a tool).
fn domain() -> usize {
    static DOMAIN: OnceLock<usize> = OnceLock::new();
    *DOMAIN.get_or_init(|| {
        type Create = extern "C" fn(*const c_char) -> *mut c_void;
        core2::<Create>(DOMAIN_CREATE_A).map_or(0, |create| create(c"Purlin".as_ptr()) as usize)
    })
}

/// A pushed range of the "Purlin" domain on this thread, popped when dropped.
#[derive(Debug)]
pub(crate) struct Range {
    pushed: bool,
}

impl Range {
    /// Pushes `name()` with `bytes` as its payload (a no-op without a profiler, where `name`
    /// is not called).
    pub(crate) fn push(name: impl FnOnce() -> String, bytes: u64) -> Range {
        if !injected() {
            return Range { pushed: false };
        }
        type Push = extern "C" fn(*mut c_void, *const EventAttributes) -> c_int;
        let (Some(push), Ok(message)) = (core2::<Push>(DOMAIN_RANGE_PUSH_EX), CString::new(name())) else {
            return Range { pushed: false };
        };
        let attributes = EventAttributes {
            version: NVTX_VERSION,
            size: size_of::<EventAttributes>() as u16,
            category: 0,
            color_type: COLOR_ARGB,
            color: 0xff76_b900,
            payload_type: PAYLOAD_TYPE_UNSIGNED_INT64,
            reserved0: 0,
            payload: bytes,
            message_type: MESSAGE_TYPE_ASCII,
            message: message.as_ptr(),
        };
        // The tool copies the message during the call.
        push(domain() as *mut c_void, &attributes);
        Range { pushed: true }
    }
}

impl Drop for Range {
    fn drop(&mut self) {
        type Pop = extern "C" fn(*mut c_void) -> c_int;
        if let (true, Some(pop)) = (self.pushed, core2::<Pop>(DOMAIN_RANGE_POP)) {
            pop(domain() as *mut c_void);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layouts_are_nvtx3s() {
        assert_eq!(size_of::<EventAttributes>(), 48);
        assert_eq!(std::mem::offset_of!(EventAttributes, payload), 24);
        assert_eq!(std::mem::offset_of!(EventAttributes, message), 40);
        assert_eq!(size_of::<ExportCallbacks>(), 16);
        assert_eq!(size_of::<ExportVersionInfo>(), 24);
    }

    #[test]
    fn the_tool_finds_a_slot_per_callback_id_and_unknown_modules_are_refused() {
        let (mut table, mut size) = (std::ptr::null_mut(), 0u32);
        assert_eq!(get_module_function_table(5, &mut table, &mut size), 1);
        assert_eq!(size, 16);
        // SAFETY: the table has size + 1 entries.
        let entries = unsafe { std::slice::from_raw_parts(table, size as usize + 1) };
        assert!(entries[0].is_null() && entries[16].is_null());
        let slot = entries[DOMAIN_RANGE_POP] as *const AtomicUsize;
        assert!(std::ptr::eq(slot, &slots().modules[CORE2][DOMAIN_RANGE_POP]));
        assert_eq!(get_module_function_table(7, &mut table, &mut size), 0);
        assert_eq!(get_module_function_table(0, &mut table, &mut size), 0);
        assert!(get_export_table(2).is_null() && !get_export_table(1).is_null());
    }

    #[test]
    fn without_a_profiler_a_range_is_a_no_op() {
        if std::env::var_os("NVTX_INJECTION64_PATH").is_none() {
            assert!(!Range::push(|| unreachable!("no name without a profiler"), 8).pushed);
        }
    }
}
