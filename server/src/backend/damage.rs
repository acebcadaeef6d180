//! The damage mark: `<data-dir>/member/db.damage`, which records that a commit of apply
//! groups to sled failed part way, so the member tree may hold some of that commit's writes
//! and miss others.
//!
//! Why: sled 0.34's `apply_batch` is atomic across a crash (its log recovers a sealed batch
//! whole or not at all), but not across an error inside it: when an insert fails (a full
//! disk while sled writes a blob), sled cancels the batch's manifest and the writes that made
//! it to the log recover one by one. The consistent index sorts before the MVCC records, so
//! a restart then found a newer consistent index with records of its groups missing, and
//! re-applied nothing: acknowledged puts were lost (failpoints `disk::a_full_filesystem...`,
//! with 4 MiB background commits). A member that finds the mark rebuilds its member tree
//! from its latest snapshot file or from an empty tree, and re-applies the raft log above it
//! (`raft/rebuild.rs`).
//!
//! Format: exactly [`LEN`] bytes, written once with zeros and then only overwritten in
//! place, so marking needs no new block and works on a full disk:
//!
//! | bytes | field |
//! |---|---|
//! | 1 | `D` damaged, `0` clean |
//! | 1 | `W` the member tree was empty when the file was created (its state is the raft log applied from its first entry), `0` otherwise |
//! | 510 | why it is damaged, UTF-8, NUL padded (truncated) |
//!
//! Invariants: the mark is set (and fdatasync'ed) after a failed commit and before the
//! member stops; it is cleared only after the rebuilt tree is flushed.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The file's name in `<data-dir>/member/`.
pub const FILE_NAME: &str = "db.damage";
/// The file's size in bytes.
pub const LEN: usize = 512;

const DAMAGED: u8 = b'D';
const FROM_EMPTY: u8 = b'W';

/// What the mark said when it was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkState {
    /// Why a commit failed, if the tree is damaged.
    pub damaged: Option<String>,
    /// The member tree was empty when the mark was created: its whole state is the raft log
    /// applied from its first entry.
    pub from_empty: bool,
}

/// The open damage mark of a member.
#[derive(Debug)]
pub struct DamageMark {
    file: Mutex<File>,
    path: PathBuf,
    from_empty: bool,
}

impl DamageMark {
    /// Opens `<member_dir>/db.damage`, creating it (zeroed, fsynced with its directory) if
    /// it does not exist; `tree_empty` says whether the member tree is empty now, which a
    /// new file records ([`MarkState::from_empty`]).
    ///
    /// Errors: I/O, or a file of the wrong size (not written by Keel).
    pub fn open(member_dir: &Path, tree_empty: bool) -> io::Result<(DamageMark, MarkState)> {
        let path = member_dir.join(FILE_NAME);
        if !path.exists() {
            let mut bytes = [0u8; LEN];
            bytes[1] = if tree_empty { FROM_EMPTY } else { 0 };
            let tmp = path.with_extension("tmp");
            let f = File::create(&tmp)?;
            f.write_all_at(&bytes, 0)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            File::open(member_dir)?.sync_all()?;
        }
        let mut file = OpenOptions::new().read(true).write(true).open(&path)?;
        let mut bytes = Vec::with_capacity(LEN);
        file.read_to_end(&mut bytes)?;
        if bytes.len() != LEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {} bytes, want {LEN}", path.display(), bytes.len()),
            ));
        }
        let state = MarkState {
            damaged: (bytes[0] == DAMAGED).then(|| {
                let why = &bytes[2..];
                let end = why.iter().position(|&b| b == 0).unwrap_or(why.len());
                String::from_utf8_lossy(&why[..end]).into_owned()
            }),
            from_empty: bytes[1] == FROM_EMPTY,
        };
        let mark = DamageMark {
            file: Mutex::new(file),
            path,
            from_empty: state.from_empty,
        };
        Ok((mark, state))
    }

    /// Records that a commit failed because of `why`, in place, and fdatasyncs it.
    ///
    /// Errors: I/O (the caller must stop the member either way).
    pub fn mark(&self, why: &str) -> io::Result<()> {
        let mut bytes = self.bytes(DAMAGED);
        let why = why.as_bytes();
        let n = why.len().min(LEN - 2);
        bytes[2..2 + n].copy_from_slice(&why[..n]);
        self.write(&bytes)
    }

    /// Records that the member tree is whole again (after a rebuild was flushed).
    ///
    /// Errors: I/O.
    pub fn clear(&self) -> io::Result<()> {
        self.write(&self.bytes(0))
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn bytes(&self, damaged: u8) -> [u8; LEN] {
        let mut bytes = [0u8; LEN];
        bytes[0] = damaged;
        bytes[1] = if self.from_empty { FROM_EMPTY } else { 0 };
        bytes
    }

    fn write(&self, bytes: &[u8; LEN]) -> io::Result<()> {
        let file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        file.write_all_at(bytes, 0)?;
        file.sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_survives_reopening_until_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let (mark, state) = DamageMark::open(dir.path(), true).unwrap();
        assert_eq!(
            state,
            MarkState {
                damaged: None,
                from_empty: true
            }
        );
        mark.mark("IO error: No space left on device").unwrap();
        drop(mark);
        // The tree is not empty now: a file that exists keeps what it recorded at creation.
        let (mark, state) = DamageMark::open(dir.path(), false).unwrap();
        assert_eq!(
            state.damaged.as_deref(),
            Some("IO error: No space left on device")
        );
        assert!(state.from_empty);
        mark.clear().unwrap();
        let (_, state) = DamageMark::open(dir.path(), false).unwrap();
        assert_eq!(state.damaged, None);
        assert!(state.from_empty);
        assert_eq!(
            std::fs::metadata(dir.path().join(FILE_NAME)).unwrap().len(),
            LEN as u64
        );
    }

    #[test]
    fn a_new_mark_beside_a_tree_with_state_is_not_from_empty_and_long_reasons_are_cut() {
        let dir = tempfile::tempdir().unwrap();
        let (mark, state) = DamageMark::open(dir.path(), false).unwrap();
        assert!(!state.from_empty);
        mark.mark(&"x".repeat(2000)).unwrap();
        let (_, state) = DamageMark::open(dir.path(), true).unwrap();
        assert_eq!(state.damaged.map(|w| w.len()), Some(LEN - 2));
        assert!(!state.from_empty);
    }

    #[test]
    fn a_file_of_another_size_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE_NAME), b"junk").unwrap();
        let err = DamageMark::open(dir.path(), true).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
