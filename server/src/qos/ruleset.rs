//! [`RuleSet`]: the rules every member applies, as replicated through raft, and
//! [`RuleChange`]: the changes to them (add, update, remove, replace).
//!
//! Rules must be applied identically on every member at the same log index, so:
//! - a set has exactly one encoding ([`RuleSet::encode`], canonical JSON: fixed field order,
//!   normal-form rules, no whitespace) and [`RuleSet::decode`] accepts only that encoding,
//!   so `decode(b) == Ok(s)` iff `encode(s) == b`;
//! - [`RuleSet::apply`] is a pure function of the set and the change: no clock, no
//!   configuration, no member identity. A refused change is refused on every member, with
//!   the same error, and leaves the set as it was;
//! - every successful change increments [`RuleSet::version`] by one, so members can compare
//!   the rules they hold by version;
//! - the encodings carry [`FORMAT`]; a member refuses a format it does not know instead of
//!   guessing. A new format ships behind the cluster version (docs/qos.md).
//!
//! Rule order is meaningful: a request is governed by the first rule that matches it
//! ([`super::Matcher`]).

use serde::{Deserialize, Serialize};

use super::rules::{self, Rule, RuleError};

/// The format number of [`RuleSet::encode`] and [`RuleChange::encode`].
pub const FORMAT: u32 = 1;

/// A validated, versioned, ordered list of rules (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RuleSet {
    version: u64,
    rules: Vec<Rule>,
}

/// The encoded shape of a [`RuleSet`]; field order is the canonical order.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EncodedSet {
    format: u32,
    version: u64,
    rules: Vec<Rule>,
}

impl RuleSet {
    /// The empty set at version 0 (a cluster that never set rules).
    pub fn empty() -> RuleSet {
        RuleSet::default()
    }

    /// A set of `rules` (validated, path `rules[i]`) at `version`.
    pub fn new(version: u64, rules: Vec<Rule>) -> Result<RuleSet, RuleError> {
        Ok(RuleSet {
            version,
            rules: rules::validate(rules, "rules")?,
        })
    }

    /// The rules of a rule file ([`rules::parse_file`]) at version 0.
    pub fn from_yaml(text: &str) -> Result<RuleSet, RuleError> {
        Ok(RuleSet {
            version: 0,
            rules: rules::parse_file(text)?,
        })
    }

    /// How many changes made this set.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The rules, in matching order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The rule named `name`.
    pub fn get(&self, name: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| r.name == name)
    }

    /// The canonical encoding: compact JSON `{"format":1,"version":V,"rules":[...]}`.
    pub fn encode(&self) -> Vec<u8> {
        encode(&EncodedSet {
            format: FORMAT,
            version: self.version,
            rules: self.rules.clone(),
        })
    }

    /// Reads a canonical encoding back.
    ///
    /// # Errors
    /// [`RuleError::Syntax`] for bytes that are not an encoding of this format, including a
    /// non-canonical spelling of one; [`RuleError::Invalid`] for a rule that does not
    /// validate.
    pub fn decode(bytes: &[u8]) -> Result<RuleSet, RuleError> {
        let e: EncodedSet = decode(bytes, "rule set")?;
        let set = RuleSet::new(e.version, e.rules)?;
        canonical(bytes, &set.encode(), "rule set")?;
        Ok(set)
    }

    /// The set after `change`, at the next version; the same on every member.
    ///
    /// # Errors
    /// [`RuleError::Invalid`]: a rule that does not validate (path `rule.field` or
    /// `rules[i].field`), a name that exists (add) or does not (update, remove, `before`),
    /// more than [`rules::MAX_RULES`] rules.
    pub fn apply(&self, change: &RuleChange) -> Result<RuleSet, RuleError> {
        let mut rules = self.rules.clone();
        let find = |rules: &[Rule], name: &str| rules.iter().position(|r| r.name == name);
        match change {
            RuleChange::Add { rule, before } => {
                let rule = rule.clone().validated("rule")?;
                if find(&rules, &rule.name).is_some() {
                    return Err(RuleError::invalid(
                        "rule.name",
                        format!("a rule named {:?} exists", rule.name),
                    ));
                }
                let at = match before {
                    None => rules.len(),
                    Some(b) => find(&rules, b).ok_or_else(|| {
                        RuleError::invalid("before", format!("no rule named {b:?}"))
                    })?,
                };
                rules.insert(at, rule);
            }
            RuleChange::Update { rule } => {
                let rule = rule.clone().validated("rule")?;
                let at = find(&rules, &rule.name).ok_or_else(|| {
                    RuleError::invalid("rule.name", format!("no rule named {:?}", rule.name))
                })?;
                rules[at] = rule;
            }
            RuleChange::Remove { name } => {
                let at = find(&rules, name)
                    .ok_or_else(|| RuleError::invalid("name", format!("no rule named {name:?}")))?;
                rules.remove(at);
            }
            RuleChange::Replace { rules: new } => rules = new.clone(),
        }
        Ok(RuleSet {
            version: self.version + 1,
            rules: rules::validate(rules, "rules")?,
        })
    }
}

