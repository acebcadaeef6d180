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

/// Parses the flag value (see the module docs); an empty value means no override.
///
/// Errors (etcd's flag-error style, `invalid value "<v>" for flag <flag>: <why>`): a pair
/// without `=`, an invalid URL on either side, or the same advertised URL twice.
pub fn parse(value: &str) -> Result<DialOverrides, String> {
    let invalid = |why: String| format!("invalid value {value:?} for flag {FLAG}: {why}");
    let mut overrides = DialOverrides::new();
    for pair in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (advertised, dial) = pair.split_once('=').ok_or_else(|| {
            invalid(format!(
                "{pair:?} is not of the form ADVERTISED_PEER_URL=DIAL_URL"
            ))
        })?;
        let (advertised, dial) = (advertised.trim(), dial.trim());
        check_url(advertised).map_err(&invalid)?;
        check_url(dial).map_err(&invalid)?;
        if overrides
            .insert(advertised.to_string(), dial.to_string())
            .is_some()
        {
            return Err(invalid(format!("{advertised} is overridden twice")));
        }
    }
    Ok(overrides)
}

/// etcd's URL checks (`pkg/types/urls.go`): scheme http(s), `host:port`, no path.
fn check_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("URL scheme must be http or https: {url:?}"))?;
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| format!("URL address does not have the form \"host:port\": {url}"))?;
    if host.is_empty() || host.contains('/') || port.parse::<u16>().is_err() {
        let why = if port.contains('/') {
            format!("URL must not contain a path: {url}")
        } else {
            format!("URL address does not have the form \"host:port\": {url}")
        };
        return Err(why);
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
        let err = parse("http://127.0.0.1:1").unwrap_err();
        assert_eq!(
            err,
            "invalid value \"http://127.0.0.1:1\" for flag --experimental-peer-dial-override: \
             \"http://127.0.0.1:1\" is not of the form ADVERTISED_PEER_URL=DIAL_URL"
        );
        let err = parse("http://a:1=ftp://b:2").unwrap_err();
        assert!(
            err.ends_with("URL scheme must be http or https: \"ftp://b:2\""),
            "{err}"
        );
        let err = parse("http://a=http://b:2").unwrap_err();
        assert!(
            err.ends_with("does not have the form \"host:port\": http://a"),
            "{err}"
        );
        let err = parse("http://a:1/x=http://b:2").unwrap_err();
        assert!(
            err.ends_with("must not contain a path: http://a:1/x"),
            "{err}"
        );
        let err = parse("http://a:1=http://b:99999").unwrap_err();
        assert!(err.contains("host:port"), "{err}");
        let err = parse("http://a:1=http://b:2,http://a:1=http://c:3").unwrap_err();
        assert!(err.ends_with("http://a:1 is overridden twice"), "{err}");
    }
}
