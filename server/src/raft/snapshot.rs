//! Snapshot files: a full, CRC-checked export of a member's sled state.
//!
//! Format (all integers little endian):
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `KEELSNAP` |
//! | 4 | format version (1) |
//! | 4 | meta length M |
//! | M | bincode `SnapshotMeta` (last log id, membership, snapshot id) |
//! | … | records: key length u32, key, value length u32, value |
//! | 4 | end marker `u32::MAX` |
//! | 4 | crc32 of every byte before it |
//!
//! A snapshot is written to a temporary name, fsync'ed, then renamed, so a crash never
//! leaves a half-written file under a snapshot name. Files are streamed record by record,
//! never held whole in memory.

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use openraft::SnapshotMeta;

use super::types::{MemberNode, NodeId};

const MAGIC: &[u8; 8] = b"KEELSNAP";
const VERSION: u32 = 1;
const END: u32 = u32::MAX;

/// Metadata of a snapshot file.
pub type Meta = SnapshotMeta<NodeId, MemberNode>;

/// Writes a snapshot of every key of `tree` to `path` (via `path.tmp`, fsync, rename).
///
/// The caller must keep `tree` unchanged while this runs, so the export is consistent with
/// `meta.last_log_id`. [`write_records`] exports a live tree instead.
pub fn write(path: &Path, meta: &Meta, tree: &sled::Tree) -> io::Result<()> {
    write_records(
        path,
        meta,
        tree.iter().map(|kv| kv.map_err(io::Error::other)),
    )
}

