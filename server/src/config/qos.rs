//! The QoS settings of a member's flags: the rule file of `--qos-config` and the overload
//! thresholds of `--qos-*` (docs/qos.md).

use super::{Config, ConfigError};
use crate::qos::{Rule, Thresholds, rules};

impl Config {
    /// The rules of `--qos-config`, or `None` without the flag.
    ///
    /// Errors: the file cannot be read; it is not a valid rule file (the error names the
    /// field, e.g. `rules[1].rate: must be > 0`).
    pub fn qos_file_rules(&self) -> Result<Option<Vec<Rule>>, ConfigError> {
        let Some(path) = &self.qos_config else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::QosRead {
            path: path.clone(),
            error,
        })?;
        rules::parse_file(&text)
            .map(Some)
            .map_err(|error| ConfigError::QosRules {
                path: path.clone(),
                error,
            })
    }

    /// Overload protection's thresholds.
    ///
    /// Errors: the bounds are out of order (low ≤ normal ≤ high must hold).
    pub fn qos_thresholds(&self) -> Result<Thresholds, ConfigError> {
        let t = Thresholds {
            max_apply_lag: self.qos_max_apply_lag,
            max_priority_apply_lag: self.qos_max_priority_apply_lag,
            low_apply_lag: self.qos_low_apply_lag,
            low_queue_depth: self.qos_low_queue_depth,
        };
        t.validate()?;
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_rule_file_is_refused_naming_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qos.yaml");
        std::fs::write(
            &path,
            "rules:\n  - {name: a, rate: 5}\n  - {name: b, rate: 0}\n",
        )
        .unwrap();
        let mut cfg = Config {
            qos_config: Some(path.clone()),
            ..Config::default()
        };
        let e = cfg.normalize().unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "invalid --qos-config {}: rules[1].rate: must be > 0",
                path.display()
            )
        );
        std::fs::write(&path, "rules:\n  - {name: a, rate: 5}\n").unwrap();
        let rules = cfg.qos_file_rules().unwrap().unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].rate, Some(5));
        cfg.qos_config = Some(dir.path().join("missing.yaml"));
        assert!(
            cfg.normalize()
                .unwrap_err()
                .to_string()
                .starts_with("cannot read --qos-config ")
        );
    }

    #[test]
    fn thresholds_come_from_the_flags_and_are_checked() {
        let mut cfg = Config::default();
        assert_eq!(cfg.qos_thresholds().unwrap(), Thresholds::default());
        cfg.qos_low_apply_lag = 6_000;
        assert!(cfg.normalize().is_err());
    }
}
