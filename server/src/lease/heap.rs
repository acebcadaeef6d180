//! [`DeadlineHeap`]: an indexed binary min-heap of `(deadline, lease)` with exactly one
//! entry per lease (etcd `lease.LeaseQueue` + `LeaseExpiredNotifier`).
//!
//! Why indexed: a keepalive moves a lease's deadline. A plain heap would push a second
//! entry and leave the old one behind until it surfaces, so the heap would grow with the
//! number of keepalives rather than the number of leases. Here a position map lets
//! [`DeadlineHeap::upsert`] move the one entry in place, so the heap holds exactly the
//! leases it was given, and [`DeadlineHeap::remove`] deletes a revoked lease at once.
//!
//! Invariants (checked by [`DeadlineHeap::check_invariants`] in tests):
//! - `pos[id] == i` iff `entries[i].1 == id`; `pos.len() == entries.len()`;
//! - every parent's deadline is `<=` its children's.
//!
//! Memory: `entries` and `pos` shrink when they fall below a quarter of their capacity, so
//! a heap that once held a lease storm gives the memory back.

use std::collections::HashMap;
use std::time::Instant;

use super::LeaseId;

/// Smallest capacity worth shrinking from (below this the allocation is negligible).
const SHRINK_MIN_CAPACITY: usize = 1024;

/// An indexed min-heap of lease deadlines. See the module docs.
#[derive(Debug, Default)]
pub struct DeadlineHeap {
    entries: Vec<(Instant, LeaseId)>,
    pos: HashMap<LeaseId, usize>,
}

impl DeadlineHeap {
    /// An empty heap.
    pub fn new() -> DeadlineHeap {
        DeadlineHeap::default()
    }

    /// Builds a heap from `(deadline, lease)` pairs in O(n) (bottom-up heapify). A lease
    /// that appears twice keeps its last deadline.
    pub fn from_entries(items: impl IntoIterator<Item = (Instant, LeaseId)>) -> DeadlineHeap {
        let mut heap = DeadlineHeap::new();
        for (deadline, id) in items {
            match heap.pos.get(&id) {
                Some(&i) => heap.entries[i].0 = deadline,
                None => {
                    heap.pos.insert(id, heap.entries.len());
                    heap.entries.push((deadline, id));
                }
            }
        }
        for i in (0..heap.entries.len() / 2).rev() {
            heap.sift_down(i);
        }
        heap
    }

    /// Number of leases in the heap.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no lease is scheduled.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The deadline of `id`, if scheduled.
    pub fn get(&self, id: LeaseId) -> Option<Instant> {
        self.pos.get(&id).map(|&i| self.entries[i].0)
    }

    /// The earliest `(deadline, lease)`.
    pub fn peek(&self) -> Option<(Instant, LeaseId)> {
        self.entries.first().copied()
    }

    /// Schedules `id` at `deadline`, moving it if it was already scheduled. O(log n).
    pub fn upsert(&mut self, id: LeaseId, deadline: Instant) {
        match self.pos.get(&id) {
            Some(&i) => {
                let old = self.entries[i].0;
                self.entries[i].0 = deadline;
                if deadline < old {
                    self.sift_up(i);
                } else {
                    self.sift_down(i);
                }
            }
            None => {
                let i = self.entries.len();
                self.entries.push((deadline, id));
                self.pos.insert(id, i);
                self.sift_up(i);
            }
        }
    }

    /// Unschedules `id`; returns its deadline if it was scheduled. O(log n).
    pub fn remove(&mut self, id: LeaseId) -> Option<Instant> {
        let i = self.pos.remove(&id)?;
        let (deadline, _) = self.entries.swap_remove(i);
        if i < self.entries.len() {
            self.pos.insert(self.entries[i].1, i);
            // The entry moved into the hole may belong above or below it.
            if self.sift_up(i) == i {
                self.sift_down(i);
            }
        }
        self.shrink_if_sparse();
        Some(deadline)
    }

