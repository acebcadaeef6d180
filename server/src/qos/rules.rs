//! The QoS rule model: what one [`Rule`] says, how a rule file is read ([`parse_file`]),
//! and the checks that make a rule valid ([`validate`]), each failing with a
//! [`RuleError`] that names the field (`rules[2].rate: must be > 0`).
//!
//! A rule file (`--qos-config`, docs/qos.md):
//!
//! ```yaml
//! rules:
//!   - name: noisy-writers          # unique; [A-Za-z0-9._-], at most 63 characters
//!     match:                       # every given field must hold; omitted = any
//!       methods: [Put, Txn, DeleteRange]
//!       key_prefix: /noisy/        # or key (+ range_end)
//!       user: alice
//!       range_keys_over: 1000      # expensive reads: a Range returning more keys
//!       range_bytes_over: 1048576  # ... or more bytes (see RangeCost)
//!     rate: 200                    # requests per second (token bucket)
//!     burst: 200                   # bucket size; default: rate
//!     max_in_flight: 64            # concurrent admitted requests
//!     priority: low                # low | normal | high; default: the method's
//! ```
//!
//! Invariants of a validated rule (what [`validate`] returns; the matcher and the
//! limiter rely on them):
//! - `name` is non-empty, at most [`MAX_NAME_LEN`] characters of `[A-Za-z0-9._-]` (it is a
//!   metric label), and unique in its set;
//! - `rate`, `burst` and `max_in_flight` are `> 0` when set; `burst` is set iff `rate` is
//!   (an omitted burst becomes the rate, as in etcd's QoS proof of concept);
//! - the rule sets at least one of `rate`, `max_in_flight`, `priority`;
//! - `methods`, when set, is non-empty, without duplicates, sorted in [`Method`] order;
//! - `key_prefix` excludes `key`/`range_end`; `range_end` needs `key` and is `"\0"` or
//!   after `key`; key fields and `user` are non-empty;
//! - a rule with `range_keys_over`/`range_bytes_over` names no method but `Range` and
//!   `RangeStream`.
//!
//! The normal form (sorted methods, explicit burst) makes equal rules encode equally
//! ([`super::RuleSet::encode`]).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::method::{Method, UnknownName, by_name};

/// The most rules a set holds: matching costs O(rules) per request.
pub const MAX_RULES: usize = 256;

/// The longest rule name (it is the `rule` label of the `keel_qos_*` metrics).
pub const MAX_NAME_LEN: usize = 63;

/// A request's priority under overload ([`super::overload`]): `Low` requests are refused
/// first, `High` ones (lease revokes and keep-alives by default) last.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Refused first: above the low thresholds of [`super::Thresholds`].
    Low,
    /// etcd's behaviour: refused when the apply lag exceeds 5,000 entries.
    #[default]
    Normal,
    /// Refused only when the apply lag exceeds 10,000 entries (etcd 3.7 `PriorityRequest`).
    High,
}

impl Priority {
    /// `low`, `normal` or `high`, as in rule files.
    pub const fn name(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
        }
    }
}

impl std::str::FromStr for Priority {
    type Err = UnknownName;

    /// `low`, `normal` or `high`.
    fn from_str(name: &str) -> Result<Priority, UnknownName> {
        let all = [Priority::Low, Priority::Normal, Priority::High];
        by_name("priority", &all, Priority::name, name)
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which requests a rule governs: every field given must hold; an omitted field matches
/// any request. Keys are UTF-8 strings (YAML escapes such as `"\0"` allowed).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Match {
    /// The RPCs, by `rpc.proto` name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub methods: Option<Vec<Method>>,
    /// Every key the request touches starts with this prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_prefix: Option<String>,
    /// Every key the request touches is this key, or with `range_end` lies in
    /// `[key, range_end)` (`range_end: "\0"`: every key from `key` on), as etcd's
    /// `RangeRequest.key`/`range_end`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// See `key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range_end: Option<String>,
    /// The authenticated user (auth token or TLS CN). A request without a user (auth off)
    /// never matches a rule that names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// An expensive read: a range that returns more than this many keys
    /// ([`super::RangeCost::keys`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range_keys_over: Option<u64>,
    /// An expensive read: a range that returns more than this many bytes
    /// ([`super::RangeCost::bytes`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range_bytes_over: Option<u64>,
}

impl Match {
    /// Whether no field is given (the rule governs every request).
    pub fn is_any(&self) -> bool {
        *self == Match::default()
    }
}

/// One QoS rule: which requests it governs ([`Match`]) and what it does to them (a token
/// bucket, an in-flight cap, a priority). See the module doc for the format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Unique in its set; the `rule` label of the metrics.
    pub name: String,
    /// Which requests the rule governs; omitted = every request.
    #[serde(rename = "match", default, skip_serializing_if = "Match::is_any")]
    pub matches: Match,
    /// Sustained admitted requests per second (the token bucket's refill rate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<u32>,
    /// Requests admitted at once from a full bucket; default: `rate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    /// Admitted requests of this rule that may be in flight at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    /// The requests' priority under overload; default: the method's
    /// ([`Method::default_priority`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
}

