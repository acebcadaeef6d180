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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use keel_proto::keelpb::{self, RaftRequest, raft_request, raft_response};
    use openraft::{CommittedLeaderId, EntryPayload};

    use crate::apply::Applier;
    use crate::membership::Attributes;
    use crate::mvcc::MvccStore;
    use crate::mvcc::test_support::temp_tree;
    use crate::qos::{Admission, LoadGauge, Method, RequestInfo, RuleChange, Thresholds};
    use crate::raft::types::{Entry, Request};

    fn change(index: u64, change: &RuleChange) -> Entry {
        raw(index, change.encode())
    }

    fn raw(index: u64, bytes: Vec<u8>) -> Entry {
        Entry {
            log_id: openraft::LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Request::new(RaftRequest {
                auth_header: None,
                id: index,
                request: Some(raft_request::Request::QosRuleChange(
                    keelpb::QosRuleChange { change: bytes },
                )),
            })),
        }
    }

    fn open(tree: &sled::Tree) -> (Applier, Arc<Admission>) {
        // Auth and QoS entries need cluster version 0.2 (version::gates).
        crate::version::store_for_test(tree, crate::version::Version::V0_2);
        let store = Arc::new(MvccStore::open(tree.clone()).unwrap());
        let mut a = Applier::open(tree.clone(), store, Arc::new(Attributes::default())).unwrap();
        let admission = Arc::new(Admission::new(
            crate::qos::RuleSet::empty(),
            Thresholds::default(),
            Arc::new(LoadGauge::default()),
        ));
        a.set_admission(admission.clone());
        (a, admission)
    }

    fn add(yaml: &str) -> RuleChange {
        RuleChange::Add {
            rule: crate::qos::Rule::from_yaml(yaml).unwrap(),
            before: None,
        }
    }

    #[test]
    fn a_rule_change_is_stored_with_its_index_put_in_force_and_reloaded() {
        let tree = temp_tree();
        let (mut a, admission) = open(&tree);
        let put = RequestInfo::new(Method::Put).keys(b"/r/1", b"");
        assert!(!admission.check(&put).unwrap().is_ruled());

        let resp = a
            .apply(&change(
                1,
                &add("{name: r, rate: 1, match: {key_prefix: /r/}}"),
            ))
            .unwrap();
        assert_eq!(
            resp.0.response,
            Some(raft_response::Response::QosRuleChange(
                keelpb::QosRuleChangeResponse { version: 1 }
            ))
        );
        assert!(
            admission.check(&put).unwrap().is_ruled(),
            "in force at once"
        );
        assert_eq!(
            admission.load().load().applied,
            1,
            "apply reports its index"
        );

        // A change that does not apply is refused naming the field; the rules stay.
        let resp = a.apply(&change(2, &add("{name: r, rate: 5}"))).unwrap();
        let Some(raft_response::Response::Error(e)) = resp.0.response else {
            panic!("{resp:?}");
        };
        assert_eq!(e.message, "rule.name: a rule named \"r\" exists");
        assert_eq!(e.code, tonic::Code::InvalidArgument as i32);
        let resp = a.apply(&raw(3, b"{\"format\":9}".to_vec())).unwrap();
        assert!(matches!(
            resp.0.response,
            Some(raft_response::Response::Error(_))
        ));
        assert_eq!(a.qos_rules().version(), 1);
        assert_eq!(a.last_applied().map(|l| l.index), Some(3));

        // A restart reads the stored set back (it was written with the consistent index).
        drop(a);
        let (reopened, admission) = open(&tree);
        assert_eq!(reopened.qos_rules().version(), 1);
        assert_eq!(reopened.qos_rules().rules()[0].name, "r");
        assert!(admission.check(&put).unwrap().is_ruled());
    }

    /// Overload protection reads the applied index apply reports and the committed index
    /// raft reports (the log store's commit hook): past 5,000 entries of lag a put is
    /// refused, a lease revoke (high) passes up to 10,000, keep-alives (never proposed)
    /// always; a low-priority rule is refused first, past 1,000.
    #[test]
    fn apply_lag_refuses_proposals_but_lease_traffic_passes() {
        let tree = temp_tree();
        let (mut a, admission) = open(&tree);
        a.apply(&change(
            1,
            &add("{name: noisy, rate: 1000000, priority: low, match: {key_prefix: /noisy/}}"),
        ))
        .unwrap();
        let load = admission.load().clone();
        let applied = load.load().applied;
        assert_eq!(applied, 1);
        let put = RequestInfo::new(Method::Put).keys(b"/good/1", b"");
        let noisy = RequestInfo::new(Method::Put).keys(b"/noisy/1", b"");
        let revoke = RequestInfo::new(Method::LeaseRevoke);
        let keep_alive = RequestInfo::new(Method::LeaseKeepAlive);
        let admitted = |r: &RequestInfo<'_>| admission.check(r).is_ok();

        load.set_committed(applied + 1_001);
        assert!(!admitted(&noisy), "low priority goes first");
        assert!(admitted(&put) && admitted(&revoke) && admitted(&keep_alive));

        load.set_committed(applied + 5_001);
        assert_eq!(
            admission.admit(&put).unwrap_err(),
            keel_proto::rpctypes::RpcError::TooManyRequests
        );
        assert!(admitted(&revoke) && admitted(&keep_alive));

        load.set_committed(applied + 10_001);
        assert!(!admitted(&revoke));
        assert!(admitted(&keep_alive), "keep-alives are not proposed");

        // Apply catching up (its own reports) ends the refusals.
        for i in 2..=10_002 {
            a.stage(&Entry {
                log_id: openraft::LogId::new(CommittedLeaderId::new(1, 1), i),
                payload: EntryPayload::Blank,
            })
            .unwrap();
        }
        a.flush().unwrap();
        assert!(admitted(&put) && admitted(&noisy) && admitted(&revoke));
    }
}
