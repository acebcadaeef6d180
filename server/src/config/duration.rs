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

    /// Errors: anything Go's `time.ParseDuration` refuses (an empty string, an unknown or
    /// missing unit, overflow), and negative values.
    fn from_str(s: &str) -> Result<GoDuration, GoDurationError> {
        match parse_go(s.trim()) {
            Ok(nanos) if nanos >= 0 => Ok(GoDuration(Duration::from_nanos(nanos as u64))),
            _ => Err(GoDurationError(s.to_string())),
        }
    }
}

/// Why Go's `time.ParseDuration` refuses a text; `Display` is Go's error text byte for byte
/// (etcd prints it inside its own messages, e.g. `error parsing CompactionRetention: ...`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GoParseError {
    /// Bad syntax or overflow: `time: invalid duration "x"`.
    #[error("time: invalid duration {}", go_quote(.0))]
    Invalid(String),
    /// A number without a unit (other than `0`): `time: missing unit in duration "5"`.
    #[error("time: missing unit in duration {}", go_quote(.0))]
    MissingUnit(String),
    /// `time: unknown unit "x" in duration "5x"`.
    #[error("time: unknown unit {} in duration {}", go_quote(.unit), go_quote(.text))]
    UnknownUnit {
        /// The unit as written.
        unit: String,
        /// The whole text.
        text: String,
    },
}

/// Go's `time.ParseDuration` (Go 1.x `time/format.go`): `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+`
/// or `0`, units `ns`, `us` (`µs`, `μs`), `ms`, `s`, `m`, `h`; returns signed nanoseconds.
///
/// Errors: [`GoParseError`], with Go's texts, where Go returns an error: empty text, no
/// digits, a missing or unknown unit, or a total beyond `i64` nanoseconds (about 292 years).
pub fn parse_go(text: &str) -> Result<i64, GoParseError> {
    let invalid = || GoParseError::Invalid(text.to_string());
    let (neg, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    const LIMIT: u64 = 1 << 63;
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let digits = |s: &str| s.bytes().take_while(u8::is_ascii_digit).count();
        if !(rest.starts_with('.') || rest.as_bytes()[0].is_ascii_digit()) {
            return Err(invalid());
        }
        // The integer part; Go refuses one that overflows even before its unit.
        let int_len = digits(rest);
        let mut whole: u64 = 0;
        for b in rest[..int_len].bytes() {
            if whole > LIMIT / 10 {
                return Err(invalid());
            }
            whole = whole * 10 + u64::from(b - b'0');
            if whole > LIMIT {
                return Err(invalid());
            }
        }
        rest = &rest[int_len..];
        // The fraction; Go stops taking digits once they would overflow.
        let (mut frac, mut scale, mut frac_len) = (0u64, 1f64, 0usize);
        if let Some(after) = rest.strip_prefix('.') {
            frac_len = digits(after);
            let mut overflow = false;
            for b in after[..frac_len].bytes() {
                if overflow || frac > (i64::MAX as u64) / 10 {
                    overflow = true;
                    continue;
                }
                let next = frac * 10 + u64::from(b - b'0');
                if next > LIMIT {
                    overflow = true;
                    continue;
                }
                frac = next;
                scale *= 10.0;
            }
            rest = &after[frac_len..];
        }
        if int_len == 0 && frac_len == 0 {
            return Err(invalid());
        }
        let unit_len = rest
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(rest.len());
        if unit_len == 0 {
            return Err(GoParseError::MissingUnit(text.to_string()));
        }
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let per: u64 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => {
                return Err(GoParseError::UnknownUnit {
                    unit: unit.to_string(),
                    text: text.to_string(),
                });
            }
        };
        if whole > LIMIT / per {
            return Err(invalid());
        }
        let mut v = whole * per;
        if frac > 0 {
            v += (frac as f64 * (per as f64 / scale)) as u64;
            if v > LIMIT {
                return Err(invalid());
            }
        }
        total += v;
        if total > LIMIT {
            return Err(invalid());
        }
    }
    if neg {
        return Ok((total as i64).wrapping_neg());
    }
    i64::try_from(total).map_err(|_| invalid())
}

/// Go's `time.quote`: the text in double quotes, `"` and `\` escaped (other escapes only
/// matter for control characters, which no flag value here holds).
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
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
    fn go_parse_duration_values_and_texts() {
        // Values and texts as Go 1.x's time.ParseDuration gives them.
        let ok = |s: &str| parse_go(s).unwrap();
        assert_eq!(ok("0"), 0);
        assert_eq!(ok("-0"), 0);
        assert_eq!(ok("1.5h"), 5_400_000_000_000);
        assert_eq!(ok(".5s"), 500_000_000);
        assert_eq!(ok("1.s"), 1_000_000_000);
        assert_eq!(ok("-1h"), -3_600_000_000_000);
        assert_eq!(ok("1h2m3s4ms5us6ns"), 3_723_004_005_006);
        assert_eq!(ok("1\u{b5}s"), 1_000);
        assert_eq!(ok("9223372036854775807ns"), i64::MAX);
        assert_eq!(ok("-9223372036854775808ns"), i64::MIN);
        let err = |s: &str| parse_go(s).unwrap_err().to_string();
        assert_eq!(err(""), r#"time: invalid duration """#);
        assert_eq!(err("abc"), r#"time: invalid duration "abc""#);
        assert_eq!(err(".s"), r#"time: invalid duration ".s""#);
        assert_eq!(err("5"), r#"time: missing unit in duration "5""#);
        assert_eq!(err("-1"), r#"time: missing unit in duration "-1""#);
        assert_eq!(err("5x"), r#"time: unknown unit "x" in duration "5x""#);
        assert_eq!(err("1h5"), r#"time: missing unit in duration "1h5""#);
        assert_eq!(err("10000000h"), r#"time: invalid duration "10000000h""#);
        assert_eq!(
            err("9223372036854775808ns"),
            r#"time: invalid duration "9223372036854775808ns""#
        );
    }

    #[test]
    fn yaml_takes_text_or_nanoseconds() {
        let d: GoDuration = serde_norway::from_str("\"5s\"").unwrap();
        assert_eq!(d.0, Duration::from_secs(5));
        let d: GoDuration = serde_norway::from_str("600000000000").unwrap();
        assert_eq!(d.0, Duration::from_secs(600));
    }
}
