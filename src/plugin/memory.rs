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

/// How long the kubelet must have made no call, and none be running, before the code the
/// calls ran is unmapped again ([`release_after_calls`]).
pub const QUIET_AFTER_CALLS: std::time::Duration = std::time::Duration::from_secs(2);

/// Kubelet calls running, and a signal for each start and end.
#[derive(Debug)]
struct Calls {
    in_flight: std::sync::atomic::AtomicUsize,
    changed: tokio::sync::Notify,
}

static CALLS: Calls = Calls {
    in_flight: std::sync::atomic::AtomicUsize::new(0),
    changed: tokio::sync::Notify::const_new(),
};

/// A kubelet call (prepare or unprepare) running: made by [`call_started`], ended when
/// dropped, also when the call's future is dropped half-way.
#[derive(Debug)]
#[must_use = "the call counts as running until this is dropped"]
pub struct CallRunning(());

impl Drop for CallRunning {
    fn drop(&mut self) {
        CALLS
            .in_flight
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        CALLS.changed.notify_one();
    }
}

/// Notes that a kubelet call started: an atomic add and a wake of [`release_after_calls`]'s
/// task, which cancels its pending timer (a timer cancelled before it fires costs no wake-up,
/// so a burst of calls closer than [`QUIET_AFTER_CALLS`] never wakes the plugin for this).
pub fn call_started() -> CallRunning {
    CALLS
        .in_flight
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    CALLS.changed.notify_one();
    CallRunning(())
}

/// Runs for the life of the plugin. Each time a burst of kubelet calls is over (calls came,
/// none is running, and none came for `quiet`), gives back what the burst left resident
/// ([`release_code_of_calls`], on a blocking thread): its free heap and the executable's
/// pages it mapped — the prepare path's TLS, HTTP, gRPC, JSON and lifecycle code, several
/// MiB that an idle plugin would otherwise hold until it restarts. Those pages stay in the
/// page cache, so the next call maps them back without reading the file.
///
/// Three wake-ups per burst (the timer's two and the blocking thread); none while calls keep
/// coming: each call cancels the pending timer before it fires.
pub async fn release_after_calls(quiet: std::time::Duration) {
    loop {
        CALLS.changed.notified().await;
        wait_until_quiet(quiet).await;
        let _ = tokio::task::spawn_blocking(release_code_of_calls).await;
    }
}

/// Returns once no kubelet call is running and none started or ended for `quiet`.
async fn wait_until_quiet(quiet: std::time::Duration) {
    loop {
        tokio::select! {
            () = CALLS.changed.notified() => {}
            () = tokio::time::sleep(quiet) => {
                if CALLS.in_flight.load(std::sync::atomic::Ordering::Relaxed) == 0 {
                    return;
                }
            }
        }
    }
}

/// Returns the heap's free pages ([`release_free_heap`]) and unmaps from this process the
/// pages of the executable's code and read-only data that hold nothing of their own
/// (`MADV_DONTNEED` on each such mapping, as `/proc/self/smaps` describes it). Unlike
/// [`release_startup`]'s page-out, the pages stay in the page cache, so the next call maps
/// them back with minor faults (no read from disk); the kernel reclaims them under memory
/// pressure like any clean cache. A mapping with a private copy of any page (relocations
/// written at load time, as in a PIE's read-only-after-relocation segment), or with pages in
/// swap, is left alone: dropping its pages would lose what was written there. On other
/// platforms only the heap is released. A blocking call (it reads `/proc`).
pub fn release_code_of_calls() {
    release_free_heap();
    #[cfg(target_os = "linux")]
    unmap_executable_code();
}

#[cfg(target_os = "linux")]
unsafe extern "C" {
    fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: std::ffi::c_int)
    -> std::ffi::c_int;
}

#[cfg(target_os = "linux")]
fn unmap_executable_code() {
    const MADV_DONTNEED: std::ffi::c_int = 4;
    // SAFETY: each range `shared_read_only_mappings_of` picks is one whole mapping of this
    // process's own executable, not writable, with no page of its own (smaps: `Anonymous:
    // 0 kB`, `Swap: 0 kB`), so every page in it is the file's page from the page cache,
    // unchanged; the mapping cannot gain a private page later, because nothing writes to a
    // read-only mapping (the loader's relocations are done before `main`). MADV_DONTNEED on a
    // private file mapping drops this process's page table entries; the next access maps the
    // file's page again, with the same content.
    unsafe {
        advise_executable(
            "/proc/self/smaps",
            shared_read_only_mappings_of,
            MADV_DONTNEED,
        );
    }
}

