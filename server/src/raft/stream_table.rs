//! The long-lived peer streams of one kind, by peer URL, and the peers that serve none: the
//! table under both the AppendEntries streams (`append_stream`) and the leader-call streams
//! (`leader_calls`).
//!
//! Invariants:
//! - At most one stream per URL is in the table; a stream is removed only if it is still the
//!   one in the table ([`StreamTable::forget`]), so a stream that ended never removes its
//!   successor.
//! - A URL marked as serving no stream (a 0.1.0 member answered `Unimplemented`) reads as such
//!   for [`UNARY_RETRY`], then the stream is tried again (the member may have been upgraded).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a peer that answered `Unimplemented` gets unary RPCs before its stream is tried
/// again.
pub const UNARY_RETRY: Duration = Duration::from_secs(10);

/// Streams of type `S` by peer URL, and the URLs that serve none.
pub struct StreamTable<S> {
    streams: Mutex<HashMap<String, Arc<S>>>,
    /// Peer URLs that answered `Unimplemented`, and when.
    unary_since: Mutex<HashMap<String, Instant>>,
}

impl<S> Default for StreamTable<S> {
    fn default() -> Self {
        StreamTable {
            streams: Mutex::default(),
            unary_since: Mutex::default(),
        }
    }
}

impl<S> StreamTable<S> {
    /// The stream to `url` if `live` says the one in the table still is; else the one `open`
    /// makes, which takes its place. `open` runs under the table's lock (it must not block).
    ///
    /// Errors: `open`'s.
    pub fn get_or_open<E>(
        &self,
        url: &str,
        live: impl Fn(&S) -> bool,
        open: impl FnOnce() -> Result<Arc<S>, E>,
    ) -> Result<Arc<S>, E> {
        let mut streams = self.streams.lock().expect("stream table lock");
        if let Some(s) = streams.get(url)
            && live(s)
        {
            return Ok(s.clone());
        }
        let stream = open()?;
        streams.insert(url.to_string(), stream.clone());
        Ok(stream)
    }

    /// The stream to `url` in the table, if any.
    #[cfg(test)]
    pub fn peek(&self, url: &str) -> Option<Arc<S>> {
        self.streams
            .lock()
            .expect("stream table lock")
            .get(url)
            .cloned()
    }

    /// Removes the stream to `url`, if any, and returns it.
    pub fn remove(&self, url: &str) -> Option<Arc<S>> {
        self.streams.lock().expect("stream table lock").remove(url)
    }

    /// Removes `stream` if it is still the one for `url`.
    pub fn forget(&self, url: &str, stream: &Arc<S>) {
        let mut streams = self.streams.lock().expect("stream table lock");
        if streams.get(url).is_some_and(|s| Arc::ptr_eq(s, stream)) {
            streams.remove(url);
        }
    }

    /// Records that the peer at `url` serves no stream (it answered `Unimplemented`).
    pub fn mark_unary(&self, url: &str) {
        self.unary_since
            .lock()
            .expect("stream table lock")
            .insert(url.to_string(), Instant::now());
    }

    /// Whether the peer at `url` answered `Unimplemented` less than [`UNARY_RETRY`] ago.
    pub fn is_unary(&self, url: &str) -> bool {
        let mut unary = self.unary_since.lock().expect("stream table lock");
        match unary.get(url) {
            Some(since) if since.elapsed() < UNARY_RETRY => true,
            Some(_) => {
                unary.remove(url);
                false
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_that_ended_never_removes_its_successor() {
        let table = StreamTable::<u32>::default();
        let first = table
            .get_or_open::<()>("u", |_| true, || Ok(Arc::new(1)))
            .unwrap();
        let same = table
            .get_or_open::<()>("u", |_| true, || panic!("a live stream is reused"))
            .unwrap();
        assert!(Arc::ptr_eq(&first, &same));
        let second = table
            .get_or_open::<()>("u", |_| false, || Ok(Arc::new(2)))
            .unwrap();
        table.forget("u", &first);
        let kept = table
            .get_or_open::<()>("u", |_| true, || panic!("the successor was removed"))
            .unwrap();
        assert!(Arc::ptr_eq(&second, &kept));
        assert_eq!(table.remove("u").as_deref(), Some(&2));
        assert!(table.remove("u").is_none());
    }

    #[test]
    fn a_unary_peer_is_remembered_per_url() {
        let table = StreamTable::<u32>::default();
        assert!(!table.is_unary("a"));
        table.mark_unary("a");
        assert!(table.is_unary("a"));
        assert!(!table.is_unary("b"));
    }
}
