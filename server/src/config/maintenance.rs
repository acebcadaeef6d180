//! etcd's maintenance flags (issue 15): the corruption checks.

use clap::{ArgAction, Args};
use serde::Deserialize;

use super::GoDuration;

/// The corruption-check flags, with etcd 3.5's names (3.6 drops the `experimental-`
/// prefix of the periodic one: `--corrupt-check-time`).
#[derive(Args, Debug, Clone, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct MaintenanceFlags {
    /// Before serving, compare this member's HashKV with every peer's at the same revision
    /// and refuse to start on a mismatch with equal compact revisions (etcd
    /// `--experimental-initial-corrupt-check`; Keel turns it on by default, etcd off).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_value_t = true, default_missing_value = "true")]
    pub experimental_initial_corrupt_check: bool,
    /// How often the leader compares the followers' HashKV with its own and raises CORRUPT
    /// for a member that differs (a Go duration; `0s` = off, etcd's default; etcd
    /// `--experimental-corrupt-check-time`).
    #[arg(long, default_value = "0s")]
    pub experimental_corrupt_check_time: GoDuration,
}

impl Default for MaintenanceFlags {
    fn default() -> MaintenanceFlags {
        MaintenanceFlags {
            experimental_initial_corrupt_check: true,
            experimental_corrupt_check_time: GoDuration(std::time::Duration::ZERO),
        }
    }
}
