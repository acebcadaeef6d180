//! etcd's maintenance flags (issue 15): the corruption checks and auto-compaction.

use std::time::Duration;

use clap::{ArgAction, Args};
use serde::Deserialize;

use super::duration::parse_go;
use super::{ConfigError, GoDuration};
use crate::cluster::autocompact::{self, Mode};

/// The corruption-check and auto-compaction flags, with etcd 3.5's names (3.6 drops the
/// `experimental-` prefix of the corruption-check ones: `--corrupt-check-time`,
/// `--compact-hash-check-time`).
#[derive(Args, Debug, Clone, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct MaintenanceFlags {
    /// Before serving, compare this member's HashKV with every peer's at the same revision
    /// and refuse to start on a mismatch with equal compact revisions (etcd
    /// `--experimental-initial-corrupt-check`; Keel turns it on by default, etcd off).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, value_parser = super::go_bool,
        default_value_t = true, default_missing_value = "true")]
    pub experimental_initial_corrupt_check: bool,
    /// How often the leader compares the followers' HashKV with its own and raises CORRUPT
    /// for a member that differs (a Go duration; `0s` = off, etcd's default; etcd
    /// `--experimental-corrupt-check-time`).
    #[arg(long, default_value = "0s")]
    pub experimental_corrupt_check_time: GoDuration,
    /// Enable the leader's check of the members' hashes at their compaction revisions (etcd
    /// 3.5 `--experimental-compact-hash-check-enabled`, off by default).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, value_parser = super::go_bool,
        default_value_t = false, default_missing_value = "true")]
    pub experimental_compact_hash_check_enabled: bool,
    /// How often the leader runs the compact-hash check (a Go duration; etcd
    /// `--experimental-compact-hash-check-time`, default 1m).
    #[arg(long, default_value = "1m")]
    pub experimental_compact_hash_check_time: GoDuration,
    /// Interpret `--auto-compaction-retention` as an amount of time (`periodic`) or a number
    /// of revisions (`revision`) (etcd `--auto-compaction-mode`).
    #[arg(long, default_value = "periodic")]
    pub auto_compaction_mode: String,
    /// Auto compaction retention for the mvcc key value store: a Go duration or a bare
    /// number of hours (`periodic`), or a number of revisions (`revision`); `0` turns
    /// auto-compaction off (etcd `--auto-compaction-retention`).
    #[arg(long, default_value = "0", allow_hyphen_values = true)]
    pub auto_compaction_retention: String,
    /// Keel: how often revision-mode auto-compaction compacts (etcd's fixed `revInterval`,
    /// 5m; tests shorten it).
    #[arg(long, default_value = "5m")]
    pub auto_compaction_revision_interval: GoDuration,
}

impl Default for MaintenanceFlags {
    fn default() -> MaintenanceFlags {
        MaintenanceFlags {
            experimental_initial_corrupt_check: true,
            experimental_corrupt_check_time: GoDuration(Duration::ZERO),
            experimental_compact_hash_check_enabled: false,
            experimental_compact_hash_check_time: GoDuration(Duration::from_secs(60)),
            auto_compaction_mode: autocompact::MODE_PERIODIC.to_string(),
            auto_compaction_retention: "0".to_string(),
            auto_compaction_revision_interval: GoDuration(autocompact::REV_INTERVAL),
        }
    }
}

