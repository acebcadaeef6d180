//! The progress-notification interval: etcd's flag
//! `--experimental-watch-progress-notify-interval` (a Go duration, parsed by
//! `config::GoDuration`; default 10 minutes, raised to at least 100 ms; etcd
//! `v3rpc/watch.go` `NewWatchServer`), and the jitter
//! etcd adds per stream (up to a tenth of the interval) so that streams created together do
//! not tick together.

use std::time::Duration;

/// etcd's default progress-notification interval (10 minutes).
pub const DEFAULT_PROGRESS_INTERVAL: Duration = Duration::from_secs(600);
/// etcd's minimum (`minWatchProgressInterval`, 100 ms).
pub const MIN_PROGRESS_INTERVAL: Duration = Duration::from_millis(100);

/// The interval a member uses for a configured value: 0 keeps etcd's default, values below
/// [`MIN_PROGRESS_INTERVAL`] are raised to it (with a warning, as etcd does).
pub fn effective_interval(configured: Duration) -> Duration {
    if configured.is_zero() {
        DEFAULT_PROGRESS_INTERVAL
    } else if configured < MIN_PROGRESS_INTERVAL {
        tracing::warn!(
            configured_ms = configured.as_millis() as u64,
            "adjusting watch progress notify interval to the 100ms minimum"
        );
        MIN_PROGRESS_INTERVAL
    } else {
        configured
    }
}

/// `interval` plus a jitter in `[0, interval / 10)` derived from `seed` (etcd adds
/// `rand(interval / 10)` per stream).
pub fn jittered(interval: Duration, seed: u64) -> Duration {
    let span = (interval.as_nanos() / 10) as u64;
    if span == 0 {
        return interval;
    }
    // splitmix64: a well-spread value from a counter-like seed.
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    interval + Duration::from_nanos(z % span)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_follows_etcds_default_and_minimum() {
        assert_eq!(
            effective_interval(Duration::ZERO),
            DEFAULT_PROGRESS_INTERVAL
        );
        assert_eq!(
            effective_interval(Duration::from_millis(10)),
            MIN_PROGRESS_INTERVAL
        );
        assert_eq!(
            effective_interval(Duration::from_secs(5)),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn jitter_stays_within_a_tenth() {
        let base = Duration::from_secs(10);
        let values: Vec<Duration> = (0..100).map(|s| jittered(base, s)).collect();
        assert!(
            values
                .iter()
                .all(|d| *d >= base && *d < base + Duration::from_secs(1))
        );
        assert!(
            values.windows(2).any(|w| w[0] != w[1]),
            "seeds spread the ticks"
        );
    }
}
