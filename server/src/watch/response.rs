//! Turning queued items into `WatchResponse`s, including etcd's fragmentation.
//!
//! Fragmentation (etcd `v3rpc/watch.go` `sendFragments`): a watcher created with
//! `fragment = true` whose response has at least two events and encodes to at least the
//! server's request limit (`--max-request-bytes` + 512 KiB gRPC overhead) gets it split into
//! several responses. Each carries as many whole events as fit below the limit (at least
//! one), all but the last have `fragment = true`, and all share the header. The events of
//! one revision therefore still arrive in order and back to back; a client reassembles them
//! before handing them on.

use std::collections::VecDeque;

use keel_proto::etcdserverpb::WatchResponse;
use keel_proto::mvccpb::Event;
use prost::Message;

use super::outbox::{Item, bare_response};

/// Appends the response(s) of `item` to `out`; `max_bytes` is the fragmentation limit.
pub fn push_responses(item: Item, max_bytes: usize, out: &mut VecDeque<WatchResponse>) {
    match item {
        Item::Control(resp) => out.push_back(resp),
        Item::Events(e) => {
            let mut resp = bare_response(e.watch_id, e.revision);
            resp.events = e.events.to_events(e.prev_kv);
            if e.fragment {
                fragment(resp, max_bytes, out);
            } else {
                out.push_back(resp);
            }
        }
    }
}

/// Bytes one event adds to an encoded `WatchResponse` (field 11: one tag byte, the length
/// varint, the message).
fn event_field_len(ev: &Event) -> usize {
    let len = ev.encoded_len();
    1 + prost::encoding::encoded_len_varint(len as u64) + len
}

/// etcd's `sendFragments` (module docs).
pub fn fragment(resp: WatchResponse, max_bytes: usize, out: &mut VecDeque<WatchResponse>) {
    if resp.encoded_len() < max_bytes || resp.events.len() < 2 {
        out.push_back(resp);
        return;
    }
    let mut template = resp;
    let events = std::mem::take(&mut template.events);
    template.fragment = true;
    let base = template.encoded_len();
    let mut events = events.into_iter().peekable();
    while events.peek().is_some() {
        let mut cur = template.clone();
        let mut size = base;
        while let Some(ev) = events.peek() {
            let add = event_field_len(ev);
            if !cur.events.is_empty() && size + add >= max_bytes {
                break;
            }
            size += add;
            cur.events.push(events.next().expect("peeked"));
        }
        cur.fragment = events.peek().is_some();
        out.push_back(cur);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_proto::mvccpb::KeyValue;

    fn put(key: &str, value_len: usize, rev: i64) -> Event {
        Event {
            r#type: 0,
            kv: Some(KeyValue {
                key: key.into(),
                value: vec![b'v'; value_len],
                create_revision: rev,
                mod_revision: rev,
                version: 1,
                lease: 0,
            }),
            prev_kv: None,
        }
    }

    fn response(events: Vec<Event>) -> WatchResponse {
        let mut r = bare_response(3, 10);
        r.events = events;
        r
    }

    #[test]
    fn small_or_single_event_responses_are_not_split() {
        let mut out = VecDeque::new();
        fragment(
            response(vec![put("a", 10, 10), put("b", 10, 10)]),
            1 << 20,
            &mut out,
        );
        assert_eq!(out.len(), 1);
        assert!(!out[0].fragment);
        out.clear();
        fragment(response(vec![put("a", 5000, 10)]), 100, &mut out);
        assert_eq!(out.len(), 1, "one event is never split");
        assert!(!out[0].fragment);
    }

    #[test]
    fn large_responses_split_into_whole_events_below_the_limit() {
        let events: Vec<Event> = (0..10).map(|i| put(&format!("k{i}"), 300, 10)).collect();
        let one = event_field_len(&events[0]);
        let limit = 3 * one + 40;
        let mut out = VecDeque::new();
        fragment(response(events.clone()), limit, &mut out);
        let sizes: Vec<usize> = out.iter().map(|r| r.events.len()).collect();
        assert_eq!(sizes.iter().sum::<usize>(), 10);
        assert!(sizes.iter().all(|&n| n >= 1));
        let flags: Vec<bool> = out.iter().map(|r| r.fragment).collect();
        assert!(flags[..flags.len() - 1].iter().all(|&f| f) && !flags[flags.len() - 1]);
        for r in &out {
            assert!(
                r.encoded_len() < limit,
                "fragment of {} bytes >= {limit}",
                r.encoded_len()
            );
            assert_eq!(r.watch_id, 3);
            assert_eq!(r.header.as_ref().map(|h| h.revision), Some(10));
        }
        let rejoined: Vec<Event> = out.into_iter().flat_map(|r| r.events).collect();
        assert_eq!(rejoined, events, "order and content survive");
    }
}
