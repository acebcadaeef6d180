//! The online `Maintenance.Defragment` of a running member: a [`Rewrite`] of its database
//! into a new generation, with the two short pauses it needs (`backend/defrag.rs` says why
//! the result equals the live tree).
//!
//! Pauses (writes only; reads never wait, they go on reading whichever generation is
//! current when they start, and both hold the same data at the switch):
//! 1. *subscribe*: the apply gate (shared: the apply task waits for it between groups) and
//!    the compactor's removal gate, while the rewrite subscribes to the live tree;
//! 2. *switch*: the apply gate, the export lock (exclusive, taken only when no export runs:
//!    an export reads records of the old generation until it ends) and the removal gate,
//!    while the follower applies the last changes, the new database is flushed, the
//!    `member/db` link is switched (`backend::generation::point`) and the [`LiveTree`] made
//!    to follow it.
//!
//! Durability: the new generation is flushed, with the consistent index it holds, before
//! the link names it, so after a crash at any step the link names a complete database that
//! holds at least what the old one held durably (the raft log is purged only below that).

use std::path::Path;
use std::time::{Duration, Instant};

use crate::backend::defrag::Rewrite;
use crate::backend::{LiveTree, generation};
use crate::mvcc::SharedStore;
use crate::raft::export::ExportLocks;

use super::BackupError;

/// How long the switch waits for running exports (snapshots, Hash) to end before giving up.
const EXPORT_WAIT: Duration = Duration::from_secs(60);

/// What one online defragment did, for the log and the benchmark.
#[derive(Debug, Clone, Copy)]
pub struct Report {
    /// Bytes on disk before (the old generation).
    pub before: u64,
    /// Bytes on disk after (the new generation).
    pub after: u64,
    /// Keys copied by the bulk copy.
    pub copied: u64,
    /// Changes of writes made during the copy, applied by the follower.
    pub followed: u64,
    /// How long writes waited at the subscription.
    pub subscribe_pause: Duration,
    /// How long writes waited at the switch.
    pub switch_pause: Duration,
    /// The whole defragment.
    pub took: Duration,
}

/// Rewrites the member's database (`live`, linked at `link`) into a new generation while
/// it serves, and switches to it. Only one may run at a time (the caller serializes).
///
/// Errors: sled or file system I/O, or exports that did not end within [`EXPORT_WAIT`]; the
/// member then keeps its current generation (the unfinished one is removed by the next
/// defragment or start).
pub async fn defragment(
    live: &LiveTree,
    link: &Path,
    locks: &ExportLocks,
    store: &SharedStore,
) -> Result<Report, BackupError> {
    let started = Instant::now();
    // Orphans of an earlier, interrupted defragment go first.
    let current = tokio::task::block_in_place(|| generation::prepare(link))?;
    let next = generation::next(link)?;
    let before = live.size_on_disk()?;

    let (l, n) = (live.clone(), next.clone());
    let mut rewrite = blocking(move || Ok(Rewrite::open(&l, &n)?)).await?;
    let gate = locks.gate.clone().read_owned().await;
    let paused = Instant::now();
    let mvcc = store.get();
    let rewrite = blocking(move || {
        let _removals = mvcc.pause_removals();
        rewrite.follow()?;
        Ok(rewrite)
    })
    .await?;
    drop(gate);
    let subscribe_pause = paused.elapsed();
    tracing::info!(
        pause_us = subscribe_pause.as_micros() as u64,
        dir = %next.display(),
        "defragment: following the live store, copying"
    );

    let (rewrite, copied) = blocking(move || {
        let copied = rewrite.copy(&|_| {})?;
        Ok((rewrite, copied))
    })
    .await?;

    tracing::info!(copied, "defragment: copied, switching");
    let deadline = Instant::now() + EXPORT_WAIT;
    let (gate, export, paused) = loop {
        let gate = locks.gate.clone().read_owned().await;
        let paused = Instant::now();
        match locks.export.clone().try_write_owned() {
            Ok(export) => break (gate, export, paused),
            Err(_) if Instant::now() < deadline => {
                drop(gate);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(_) => {
                return Err(BackupError::Io(std::io::Error::other(
                    "defragment: snapshot exports kept running; try again",
                )));
            }
        }
    };
    let (l, link, mvcc) = (live.clone(), link.to_path_buf(), store.get());
    let followed = blocking(move || {
        let _removals = mvcc.pause_removals();
        // Apply is paused: what is pending reaches the old generation before the fence, so
        // the follower copies it and the new generation starts with nothing pending.
        mvcc.persist().map_err(std::io::Error::other)?;
        let dir = rewrite.dir().to_path_buf();
        let (generation, followed) = rewrite.finish()?;
        generation::point(&link, &dir)?;
        // Crash with the link switched: the new generation is complete and flushed.
        crate::failpoint::crash_point!("defrag_switch");
        l.switch(generation, current);
        Ok(followed)
    })
    .await?;
    drop((export, gate));
    let switch_pause = paused.elapsed();
    let after = live.size_on_disk()?;
    Ok(Report {
        before,
        after,
        copied,
        followed,
        subscribe_pause,
        switch_pause,
        took: started.elapsed(),
    })
}

/// Runs `f` on a blocking thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BackupError> + Send + 'static,
) -> Result<T, BackupError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| BackupError::Io(std::io::Error::other(format!("defragment task: {e}"))))?
}
