//! `--experimental-peer-dial-override` (Keel only): dial another address than the one a peer
//! advertises.
//!
//! The value is a comma-separated list of `ADVERTISED_PEER_URL=DIAL_URL` pairs, e.g.
//! `http://127.0.0.1:25380=http://127.0.0.1:25480`. When this member opens a connection to a
//! peer advertised at the left URL it connects to the right URL instead; membership, member IDs
//! and every message keep using the advertised URL. The chaos harness (`keel-chaos`) uses it to
//! put a TCP proxy on each ordered pair of members, so it can cut or delay one direction of one
//! link.
//!
//! URLs are checked like etcd checks its URL flags (`types.NewURLs`): scheme `http` or
//! `https`, a `host:port` address, no path.

use std::collections::HashMap;

/// The flag's name, used in start-up errors.
pub const FLAG: &str = "--experimental-peer-dial-override";

/// Advertised peer URL → URL to dial instead.
pub type DialOverrides = HashMap<String, String>;

/// A flag value that does not parse, in etcd's flag-error style:
/// `invalid value "<v>" for flag --experimental-peer-dial-override: <why>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid value {value:?} for flag {flag}: {why}", flag = FLAG)]
pub struct DialOverrideError {
    /// The whole flag value.
    pub value: String,
    /// What is wrong with it.
    pub why: BadOverride,
}

/// What is wrong with a `--experimental-peer-dial-override` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadOverride {
    /// A pair without `=`.
    #[error("{0:?} is not of the form ADVERTISED_PEER_URL=DIAL_URL")]
    NotAPair(String),
    /// An advertised URL listed twice.
    #[error("{0} is overridden twice")]
    Twice(String),
    /// A URL that etcd would not accept.
    #[error(transparent)]
    Url(#[from] BadUrl),
}

/// A URL that fails etcd's URL checks (`pkg/types/urls.go`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadUrl {
    /// Neither `http://` nor `https://`.
    #[error("URL scheme must be http or https: {0:?}")]
    Scheme(String),
    /// No `host:port` address.
    #[error("URL address does not have the form \"host:port\": {0}")]
    HostPort(String),
    /// A path after the address.
    #[error("URL must not contain a path: {0}")]
    Path(String),
}

/// Parses the flag value (see the module docs); an empty value means no override.
///
/// Errors: a pair without `=`, an invalid URL on either side, or the same advertised URL
/// twice ([`DialOverrideError`]).
pub fn parse(value: &str) -> Result<DialOverrides, DialOverrideError> {
    let invalid = |why: BadOverride| DialOverrideError {
        value: value.to_string(),
        why,
    };
    let mut overrides = DialOverrides::new();
    for pair in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (advertised, dial) = pair
            .split_once('=')
            .ok_or_else(|| invalid(BadOverride::NotAPair(pair.to_string())))?;
        let (advertised, dial) = (advertised.trim(), dial.trim());
        check_url(advertised).map_err(|e| invalid(e.into()))?;
        check_url(dial).map_err(|e| invalid(e.into()))?;
        if overrides
            .insert(advertised.to_string(), dial.to_string())
            .is_some()
        {
            return Err(invalid(BadOverride::Twice(advertised.to_string())));
        }
    }
    Ok(overrides)
}

/// etcd's URL checks (`pkg/types/urls.go`): scheme http(s), `host:port`, no path.
fn check_url(url: &str) -> Result<(), BadUrl> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| BadUrl::Scheme(url.to_string()))?;
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| BadUrl::HostPort(url.to_string()))?;
    if host.is_empty() || host.contains('/') || port.parse::<u16>().is_err() {
        return Err(if port.contains('/') {
            BadUrl::Path(url.to_string())
        } else {
            BadUrl::HostPort(url.to_string())
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pairs_and_ignores_blanks() {
        let o = parse(
            " http://127.0.0.1:25380=http://127.0.0.1:25480 ,,\
             https://m2:2380=http://127.0.0.1:1",
        )
        .unwrap();
        assert_eq!(o.len(), 2);
        assert_eq!(o["http://127.0.0.1:25380"], "http://127.0.0.1:25480");
        assert_eq!(o["https://m2:2380"], "http://127.0.0.1:1");
        assert!(parse("").unwrap().is_empty());
    }

    #[test]
    fn bad_input_is_named_in_the_error() {
        let err = parse("http://127.0.0.1:1").unwrap_err().to_string();
        assert_eq!(
            err,
            "invalid value \"http://127.0.0.1:1\" for flag --experimental-peer-dial-override: \
             \"http://127.0.0.1:1\" is not of the form ADVERTISED_PEER_URL=DIAL_URL"
        );
        let err = parse("http://a:1=ftp://b:2").unwrap_err().to_string();
        assert!(
            err.ends_with("URL scheme must be http or https: \"ftp://b:2\""),
            "{err}"
        );
        let err = parse("http://a=http://b:2").unwrap_err().to_string();
        assert!(
            err.ends_with("does not have the form \"host:port\": http://a"),
            "{err}"
        );
        let err = parse("http://a:1/x=http://b:2").unwrap_err().to_string();
        assert!(
            err.ends_with("must not contain a path: http://a:1/x"),
            "{err}"
        );
        let err = parse("http://a:1=http://b:99999").unwrap_err().to_string();
        assert!(err.contains("host:port"), "{err}");
        let err = parse("http://a:1=http://b:2,http://a:1=http://c:3")
            .unwrap_err()
            .to_string();
        assert!(err.ends_with("http://a:1 is overridden twice"), "{err}");
    }
}
