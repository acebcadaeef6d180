//! QoS rule changes in apply (issue 17, docs/qos.md "Replication"): the rule set is part of
//! the applied state. A `qos_rule_change` entry is decoded, applied to the stored set
//! ([`RuleSet::apply`], a pure function, so every member computes the same set or the same
//! refusal), and the new set is staged under [`schema::QOS_RULES`] in the entry's batch,
//! next to the consistent index. The member's [`Admission`] takes the set when the entry is
//! staged, at load (restart) and after a snapshot install.

use std::sync::Arc;

use crate::backend::{Batch, schema};
use crate::error::EtcdError;
use crate::qos::{Admission, RuleChange, RuleError, RuleSet};

/// The rules of the applied state and the admission they are put in force in.
pub(super) struct QosRules {
    rules: RuleSet,
    admission: Option<Arc<Admission>>,
}

impl QosRules {
    /// The rule set stored in `tree` (the empty set at version 0 if none was ever applied).
    ///
    /// Errors: sled I/O; a stored value that does not decode (a newer format, corruption).
    pub(super) fn load(tree: &sled::Tree) -> Result<QosRules, super::ApplyError> {
        let rules = match tree.get(schema::QOS_RULES)? {
            Some(bytes) => RuleSet::decode(&bytes).map_err(super::ApplyError::Qos)?,
            None => RuleSet::empty(),
        };
        Ok(QosRules {
            rules,
            admission: None,
        })
    }

    /// Puts the rules in force in `admission`, now and after every change.
    pub(super) fn set_admission(&mut self, admission: Arc<Admission>) {
        admission.set_rules(self.rules.clone());
        self.admission = Some(admission);
    }

    /// The member's admission, if one is attached.
    pub(super) fn admission(&self) -> Option<&Arc<Admission>> {
        self.admission.as_ref()
    }

    /// Reloads the set from `tree` (after a snapshot install replaced it) and puts it in force.
    pub(super) fn reload(&mut self, tree: &sled::Tree) -> Result<(), super::ApplyError> {
        let admission = self.admission.take();
        *self = QosRules::load(tree)?;
        if let Some(a) = admission {
            self.set_admission(a);
        }
        Ok(())
    }

    /// Applies the encoded [`RuleChange`] `change`: stages the new set in `batch` and returns
    /// it, to be [`QosRules::publish`]ed once the entry is staged.
    ///
    /// Errors: `InvalidArgument` with the [`RuleError`] text (naming the field) for a change
    /// that does not decode or does not apply; nothing is staged then.
    pub(super) fn stage(&self, batch: &mut Batch, change: &[u8]) -> Result<RuleSet, EtcdError> {
        let invalid = |e: RuleError| EtcdError::InvalidArgument(e.to_string());
        let change = RuleChange::decode(change).map_err(invalid)?;
        let next = self.rules.apply(&change).map_err(invalid)?;
        batch.insert(schema::QOS_RULES, next.encode());
        Ok(next)
    }

    /// Makes `next` (from [`QosRules::stage`]) the rules in force.
    pub(super) fn publish(&mut self, next: RuleSet) {
        if let Some(a) = &self.admission {
            a.set_rules(next.clone());
        }
        self.rules = next;
    }

    /// The rules of the applied state.
    pub(super) fn rules(&self) -> &RuleSet {
        &self.rules
    }
}