/// Why a rule file, a rule or an encoded rule set was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// The text is not the format: bad YAML or JSON, an unknown field, a wrong type. The
    /// message is the parser's, which names the field path and position
    /// (`rules[0].match: unknown field `metods`, ... at line 3 column 7`).
    #[error("{0}")]
    Syntax(String),
    /// A field's value breaks a rule of the model.
    #[error("{path}: {message}")]
    Invalid {
        /// The field, e.g. `rules[2].rate`.
        path: String,
        /// What is wrong with it, e.g. `must be > 0`.
        message: String,
    },
}

impl RuleError {
    /// A refusal of the field at `path`.
    pub fn invalid(path: impl Into<String>, message: impl Into<String>) -> RuleError {
        RuleError::Invalid {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// The top level of a rule file.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    rules: Vec<Rule>,
}

/// Reads a rule file (YAML; JSON is YAML too) into validated rules, in file order.
///
/// # Errors
/// [`RuleError::Syntax`] for text that is not the format, [`RuleError::Invalid`] (path
/// `rules[i].field`) for a value that [`validate`] refuses.
pub fn parse_file(text: &str) -> Result<Vec<Rule>, RuleError> {
    let file: RuleFile =
        serde_norway::from_str(text).map_err(|e| RuleError::Syntax(e.to_string()))?;
    validate(file.rules, "rules")
}

/// Writes `rules` as a rule file that [`parse_file`] reads back to the same rules.
pub fn to_file(rules: &[Rule]) -> String {
    serde_norway::to_string(&RuleFile {
        rules: rules.to_vec(),
    })
    .expect("a rule serializes")
}

impl Rule {
    /// Reads one rule (YAML or JSON, the shape of one entry of a rule file), as the
    /// runtime API receives it, and validates it alone (path `rule.field`); uniqueness in a
    /// set is checked when the rule is added ([`super::RuleChange`]).
    pub fn from_yaml(text: &str) -> Result<Rule, RuleError> {
        let rule: Rule =
            serde_norway::from_str(text).map_err(|e| RuleError::Syntax(e.to_string()))?;
        rule.validated("rule")
    }

    /// Checks this rule alone and returns its normal form; `path` names it in errors
    /// (`rules[2]`). See the module doc for the checks.
    pub fn validated(mut self, path: &str) -> Result<Rule, RuleError> {
        let bad =
            |field: &str, message: &str| RuleError::invalid(format!("{path}.{field}"), message);
        if self.name.is_empty()
            || self.name.chars().count() > MAX_NAME_LEN
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(bad(
                "name",
                "must be 1 to 63 characters of A-Z, a-z, 0-9, '.', '_', '-'",
            ));
        }
        let m = &mut self.matches;
        if let Some(methods) = &mut m.methods {
            if methods.is_empty() {
                return Err(bad(
                    "match.methods",
                    "must not be empty (omit it to match any method)",
                ));
            }
            methods.sort();
            if let Some(w) = methods.windows(2).find(|w| w[0] == w[1]) {
                return Err(bad("match.methods", &format!("lists {} twice", w[0])));
            }
        }
        let empty = |v: &Option<String>| v.as_deref() == Some("");
        if empty(&m.key_prefix) {
            return Err(bad(
                "match.key_prefix",
                "must not be empty (omit it to match any key)",
            ));
        }
        if empty(&m.key) {
            return Err(bad(
                "match.key",
                "must not be empty (omit it to match any key)",
            ));
        }
        if empty(&m.user) {
            return Err(bad(
                "match.user",
                "must not be empty (omit it to match any user)",
            ));
        }
        if m.key_prefix.is_some() && (m.key.is_some() || m.range_end.is_some()) {
            return Err(bad("match.key_prefix", "excludes key and range_end"));
        }
        match (&m.key, &m.range_end) {
            (None, Some(_)) => return Err(bad("match.range_end", "needs match.key")),
            (Some(key), Some(end)) if end != "\0" && end.as_bytes() <= key.as_bytes() => {
                return Err(bad(
                    "match.range_end",
                    "must be after key, or \"\\0\" for every key from key on",
                ));
            }
            _ => {}
        }
        if m.range_keys_over.is_some() || m.range_bytes_over.is_some() {
            let not_a_range = m
                .methods
                .iter()
                .flatten()
                .find(|x| !matches!(x, Method::Range | Method::RangeStream));
            if let Some(x) = not_a_range {
                return Err(bad(
                    "match.methods",
                    &format!(
                        "range_keys_over and range_bytes_over apply to Range and RangeStream only, not {x}"
                    ),
                ));
            }
        }
        for (field, v) in [
            ("rate", self.rate),
            ("burst", self.burst),
            ("max_in_flight", self.max_in_flight),
        ] {
            if v == Some(0) {
                return Err(bad(field, "must be > 0"));
            }
        }
        match (self.rate, self.burst) {
            (None, Some(_)) => return Err(bad("burst", "needs rate")),
            (Some(rate), None) => self.burst = Some(rate),
            _ => {}
        }
        if self.rate.is_none() && self.max_in_flight.is_none() && self.priority.is_none() {
            return Err(RuleError::invalid(
                path,
                "sets none of rate, max_in_flight, priority (the rule would do nothing)",
            ));
        }
        Ok(self)
    }
}

/// Checks a list of rules (each as [`Rule::validated`], plus unique names and at most
/// [`MAX_RULES`]) and returns their normal forms in order; `path` names the list in errors
/// (`rules` → `rules[2].rate`).
pub fn validate(rules: Vec<Rule>, path: &str) -> Result<Vec<Rule>, RuleError> {
    if rules.len() > MAX_RULES {
        return Err(RuleError::invalid(
            path,
            format!(
                "holds {} rules, at most {MAX_RULES} are allowed",
                rules.len()
            ),
        ));
    }
    let mut out: Vec<Rule> = Vec::with_capacity(rules.len());
    for (i, rule) in rules.into_iter().enumerate() {
        let rule = rule.validated(&format!("{path}[{i}]"))?;
        if let Some(j) = out.iter().position(|r| r.name == rule.name) {
            return Err(RuleError::invalid(
                format!("{path}[{i}].name"),
                format!("{:?} is already the name of {path}[{j}]", rule.name),
            ));
        }
        out.push(rule);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_issue_example_parses_to_its_normal_form() {
        let rules = parse_file(
            "rules:
  - name: noisy-writers
    match:
      methods: [Txn, Put, DeleteRange]
      key_prefix: /noisy/
      user: alice
    rate: 200
    priority: low
",
        )
        .unwrap();
        assert_eq!(
            rules,
            [Rule {
                name: "noisy-writers".into(),
                matches: Match {
                    methods: Some(vec![Method::Put, Method::DeleteRange, Method::Txn]),
                    key_prefix: Some("/noisy/".into()),
                    user: Some("alice".into()),
                    ..Match::default()
                },
                rate: Some(200),
                burst: Some(200),
                max_in_flight: None,
                priority: Some(Priority::Low),
            }]
        );
        assert_eq!(parse_file(&to_file(&rules)).unwrap(), rules);
    }

    #[test]
    fn errors_name_the_field() {
        let err = |text: &str| parse_file(text).unwrap_err().to_string();
        assert_eq!(
            err("rules: [{name: a, rate: 1}, {name: b, rate: 0}]"),
            "rules[1].rate: must be > 0"
        );
        assert!(
            err("rules: [{name: a, rate: 1, match: {metods: [Put]}}]")
                .starts_with("rules[0].match: unknown field `metods`, expected one of"),
        );
        assert!(err("rules: [{name: a, rate: x}]").starts_with("rules[0].rate: invalid type"));
    }

    #[test]
    fn a_set_holds_at_most_max_rules() {
        let file = |n: usize| {
            let rules: Vec<String> = (0..n).map(|i| format!("{{name: r{i}, rate: 1}}")).collect();
            format!("rules: [{}]", rules.join(", "))
        };
        assert_eq!(parse_file(&file(MAX_RULES)).unwrap().len(), MAX_RULES);
        assert_eq!(
            parse_file(&file(MAX_RULES + 1)).unwrap_err().to_string(),
            "rules: holds 257 rules, at most 256 are allowed"
        );
    }
}
