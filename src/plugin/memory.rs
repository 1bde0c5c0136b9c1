//! Giving memory back to the kernel once the plugin is idle: the heap a burst of work freed,
//! and the code pages only start-up ran.
//!
//! Building a device model, publishing slices or handling a batch of claims allocates a few
//! megabytes of short-lived objects on a large node. glibc's malloc keeps freed chunks in its
//! free lists, and trims only the top of the heap (`MALLOC_TRIM_THRESHOLD_`): one small live
//! object above the freed ones keeps them all resident, so the idle plugin would carry its
//! busiest moment's footprint. `malloc_trim(0)` returns every free page in the heap.

/// Returns every whole free page of the heap to the kernel (glibc `malloc_trim(0)`); live
/// memory is untouched. A no-op with other C libraries. Costs a walk over the allocator's
/// free lists (tens of microseconds), so call it when idle, not per request.
pub fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn malloc_trim(pad: usize) -> std::ffi::c_int;
        }
        // SAFETY: `malloc_trim` is glibc's documented, MT-safe entry point: it takes a plain
        // integer, works only on the allocator's own state under the allocator's locks, and
        // frees no memory that is in use, so it is sound to call from any thread at any time.
        unsafe {
            malloc_trim(0);
        }
    }
}

/// Releases what start-up alone needed: free heap ([`release_free_heap`]) and the pages of
/// the executable's read-only mappings (code and constants).
///
/// Start-up runs much code once — flag parsing, recovery, the first device model and slice
/// publish, the API client's set-up — and the kernel maps executable pages in 64 KiB
/// fault-around blocks, so most of the binary's code stays resident in the idle plugin
/// although it never runs again (about 10 MiB of a 15 MiB resident set on a 64-device
/// node). `MADV_PAGEOUT` (Linux 5.4+) drops those clean, file-backed pages from this process
/// (and from the page cache charged to its cgroup, when no one else maps them); the few the
/// plugin runs again are read back on first use, from the page cache or the image. On older
/// kernels, or other platforms, only the heap is released. Call once, when idle.
pub fn release_startup() {
    release_free_heap();
    #[cfg(target_os = "linux")]
    page_out_executable();
}

/// How long the kubelet must have made no call before the executable's code is paged out
/// again ([`calls_burst_ended`]).
pub const QUIET_AFTER_CALLS: std::time::Duration = std::time::Duration::from_secs(10);

/// Kubelet calls and when the last one came, against what the last page-out saw.
#[derive(Debug)]
struct Bursts {
    epoch: std::time::Instant,
    calls: std::sync::atomic::AtomicU64,
    last_call_ms: std::sync::atomic::AtomicU64,
    paged_out_at_calls: std::sync::atomic::AtomicU64,
}

