//! What one watcher watches: a key, a half-open key range or every key from a start key,
//! and which event types it filters out.
//!
//! Semantics of etcd's `WatchCreateRequest` (rpc.proto, and `v3rpc/watch.go` `recvLoop`):
//! an empty `key` means `"\0"` (the smallest key); an empty `range_end` watches `key` alone;
//! `range_end == "\0"` watches every key `>= key`; any other `range_end` watches
//! `[key, range_end)`, which must not be empty (`key < range_end`).

use std::sync::Arc;

use keel_proto::etcdserverpb::watch_create_request::FilterType;
use keel_proto::mvccpb::Event;
use keel_proto::mvccpb::event::EventType;

/// etcd's `mvcc.ErrEmptyWatcherRange` text, sent as `cancel_reason` (from the catalogue).
pub const EMPTY_RANGE_REASON: &str = keel_proto::rpctypes::WATCH_EMPTY_RANGE;

/// The keys one watcher follows. Keys are shared (`Arc<[u8]>`) between the watcher and the
/// hub's index, so a watcher's key bytes are stored once.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum WatchKeyRange {
    /// Exactly one key.
    Single(Arc<[u8]>),
    /// `[start, end)`; `end == None` means every key `>= start`.
    Span {
        /// Inclusive lower bound.
        start: Arc<[u8]>,
        /// Exclusive upper bound, or none.
        end: Option<Arc<[u8]>>,
    },
}

impl WatchKeyRange {
    /// Resolves a create request's `key` / `range_end` with etcd's rules (module docs).
    ///
    /// Errors: [`EMPTY_RANGE_REASON`] when `range_end` is set (and not `"\0"`) but not
    /// greater than `key` (etcd `watchStream.Watch`).
    pub fn from_request(key: &[u8], range_end: &[u8]) -> Result<WatchKeyRange, &'static str> {
        let key: &[u8] = if key.is_empty() { &[0] } else { key };
        match range_end {
            [] => Ok(WatchKeyRange::Single(key.into())),
            [0] => Ok(WatchKeyRange::Span {
                start: key.into(),
                end: None,
            }),
            end if key < end => Ok(WatchKeyRange::Span {
                start: key.into(),
                end: Some(end.into()),
            }),
            _ => Err(EMPTY_RANGE_REASON),
        }
    }

    /// Whether `key` is watched.
    pub fn contains(&self, key: &[u8]) -> bool {
        match self {
            WatchKeyRange::Single(k) => **k == *key,
            WatchKeyRange::Span { start, end } => {
                key >= &**start && end.as_ref().is_none_or(|e| key < &**e)
            }
        }
    }

    /// The first watched key.
    pub fn start(&self) -> &[u8] {
        match self {
            WatchKeyRange::Single(k) => k,
            WatchKeyRange::Span { start, .. } => start,
        }
    }

    /// The range in etcd's `(key, range_end)` request form: `range_end` empty for one key,
    /// `"\0"` for "every key from `key`".
    pub fn as_request(&self) -> (&[u8], &[u8]) {
        match self {
            WatchKeyRange::Single(k) => (k, &[]),
            WatchKeyRange::Span { start, end: None } => (start, &[0]),
            WatchKeyRange::Span {
                start,
                end: Some(e),
            } => (start, e),
        }
    }

    /// Heap bytes owned by this range (key bytes plus the `Arc` counters), for memory
    /// accounting.
    pub fn heap_bytes(&self) -> usize {
        const ARC_HEADER: usize = 2 * std::mem::size_of::<usize>();
        match self {
            WatchKeyRange::Single(k) => ARC_HEADER + k.len(),
            WatchKeyRange::Span { start, end } => {
                ARC_HEADER + start.len() + end.as_ref().map_or(0, |e| ARC_HEADER + e.len())
            }
        }
    }
}

/// The event types a watcher filters out (etcd `FiltersFromRequest`), as a bit set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventFilter(u8);

impl EventFilter {
    const NO_PUT: u8 = 1;
    const NO_DELETE: u8 = 2;

    /// The filter of a create request's `filters` list; unknown values are ignored, as in
    /// etcd.
    pub fn from_request(filters: &[i32]) -> EventFilter {
        let mut bits = 0;
        for f in filters {
            match FilterType::try_from(*f) {
                Ok(FilterType::Noput) => bits |= Self::NO_PUT,
                Ok(FilterType::Nodelete) => bits |= Self::NO_DELETE,
                Err(_) => {}
            }
        }
        EventFilter(bits)
    }

    /// Whether `event` reaches the watcher.
    pub fn passes(self, event: &Event) -> bool {
        let bit = if event.r#type == EventType::Delete as i32 {
            Self::NO_DELETE
        } else {
            Self::NO_PUT
        };
        self.0 & bit == 0
    }

    /// Whether nothing is filtered out.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_proto::mvccpb::KeyValue;

    fn event(kind: EventType, key: &str) -> Event {
        Event {
            r#type: kind as i32,
            kv: Some(KeyValue {
                key: key.into(),
                ..Default::default()
            }),
            prev_kv: None,
        }
    }

    #[test]
    fn request_forms_follow_etcd() {
        let single = WatchKeyRange::from_request(b"k", b"").unwrap();
        assert!(single.contains(b"k"));
        assert!(!single.contains(b"k1"));
        assert_eq!(single.as_request(), (&b"k"[..], &b""[..]));

        let span = WatchKeyRange::from_request(b"a", b"c").unwrap();
        assert!(span.contains(b"a") && span.contains(b"bzz"));
        assert!(!span.contains(b"c") && !span.contains(b"0"));

        let from = WatchKeyRange::from_request(b"m", b"\0").unwrap();
        assert!(from.contains(b"m") && from.contains(b"\xff\xff"));
        assert!(!from.contains(b"l"));
        assert_eq!(from.as_request(), (&b"m"[..], &b"\0"[..]));

        // An empty key is "\0": with range_end "\0" it watches every key.
        let all = WatchKeyRange::from_request(b"", b"\0").unwrap();
        assert!(all.contains(b"\0") && all.contains(b"anything"));
        assert_eq!(all.start(), b"\0");
    }

    #[test]
    fn empty_ranges_are_rejected_with_etcds_reason() {
        assert_eq!(
            WatchKeyRange::from_request(b"b", b"a"),
            Err(EMPTY_RANGE_REASON)
        );
        assert_eq!(
            WatchKeyRange::from_request(b"b", b"b"),
            Err(EMPTY_RANGE_REASON)
        );
        assert_eq!(EMPTY_RANGE_REASON, "mvcc: watcher range is empty");
    }

    #[test]
    fn filters_drop_the_named_event_types() {
        let put = event(EventType::Put, "k");
        let del = event(EventType::Delete, "k");
        let none = EventFilter::from_request(&[]);
        assert!(none.is_empty() && none.passes(&put) && none.passes(&del));
        let noput = EventFilter::from_request(&[FilterType::Noput as i32]);
        assert!(!noput.passes(&put) && noput.passes(&del));
        let nodel = EventFilter::from_request(&[FilterType::Nodelete as i32, 99]);
        assert!(nodel.passes(&put) && !nodel.passes(&del));
    }
}
