//! The progress-notification interval: etcd's flag
//! `--experimental-watch-progress-notify-interval` (a Go duration, default 10 minutes,
//! raised to at least 100 ms; etcd `v3rpc/watch.go` `NewWatchServer`), and the jitter
//! etcd adds per stream (up to a tenth of the interval) so that streams created together do
//! not tick together.

use std::str::FromStr;
use std::time::Duration;

/// etcd's default progress-notification interval (10 minutes).
pub const DEFAULT_PROGRESS_INTERVAL: Duration = Duration::from_secs(600);
/// etcd's minimum (`minWatchProgressInterval`, 100 ms).
pub const MIN_PROGRESS_INTERVAL: Duration = Duration::from_millis(100);

/// A Go `time.Duration`, as etcd's duration flags take it: `"10m"`, `"1h30m"`, `"1.5s"`,
/// `"250ms"`, `"0"`. In a YAML config file an integer is nanoseconds (etcd's config keys
/// unmarshal durations from JSON numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoDuration(pub Duration);

impl FromStr for GoDuration {
    type Err = String;

    /// Errors: an empty string, an unknown unit, a missing number or a negative value.
    fn from_str(s: &str) -> Result<GoDuration, String> {
        let bad = || format!("invalid duration {s:?} (expected e.g. 10m, 1m30s, 500ms)");
        let text = s.trim();
        if text == "0" {
            return Ok(GoDuration(Duration::ZERO));
        }
        if text.is_empty() || text.starts_with('-') {
            return Err(bad());
        }
        let text = text.strip_prefix('+').unwrap_or(text);
        let mut total = 0f64;
        let mut rest = text;
        while !rest.is_empty() {
            let num_len = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(rest.len());
            if num_len == 0 {
                return Err(bad());
            }
            let value: f64 = rest[..num_len].parse().map_err(|_| bad())?;
            rest = &rest[num_len..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(rest.len());
            let nanos_per = match &rest[..unit_len] {
                "ns" => 1.0,
                "us" | "µs" | "μs" => 1e3,
                "ms" => 1e6,
                "s" => 1e9,
                "m" => 60e9,
                "h" => 3600e9,
                _ => return Err(bad()),
            };
            rest = &rest[unit_len..];
            total += value * nanos_per;
        }
        Ok(GoDuration(Duration::from_nanos(total.round() as u64)))
    }
}

impl std::fmt::Display for GoDuration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}ms", self.0.as_millis())
    }
}

impl<'de> serde::Deserialize<'de> for GoDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<GoDuration, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Nanos(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Nanos(n) => Ok(GoDuration(Duration::from_nanos(n))),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

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

    fn parse(s: &str) -> Duration {
        s.parse::<GoDuration>().unwrap().0
    }

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse("10m"), Duration::from_secs(600));
        assert_eq!(parse("10m0s"), Duration::from_secs(600));
        assert_eq!(parse("1h30m"), Duration::from_secs(5400));
        assert_eq!(parse("1.5s"), Duration::from_millis(1500));
        assert_eq!(parse("250ms"), Duration::from_millis(250));
        assert_eq!(parse("3us"), Duration::from_micros(3));
        assert_eq!(parse("0"), Duration::ZERO);
        for bad in ["", "10", "5x", "-1s", "ms", "1.2.3s"] {
            assert!(
                bad.parse::<GoDuration>().is_err(),
                "{bad:?} should not parse"
            );
        }
    }

    #[test]
    fn yaml_takes_text_or_nanoseconds() {
        let d: GoDuration = serde_norway::from_str("\"5s\"").unwrap();
        assert_eq!(d.0, Duration::from_secs(5));
        let d: GoDuration = serde_norway::from_str("600000000000").unwrap();
        assert_eq!(d.0, Duration::from_secs(600));
    }

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