impl Bursts {
    fn new() -> Bursts {
        Bursts {
            epoch: std::time::Instant::now(),
            calls: Default::default(),
            last_call_ms: Default::default(),
            paged_out_at_calls: Default::default(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn note_call(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        self.last_call_ms.store(self.now_ms(), Relaxed);
        self.calls.fetch_add(1, Relaxed);
    }

    /// Whether a burst ended: calls since the last `true`, none for `quiet`. Marks it.
    fn burst_ended(&self, quiet: std::time::Duration) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let calls = self.calls.load(Relaxed);
        let quiet_ms = u64::try_from(quiet.as_millis()).unwrap_or(u64::MAX);
        if calls == self.paged_out_at_calls.load(Relaxed)
            || self
                .now_ms()
                .saturating_sub(self.last_call_ms.load(Relaxed))
                < quiet_ms
        {
            return false;
        }
        self.paged_out_at_calls.store(calls, Relaxed);
        true
    }
}

fn bursts() -> &'static Bursts {
    static BURSTS: std::sync::OnceLock<Bursts> = std::sync::OnceLock::new();
    BURSTS.get_or_init(Bursts::new)
}

/// Notes a kubelet call (prepare or unprepare): two relaxed atomic updates.
pub fn note_call() {
    bursts().note_call();
}

/// Whether a burst of kubelet calls is over: calls came since the last time this said so,
/// and none for [`QUIET_AFTER_CALLS`]. Two atomic loads (and a store when it says so).
///
/// When it does, give back the code the calls paged in with [`release_startup`] (a blocking
/// call): the prepare path's TLS, HTTP, gRPC, JSON and lifecycle code, several MiB of the
/// image's build, which an idle plugin would otherwise hold on every node until it restarts.
/// The next call reads those pages back, from the page cache or, when the kernel has dropped
/// them, from the image: once per burst.
pub fn calls_burst_ended() -> bool {
    bursts().burst_ended(QUIET_AFTER_CALLS)
}

#[cfg(target_os = "linux")]
fn page_out_executable() {
    const MADV_PAGEOUT: std::ffi::c_int = 21;
    unsafe extern "C" {
        fn madvise(
            addr: *mut std::ffi::c_void,
            len: usize,
            advice: std::ffi::c_int,
        ) -> std::ffi::c_int;
    }
    let (Ok(exe), Ok(maps)) = (
        std::fs::read_link("/proc/self/exe"),
        std::fs::read_to_string("/proc/self/maps"),
    ) else {
        return;
    };
    for (start, end) in read_only_mappings_of(&maps, &exe) {
        // SAFETY: the range is one whole mapping of this process's own executable, read-only
        // and file-backed, as /proc/self/maps lists it; the executable stays mapped for the
        // life of the process. MADV_PAGEOUT only drops clean pages, which the kernel reads
        // back from the file on the next access, so no memory the program uses changes; an
        // unsupported advice fails with EINVAL and changes nothing.
        unsafe {
            madvise(start as *mut std::ffi::c_void, end - start, MADV_PAGEOUT);
        }
    }
}

/// The address ranges of `exe`'s mappings in `maps` (the format of `/proc/self/maps`) that
/// are not writable: code and read-only data, never data the program writes.
pub fn read_only_mappings_of(maps: &str, exe: &std::path::Path) -> Vec<(usize, usize)> {
    maps.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let range = fields.next()?;
            let perms = fields.next()?;
            let path = fields.nth(3)?;
            if std::path::Path::new(path) != exe || perms.as_bytes().get(1) != Some(&b'-') {
                return None;
            }
            let (start, end) = range.split_once('-')?;
            let start = usize::from_str_radix(start, 16).ok()?;
            let end = usize::from_str_radix(end, 16).ok()?;
            (end > start).then_some((start, end))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_executables_read_only_mappings_are_paged_out() {
        let maps = "\
55d0a000-55d0b000 r--p 00000000 fd:01 123 /usr/bin/gpu-dra
55d0b000-55d1b000 r-xp 00001000 fd:01 123 /usr/bin/gpu-dra
55d1b000-55d1c000 rw-p 00011000 fd:01 123 /usr/bin/gpu-dra
55d1c000-55d1d000 r-xp 00000000 fd:01 456 /usr/lib/libc.so.6
7ffd0000-7ffd1000 rw-p 00000000 00:00 0 [stack]
";
        let got = read_only_mappings_of(maps, std::path::Path::new("/usr/bin/gpu-dra"));
        assert_eq!(got, [(0x55d0a000, 0x55d0b000), (0x55d0b000, 0x55d1b000)]);
    }

    #[test]
    fn paging_out_this_test_binary_keeps_it_running() {
        release_startup();
        let sum: u64 = (1..=100u64).sum();
        assert_eq!(sum, 5050);
    }

    #[test]
    fn releasing_free_heap_keeps_live_memory_intact() {
        let live: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 4096]).collect();
        let freed: Vec<Vec<u8>> = (0..256).map(|_| vec![0xAB; 4096]).collect();
        drop(freed);
        release_free_heap();
        assert!(
            live.iter()
                .enumerate()
                .all(|(i, v)| v.iter().all(|b| *b == i as u8))
        );
    }

    #[test]
    fn a_burst_ends_once_after_the_quiet_time_and_only_after_calls() {
        use std::time::Duration;
        let b = Bursts::new();
        assert!(!b.burst_ended(Duration::ZERO), "no call yet");
        b.note_call();
        assert!(
            !b.burst_ended(Duration::from_secs(3600)),
            "a call just now: not quiet yet"
        );
        assert!(b.burst_ended(Duration::ZERO), "calls came and it is quiet");
        assert!(!b.burst_ended(Duration::ZERO), "once per burst");
        b.note_call();
        b.note_call();
        assert!(b.burst_ended(Duration::ZERO), "the next burst");
    }
}