/// Applies `advice` to each range `select` picks from `table` (`/proc/self/maps` or
/// `smaps`) for this process's executable. Does nothing when either file cannot be read; an
/// advice the kernel does not know fails with EINVAL and changes nothing.
///
/// # Safety
///
/// `advice` must leave the content of every page of every range `select` picks as the
/// program sees it.
#[cfg(target_os = "linux")]
unsafe fn advise_executable(
    table: &str,
    select: fn(&str, &std::path::Path) -> Vec<(usize, usize)>,
    advice: std::ffi::c_int,
) {
    let (Ok(exe), Ok(table)) = (
        std::fs::read_link("/proc/self/exe"),
        std::fs::read_to_string(table),
    ) else {
        return;
    };
    for (start, end) in select(&table, &exe) {
        // SAFETY: the range is one whole mapping of this process's executable, which stays
        // mapped for the life of the process; that the advice keeps its pages' content is
        // this function's contract with its caller.
        unsafe {
            madvise(start as *mut std::ffi::c_void, end - start, advice);
        }
    }
}

/// The address ranges of `exe`'s mappings in `smaps` (the format of `/proc/self/smaps`) that
/// are not writable and whose every resident page is the file's own: `Anonymous` and `Swap`
/// both `0 kB`. A mapping whose block lacks the `Anonymous` line is left out.
pub fn shared_read_only_mappings_of(smaps: &str, exe: &std::path::Path) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    // The qualifying mapping whose lines are being read, and whether its `Anonymous: 0 kB`
    // line was seen.
    let mut current: Option<((usize, usize), bool)> = None;
    for line in smaps.lines() {
        let Some(mapping) = mapping_header(line) else {
            if let Some((_, anonymous_seen)) = &mut current {
                match line.split_once(':') {
                    Some(("Anonymous", v)) if v.trim() == "0 kB" => *anonymous_seen = true,
                    Some(("Anonymous" | "Swap", v)) if v.trim() != "0 kB" => current = None,
                    _ => {}
                }
            }
            continue;
        };
        if let Some((range, true)) = current.take() {
            out.push(range);
        }
        let (range, perms, path) = mapping;
        if read_only_of(perms, path, exe) {
            current = Some((range, false));
        }
    }
    if let Some((range, true)) = current {
        out.push(range);
    }
    out
}

/// A mapping's header line in `/proc/<pid>/maps` or `smaps`: its address range, permissions
/// and path (empty for an anonymous mapping). `None` for any other line.
fn mapping_header(line: &str) -> Option<((usize, usize), &str, &str)> {
    let mut fields = line.split_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    let perms = fields.next()?;
    let path = fields.nth(3).unwrap_or("");
    (end > start).then_some(((start, end), perms, path))
}

/// Whether a mapping with these permissions (`r-xp`, the maps format) and path is one of
/// `exe`'s that the program cannot write: code or read-only data.
fn read_only_of(perms: &str, path: &str, exe: &std::path::Path) -> bool {
    std::path::Path::new(path) == exe && perms.as_bytes().get(1) == Some(&b'-')
}

#[cfg(target_os = "linux")]
fn page_out_executable() {
    const MADV_PAGEOUT: std::ffi::c_int = 21;
    // SAFETY: each range `read_only_mappings_of` picks is a read-only, file-backed mapping of
    // the executable. MADV_PAGEOUT only reclaims pages it can give back without loss (clean
    // file pages, which the kernel reads back from the file on the next access; a private
    // copy only to swap), so no memory the program uses changes.
    unsafe {
        advise_executable("/proc/self/maps", read_only_mappings_of, MADV_PAGEOUT);
    }
}

