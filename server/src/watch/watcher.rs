//! One watcher as the hub keeps it, and the slab that stores all of them.
//!
//! A watcher is small on purpose (a member may hold hundreds of thousands): its key range
//! (shared key bytes), the next revision it needs, a few flags, and the outbox of its
//! stream. Per-watcher options that only matter when a response is built (`prev_kv`,
//! `fragment`) travel with the queued items instead of being looked up.

use std::sync::Arc;

use super::key_range::{EventFilter, WatchKeyRange};
use super::outbox::Outbox;

/// A hub-wide watcher handle: a slab slot plus the slot's generation, so a handle of a
/// removed watcher never reaches the watcher that reuses its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WatcherId {
    slot: u32,
    generation: u32,
}

/// Where a watcher is in its life (etcd's synced / unsynced groups).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatcherState {
    /// Every event below `next_rev` is queued; live events are pushed as they are applied.
    Synced,
    /// Behind the store: the sync thread reads `next_rev..` from the store's history.
    Unsynced,
    /// Canceled because `next_rev` fell below the compact revision; kept only so that a
    /// later cancel request for its ID succeeds, as in etcd.
    Compacted,
}

/// Per-watcher options from the create request (bit set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WatcherFlags(u8);

impl WatcherFlags {
    const PREV_KV: u8 = 1;
    const FRAGMENT: u8 = 2;
    const PROGRESS_NOTIFY: u8 = 4;

    /// Flags from `WatchCreateRequest.{prev_kv, fragment, progress_notify}`.
    pub fn new(prev_kv: bool, fragment: bool, progress_notify: bool) -> WatcherFlags {
        let mut bits = 0;
        if prev_kv {
            bits |= Self::PREV_KV;
        }
        if fragment {
            bits |= Self::FRAGMENT;
        }
        if progress_notify {
            bits |= Self::PROGRESS_NOTIFY;
        }
        WatcherFlags(bits)
    }

    /// Events carry the key's previous version.
    pub fn prev_kv(self) -> bool {
        self.0 & Self::PREV_KV != 0
    }

    /// Responses larger than the request limit are split into fragments.
    pub fn fragment(self) -> bool {
        self.0 & Self::FRAGMENT != 0
    }

    /// Periodic progress notifications are wanted.
    pub fn progress_notify(self) -> bool {
        self.0 & Self::PROGRESS_NOTIFY != 0
    }
}

/// One watcher.
///
/// Invariants (kept by the hub under its lock):
/// - `Synced`: the watcher is in the synced index, and every matching event of a revision
///   `< next_rev` (and `<=` the hub revision) is queued in its outbox;
/// - `Unsynced`: the watcher is in the unsynced set, every matching event below `next_rev`
///   is queued, and `next_rev <=` the hub revision;
/// - `next_rev` only grows.
#[derive(Debug)]
pub struct Watcher {
    /// The stream's outbox (shared by all watchers of one gRPC stream).
    pub outbox: Arc<Outbox>,
    /// The client-visible watch ID (per stream).
    pub watch_id: i64,
    /// Watched keys.
    pub range: WatchKeyRange,
    /// Smallest revision whose events are not queued yet (etcd's `minRev`).
    pub next_rev: i64,
    /// Event types filtered out.
    pub filter: EventFilter,
    /// Create-request options.
    pub flags: WatcherFlags,
    /// Group membership.
    pub state: WatcherState,
    /// Events were queued since the last progress tick (etcd elides the next periodic
    /// progress notification then).
    pub events_since_tick: bool,
}

/// Storage for all watchers of a hub: a vector of slots with a free list.
#[derive(Debug, Default)]
pub struct Slab {
    slots: Vec<Slot>,
    free: Vec<u32>,
    len: usize,
}

#[derive(Debug)]
struct Slot {
    generation: u32,
    watcher: Option<Watcher>,
}

impl Slab {
    /// Stores `watcher` and returns its handle.
    pub fn insert(&mut self, watcher: Watcher) -> WatcherId {
        self.len += 1;
        if let Some(slot) = self.free.pop() {
            let s = &mut self.slots[slot as usize];
            s.watcher = Some(watcher);
            return WatcherId {
                slot,
                generation: s.generation,
            };
        }
        let slot = u32::try_from(self.slots.len()).expect("fewer than 2^32 watchers");
        self.slots.push(Slot {
            generation: 0,
            watcher: Some(watcher),
        });
        WatcherId {
            slot,
            generation: 0,
        }
    }

    /// The watcher of `id`, if it still exists.
    pub fn get(&self, id: WatcherId) -> Option<&Watcher> {
        let s = self.slots.get(id.slot as usize)?;
        if s.generation != id.generation {
            return None;
        }
        s.watcher.as_ref()
    }

    /// The watcher of `id`, mutably.
    pub fn get_mut(&mut self, id: WatcherId) -> Option<&mut Watcher> {
        let s = self.slots.get_mut(id.slot as usize)?;
        if s.generation != id.generation {
            return None;
        }
        s.watcher.as_mut()
    }

    /// Removes and returns the watcher of `id`.
    pub fn remove(&mut self, id: WatcherId) -> Option<Watcher> {
        let s = self.slots.get_mut(id.slot as usize)?;
        if s.generation != id.generation {
            return None;
        }
        let w = s.watcher.take()?;
        s.generation = s.generation.wrapping_add(1);
        self.free.push(id.slot);
        self.len -= 1;
        Some(w)
    }

    /// Number of watchers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no watchers.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Handles of all watchers (slot order).
    pub fn ids(&self) -> Vec<WatcherId> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.watcher.is_some())
            .map(|(i, s)| WatcherId {
                slot: i as u32,
                generation: s.generation,
            })
            .collect()
    }

    /// Heap bytes of the slot vectors (not of what the watchers point to).
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>() + self.free.capacity() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::WatchConfig;
    use crate::watch::outbox::Outbox;

    fn watcher(id: i64) -> Watcher {
        Watcher {
            outbox: Outbox::new(
                &WatchConfig::default(),
                Arc::new(super::super::hub::SyncSignal::default()),
            ),
            watch_id: id,
            range: WatchKeyRange::from_request(b"k", b"").unwrap(),
            next_rev: 1,
            filter: EventFilter::default(),
            flags: WatcherFlags::default(),
            state: WatcherState::Synced,
            events_since_tick: false,
        }
    }

    #[test]
    fn stale_handles_do_not_reach_a_reused_slot() {
        let mut slab = Slab::default();
        let a = slab.insert(watcher(1));
        assert_eq!(slab.get(a).map(|w| w.watch_id), Some(1));
        assert_eq!(slab.remove(a).map(|w| w.watch_id), Some(1));
        let b = slab.insert(watcher(2));
        assert_ne!(a, b, "the reused slot has a new generation");
        assert!(slab.get(a).is_none() && slab.remove(a).is_none());
        assert_eq!(slab.get(b).map(|w| w.watch_id), Some(2));
        assert_eq!(slab.len(), 1);
        assert_eq!(slab.ids(), vec![b]);
    }

    #[test]
    fn flags_round_trip() {
        let f = WatcherFlags::new(true, false, true);
        assert!(f.prev_kv() && !f.fragment() && f.progress_notify());
        assert!(!WatcherFlags::default().prev_kv());
    }
}