/// Writes a snapshot holding `records` (key/value pairs in any order) to `path`: to
/// `path.tmp` first, then fsync, rename and fsync of the directory, so a crash never leaves
/// a partial file under a snapshot name. Streams record by record.
///
/// Errors: the first error of `records`, or I/O.
pub fn write_records<K, V>(
    path: &Path,
    meta: &Meta,
    records: impl Iterator<Item = io::Result<(K, V)>>,
) -> io::Result<()>
where
    K: AsRef<[u8]>,
    V: AsRef<[u8]>,
{
    let tmp = path.with_extension("tmp");
    let file = File::create(&tmp)?;
    let mut w = CrcWriter {
        inner: BufWriter::with_capacity(1 << 20, file),
        crc: crc32fast::Hasher::new(),
    };
    let meta_bytes = bincode::serialize(meta).map_err(io::Error::other)?;
    w.write_all(MAGIC)?;
    w.write_all(&VERSION.to_le_bytes())?;
    w.write_all(&(meta_bytes.len() as u32).to_le_bytes())?;
    w.write_all(&meta_bytes)?;
    for kv in records {
        let (k, v) = kv?;
        let (k, v) = (k.as_ref(), v.as_ref());
        w.write_all(&(k.len() as u32).to_le_bytes())?;
        w.write_all(k)?;
        w.write_all(&(v.len() as u32).to_le_bytes())?;
        w.write_all(v)?;
    }
    w.write_all(&END.to_le_bytes())?;
    let crc = w.crc.clone().finalize();
    let mut inner = w.inner.into_inner().map_err(|e| e.into_error())?;
    inner.write_all(&crc.to_le_bytes())?;
    inner.sync_all()?;
    fs::rename(&tmp, path)?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// Reads only the metadata of a snapshot file.
pub fn read_meta(file: &mut File) -> io::Result<Meta> {
    file.seek(SeekFrom::Start(0))?;
    let mut r = BufReader::new(file);
    let mut crc = crc32fast::Hasher::new();
    let meta = read_header(&mut r, &mut crc)?;
    Ok(meta)
}

/// Verifies the whole file (magic, version, framing, CRC) and returns its metadata.
pub fn verify(file: &mut File) -> io::Result<Meta> {
    walk(file, |_, _| Ok(()))
}

/// Calls `each` for every record, in file order. Call [`verify`] first: a corrupt file is
/// only detected at its end here.
pub fn read_records(
    file: &mut File,
    each: impl FnMut(Vec<u8>, Vec<u8>) -> io::Result<()>,
) -> io::Result<Meta> {
    walk(file, each)
}

/// Replaces every key of `tree` with the records of the verified snapshot file at `path`
/// (sled batches of 10,000 records), flushes the tree and returns the file's metadata.
/// Blocking. Not atomic: a crash part way leaves the tree cleared and partly loaded, so the
/// caller holds a marker that makes the next start redo it (the install marker,
/// `state_machine.rs`; the damage mark, `backend/damage.rs`).
///
/// Errors: I/O, sled, or a file that does not verify.
pub fn load_into(tree: &sled::Tree, path: &Path) -> io::Result<Meta> {
    let mut file = File::open(path)?;
    tree.clear().map_err(io::Error::other)?;
    let mut batch = sled::Batch::default();
    let mut n = 0usize;
    let meta = read_records(&mut file, |k, v| {
        batch.insert(k, v);
        n += 1;
        if n.is_multiple_of(10_000) {
            tree.apply_batch(std::mem::take(&mut batch))
                .map_err(io::Error::other)?;
        }
        Ok(())
    })?;
    // Crash with the old store cleared and the snapshot partly loaded; the caller's marker
    // makes the next start redo the load.
    crate::failpoint::crash_point!("snapshot_install_mid");
    tree.apply_batch(batch).map_err(io::Error::other)?;
    tree.flush().map_err(io::Error::other)?;
    Ok(meta)
}

/// [`verify`], then [`read_records`]: `each` runs only for a file whose CRC matched.
#[cfg(test)]
fn load(file: &mut File, each: impl FnMut(Vec<u8>, Vec<u8>) -> io::Result<()>) -> io::Result<Meta> {
    verify(file)?;
    read_records(file, each)
}

fn walk(
    file: &mut File,
    mut each: impl FnMut(Vec<u8>, Vec<u8>) -> io::Result<()>,
) -> io::Result<Meta> {
    file.seek(SeekFrom::Start(0))?;
    let mut r = BufReader::with_capacity(1 << 20, &mut *file);
    let mut crc = crc32fast::Hasher::new();
    let meta = read_header(&mut r, &mut crc)?;
    loop {
        let klen = read_u32(&mut r, &mut crc)?;
        if klen == END {
            break;
        }
        let key = read_exact(&mut r, &mut crc, klen as usize)?;
        let vlen = read_u32(&mut r, &mut crc)?;
        let value = read_exact(&mut r, &mut crc, vlen as usize)?;
        each(key, value)?;
    }
    let expected = crc.finalize();
    let mut stored = [0u8; 4];
    r.read_exact(&mut stored)?;
    if u32::from_le_bytes(stored) != expected {
        return Err(invalid("snapshot checksum mismatch"));
    }
    // The checksum ends the file: bytes after it mean the file is not the one written
    // (found by fuzzing, server/tests/fuzz).
    if r.read(&mut [0u8; 1])? != 0 {
        return Err(invalid("snapshot has bytes after its checksum"));
    }
    Ok(meta)
}

fn read_header(r: &mut impl Read, crc: &mut crc32fast::Hasher) -> io::Result<Meta> {
    let magic = read_exact(r, crc, 8)?;
    if magic != MAGIC {
        return Err(invalid("not a Keel snapshot (bad magic)"));
    }
    let version = read_u32(r, crc)?;
    if version != VERSION {
        return Err(invalid(&format!(
            "unsupported snapshot format version {version}"
        )));
    }
    let len = read_u32(r, crc)? as usize;
    let meta = read_exact(r, crc, len)?;
    bincode::deserialize(&meta).map_err(|e| invalid(&format!("snapshot meta: {e}")))
}

fn read_u32(r: &mut impl Read, crc: &mut crc32fast::Hasher) -> io::Result<u32> {
    let b = read_exact(r, crc, 4)?;
    Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
}

fn read_exact(r: &mut impl Read, crc: &mut crc32fast::Hasher, n: usize) -> io::Result<Vec<u8>> {
    // Grow with the data actually read, so a corrupt length cannot allocate gigabytes.
    let mut buf = Vec::new();
    let got = r.take(n as u64).read_to_end(&mut buf)?;
    if got != n {
        return Err(invalid("snapshot is truncated"));
    }
    crc.update(&buf);
    Ok(buf)
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

/// fsyncs a directory so renames and creations in it are durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The snapshot file name for a meta: `<term>-<index>.snap` (16 hex digits each), so
/// lexical order is log order.
pub fn file_name(dir: &Path, meta: &Meta) -> PathBuf {
    let (term, index) = meta
        .last_log_id
        .map_or((0, 0), |l| (l.leader_id.term, l.index));
    dir.join(format!("{term:016x}-{index:016x}.snap"))
}

/// The newest complete snapshot file in `dir`, if any.
pub fn latest(dir: &Path) -> io::Result<Option<PathBuf>> {
    let mut names: Vec<PathBuf> = fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "snap"))
        .collect();
    names.sort();
    Ok(names.pop())
}