    /// Removes and returns the earliest entry if its deadline is `<= now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<(Instant, LeaseId)> {
        let (deadline, id) = self.peek()?;
        if deadline > now {
            return None;
        }
        self.remove(id);
        Some((deadline, id))
    }

    /// Bytes held by the heap's allocations (capacity, not length): for memory reports.
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<(Instant, LeaseId)>()
            + self.pos.capacity() * (std::mem::size_of::<(LeaseId, usize)>() + 1)
    }

    /// Asserts the invariants of the module docs. O(n); for tests.
    pub fn check_invariants(&self) {
        assert_eq!(
            self.pos.len(),
            self.entries.len(),
            "position map and entries differ in size"
        );
        for (i, (deadline, id)) in self.entries.iter().enumerate() {
            assert_eq!(
                self.pos.get(id),
                Some(&i),
                "lease {id} is not indexed at {i}"
            );
            if i > 0 {
                let parent = (i - 1) / 2;
                assert!(
                    self.entries[parent].0 <= *deadline,
                    "heap order broken at {i}"
                );
            }
        }
    }

    fn shrink_if_sparse(&mut self) {
        let cap = self.entries.capacity();
        if cap >= SHRINK_MIN_CAPACITY && self.entries.len() < cap / 4 {
            self.entries.shrink_to(self.entries.len() * 2);
            self.pos.shrink_to(self.entries.len() * 2);
        }
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.entries.swap(a, b);
        self.pos.insert(self.entries[a].1, a);
        self.pos.insert(self.entries[b].1, b);
    }

    /// Moves entry `i` up to its place; returns where it ended.
    fn sift_up(&mut self, mut i: usize) -> usize {
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.entries[parent].0 <= self.entries[i].0 {
                break;
            }
            self.swap(parent, i);
            i = parent;
        }
        i
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.entries.len();
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut smallest = i;
            if l < n && self.entries[l].0 < self.entries[smallest].0 {
                smallest = l;
            }
            if r < n && self.entries[r].0 < self.entries[smallest].0 {
                smallest = r;
            }
            if smallest == i {
                break;
            }
            self.swap(i, smallest);
            i = smallest;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn pops_in_deadline_order_and_moves_entries_in_place() {
        let t = Instant::now();
        let mut h = DeadlineHeap::new();
        h.upsert(1, at(t, 30));
        h.upsert(2, at(t, 10));
        h.upsert(3, at(t, 20));
        h.upsert(2, at(t, 40)); // a keepalive moves lease 2 later
        assert_eq!(h.len(), 3, "a moved lease keeps one entry");
        assert_eq!(h.get(2), Some(at(t, 40)));
        assert_eq!(h.pop_due(at(t, 25)), Some((at(t, 20), 3)));
        assert_eq!(h.pop_due(at(t, 25)), None, "lease 1 is due at 30");
        assert_eq!(h.remove(1), Some(at(t, 30)));
        assert_eq!(h.remove(1), None);
        assert_eq!(h.pop_due(at(t, 100)), Some((at(t, 40), 2)));
        assert!(h.is_empty());
        h.check_invariants();
    }

    #[test]
    fn shrinks_after_a_storm() {
        let t = Instant::now();
        let mut h = DeadlineHeap::from_entries((0..100_000).map(|i| (at(t, i as u64), i)));
        let full = h.heap_bytes();
        while h.pop_due(at(t, 100_000)).is_some() {}
        assert!(h.is_empty());
        assert!(
            h.heap_bytes() < full / 20,
            "heap kept {} of {} bytes",
            h.heap_bytes(),
            full
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Upsert(i64, u64),
        Remove(i64),
        Pop(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0i64..40, 0u64..1000).prop_map(|(id, d)| Op::Upsert(id, d)),
            (0i64..40).prop_map(Op::Remove),
            (0u64..1000).prop_map(Op::Pop),
        ]
    }

    proptest! {
        /// The heap agrees with a plain map model after any sequence of operations.
        #[test]
        fn matches_a_map_model(init in proptest::collection::vec((0u64..1000, 0i64..40), 0..50),
                               ops in proptest::collection::vec(op(), 0..200)) {
            let t = Instant::now();
            let mut h = DeadlineHeap::from_entries(init.iter().map(|&(d, id)| (at(t, d), id)));
            let mut model: HashMap<i64, Instant> = HashMap::new();
            for &(d, id) in &init {
                model.insert(id, at(t, d));
            }
            h.check_invariants();
            for op in ops {
                match op {
                    Op::Upsert(id, d) => {
                        h.upsert(id, at(t, d));
                        model.insert(id, at(t, d));
                    }
                    Op::Remove(id) => prop_assert_eq!(h.remove(id), model.remove(&id)),
                    Op::Pop(now) => {
                        let min = model.iter().map(|(id, d)| (*d, *id)).min_by_key(|(d, _)| *d);
                        match h.pop_due(at(t, now)) {
                            Some((d, id)) => {
                                prop_assert_eq!(Some(d), min.map(|m| m.0));
                                prop_assert!(d <= at(t, now));
                                prop_assert_eq!(model.remove(&id), Some(d));
                            }
                            None => prop_assert!(min.is_none_or(|(d, _)| d > at(t, now))),
                        }
                    }
                }
                h.check_invariants();
                prop_assert_eq!(h.len(), model.len());
            }
        }
    }
}
