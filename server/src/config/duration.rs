//! Go `time.Duration` values, as etcd's duration flags and config keys take them.

use std::str::FromStr;
use std::time::Duration;

/// A Go `time.Duration`, as etcd's duration flags take it: `"10m"`, `"1h30m"`, `"1.5s"`,
/// `"250ms"`, `"0"`. In a YAML config file an integer is nanoseconds (etcd's config keys
/// unmarshal durations from JSON numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoDuration(pub Duration);

/// A flag or config value that is not a Go duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {0:?} (expected e.g. 10m, 1m30s, 500ms)")]
pub struct GoDurationError(pub String);

impl FromStr for GoDuration {
    type Err = GoDurationError;

    /// Errors: an empty string, an unknown unit, a missing number or a negative value.
    fn from_str(s: &str) -> Result<GoDuration, GoDurationError> {
        let bad = || GoDurationError(s.to_string());
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
        assert_eq!(
            "5x".parse::<GoDuration>().unwrap_err().to_string(),
            "invalid duration \"5x\" (expected e.g. 10m, 1m30s, 500ms)"
        );
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
}
