//! etcd's disaster-recovery and retention flags (issue 15 parts 7-8): `--force-new-cluster`,
//! `--max-snapshots`, `--max-wals`.

use clap::{ArgAction, Args};
use serde::Deserialize;

use crate::wal::WalOptions;

/// etcd's default `--max-snapshots` and `--max-wals` (etcd `embed.DefaultMaxSnapshots`,
/// `DefaultMaxWALs`).
pub const DEFAULT_MAX_FILES: u32 = 5;

/// The recovery and retention flags, with etcd's names and defaults.
#[derive(Args, Debug, Clone, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct RecoveryFlags {
    /// Force to create a new one member cluster: at start, this member becomes the only
    /// voter, keeping its data, member ID and cluster ID (etcd `--force-new-cluster`;
    /// docs/operations.md "Disaster recovery").
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, value_parser = super::go_bool,
        default_value_t = false, default_missing_value = "true")]
    pub force_new_cluster: bool,
    /// Maximum number of snapshot files to retain (0 is unlimited). Keel keeps only the
    /// newest snapshot file, which is within any limit (docs/compat.md).
    #[arg(long, default_value_t = DEFAULT_MAX_FILES)]
    pub max_snapshots: u32,
    /// Maximum number of WAL segment files to retain (0 is unlimited): when there are more,
    /// the raft log is purged up to the last snapshot so older segments go (docs/wal.md).
    #[arg(long, default_value_t = DEFAULT_MAX_FILES)]
    pub max_wals: u32,
    /// Keel, for tests: WAL segment size in bytes (default 64 MiB, etcd's `SegmentSizeBytes`).
    #[arg(long, hide = true, default_value_t = 64 << 20)]
    pub experimental_wal_segment_bytes: u64,
}

impl Default for RecoveryFlags {
    fn default() -> RecoveryFlags {
        RecoveryFlags {
            force_new_cluster: false,
            max_snapshots: DEFAULT_MAX_FILES,
            max_wals: DEFAULT_MAX_FILES,
            experimental_wal_segment_bytes: 64 << 20,
        }
    }
}

impl super::Config {
    /// The WAL options these flags give.
    pub fn wal_options(&self) -> WalOptions {
        WalOptions {
            segment_bytes: self.recovery.experimental_wal_segment_bytes,
            ..WalOptions::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::config::Config;

    #[test]
    fn defaults_match_etcd() {
        let r = Config::default().recovery;
        assert!(!r.force_new_cluster);
        assert_eq!((r.max_snapshots, r.max_wals), (5, 5));
        assert_eq!(r.experimental_wal_segment_bytes, 64 << 20);
    }

    #[test]
    fn flags_parse_in_gos_forms() {
        let c = Config::parse_from(["keel", "--force-new-cluster", "--max-wals", "0"]);
        assert!(c.recovery.force_new_cluster);
        assert_eq!(c.recovery.max_wals, 0);
        let c = Config::parse_from(["keel", "--force-new-cluster=false", "--max-snapshots=2"]);
        assert!(!c.recovery.force_new_cluster);
        assert_eq!(c.recovery.max_snapshots, 2);
        let y: Config = serde_norway::from_str("force-new-cluster: true\nmax-wals: 3\n").unwrap();
        assert!(y.recovery.force_new_cluster);
        assert_eq!((y.recovery.max_wals, y.recovery.max_snapshots), (3, 5));
    }
}
