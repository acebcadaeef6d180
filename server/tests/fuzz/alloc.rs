//! The system allocator, remembering the largest single allocation each thread made since
//! its last [`reset`], so a target can assert that a small input never makes a decoder
//! reserve gigabytes (an OOM in production, from one corrupt length field).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The largest single allocation (bytes) any fuzz input may cause. Inputs are at most a few
/// hundred KiB; Keel's own request limit is 1.5 MiB (`--max-request-bytes`) and readers
/// buffer at most 1 MiB.
pub const LIMIT_BYTES: usize = 64 << 20;

struct Tracking;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: the thread-local may be gone while a thread exits.
    let _ = LARGEST.try_with(|c| {
        if size > c.get() {
            c.set(size);
        }
    });
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

/// Forgets this thread's largest allocation so far.
pub fn reset() {
    LARGEST.with(|c| c.set(0));
}

/// The largest single allocation (bytes) of this thread since [`reset`].
pub fn largest() -> usize {
    LARGEST.with(Cell::get)
}

/// Runs `f` and fails (as a proptest case failure) if it allocated more than
/// [`LIMIT_BYTES`] at once on this thread.
pub fn bounded<T>(
    what: &str,
    f: impl FnOnce() -> T,
) -> Result<T, proptest::test_runner::TestCaseError> {
    reset();
    let out = f();
    let largest = largest();
    if largest > LIMIT_BYTES {
        return Err(proptest::test_runner::TestCaseError::fail(format!(
            "{what}: one allocation of {largest} bytes (limit {LIMIT_BYTES})"
        )));
    }
    Ok(out)
}
