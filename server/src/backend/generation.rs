//! Generations of the sled database on disk: `member/db` is a symlink to the current
//! generation's directory, `member/db.gen-N`, so an online defragment can build a fresh
//! database beside the live one and switch to it with one atomic rename
//! (`docs/backend.md`, "Online defragment").
//!
//! Why a symlink and not a renamed directory: sled keeps the path it was opened with and
//! creates files there later (its snapshots, blobs). The live database is therefore always
//! opened through its generation's real path ([`prepare`] returns it), and only the link
//! moves; the old database never sees its path change under it.
//!
//! Crash safety, step by step:
//! - a new generation is built in a directory no link points to; a crash leaves an orphan
//!   that the next [`prepare`] removes;
//! - [`point`] makes `db.tmp` → the new generation, renames it over `db` (atomic) and
//!   fsyncs `member/`: after a crash `db` names either the old or the new generation,
//!   each complete and flushed;
//! - a data dir of an earlier release (`member/db` a real directory) is moved to
//!   `db.gen-0` and linked on the first start ([`prepare`]); a crash between the rename
//!   and the link is repaired by the next start (no `db`, exactly the moved generation).

use std::io;
use std::path::{Path, PathBuf};

/// Prefix of a generation's directory name, next to the `db` link.
const GEN_PREFIX: &str = "gen-";

/// The directory of generation `n` beside the link `db` (`member/db.gen-<n>`).
pub fn dir(link: &Path, n: u64) -> PathBuf {
    link.with_extension(format!("{GEN_PREFIX}{n}"))
}

/// The generation number of `path` if it is a generation directory of `link`.
fn number(link: &Path, path: &Path) -> Option<u64> {
    let stem = link.file_name()?.to_str()?;
    let name = path.file_name()?.to_str()?;
    name.strip_prefix(stem)?
        .strip_prefix('.')?
        .strip_prefix(GEN_PREFIX)?
        .parse()
        .ok()
}

/// Every generation directory beside `link`, as `(number, path)`, ascending.
fn all(link: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let parent = link.parent().unwrap_or(Path::new("."));
    let mut found = Vec::new();
    for entry in std::fs::read_dir(parent)? {
        let path = entry?.path();
        if let Some(n) = number(link, &path) {
            found.push((n, path));
        }
    }
    found.sort();
    Ok(found)
}

/// The generation `link` points to: `(number, real directory)`.
///
/// Errors: `link` is not a symlink to a generation directory beside it.
pub fn current(link: &Path) -> io::Result<(u64, PathBuf)> {
    let target = std::fs::read_link(link)?;
    let real = link.parent().unwrap_or(Path::new(".")).join(&target);
    let n = number(link, &real).ok_or_else(|| {
        io::Error::other(format!(
            "{} points to {}, not a generation of it",
            link.display(),
            target.display()
        ))
    })?;
    Ok((n, real))
}

/// Makes `link` a symlink to a generation (moving a real directory of an earlier layout to
/// generation 0, creating an empty generation 0 for a new member), removes every other
/// generation directory (orphans of an interrupted defragment, or the previous generation
/// of a finished one), and returns the current generation's real directory: the path to
/// open sled on.
///
/// Errors: file system I/O.
pub fn prepare(link: &Path) -> io::Result<PathBuf> {
    match std::fs::symlink_metadata(link) {
        Ok(m) if m.file_type().is_symlink() => {}
        Ok(m) if m.is_dir() => {
            let first = dir(link, 0);
            if first.exists() {
                std::fs::remove_dir_all(&first)?;
            }
            std::fs::rename(link, &first)?;
            point(link, &first)?;
        }
        Ok(_) => {
            return Err(io::Error::other(format!(
                "{} is not a directory",
                link.display()
            )));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            // A crash between moving an old layout and linking it leaves exactly that
            // generation; a new member has none.
            let target = match all(link)?.pop() {
                Some((_, p)) => p,
                None => {
                    let first = dir(link, 0);
                    std::fs::create_dir_all(&first)?;
                    first
                }
            };
            point(link, &target)?;
        }
        Err(e) => return Err(e),
    }
    let (n, real) = current(link)?;
    for (other, path) in all(link)? {
        if other != n {
            tracing::info!(dir = %path.display(), "backend: removing an old database generation");
            std::fs::remove_dir_all(&path)?;
        }
    }
    Ok(real)
}

/// The directory the next generation is built in (one above every existing one).
///
/// Errors: file system I/O.
pub fn next(link: &Path) -> io::Result<PathBuf> {
    let top = all(link)?.last().map_or(0, |(n, _)| *n);
    Ok(dir(link, top + 1))
}

/// Points `link` at the generation directory `target` atomically and durably (a relative
/// link through `<link>.tmp`, a rename over `link`, an fsync of the parent directory).
///
/// Errors: file system I/O; then `link` still names what it named before.
pub fn point(link: &Path, target: &Path) -> io::Result<()> {
    let parent = link.parent().unwrap_or(Path::new("."));
    let name = target
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{} has no name", target.display())))?;
    let tmp = link.with_extension("tmp");
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::os::unix::fs::symlink(name, &tmp)?;
    std::fs::rename(&tmp, link)?;
    std::fs::File::open(parent)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_old_layout_becomes_generation_zero_and_keeps_its_files() {
        let d = tempfile::tempdir().unwrap();
        let link = d.path().join("db");
        std::fs::create_dir(&link).unwrap();
        std::fs::write(link.join("f"), b"x").unwrap();
        let real = prepare(&link).unwrap();
        assert_eq!(real, dir(&link, 0));
        assert_eq!(std::fs::read(link.join("f")).unwrap(), b"x");
        assert_eq!(current(&link).unwrap().0, 0);
        // Idempotent.
        assert_eq!(prepare(&link).unwrap(), real);
    }

    #[test]
    fn a_new_member_gets_an_empty_generation_zero() {
        let d = tempfile::tempdir().unwrap();
        let link = d.path().join("db");
        assert_eq!(prepare(&link).unwrap(), dir(&link, 0));
        assert!(link.is_dir());
        assert_eq!(next(&link).unwrap(), dir(&link, 1));
    }

    #[test]
    fn prepare_removes_orphans_and_old_generations() {
        let d = tempfile::tempdir().unwrap();
        let link = d.path().join("db");
        prepare(&link).unwrap();
        let one = next(&link).unwrap();
        std::fs::create_dir(&one).unwrap();
        // Interrupted before the switch: generation 1 is an orphan.
        assert_eq!(prepare(&link).unwrap(), dir(&link, 0));
        assert!(!one.exists());
        // Switched: generation 0 is the old one.
        std::fs::create_dir(&one).unwrap();
        point(&link, &one).unwrap();
        assert_eq!(prepare(&link).unwrap(), one);
        assert!(!dir(&link, 0).exists());
        assert_eq!(next(&link).unwrap(), dir(&link, 2));
    }

    #[test]
    fn a_crash_between_moving_and_linking_is_repaired() {
        let d = tempfile::tempdir().unwrap();
        let link = d.path().join("db");
        std::fs::create_dir(dir(&link, 0)).unwrap();
        std::fs::write(dir(&link, 0).join("f"), b"kept").unwrap();
        assert_eq!(prepare(&link).unwrap(), dir(&link, 0));
        assert_eq!(std::fs::read(link.join("f")).unwrap(), b"kept");
    }
}
