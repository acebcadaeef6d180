//! etcd's command line as Go's `flag` package reads it: single-dash flags
//! ([`go_style_args`]) and boolean values in `strconv.ParseBool`'s spellings ([`go_bool`]).
//! clap reads the rest; these two close the gaps an etcd user's scripts would hit.

use super::{Config, operator};

/// The command line with Go's single-dash flags (`-name x`, `-pre-vote=false`, as etcd's
/// `flag` package takes them and older etcd docs write them) spelled with two dashes.
///
/// Only the flags Keel knows (and the etcd flags it refuses by name) are rewritten, only in
/// flag position (not the separate value of the flag before), and nothing after a bare `--`
/// (Go's end of flags).
pub fn go_style_args<I, S>(args: I) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    use clap::CommandFactory;
    let command = Config::command();
    let takes_separate_value = |name: &str| {
        command
            .get_arguments()
            .find(|a| a.get_long() == Some(name))
            .map(|a| a.get_action().takes_values() && !a.is_require_equals_set())
    };
    let mut out = Vec::new();
    let mut value_next = false;
    let mut ended = false;
    for (i, arg) in args.into_iter().map(Into::into).enumerate() {
        let is_value = std::mem::take(&mut value_next);
        if i == 0 || ended || is_value {
            out.push(arg);
            continue;
        }
        if arg == "--" {
            ended = true;
            out.push(arg);
            continue;
        }
        let long = match arg.strip_prefix("--") {
            Some(rest) => Some(rest.to_string()),
            None => arg
                .strip_prefix('-')
                .filter(|rest| rest.len() > 1)
                .map(str::to_string),
        };
        let Some(long) = long else {
            out.push(arg);
            continue;
        };
        let (name, inline) = long
            .split_once('=')
            .map_or((long.as_str(), false), |(n, _)| (n, true));
        match takes_separate_value(name) {
            Some(separate) => {
                value_next = separate && !inline;
                out.push(format!("--{long}"));
            }
            None if operator::UNSUPPORTED_ETCD_FLAGS.contains(&name) => {
                out.push(format!("--{long}"))
            }
            None => out.push(arg),
        }
    }
    out
}

/// A boolean flag value as etcd's flags take it (Go's `strconv.ParseBool`): `1`, `t`, `T`,
/// `TRUE`, `true`, `True` and `0`, `f`, `F`, `FALSE`, `false`, `False`.
///
/// Errors: any other text, with Go's words (`parse error`).
pub fn go_bool(value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!("invalid boolean value {value:?}: parse error")),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn single_dash_flags_are_read_as_go_reads_them() {
        let args = go_style_args([
            "keel",
            "-name",
            "-data-dir",
            "-data-dir=/tmp/x",
            "-pre-vote=false",
            "--election-timeout",
            "2000",
            "-strict-reconfig-check",
            "-enable-v2=true",
            "-x",
            "--",
            "-name",
        ]);
        assert_eq!(
            args,
            [
                "keel",
                "--name",
                "-data-dir",
                "--data-dir=/tmp/x",
                "--pre-vote=false",
                "--election-timeout",
                "2000",
                "--strict-reconfig-check",
                "--enable-v2=true",
                "-x",
                "--",
                "-name",
            ],
            "a value is never rewritten, unknown names and what follows -- are left alone"
        );
        let c = Config::parse_from(go_style_args([
            "keel",
            "-name",
            "m1",
            "-pre-vote=0",
            "-heartbeat-interval",
            "200",
            "-election-timeout=2000",
        ]));
        assert_eq!(c.name, "m1");
        assert!(!c.operator.pre_vote);
        assert_eq!((c.heartbeat_interval, c.election_timeout), (200, 2000));
        assert_eq!(
            operator::unsupported_etcd_flag(&go_style_args(["keel", "-enable-v2"])).as_deref(),
            Some("--enable-v2")
        );
    }
}
