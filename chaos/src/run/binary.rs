//! Checks on the `keel` binary before a run.

use std::io::Read;
use std::path::Path;

/// The environment variable the `fail` crate's `FailScenario::setup` reads; its name is in
/// the binary only when `keel` was built with the `failpoints` feature (the normal build
/// links no `fail` code).
const FAILPOINTS_MARKER: &[u8] = b"FAILPOINTS";

/// Whether the binary at `path` was built with failpoints (contains [`FAILPOINTS_MARKER`]).
///
/// Errors: the file cannot be read.
pub fn has_failpoints(path: &Path) -> std::io::Result<bool> {
    let mut file = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    // Keep the last marker-length - 1 bytes of a chunk, so a marker across chunks is found.
    let keep = FAILPOINTS_MARKER.len() - 1;
    let mut filled = 0usize;
    loop {
        let n = file.read(&mut buf[filled..])?;
        if n == 0 {
            return Ok(false);
        }
        let end = filled + n;
        if buf[..end]
            .windows(FAILPOINTS_MARKER.len())
            .any(|w| w == FAILPOINTS_MARKER)
        {
            return Ok(true);
        }
        let tail = end.min(keep);
        buf.copy_within(end - tail..end, 0);
        filled = tail;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_marker_across_chunk_borders() {
        let dir = tempfile::tempdir().unwrap();
        let with = dir.path().join("with");
        let mut bytes = vec![b'x'; (1 << 20) - 4];
        bytes.extend_from_slice(b"FAILPOINTS");
        bytes.extend_from_slice(&[b'y'; 100]);
        std::fs::write(&with, &bytes).unwrap();
        assert!(has_failpoints(&with).unwrap());
        let without = dir.path().join("without");
        std::fs::write(&without, vec![b'z'; 3 << 20]).unwrap();
        assert!(!has_failpoints(&without).unwrap());
    }
}