impl MaintenanceFlags {
    /// The auto-compaction of `--auto-compaction-mode` and `--auto-compaction-retention`
    /// (etcd `parseCompactionRetention` and `embed.Config.Validate`); `None` when the
    /// retention is zero (off).
    ///
    /// Errors: etcd's texts, `unknown auto-compaction-mode "x"` and `error parsing
    /// CompactionRetention: time: invalid duration "x"`.
    pub fn auto_compaction(&self) -> Result<Option<Mode>, ConfigError> {
        let mode = self.auto_compaction_mode.as_str();
        if ![autocompact::MODE_PERIODIC, autocompact::MODE_REVISION].contains(&mode) {
            return Err(ConfigError::CompactionMode(mode.to_string()));
        }
        // Not trimmed: etcd refuses " 1h" (Go's ParseDuration takes no spaces).
        let text = self.auto_compaction_retention.as_str();
        // etcd: an empty value is the default, 0 (off).
        let text = if text.is_empty() { "0" } else { text };
        // etcd `parseCompactionRetention`: a non-negative integer is hours (periodic) or
        // revisions (revision); anything else is a Go duration, in revision mode taken as
        // its nanoseconds.
        let retention = match text.parse::<i64>() {
            Ok(n) if n >= 0 => match mode {
                autocompact::MODE_REVISION => Retention::Revisions(n),
                _ => Retention::Time(Duration::from_secs(3600u64.saturating_mul(n as u64))),
            },
            _ => {
                let nanos =
                    parse_go(text).map_err(|e| ConfigError::CompactionRetention(e.to_string()))?;
                // Go takes a negative duration; a negative retention means nothing useful,
                // so Keel refuses it (docs/compat.md).
                let nanos = u64::try_from(nanos).map_err(|_| {
                    ConfigError::CompactionRetention(format!("negative retention {text:?}"))
                })?;
                match mode {
                    autocompact::MODE_REVISION => {
                        Retention::Revisions(i64::try_from(nanos).unwrap_or(i64::MAX))
                    }
                    _ => Retention::Time(Duration::from_nanos(nanos)),
                }
            }
        };
        Ok(match retention {
            Retention::Time(d) if !d.is_zero() => Some(Mode::Periodic(d)),
            Retention::Revisions(n) if n > 0 => Some(Mode::Revision {
                retention: n,
                interval: self.auto_compaction_revision_interval.0,
            }),
            _ => None,
        })
    }

    /// How often the leader runs the compact-hash check (`None`: off).
    pub fn compact_hash_check(&self) -> Option<Duration> {
        let every = self.experimental_compact_hash_check_time.0;
        (self.experimental_compact_hash_check_enabled && !every.is_zero()).then_some(every)
    }
}

enum Retention {
    Time(Duration),
    Revisions(i64),
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::config::Config;