/// Name of the file a snapshot from the leader is received into (never a `.snap` or `.tmp`
/// name, so [`remove_others`] run by a concurrent snapshot build cannot delete it).
pub const RECEIVING: &str = "receiving.part";

/// Removes every snapshot file in `dir` except `keep`, and stale export temporaries
/// (`*.tmp`). The file being received ([`RECEIVING`]) is kept.
pub fn remove_others(dir: &Path, keep: &Path) -> io::Result<()> {
    for e in fs::read_dir(dir)? {
        let p = e?.path();
        let ext = p.extension().and_then(|x| x.to_str()).unwrap_or("");
        if p != keep && (ext == "snap" || ext == "tmp") {
            fs::remove_file(&p)?;
        }
    }
    Ok(())
}

struct CrcWriter<W: Write> {
    inner: W,
    crc: crc32fast::Hasher,
}

impl<W: Write> Write for CrcWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Meta {
        SnapshotMeta {
            last_log_id: Some(openraft::LogId::new(
                openraft::CommittedLeaderId::new(3, 1),
                40,
            )),
            last_membership: Default::default(),
            snapshot_id: "s1".into(),
        }
    }

    #[test]
    fn round_trip_and_corruption_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = db.open_tree("t").unwrap();
        for i in 0..100u32 {
            tree.insert(i.to_be_bytes(), vec![i as u8; 50]).unwrap();
        }
        let path = file_name(dir.path(), &meta());
        write(&path, &meta(), &tree).unwrap();
        assert_eq!(latest(dir.path()).unwrap(), Some(path.clone()));

        let mut f = File::open(&path).unwrap();
        assert_eq!(read_meta(&mut f).unwrap(), meta());
        let mut got = Vec::new();
        let m = load(&mut f, |k, v| {
            got.push((k, v));
            Ok(())
        })
        .unwrap();
        assert_eq!(m, meta());
        assert_eq!(got.len(), 100);
        assert_eq!(got[7], (7u32.to_be_bytes().to_vec(), vec![7u8; 50]));

        // Flip one byte in the middle: load must fail and apply nothing.
        let mut bytes = fs::read(&path).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        fs::write(&path, &bytes).unwrap();
        let mut f = File::open(&path).unwrap();
        let mut applied = 0;
        let err = load(&mut f, |_, _| {
            applied += 1;
            Ok(())
        })
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert_eq!(applied, 0);
    }

    #[test]
    fn bytes_after_the_checksum_fail_verification() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.snap");
        let records = [(b"k".to_vec(), b"v".to_vec())];
        write_records(&path, &meta(), records.iter().map(|(k, v)| Ok((k, v)))).unwrap();
        assert_eq!(verify(&mut File::open(&path).unwrap()).unwrap(), meta());
        let mut bytes = fs::read(&path).unwrap();
        bytes.push(0);
        fs::write(&path, &bytes).unwrap();
        let err = verify(&mut File::open(&path).unwrap()).unwrap_err();
        assert_eq!(err.to_string(), "snapshot has bytes after its checksum");
    }
}
