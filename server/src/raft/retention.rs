//! `--max-wals`: keeps the number of live WAL segments within the limit by moving the raft
//! log's purge point forward, never past the last snapshot (etcd `--max-wals`; etcd purges WAL
//! files every 30 s, `fileutil.PurgeFile`).
//!
//! openraft purges the log to `snapshot - max_in_snapshot_log_to_keep` by itself, and the WAL
//! deletes every segment whose entries are all at or below the purge point (docs/wal.md). With
//! more live segments than `--max-wals`, this task asks openraft to purge up to the last entry
//! of the newest segment that must go, capped at the last snapshot's index: a segment still
//! holding an entry above the snapshot is never purged, since a restart needs it to rebuild
//! the state after the snapshot. Followers that fall behind the new purge point get a
//! snapshot instead of log entries.
//!
//! The task purges once the count reaches `max_wals - 1` (at least 1), so the rollover that
//! opens the next segment reaches the limit rather than passing it, as long as the purge (a
//! WAL record made durable, then file deletions) finishes before the segment after that
//! starts. It checks at every rollover (the WAL signals it) and every [`CHECK_EVERY`]
//! (a snapshot that completes lets a capped purge go further): with the timer alone, a
//! release build writing over 10 MB/s of entries filled a 512 KiB segment between two
//! checks, and the count passed the limit.

use std::sync::Arc;
use std::time::Duration;

use super::types::Raft;
use crate::wal::Wal;

/// How often the segment count is checked (cheap: one mutex and a short vector). etcd checks
/// every 30 s; segments fill in well under a second under load.
const CHECK_EVERY: Duration = Duration::from_millis(50);

/// The index to purge up to so that at most `max_wals` of `segments` (oldest first, each
/// segment's highest entry index; see [`Wal::segments`]) stay, without passing `snapshot` and
/// only when it is above `purged`. `None`: nothing to do (0 = unlimited, within the limit,
/// or the segments over the limit still hold entries above the snapshot).
pub fn purge_target(
    segments: &[Option<u64>],
    max_wals: usize,
    purged: Option<u64>,
    snapshot: Option<u64>,
) -> Option<u64> {
    if max_wals == 0 || segments.len() <= max_wals {
        return None;
    }
    let excess = segments.len() - max_wals;
    let needed = segments[..excess].iter().flatten().max().copied()?;
    let target = needed.min(snapshot?);
    (purged.is_none_or(|p| target > p)).then_some(target)
}

/// Runs until raft shuts down; a no-op loop for `max_wals == 0` is not started.
pub async fn run(raft: Raft, wal: Arc<Wal>, max_wals: usize) {
    if max_wals == 0 {
        return;
    }
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut asked: Option<u64> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = wal.rolled_over() => {}
        }
        let (snapshot, purged) = {
            let m = raft.metrics();
            let m = m.borrow();
            (m.snapshot.map(|l| l.index), m.purged.map(|l| l.index))
        };
        // A purge already asked for and not yet done: openraft may delay it while a
        // replication stream reads those entries.
        let purged = purged.max(asked.filter(|a| purged.is_none_or(|p| *a > p)));
        // One below the limit: the next rollover then reaches the limit, not one over it.
        let keep = max_wals.saturating_sub(1).max(1);
        let Some(target) = purge_target(&wal.segments(), keep, purged, snapshot) else {
            continue;
        };
        if raft.trigger().purge_log(target).await.is_err() {
            return; // raft stopped
        }
        tracing::debug!(
            upto = target,
            max_wals,
            "purging the raft log to honour --max-wals"
        );
        asked = Some(target);
    }
}

#[cfg(test)]
mod tests {
    use super::purge_target;

    #[test]
    fn purges_the_oldest_segments_over_the_limit_up_to_the_snapshot() {
        let segs = [Some(10), Some(20), Some(30), Some(40), None];
        // Two over the limit of 3: the second segment's last entry, 20.
        assert_eq!(purge_target(&segs, 3, Some(5), Some(35)), Some(20));
        // The snapshot caps it: entries above 15 are needed to rebuild the state.
        assert_eq!(purge_target(&segs, 3, Some(5), Some(15)), Some(15));
        // Nothing beyond the purge point, no snapshot, unlimited, within the limit.
        assert_eq!(purge_target(&segs, 3, Some(20), Some(35)), None);
        assert_eq!(purge_target(&segs, 3, None, None), None);
        assert_eq!(purge_target(&segs, 0, None, Some(35)), None);
        assert_eq!(purge_target(&segs, 5, None, Some(35)), None);
        // Segments holding only metadata need no particular purge point.
        assert_eq!(purge_target(&[None, None, Some(3)], 1, None, Some(9)), None);
    }
}
