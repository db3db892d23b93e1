//! The log subscriber that Purlin's programs install (examples, the bench, tools).
//!
//! The library crates only *emit* [`tracing`] events and spans; they install nothing, so a
//! program that embeds Purlin keeps its own subscriber. A program that wants Purlin's logs
//! without one calls [`init`] once at start:
//!
//! - `PURLIN_LOG` — an [`EnvFilter`] directive list (`purlin=debug`, `info`,
//!   `purlin_collectives::cpu=trace,warn`). Unset: warnings and errors only.
//! - `PURLIN_LOG_FILE` — write to this file (appended) instead of stderr; `%h` is replaced by
//!   the host name and `%p` by the process id, as in `NCCL_DEBUG_FILE`, so every rank of a
//!   launch gets its own file (`%%` is a literal `%`).
//!
//! A separate crate, not a feature of purlin-collectives: the library's dependency tree never
//! contains a subscriber (nor its filter parser), and every binary of the workspace shares
//! one implementation of the two variables.
//!
//! ```
//! // A program's first line; an error names the bad variable.
//! purlin_log::init().expect("PURLIN_LOG / PURLIN_LOG_FILE");
//! tracing::warn!(target: "purlin", "shown by default");
//! tracing::debug!(target: "purlin", "shown with PURLIN_LOG=purlin=debug");
//! ```

use std::fs::{File, OpenOptions};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Mutex;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::format::FmtSpan;

/// The variable holding the filter directives.
pub const LOG_VAR: &str = "PURLIN_LOG";
/// The variable naming the log file (`%h` host, `%p` pid).
pub const LOG_FILE_VAR: &str = "PURLIN_LOG_FILE";

/// Why the subscriber could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `PURLIN_LOG` does not parse as filter directives.
    #[error("{LOG_VAR}={value:?}: {problem}")]
    Filter {
        /// The variable's value.
        value: String,
        /// The parser's complaint.
        problem: String,
    },
    /// `PURLIN_LOG_FILE` could not be opened.
    #[error("{LOG_FILE_VAR}: cannot open {path}: {source}")]
    File {
        /// The path after expansion.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The filter for a `PURLIN_LOG` value: the directives, over a default of warnings
/// (`None` or an empty value: warnings only).
pub fn filter(value: Option<&str>) -> Result<EnvFilter, Error> {
    let builder = EnvFilter::builder().with_default_directive(LevelFilter::WARN.into());
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(builder.parse_lossy("")),
        Some(v) => builder.parse(v).map_err(|e| Error::Filter { value: v.into(), problem: e.to_string() }),
    }
}

/// `pattern` with `%h` replaced by `host`, `%p` by `pid` and `%%` by `%` (`NCCL_DEBUG_FILE`'s
/// expansion); any other `%x` is kept as written.
pub fn expand_path(pattern: &str, host: &str, pid: u32) -> String {
    let mut out = String::with_capacity(pattern.len() + host.len());
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.peek() {
            Some('h') => out.push_str(host),
            Some('p') => out.push_str(&pid.to_string()),
            Some('%') => out.push('%'),
            _ => {
                out.push('%');
                continue;
            }
        }
        chars.next();
    }
    out
}

/// This machine's host name (`gethostname`), or `localhost` where it cannot be read.
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for its whole length, which is passed; gethostname writes at
    // most that many bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    if rc != 0 || len == 0 {
        return "localhost".into();
    }
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

/// Opens `PURLIN_LOG_FILE`'s file (after expansion) for appending.
fn open(pattern: &str) -> Result<File, Error> {
    let path = PathBuf::from(expand_path(pattern, &host_name(), std::process::id()));
    OpenOptions::new().create(true).append(true).open(&path).map_err(|source| Error::File { path, source })
}

/// Installs the process's global subscriber from `PURLIN_LOG` and `PURLIN_LOG_FILE`. A
/// program that already installed one keeps it (this returns `Ok` and changes nothing).
pub fn init() -> Result<(), Error> {
    let filter = filter(std::env::var(LOG_VAR).ok().as_deref())?;
    // A span's line is printed when it closes, with its fields and time: one line per call.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(true)
        .with_thread_names(true)
        .with_span_events(FmtSpan::CLOSE);
    let installed = match std::env::var(LOG_FILE_VAR).ok().filter(|p| !p.trim().is_empty()) {
        Some(pattern) => builder.with_ansi(false).with_writer(Mutex::new(open(&pattern)?)).try_init(),
        None => builder.with_ansi(std::io::stderr().is_terminal()).with_writer(std::io::stderr).try_init(),
    };
    // Err only when a global subscriber exists already: the program's own wins.
    drop(installed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_pattern_expands_host_and_pid_like_nccl_debug_file() {
        assert_eq!(expand_path("/tmp/purlin.%h.%p.log", "node-01", 4242), "/tmp/purlin.node-01.4242.log");
        assert_eq!(expand_path("a%%h-%x%", "h", 1), "a%h-%x%");
        assert_eq!(expand_path("plain", "h", 1), "plain");
    }

    #[test]
    fn warnings_by_default_and_bad_directives_are_a_typed_error() {
        assert_eq!(filter(None).unwrap().max_level_hint(), Some(LevelFilter::WARN));
        assert_eq!(filter(Some("  ")).unwrap().max_level_hint(), Some(LevelFilter::WARN));
        assert_eq!(filter(Some("purlin=debug")).unwrap().max_level_hint(), Some(LevelFilter::DEBUG));
        let e = filter(Some("purlin=loud")).unwrap_err();
        assert!(e.to_string().contains("PURLIN_LOG=\"purlin=loud\""), "{e}");
    }
}
