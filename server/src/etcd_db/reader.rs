//! Opens an etcd database (a data dir's `member/snap/db`, a Keel export, or a snapshot file
//! with its trailing sha256) and decodes its buckets.
//!
//! Missing buckets read as empty (etcd creates every bucket at start, but a file need not
//! have been written by etcd). The `key` and `lease` buckets are streamed; the others are
//! small and returned whole.

use std::fs::File;
use std::path::Path;

use keel_proto::authpb::{Role, User};
use keel_proto::etcdserverpb::AlarmMember;
use keel_proto::leasepb::Lease;
use prost::Message;

use super::bolt::{BoltFile, Bucket, Entries};
use super::model::{AuthMeta, Cluster, Member, Members, Meta, MvccRecord, Status};
use super::schema;
use super::snapshot::check_hash;
use super::{EtcdDbError, Result};
use crate::mvcc::Crc32c;

/// What to do with a snapshot file's trailing sha256 (etcd's `--skip-hash-check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashCheck {
    /// The file must end with the sha256 of the bytes before it (a snapshot saved from the
    /// `Maintenance.Snapshot` stream).
    Verify,
    /// Strip a hash if the file length says there is one, without comparing it; accept a
    /// raw database (copied from a data dir).
    Skip,
}

/// An open etcd database (read-only).
pub struct EtcdDb {
    bolt: BoltFile,
}

fn corrupt(bucket: &'static str, key: &[u8], why: impl Into<String>) -> EtcdDbError {
    EtcdDbError::Corrupt {
        bucket,
        key: key.to_vec(),
        why: why.into(),
    }
}

impl EtcdDb {
    /// Opens the database or snapshot file at `path`, checking its hash as `check` says.
    ///
    /// Errors: [`EtcdDbError::MissingHash`] / [`EtcdDbError::HashMismatch`] (etcd's texts),
    /// or [`EtcdDbError::Invalid`] if the bytes are not a bbolt database.
    pub fn open(path: impl AsRef<Path>, check: HashCheck) -> Result<EtcdDb> {
        let f = File::open(path.as_ref())?;
        let len = f.metadata()?.len();
        let db_len = check_hash(&f, len, check == HashCheck::Verify)?;
        Ok(EtcdDb {
            bolt: BoltFile::open(f, db_len)?,
        })
    }

    /// The underlying page walker (for tools that list buckets).
    pub fn bolt(&self) -> &BoltFile {
        &self.bolt
    }

    fn bucket(&self, name: &'static str) -> Result<Option<Bucket>> {
        self.bolt.bucket(name.as_bytes())
    }

    fn get(&self, bucket: &'static str, key: &[u8]) -> Result<Option<Vec<u8>>> {
        match self.bucket(bucket)? {
            Some(b) => self.bolt.get(&b, key),
            None => Ok(None),
        }
    }

    /// Every entry of `bucket` (none if the bucket is absent).
    fn entries(&self, bucket: &'static str) -> Result<Option<Entries<'_>>> {
        Ok(self.bucket(bucket)?.map(|b| self.bolt.entries(&b)))
    }

    /// The `meta` bucket.
    pub fn meta(&self) -> Result<Meta> {
        const M: &str = schema::META;
        let u64_of = |key: &[u8]| -> Result<u64> {
            match self.get(M, key)? {
                Some(v) => schema::parse_u64(&v).ok_or_else(|| corrupt(M, key, "not 8 bytes")),
                None => Ok(0),
            }
        };
        let rev_of = |key: &[u8]| -> Result<Option<i64>> {
            self.get(M, key)?
                .map(|v| {
                    schema::parse_compact_rev(&v).ok_or_else(|| corrupt(M, key, "not a revision"))
                })
                .transpose()
        };
        let conf_state = self
            .get(M, schema::CONF_STATE)?
            .map(|v| {
                serde_json::from_slice(&v)
                    .map_err(|e| corrupt(M, schema::CONF_STATE, e.to_string()))
            })
            .transpose()?;
        let storage_version = self
            .get(M, schema::STORAGE_VERSION)?
            .map(|v| String::from_utf8_lossy(&v).into_owned());
        Ok(Meta {
            consistent_index: u64_of(schema::CONSISTENT_INDEX)?,
            term: u64_of(schema::TERM)?,
            conf_state,
            scheduled_compact_rev: rev_of(schema::SCHEDULED_COMPACT)?,
            finished_compact_rev: rev_of(schema::FINISHED_COMPACT)?,
            storage_version,
        })
    }

    /// The records of the `key` bucket in revision order, read page by page. Keys are
    /// checked to be revision keys; values are returned undecoded ([`MvccRecord::decode`]).
    pub fn records(&self) -> Result<impl Iterator<Item = Result<MvccRecord>> + '_> {
        Ok(self.entries(schema::KEY)?.into_iter().flatten().map(|e| {
            let e = e?;
            if e.is_bucket {
                return Err(corrupt(schema::KEY, &e.key, "nested bucket"));
            }
            MvccRecord::from_etcd(&e.key, e.value)
        }))
    }