/// A change to the replicated [`RuleSet`]: the payload of the raft entry that the admin
/// API proposes (docs/qos.md, "wiring"). Applied by [`RuleSet::apply`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum RuleChange {
    /// Adds a rule with a new name, before the rule named `before` or, without it, last.
    Add {
        /// The new rule.
        rule: Rule,
        /// The rule it goes before (it then takes precedence over that one).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        before: Option<String>,
    },
    /// Replaces the rule of the same name, in place (its bucket restarts if its rate or
    /// burst changed; see [`super::Limiters::rebuild`]).
    Update {
        /// The rule's new form.
        rule: Rule,
    },
    /// Removes the rule named `name`.
    Remove {
        /// The rule's name.
        name: String,
    },
    /// Replaces every rule (a rule file loaded at run time or at start).
    Replace {
        /// The new rules, in matching order.
        rules: Vec<Rule>,
    },
}

/// The encoded shape of a [`RuleChange`].
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EncodedChange {
    format: u32,
    change: RuleChange,
}

impl RuleChange {
    /// The canonical encoding: compact JSON `{"format":1,"change":{"add":{...}}}`.
    pub fn encode(&self) -> Vec<u8> {
        encode(&EncodedChange {
            format: FORMAT,
            change: self.clone(),
        })
    }

    /// Reads a canonical encoding back (the rules in it are validated when applied).
    pub fn decode(bytes: &[u8]) -> Result<RuleChange, RuleError> {
        let e: EncodedChange = decode(bytes, "rule change")?;
        canonical(bytes, &e.change.encode(), "rule change")?;
        Ok(e.change)
    }
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("a rule set serializes")
}

fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8], what: &str) -> Result<T, RuleError> {
    // The format is read first, alone, so a newer format is named as such rather than
    // failing on a field this member does not know.
    #[derive(Deserialize)]
    struct Format {
        format: u32,
    }
    let syntax = |e: serde_json::Error| RuleError::Syntax(format!("{what}: {e}"));
    let f: Format = serde_json::from_slice(bytes).map_err(syntax)?;
    if f.format != FORMAT {
        return Err(RuleError::Syntax(format!(
            "{what}: format {} is not supported (this member reads format {FORMAT})",
            f.format
        )));
    }
    serde_json::from_slice(bytes).map_err(syntax)
}

fn canonical(bytes: &[u8], again: &[u8], what: &str) -> Result<(), RuleError> {
    if bytes == again {
        return Ok(());
    }
    Err(RuleError::Syntax(format!("{what}: not in canonical form")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qos::rules::Match;

    fn rule(name: &str, rate: u32) -> Rule {
        Rule {
            name: name.into(),
            matches: Match::default(),
            rate: Some(rate),
            burst: None,
            max_in_flight: None,
            priority: None,
        }
    }

    #[test]
    fn encoding_is_canonical_and_round_trips() {
        let set = RuleSet::new(7, vec![rule("a", 5)]).unwrap();
        let bytes = set.encode();
        assert_eq!(
            String::from_utf8(bytes.clone()).unwrap(),
            r#"{"format":1,"version":7,"rules":[{"name":"a","rate":5,"burst":5}]}"#
        );
        assert_eq!(RuleSet::decode(&bytes).unwrap(), set);
        // The same set spelled another way is refused: one set, one encoding.
        let spaced = br#"{"format":1, "version":7,"rules":[{"name":"a","rate":5,"burst":5}]}"#;
        assert_eq!(
            RuleSet::decode(spaced).unwrap_err().to_string(),
            "rule set: not in canonical form"
        );
        // Normal form: the omitted burst is written out, so this is not canonical either.
        let short = br#"{"format":1,"version":7,"rules":[{"name":"a","rate":5}]}"#;
        assert!(RuleSet::decode(short).is_err());
        assert_eq!(
            RuleSet::decode(br#"{"format":2,"version":7,"rules":[]}"#)
                .unwrap_err()
                .to_string(),
            "rule set: format 2 is not supported (this member reads format 1)"
        );
    }

    #[test]
    fn changes_round_trip_and_apply_purely() {
        let change = RuleChange::Add {
            rule: rule("b", 1),
            before: Some("a".into()),
        };
        let bytes = change.encode();
        assert_eq!(
            String::from_utf8(bytes.clone()).unwrap(),
            r#"{"format":1,"change":{"add":{"rule":{"name":"b","rate":1},"before":"a"}}}"#
        );
        assert_eq!(RuleChange::decode(&bytes).unwrap(), change);

        let set = RuleSet::new(3, vec![rule("a", 5)]).unwrap();
        let next = set.apply(&change).unwrap();
        assert_eq!(next, set.apply(&change).unwrap());
        assert_eq!(next.version(), 4);
        let names: Vec<_> = next.rules().iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["b", "a"]);
        assert_eq!(
            next.apply(&change).unwrap_err().to_string(),
            "rule.name: a rule named \"b\" exists"
        );
    }
}
