//! QoS matching and admission allocate nothing (issue 17: "rule matching costs O(rules) per
//! request with no allocation"). This binary installs a global allocator that counts the
//! allocations of the current thread, so it is a test binary of its own: the counter
//! must not wrap the e2e binary or the library's tests.
//!
//! `cargo test -p keel-server --test qos_alloc`

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use keel_server::qos::{Admission, Matcher, Method, RangeCost, RequestInfo, RuleSet, Thresholds};

/// The system allocator, counting allocations (alloc, alloc_zeroed, realloc) made by the
/// current thread.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: the thread-local may be gone while a thread exits.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made by this thread while `f` runs.
fn allocations(f: impl FnOnce()) -> u64 {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}

const RULES: &str = "rules:
  - {name: noisy, match: {methods: [Put, Txn, DeleteRange], key_prefix: /noisy/}, rate: 200, priority: low}
  - {name: alice, match: {user: alice}, rate: 50, max_in_flight: 4}
  - {name: one-key, match: {key: /config}, rate: 1}
  - {name: span, match: {key: /b/, range_end: /b/m}, max_in_flight: 1}
  - {name: tail, match: {key: /z/, range_end: \"\\0\"}, rate: 1000}
  - {name: lists, match: {range_keys_over: 1000, range_bytes_over: 65536}, max_in_flight: 2}
  - {name: sessions, match: {methods: [LeaseGrant]}, priority: high}
";

/// Requests that take every branch: unmatched, matched and admitted, refused by the bucket,
/// by the in-flight cap, by overload, by user, by range cost.
fn requests() -> Vec<RequestInfo<'static>> {
    let big = RangeCost::estimate(0, 50_000, false, 100);
    vec![
        RequestInfo::new(Method::Put).keys(b"/noisy/a", b""),
        RequestInfo::new(Method::DeleteRange).keys(b"/noisy/a", b"/noisy/b"),
        RequestInfo::new(Method::Put).keys(b"/good/a", b""),
        RequestInfo::new(Method::Range)
            .keys(b"/x", b"")
            .user(Some("alice")),
        RequestInfo::new(Method::Range)
            .keys(b"/x", b"")
            .user(Some("bob")),
        RequestInfo::new(Method::Put).keys(b"/config", b""),
        RequestInfo::new(Method::Range).keys(b"/b/a", b"/b/c"),
        RequestInfo::new(Method::Range).keys(b"/z/a", b"\0"),
        RequestInfo::new(Method::Range)
            .keys(b"/", b"0")
            .range_cost(big),
        RequestInfo::new(Method::Txn)
            .keys(b"/good/", b"/good0")
            .proposal(false),
        RequestInfo::new(Method::LeaseGrant),
        RequestInfo::new(Method::LeaseKeepAlive),
        RequestInfo::new(Method::LeaseRevoke),
    ]
}

#[test]
fn matching_allocates_nothing() {
    let set = RuleSet::from_yaml(RULES).unwrap();
    let matcher = Matcher::new(set.rules());
    let reqs = requests();
    let mut matched = 0;
    let n = allocations(|| {
        for _ in 0..1000 {
            for r in &reqs {
                matched += matcher.first_match(r).map_or(0, |i| i + 1);
            }
        }
    });
    assert_eq!(n, 0, "allocations while matching");
    assert!(matched > 0, "the requests match some rules");
}

#[test]
fn admission_allocates_nothing() {
    let admission = Admission::new(
        RuleSet::from_yaml(RULES).unwrap(),
        Thresholds::default(),
        Arc::default(),
    );
    let reqs = requests();
    // Warm up once: first calls may initialise the clock or thread-locals.
    for r in &reqs {
        let _ = admission.admit(r);
    }
    let (mut allowed, mut refused) = (0u64, 0u64);
    let mut held = Vec::with_capacity(64);
    let n = allocations(|| {
        for round in 0..2_000u64 {
            // Overload for a quarter of the rounds, so overload refusals are measured too.
            admission
                .load()
                .set_committed(if round % 4 == 0 { 20_000 } else { 0 });
            for r in &reqs {
                let _ = admission.check_overload(r);
                match admission.admit(r) {
                    Ok(permit) if held.len() < held.capacity() => held.push(permit),
                    Ok(_) => allowed += 1,
                    Err(_) => refused += 1,
                }
            }
            if round % 8 == 0 {
                allowed += held.len() as u64;
                held.clear();
            }
        }
    });
    assert_eq!(n, 0, "allocations while admitting");
    assert!(
        allowed > 0 && refused > 0,
        "allowed={allowed} refused={refused}"
    );
    let stats = admission.stats();
    let refused_by = |name: &str| stats.rules.iter().find(|s| s.name == name).unwrap();
    assert!(refused_by("noisy").refused_rate > 0);
    assert!(refused_by("span").refused_in_flight > 0);
    assert!(refused_by("noisy").refused_overload > 0);
}