    /// The `lease` bucket, in ID order (as unsigned big-endian bytes).
    pub fn leases(&self) -> Result<impl Iterator<Item = Result<Lease>> + '_> {
        Ok(self.entries(schema::LEASE)?.into_iter().flatten().map(|e| {
            let e = e?;
            let l = Lease::decode(e.value.as_slice())
                .map_err(|err| corrupt(schema::LEASE, &e.key, err.to_string()))?;
            if e.key != schema::lease_key(l.id) {
                return Err(corrupt(
                    schema::LEASE,
                    &e.key,
                    "key differs from the lease ID",
                ));
            }
            Ok(l)
        }))
    }

    /// The `members` and `members_removed` buckets.
    pub fn members(&self) -> Result<Members> {
        let mut out = Members::default();
        for e in self.entries(schema::MEMBERS)?.into_iter().flatten() {
            let e = e?;
            let id = schema::parse_member_key(&e.key)
                .ok_or_else(|| corrupt(schema::MEMBERS, &e.key, "not a hex member ID"))?;
            let mut m: Member = serde_json::from_slice(&e.value)
                .map_err(|err| corrupt(schema::MEMBERS, &e.key, err.to_string()))?;
            // etcd starts from the key's ID and lets the JSON's `id` override it
            // (`readMembersFromBackend`).
            if m.id == 0 {
                m.id = id;
            }
            out.members.push(m);
        }
        for e in self.entries(schema::MEMBERS_REMOVED)?.into_iter().flatten() {
            let e = e?;
            let id = schema::parse_member_key(&e.key)
                .ok_or_else(|| corrupt(schema::MEMBERS_REMOVED, &e.key, "not a hex member ID"))?;
            out.removed.push(id);
        }
        Ok(out)
    }

    /// The `cluster` bucket.
    pub fn cluster(&self) -> Result<Cluster> {
        let cluster_version = self
            .get(schema::CLUSTER, schema::CLUSTER_VERSION)?
            .map(|v| String::from_utf8_lossy(&v).into_owned());
        let downgrade = self
            .get(schema::CLUSTER, schema::DOWNGRADE)?
            .map(|v| {
                serde_json::from_slice(&v)
                    .map_err(|e| corrupt(schema::CLUSTER, schema::DOWNGRADE, e.to_string()))
            })
            .transpose()?;
        Ok(Cluster {
            cluster_version,
            downgrade,
        })
    }

    /// The `alarm` bucket.
    pub fn alarms(&self) -> Result<Vec<AlarmMember>> {
        let mut out = Vec::new();
        for e in self.entries(schema::ALARM)?.into_iter().flatten() {
            let e = e?;
            let a = AlarmMember::decode(e.key.as_slice())
                .map_err(|err| corrupt(schema::ALARM, &e.key, err.to_string()))?;
            out.push(a);
        }
        Ok(out)
    }

    /// The `auth` bucket (absent flags read as disabled, revision 0, as etcd reads them).
    pub fn auth_meta(&self) -> Result<AuthMeta> {
        let enabled = self.get(schema::AUTH, schema::AUTH_ENABLED)?;
        let revision = match self.get(schema::AUTH, schema::AUTH_REVISION)? {
            Some(v) => schema::parse_u64(&v)
                .ok_or_else(|| corrupt(schema::AUTH, schema::AUTH_REVISION, "not 8 bytes"))?,
            None => 0,
        };
        Ok(AuthMeta {
            // etcd: enabled only if the value is exactly `[1]`.
            enabled: enabled.as_deref() == Some(&schema::auth_enabled_value(true)[..]),
            revision,
        })
    }

    /// The `authUsers` bucket, in name order.
    pub fn users(&self) -> Result<Vec<User>> {
        self.decode_all(schema::AUTH_USERS, |u: &User| u.name.as_slice())
    }

    /// The `authRoles` bucket, in name order.
    pub fn roles(&self) -> Result<Vec<Role>> {
        self.decode_all(schema::AUTH_ROLES, |r: &Role| r.name.as_slice())
    }

    fn decode_all<T: Message + Default>(
        &self,
        bucket: &'static str,
        name: fn(&T) -> &[u8],
    ) -> Result<Vec<T>> {
        let mut out = Vec::new();
        for e in self.entries(bucket)?.into_iter().flatten() {
            let e = e?;
            let v = T::decode(e.value.as_slice())
                .map_err(|err| corrupt(bucket, &e.key, err.to_string()))?;
            if name(&v) != e.key.as_slice() {
                return Err(corrupt(bucket, &e.key, "key differs from the name"));
            }
            out.push(v);
        }
        Ok(out)
    }

    /// What `etcdctl snapshot status` prints for this file: the CRC-32C of every bucket name
    /// followed by its keys and values (buckets in name order), the main revision of the
    /// last `key` entry, the number of entries and the database size.
    pub fn status(&self) -> Result<Status> {
        let mut crc = Crc32c::new();
        let (mut revision, mut total_key) = (0i64, 0u64);
        for b in self.bolt.entries(&self.bolt.root()) {
            let b = b?;
            let bucket = b.as_bucket()?;
            crc.update(&b.key);
            let is_key = b.key == schema::KEY.as_bytes();
            for e in self.bolt.entries(&bucket) {
                let e = e?;
                crc.update(&e.key);
                // Go's ForEach hands a nested bucket's value as nil.
                if !e.is_bucket {
                    crc.update(&e.value);
                }
                if is_key {
                    // etcd `bytesToRev(k).main`: the first 8 bytes.
                    let main: [u8; 8] = e
                        .key
                        .get(..8)
                        .and_then(|s| s.try_into().ok())
                        .ok_or_else(|| corrupt(schema::KEY, &e.key, "key shorter than 8 bytes"))?;
                    revision = u64::from_be_bytes(main) as i64;
                }
                total_key += 1;
            }
        }
        Ok(Status {
            hash: crc.finish(),
            revision,
            total_key,
            total_size: self.bolt.size(),
        })
    }
}
