//! etcd database and snapshot files (`etcd_db`, read by `keelutl snapshot restore` and
//! `snapshot status`): every reader on a damaged etcd 3.4.23 snapshot returns a result or
//! an error, never a panic or a huge allocation; a damaged file never passes the sha256
//! check.

use keel_server::etcd_db::{EtcdDb, HashCheck};
use proptest::prop_assert;

use crate::{alloc, budget, mutate};

/// `etcdctl snapshot save` of etcd 3.4.23 (the `etcd_db` unit tests' fixture).
const SEED: &[u8] = include_bytes!("../../src/etcd_db/testdata/etcd-3.4.23.snapshot.db");

/// Calls every reader; counts what it could read.
fn read_all(db: &EtcdDb) -> usize {
    let mut n = 0;
    n += usize::from(db.meta().is_ok());
    if let Ok(records) = db.records() {
        n += records.take(100_000).filter(Result::is_ok).count();
    }
    if let Ok(leases) = db.leases() {
        n += leases.take(100_000).filter(Result::is_ok).count();
    }
    n += usize::from(db.members().is_ok());
    n += usize::from(db.cluster().is_ok());
    n += db.alarms().map_or(0, |a| a.len());
    n += usize::from(db.auth_meta().is_ok());
    n += db.users().map_or(0, |u| u.len());
    n += db.roles().map_or(0, |r| r.len());
    n += usize::from(db.status().is_ok());
    n
}

#[test]
fn damaged_etcd_snapshots_are_read_without_panics() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("case.db");
    {
        std::fs::write(&path, SEED).expect("write seed");
        let db = EtcdDb::open(&path, HashCheck::Verify).expect("the seed opens");
        assert!(read_all(&db) > 10, "the seed has records to read");
    }
    budget::fuzz("etcd snapshot", mutate::mutated(SEED.to_vec()), |bytes| {
        std::fs::write(&path, &bytes).expect("write case");
        let verified = alloc::bounded("open (verify)", || EtcdDb::open(&path, HashCheck::Verify))?;
        if bytes != SEED {
            prop_assert!(
                verified.is_err(),
                "a damaged snapshot passed the sha256 check"
            );
        }
        alloc::bounded("read (skip hash)", || {
            if let Ok(db) = EtcdDb::open(&path, HashCheck::Skip) {
                read_all(&db);
            }
        })?;
        Ok(())
    });
}
