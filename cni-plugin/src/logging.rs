//! The plugin's own log (the `log` crate's macros), set by the network configuration:
//! `logLevel` (default `error`, or `info` when `logFile` is given) and `logFile` (appended to).
//! Errors always reach stderr too, where runtimes look for them; stdout is the CNI result's
//! alone. A log file that cannot be opened is reported and skipped: logging never fails a verb.
use std::{
    fs::{File, OpenOptions},
    io::Write as _,
    os::unix::fs::OpenOptionsExt as _,
    path::Path,
    sync::Mutex,
    time::SystemTime,
};

use log::{Level, LevelFilter, Log, Metadata, Record};

struct Logger {
    file: Mutex<Option<File>>,
}

static LOGGER: Logger = Logger { file: Mutex::new(None) };

/// Errors to stderr until the configuration says otherwise.
pub fn init() {
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(LevelFilter::Error);
    }
}

/// Applies the configuration's `logLevel` and `logFile` (already validated).
pub fn configure(level: LevelFilter, file: Option<&Path>) {
    log::set_max_level(level);
    let Some(path) = file else { return };
    match open_log_file(path) {
        Ok(f) => *LOGGER.file.lock().unwrap_or_else(|e| e.into_inner()) = Some(f),
        Err(e) => eprintln!("ebpf-cni: cannot use logFile {}: {e}; logging to stderr", path.display()),
    }
}

/// The log file, only if it is a regular file: a symlink is not followed (it could point the
/// plugin's root writes anywhere), and a FIFO or device is never waited on (a FIFO without a
/// reader would hang every verb).
fn open_log_file(path: &Path) -> std::io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        // 0600: lines name containers and addresses; only root reads them.
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    if !file.metadata()?.file_type().is_file() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"));
    }
    Ok(file)
}

/// `logLevel` values, as written in the configuration.
pub fn parse_level(text: &str) -> Option<LevelFilter> {
    match text {
        "off" => Some(LevelFilter::Off),
        "error" => Some(LevelFilter::Error),
        "warn" => Some(LevelFilter::Warn),
        "info" => Some(LevelFilter::Info),
        "debug" => Some(LevelFilter::Debug),
        _ => None,
    }
}

impl Log for Logger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = format!(
            "{} {:5} ebpf-cni[{}] {}\n",
            humantime::format_rfc3339_millis(SystemTime::now()),
            record.level(),
            std::process::id(),
            record.args()
        );
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let to_file = file.as_mut().is_some_and(|f| f.write_all(line.as_bytes()).is_ok());
        if !to_file || record.level() == Level::Error {
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    }

    fn flush(&self) {}
}
