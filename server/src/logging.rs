//! The member's log: etcd's `--log-level`, `--log-outputs` and `--log-format` on
//! tracing-subscriber. `RUST_LOG` (tracing's filter syntax) overrides the level.
//!
//! Sits at the top with `main.rs` (it reads the flags); no component uses it.

use std::fs::OpenOptions;
use std::sync::Arc;

use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};

use crate::config::{ConfigError, OperatorFlags, split_urls};

/// tracing's level for etcd's `--log-level` (zap's names: `debug`, `info`, `warn`, `error`,
/// `dpanic`, `panic`, `fatal`; the last three log as `error`).
///
/// Errors: `FlagValue` for any other name (etcd stops with `unknown level "<name>"`; a level
/// tracing cannot parse would otherwise silence the whole log).
pub fn level(etcd_level: &str) -> Result<&'static str, ConfigError> {
    match etcd_level {
        "debug" => Ok("debug"),
        "info" => Ok("info"),
        "warn" => Ok("warn"),
        "error" | "dpanic" | "panic" | "fatal" => Ok("error"),
        other => Err(ConfigError::FlagValue {
            flag: "log-level",
            value: other.to_string(),
            reason: format!("unknown level {other:?}"),
        }),
    }
}

/// The writer of `--log-outputs`: `default` and `stderr` are stderr, `stdout` is stdout,
/// anything else a file appended to; several outputs all get every line.
///
/// Errors: `FlagValue` naming a file that cannot be opened.
pub fn writer(outputs: &str) -> Result<BoxMakeWriter, ConfigError> {
    let mut combined: Option<BoxMakeWriter> = None;
    for output in split_urls(outputs) {
        let next = match output.as_str() {
            "default" | "stderr" => BoxMakeWriter::new(std::io::stderr),
            "stdout" => BoxMakeWriter::new(std::io::stdout),
            path => {
                let file = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| ConfigError::FlagValue {
                        flag: "log-outputs",
                        value: path.to_string(),
                        reason: e.to_string(),
                    })?;
                BoxMakeWriter::new(Arc::new(file))
            }
        };
        combined = Some(match combined {
            None => next,
            Some(before) => BoxMakeWriter::new(before.and(next)),
        });
    }
    Ok(combined.unwrap_or_else(|| BoxMakeWriter::new(std::io::stderr)))
}

/// Installs the global subscriber for `--log-level` `etcd_level` and the logging flags of
/// `flags`.
///
/// Errors: those of [`level`] and [`writer`].
pub fn init(etcd_level: &str, flags: &OperatorFlags) -> Result<(), ConfigError> {
    let level = level(etcd_level)?;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("{level},openraft=warn")));
    let writer = writer(&flags.log_outputs)?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    if flags.log_format == "json" {
        builder
            .json()
            .flatten_event(true)
            .with_writer(writer)
            .init();
    } else {
        let terminal = matches!(flags.log_outputs.as_str(), "default" | "stderr")
            && std::io::IsTerminal::is_terminal(&std::io::stderr());
        builder.with_writer(writer).with_ansi(terminal).init();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    #[test]
    fn etcds_levels_map_onto_tracings() {
        assert_eq!(level("fatal").unwrap(), "error");
        assert_eq!(level("warn").unwrap(), "warn");
        assert_eq!(level("debug").unwrap(), "debug");
        let err = level("warning").unwrap_err().to_string();
        assert_eq!(
            err,
            r#"invalid value "warning" for flag --log-level: unknown level "warning""#
        );
    }

    #[test]
    fn every_output_gets_every_line() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.log"), dir.path().join("b.log"));
        let w = writer(&format!("{},{}", a.display(), b.display())).unwrap();
        w.make_writer().write_all(b"line\n").unwrap();
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "line\n");
        assert_eq!(std::fs::read_to_string(&b).unwrap(), "line\n");
        let err = writer("/nonexistent-dir/x.log").err().unwrap().to_string();
        assert!(err.contains("--log-outputs"), "{err}");
    }
}
