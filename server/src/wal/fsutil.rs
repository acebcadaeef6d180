//! Small file-system helpers (Linux): preallocation, directory fsync, locking, nonces.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Makes sure `file` has `len` bytes allocated. Uses `fallocate(2)` mode 0 (extends the size,
/// never shrinks, new space reads as zeros); falls back to `set_len` (a sparse extension) on
/// file systems without fallocate. Callers fsync the file and its directory afterwards.
pub(crate) fn preallocate(file: &File, len: u64) -> io::Result<()> {
    let off_len = libc::off_t::try_from(len)
        .map_err(|_| io::Error::other("preallocation size overflows off_t"))?;
    // SAFETY: fallocate only reads the fd and two integers.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, off_len) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => {
            if file.metadata()?.len() < len {
                file.set_len(len)?;
            }
            Ok(())
        }
        _ => Err(err),
    }
}

/// fsyncs a directory so that file creations, renames and deletions in it are durable.
pub(crate) fn fsync_dir(dir: &File) -> io::Result<()> {
    dir.sync_all()
}

/// Opens a directory for fsync and locking.
pub(crate) fn open_dir(path: &Path) -> io::Result<File> {
    File::open(path)
}

/// Takes an exclusive, non-blocking `flock(2)` on the directory. Returns `Ok(false)` if someone
/// else holds it. The lock lives as long as the descriptor.
pub(crate) fn try_lock_exclusive(dir: &File) -> io::Result<bool> {
    // SAFETY: flock only reads the fd and flags.
    let rc = unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(err)
    }
}

/// A random 64-bit segment nonce from `getrandom(2)`. If the syscall is unavailable, mixes the
/// clock, the pid and a process-wide counter: the nonce only has to differ from the nonces of
/// earlier incarnations of the same file, not be secret.
pub(crate) fn random_nonce() -> u64 {
    let mut buf = [0u8; 8];
    // SAFETY: the buffer is valid for 8 bytes of writes.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n == 8 {
        return u64::from_le_bytes(buf);
    }
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mixed = nanos
        ^ (u64::from(std::process::id()) << 32)
        ^ COUNTER.fetch_add(1, Ordering::Relaxed).rotate_left(17);
    splitmix64(mixed)
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
