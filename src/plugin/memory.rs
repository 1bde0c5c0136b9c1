//! Giving the heap memory a burst of work freed back to the kernel once the plugin is idle.
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
