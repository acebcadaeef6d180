//! Serializable reads (etcd `RangeRequest.serializable`) may be stale, so they are not held to
//! linearizability; they must still not read out of thin air: a returned value must have been
//! written to that key by a put or CAS invoked before the read returned, and when that write
//! was acknowledged, at the revision it was acknowledged with.

use std::collections::HashMap;

use crate::history::{Input, Operation, Outcome, Output};

use super::format::format_ns;
use super::report::{Checker, Violation};

/// Checks every `Ok` serializable `Get` of `ops` (all keys) against the writes of `ops`.
pub fn check_serializable_reads(ops: &[Operation]) -> Vec<Violation> {
    // value -> the write that wrote it (values are unique per run).
    let mut writes: HashMap<&str, &Operation> = HashMap::new();
    for op in ops {
        if let Input::Put { value, .. } | Input::Cas { value, .. } = &op.input
            && !matches!(op.outcome, Outcome::Failed(_))
        {
            writes.insert(value, op);
        }
    }
    let mut violations = Vec::new();
    for read in ops {
        let (
            Input::Get {
                key,
                linearizable: false,
            },
            Outcome::Ok(Output::Get {
                kv: Some((value, mod_revision)),
                ..
            }),
        ) = (&read.input, &read.outcome)
        else {
            continue;
        };
        let problem = match writes.get(value.as_str()) {
            None => Some("no write of this value exists".to_string()),
            Some(write) if write.input.key() != key => Some(format!(
                "the value was written to key {:?}",
                write.input.key()
            )),
            Some(write) if write.invoke_ns > read.return_ns => Some(format!(
                "the write of this value was invoked at {}, after the read returned",
                format_ns(write.invoke_ns)
            )),
            Some(write) => match &write.outcome {
                Outcome::Ok(
                    Output::Put { revision }
                    | Output::Cas {
                        revision,
                        succeeded: true,
                    },
                ) if revision != mod_revision => Some(format!(
                    "the write was acknowledged at revision {revision}, the read says {mod_revision}"
                )),
                Outcome::Ok(Output::Cas {
                    succeeded: false, ..
                }) => {
                    Some("the only write of this value was a CAS whose compare failed".to_string())
                }
                _ => None,
            },
        };
        if let Some(problem) = problem {
            let mut violation = Violation::new(
                Checker::SerializableRead,
                Some(key.clone()),
                format!("serializable read of {value:?} out of thin air: {problem}"),
            );
            violation.sub_history.push(read.clone());
            if let Some(write) = writes.get(value.as_str()) {
                violation.sub_history.insert(0, (*write).clone());
            }
            violations.push(violation);
        }
    }
    violations
}
