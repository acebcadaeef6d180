//! Keel snapshot files (`raft::snapshot`, CRC-32 over the whole file): a damaged file never
//! verifies, nothing panics or over-allocates, and an intact one reads back exactly.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;

use keel_server::raft::snapshot::{self, Meta};
use keel_server::raft::types::MemberNode;
use openraft::{CommittedLeaderId, LogId, Membership, StoredMembership};

use crate::{alloc, budget, mutate};

type Records = Vec<(Vec<u8>, Vec<u8>)>;

fn seed_meta() -> Meta {
    let log_id = LogId::new(CommittedLeaderId::new(3, 1), 120);
    let node = |name: &str, port: u16| MemberNode {
        name: name.to_string(),
        peer_urls: vec![format!("http://127.0.0.1:{port}")],
    };
    let membership = Membership::new(
        vec![BTreeSet::from([1, 2])],
        BTreeMap::from([(1, node("m1", 2380)), (2, node("m2", 2381))]),
    );
    Meta {
        last_log_id: Some(log_id),
        last_membership: StoredMembership::new(Some(log_id), membership),
        snapshot_id: "3-120-7".to_string(),
    }
}

fn seed_records() -> Records {
    (0..40u32)
        .map(|i| {
            let key = format!("k/{i:04}").into_bytes();
            let value = vec![i as u8; (i as usize * 13) % 90];
            (key, value)
        })
        .collect()
}

#[test]
fn damaged_snapshot_files_never_verify() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seed_path = dir.path().join("seed.snap");
    let meta = seed_meta();
    let records = seed_records();
    snapshot::write_records(
        &seed_path,
        &meta,
        records
            .iter()
            .map(|(k, v)| Ok((k.as_slice(), v.as_slice()))),
    )
    .expect("write seed snapshot");
    let seed = std::fs::read(&seed_path).expect("read seed");
    let path = dir.path().join("case.snap");
    budget::fuzz("snapshot file", mutate::mutated(seed.clone()), |bytes| {
        std::fs::write(&path, &bytes).expect("write case");
        let mut file = File::open(&path).expect("open case");
        let _ = alloc::bounded("read_meta", || snapshot::read_meta(&mut file))?;
        let verified = alloc::bounded("verify", || snapshot::verify(&mut file))?;
        if bytes != seed {
            proptest::prop_assert!(verified.is_err(), "a damaged snapshot verified");
            return Ok(());
        }
        let mut read: Records = Vec::new();
        let read_meta = snapshot::read_records(&mut file, |k, v| {
            read.push((k, v));
            Ok(())
        })
        .expect("an intact snapshot reads");
        proptest::prop_assert_eq!(read_meta, meta.clone());
        proptest::prop_assert_eq!(&read, &records);
        Ok(())
    });
}
