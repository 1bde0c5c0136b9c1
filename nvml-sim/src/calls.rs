//! How many NVML calls this process made, for tests that hold a code path to a budget of
//! driver calls (a real driver answers most of them with an ioctl into the kernel module).
//!
//! Off unless [`CALLS_ENV`] names a file. Then every exported function counts itself once,
//! and the running total is kept in that file as decimal text with a newline, rewritten in
//! place (`pwrite` at offset 0: the total only grows, so its text never gets shorter) before
//! the call does its work. A reader sees a whole number of calls made so far. If the file
//! cannot be opened the count is not kept, and the calls work as without it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Mutex;
use std::sync::OnceLock;

/// Environment variable naming the file the count is kept in.
pub const CALLS_ENV: &str = "GPU_DRA_SIM_NVML_CALLS";

/// The file and the count so far; `None` when counting is off.
static COUNTER: OnceLock<Option<Mutex<(File, u64)>>> = OnceLock::new();

fn counter() -> Option<&'static Mutex<(File, u64)>> {
    COUNTER
        .get_or_init(|| {
            let path = std::env::var_os(CALLS_ENV)?;
            match File::create(&path) {
                Ok(file) => Some(Mutex::new((file, 0))),
                Err(e) => {
                    eprintln!(
                        "simulated NVML: {CALLS_ENV}={}: {e}; calls are not counted",
                        std::path::Path::new(&path).display()
                    );
                    None
                }
            }
        })
        .as_ref()
}

/// Counts one NVML call, when counting is on.
pub fn count() {
    let Some(counter) = counter() else {
        return;
    };
    let mut guard = counter.lock().unwrap_or_else(|p| p.into_inner());
    guard.1 += 1;
    let text = format!("{}\n", guard.1);
    // A failed write loses nothing but the test's view of the count.
    let _ = guard.0.write_at(text.as_bytes(), 0);
}

/// The count a file written by [`count`] holds (`None` when it holds no number yet).
pub fn read(path: &std::path::Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}