/// The address ranges of `exe`'s mappings in `maps` (the format of `/proc/self/maps`) that
/// are not writable: code and read-only data, never data the program writes.
pub fn read_only_mappings_of(maps: &str, exe: &std::path::Path) -> Vec<(usize, usize)> {
    maps.lines()
        .filter_map(mapping_header)
        .filter(|(_, perms, path)| read_only_of(perms, path, exe))
        .map(|(range, _, _)| range)
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

    /// Held by the tests that page out or unmap this test binary's code, so that one's
    /// before-and-after reading does not see the other's work.
    static EXE_PAGES: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn paging_out_this_test_binary_keeps_it_running() {
        let _alone = EXE_PAGES.lock().unwrap_or_else(|e| e.into_inner());
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
    fn only_read_only_mappings_without_pages_of_their_own_are_unmapped() {
        let smaps = "\
55d0a000-55d0b000 r--p 00000000 fd:01 123 /usr/bin/gpu-dra
Size:                  4 kB
Rss:                   4 kB
Anonymous:             0 kB
Swap:                  0 kB
VmFlags: rd mr mw me sd
55d0b000-55d1b000 r-xp 00001000 fd:01 123 /usr/bin/gpu-dra
Rss:                  64 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me sd
55d1b000-55d1c000 r--p 00011000 fd:01 123 /usr/bin/gpu-dra
Rss:                   4 kB
Anonymous:             4 kB
Swap:                  0 kB
55d1c000-55d1d000 r--p 00012000 fd:01 123 /usr/bin/gpu-dra
Anonymous:             0 kB
Swap:                  4 kB
55d1d000-55d1e000 rw-p 00013000 fd:01 123 /usr/bin/gpu-dra
Anonymous:             0 kB
55d1e000-55d1f000 r--p 00014000 fd:01 123 /usr/bin/gpu-dra
Rss:                   4 kB
55d1f000-55d20000 r-xp 00000000 fd:01 456 /usr/lib/libc.so.6
Anonymous:             0 kB
7ffd0000-7ffd1000 rw-p 00000000 00:00 0 [stack]
Anonymous:             4 kB
55d20000-55d21000 r-xp 00015000 fd:01 123 /usr/bin/gpu-dra
Anonymous:             0 kB
";
        let got = shared_read_only_mappings_of(smaps, std::path::Path::new("/usr/bin/gpu-dra"));
        assert_eq!(
            got,
            [
                (0x55d0a000, 0x55d0b000),
                (0x55d0b000, 0x55d1b000),
                (0x55d20000, 0x55d21000)
            ],
            "relocated (anonymous) pages, swapped pages, writable mappings, a block without \
             its Anonymous line and other files are left alone"
        );
    }

    /// The resident kB of this test binary's mappings that [`release_code_of_calls`] may
    /// unmap, from a fresh `/proc/self/smaps`.
    #[cfg(target_os = "linux")]
    fn resident_unmappable_kb() -> (u64, Vec<(usize, usize)>) {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let ranges = shared_read_only_mappings_of(&smaps, &exe);
        let mut kb = 0;
        let mut counting = false;
        for line in smaps.lines() {
            if let Some((range, _, _)) = mapping_header(line) {
                counting = ranges.contains(&range);
            } else if let Some(v) = line.strip_prefix("Rss:").filter(|_| counting) {
                kb += v
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap();
            }
        }
        (kb, ranges)
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn unmapping_this_test_binarys_code_keeps_it_running_and_drops_its_pages() {
        const MADV_POPULATE_READ: std::ffi::c_int = 22;
        let _alone = EXE_PAGES.lock().unwrap_or_else(|e| e.into_inner());
        let (_, ranges) = resident_unmappable_kb();
        assert!(!ranges.is_empty(), "the test binary's code qualifies");
        let mut populated = true;
        for (start, end) in &ranges {
            // SAFETY: each range is a whole read-only mapping of this process's executable;
            // MADV_POPULATE_READ (Linux 5.14+) only faults its pages in, as a read would,
            // and fails with EINVAL on older kernels, changing nothing.
            let rc = unsafe {
                madvise(
                    *start as *mut std::ffi::c_void,
                    end - start,
                    MADV_POPULATE_READ,
                )
            };
            populated &= rc == 0;
        }
        let (before, _) = resident_unmappable_kb();
        release_code_of_calls();
        let (after, _) = resident_unmappable_kb();
        // Code reached through relocated pointers (a vtable, libc through the GOT) still runs.
        let text = format!("{:?}", std::env::var_os("PATH").map(|p| p.len()));
        assert!(text.starts_with("Some(") || text == "None");
        // Without MADV_POPULATE_READ (kernels before 5.14) what was resident is unknown.
        if populated {
            assert!(
                after < before / 2,
                "resident code after unmapping {after} kB, before {before} kB"
            );
        }
    }
}