    fn parse(args: &[&str]) -> Result<Option<Mode>, String> {
        let mut all = vec!["keel"];
        all.extend_from_slice(args);
        Config::parse_from(all)
            .maintenance
            .auto_compaction()
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_match_etcd() {
        let m = Config::default().maintenance;
        assert_eq!(m.auto_compaction_mode, "periodic");
        assert_eq!(m.auto_compaction_retention, "0");
        assert_eq!(m.auto_compaction().unwrap(), None, "off by default");
        assert!(!m.experimental_compact_hash_check_enabled);
        assert_eq!(
            m.experimental_compact_hash_check_time.0,
            Duration::from_secs(60)
        );
        assert_eq!(m.compact_hash_check(), None);
        assert_eq!(
            m.auto_compaction_revision_interval.0,
            Duration::from_secs(300)
        );
        let d = MaintenanceFlags::default();
        assert_eq!(
            (d.auto_compaction_mode, d.auto_compaction_retention),
            (m.auto_compaction_mode, m.auto_compaction_retention)
        );
    }

    #[test]
    fn retention_parses_as_etcd_does() {
        let hour = Duration::from_secs(3600);
        assert_eq!(
            parse(&["--auto-compaction-retention", "1"]),
            Ok(Some(Mode::Periodic(hour))),
            "a bare number is hours"
        );
        assert_eq!(
            parse(&["--auto-compaction-retention", "5s"]),
            Ok(Some(Mode::Periodic(Duration::from_secs(5))))
        );
        assert_eq!(
            parse(&["--auto-compaction-retention=1h30m"]),
            Ok(Some(Mode::Periodic(hour + hour / 2)))
        );
        assert_eq!(
            parse(&[
                "--auto-compaction-mode",
                "revision",
                "--auto-compaction-retention",
                "100"
            ]),
            Ok(Some(Mode::Revision {
                retention: 100,
                interval: Duration::from_secs(300)
            }))
        );
        assert_eq!(
            parse(&[
                "--auto-compaction-mode=revision",
                "--auto-compaction-retention=7",
                "--auto-compaction-revision-interval=2s"
            ]),
            Ok(Some(Mode::Revision {
                retention: 7,
                interval: Duration::from_secs(2)
            }))
        );
        // etcd takes a duration's nanoseconds as the revision count.
        assert_eq!(
            parse(&[
                "--auto-compaction-mode",
                "revision",
                "--auto-compaction-retention",
                "1us"
            ]),
            Ok(Some(Mode::Revision {
                retention: 1000,
                interval: Duration::from_secs(300)
            }))
        );
        assert_eq!(parse(&["--auto-compaction-retention", "0s"]), Ok(None));
        assert_eq!(
            parse(&[
                "--auto-compaction-mode",
                "revision",
                "--auto-compaction-retention",
                "0"
            ]),
            Ok(None)
        );
    }

    #[test]
    fn bad_values_get_etcds_texts() {
        // As etcd 3.4.23 prints them.
        assert_eq!(
            parse(&[
                "--auto-compaction-mode",
                "foo",
                "--auto-compaction-retention",
                "1"
            ]),
            Err(r#"unknown auto-compaction-mode "foo""#.to_string())
        );
        assert_eq!(
            parse(&["--auto-compaction-retention", "abc"]),
            Err(r#"error parsing CompactionRetention: time: invalid duration "abc""#.to_string())
        );
        assert_eq!(
            parse(&["--auto-compaction-retention=-1"]),
            Err(
                r#"error parsing CompactionRetention: time: missing unit in duration "-1""#
                    .to_string()
            )
        );
        assert_eq!(
            parse(&["--auto-compaction-retention", "5x"]),
            Err(
                r#"error parsing CompactionRetention: time: unknown unit "x" in duration "5x""#
                    .to_string()
            )
        );
        assert_eq!(
            parse(&["--auto-compaction-retention", "10000000h"]),
            Err(
                r#"error parsing CompactionRetention: time: invalid duration "10000000h""#
                    .to_string()
            )
        );
        // Go's flag package takes the next argument as the value even when it starts with -.
        assert_eq!(
            parse(&["--auto-compaction-retention", "-1"]),
            Err(
                r#"error parsing CompactionRetention: time: missing unit in duration "-1""#
                    .to_string()
            )
        );
        assert_eq!(
            parse(&["--auto-compaction-retention", "-1h"]),
            Err(r#"error parsing CompactionRetention: negative retention "-1h""#.to_string())
        );
        assert_eq!(
            parse(&["--auto-compaction-retention="]),
            Ok(None),
            "empty is off"
        );
        assert_eq!(
            parse(&["--auto-compaction-retention", " 1h"]),
            Err(r#"error parsing CompactionRetention: time: invalid duration " 1h""#.to_string())
        );
        assert_eq!(
            parse(&["--auto-compaction-retention", "1h "]),
            Err(
                r#"error parsing CompactionRetention: time: unknown unit "h " in duration "1h ""#
                    .to_string()
            )
        );
        let mut c = Config::parse_from(["keel", "--auto-compaction-retention", "x1"]);
        assert!(c.normalize().is_err(), "checked at start-up");
    }

    #[test]
    fn compact_hash_check_flags() {
        let c = Config::parse_from([
            "keel",
            "--experimental-compact-hash-check-enabled",
            "--experimental-compact-hash-check-time",
            "2s",
        ]);
        assert_eq!(
            c.maintenance.compact_hash_check(),
            Some(Duration::from_secs(2))
        );
    }
}
