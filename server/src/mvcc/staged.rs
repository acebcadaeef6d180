//! The apply group: the committed write txns of the entries the apply loop staged since its
//! last flush, gathered into ONE [`Batch`] (see `backend/batch.rs` for why a group, not a
//! request, is the unit of a sled write).

use std::collections::HashMap;
use std::sync::Arc;

use keel_proto::mvccpb::Event;

use super::compactor::Job;
use super::store::View;
use crate::backend::Batch;

/// Committed write txns that are not published yet. Only the apply loop touches it (one writer),
/// so its mutex is never contended.
#[derive(Debug, Default)]
pub(super) struct Staged {
    /// The view after the last staged txn; readers still see the published one.
    pub view: Option<Arc<View>>,
    /// Every staged txn's sled writes, in commit order.
    pub batch: Batch,
    /// The changes of each staged revision, by main revision (`events[sub]` has sub revision
    /// `sub`): later txns of the group read values from here, as the records are not
    /// published.
    pub records: HashMap<i64, Vec<Event>>,
    /// Highest compact revision among the staged txns (raised before the batch is applied).
    pub compact_floor: Option<i64>,
    /// Background removals to hand to the compactor once the batch is applied.
    pub jobs: Vec<Job>,
    /// Set when a txn changed the working index and was dropped unstaged: the group can
    /// never be flushed (see `MvccError::Abandoned`).
    pub abandoned: Option<String>,
}

impl Staged {
    /// The staged changes in revision order (what watchers hear of once the group is
    /// published).
    pub fn into_events(self) -> Vec<(i64, Vec<Event>)> {
        let mut events: Vec<_> = self.records.into_iter().collect();
        events.sort_unstable_by_key(|(revision, _)| *revision);
        events
    }

    /// The staged change with revision `main`/`sub`, if that revision is staged.
    pub fn event(&self, main: i64, sub: u32) -> Option<&Event> {
        self.records.get(&main)?.get(sub as usize)
    }

    /// True when a flush has nothing to do.
    pub fn is_empty(&self) -> bool {
        self.view.is_none()
            && self.batch.is_empty()
            && self.jobs.is_empty()
            && self.abandoned.is_none()
    }
}

#[cfg(test)]
mod tests {
    use keel_proto::etcdserverpb::{PutRequest, RangeRequest};

    use crate::mvcc::{MvccError, MvccStore};

    fn store() -> (sled::Db, MvccStore) {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let store = MvccStore::open(db.open_tree("t").unwrap()).unwrap();
        (db, store)
    }

    /// A fresh store whose open apply group holds one staged put, `a = 1` at revision 2.
    fn store_with_a_staged() -> (sled::Db, MvccStore) {
        let (db, store) = store();
        {
            let mut w = store.write();
            w.put(&put("a", "1")).unwrap();
            assert_eq!(w.stage(), 2);
        }
        (db, store)
    }

    fn put(key: &str, value: &str) -> PutRequest {
        PutRequest {
            key: key.into(),
            value: value.into(),
            prev_kv: true,
            ..Default::default()
        }
    }

    fn get(store: &MvccStore, key: &str) -> Option<(Vec<u8>, i64, i64)> {
        let resp = store
            .range(&RangeRequest {
                key: key.into(),
                ..Default::default()
            })
            .unwrap();
        resp.kvs
            .first()
            .map(|kv| (kv.value.clone(), kv.mod_revision, kv.version))
    }

    #[test]
    fn a_group_is_invisible_until_flushed_then_lands_whole() {
        let (db, store) = store_with_a_staged();
        let mut w = store.write();
        // The second txn reads the first one's staged value (prev_kv) and bumps its version.
        let resp = w.put(&put("a", "2")).unwrap();
        assert_eq!(resp.prev_kv.unwrap().value, b"1");
        w.batch_mut().insert(b"c/extra".as_slice(), b"x".as_slice());
        assert_eq!(w.stage(), 3);
        assert_eq!(
            store.current_revision(),
            1,
            "readers see the published view"
        );
        assert_eq!(store.staged_revision(), 3);
        assert_eq!(get(&store, "a"), None);
        assert!(
            db.open_tree("t")
                .unwrap()
                .get(b"c/extra")
                .unwrap()
                .is_none()
        );
        store.flush().unwrap();
        assert_eq!(store.current_revision(), 3);
        assert_eq!(get(&store, "a"), Some((b"2".to_vec(), 3, 2)));
        assert!(
            db.open_tree("t")
                .unwrap()
                .get(b"c/extra")
                .unwrap()
                .is_some()
        );
        // Both records reached sled: a reopened store rebuilds the same index.
        drop(store);
        let reopened = MvccStore::open(db.open_tree("t").unwrap()).unwrap();
        assert_eq!(reopened.current_revision(), 3);
        assert_eq!(get(&reopened, "a"), Some((b"2".to_vec(), 3, 2)));
    }

    #[test]
    fn an_unchanged_txn_dropped_unstaged_gives_the_group_back() {
        let (_db, store) = store_with_a_staged();
        let w = store.write();
        drop(w);
        assert_eq!(store.staged_revision(), 2);
        store.flush().unwrap();
        assert_eq!(get(&store, "a"), Some((b"1".to_vec(), 2, 1)));
    }

    #[test]
    fn a_changed_txn_dropped_unstaged_abandons_the_group() {
        let (_db, store) = store_with_a_staged();
        let mut w = store.write();
        w.put(&put("b", "1")).unwrap();
        drop(w);
        match store.flush() {
            Err(MvccError::Abandoned(why)) => assert!(why.contains("revision 3"), "{why}"),
            other => panic!("expected an abandoned group, got {other:?}"),
        }
        assert_eq!(store.current_revision(), 1, "nothing was published");
        assert_eq!(get(&store, "a"), None);
    }
}
