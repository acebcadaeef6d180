//! The sequential specification of one etcd key, as used by the linearizability search.
//!
//! State: the key's value and mod_revision (or absent), plus `floor`, the highest store revision
//! known to have been reached. Revisions matter because etcd answers carry them: a write's
//! revision must exceed every earlier write's to this key and every earlier header revision, and
//! a linearizable read's header revision is at least the key's last change. So operations are
//! linearized in revision order. Writes whose outcome is unknown have no known
//! revision; the state then holds `mod_revision = UNKNOWN_REVISION` until a read reveals it.

use std::collections::HashMap;

use crate::history::{Input, Operation, Outcome, Output};

/// Marks a present value whose mod_revision is not known (written by an `Unknown` op).
pub const UNKNOWN_REVISION: i64 = -1;

/// Interned value: values are unique per run, so equality of ids is equality of writes.
pub type ValueId = u32;

/// The model state of one key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct KeyState {
    /// The current value and its mod_revision (`UNKNOWN_REVISION` when not yet known), or
    /// `None` when the key does not exist. Initially the key does not exist (fresh cluster).
    pub value: Option<(ValueId, i64)>,
    /// Highest revision the store is known to have reached when this state held: the last
    /// change of the key, or a later header revision of an answer about it (0 initially). Every
    /// later change of the key has a higher revision.
    pub floor: i64,
}

impl KeyState {
    /// The state after an answer with header `revision` that changed nothing: the store was at
    /// `revision` then, so any later change of the key gets a higher revision.
    fn after(&self, revision: i64) -> KeyState {
        KeyState {
            value: self.value,
            floor: self.floor.max(revision),
        }
    }
}

/// One operation reduced to what the model needs. `Unknown` variants may or may not have
/// taken effect; the search may leave them out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// A linearizable `Get` that returned `kv` with header `revision`.
    Get {
        kv: Option<(ValueId, i64)>,
        revision: i64,
    },
    Put {
        value: ValueId,
        revision: i64,
    },
    PutUnknown {
        value: ValueId,
    },
    Delete {
        deleted: bool,
        revision: i64,
    },
    DeleteUnknown,
    Cas {
        expect: Option<ValueId>,
        value: ValueId,
        succeeded: bool,
        revision: i64,
    },
    CasUnknown {
        expect: Option<ValueId>,
        value: ValueId,
    },
}

impl Step {
    /// The value this step writes when it takes effect (puts and CAS).
    pub fn written_value(&self) -> Option<ValueId> {
        match *self {
            Step::Put { value, .. } | Step::PutUnknown { value } => Some(value),
            Step::Cas { value, .. } | Step::CasUnknown { value, .. } => Some(value),
            _ => None,
        }
    }

    /// Applies the step to `state`: `None` when the recorded output is impossible in it.
    pub fn apply(&self, state: &KeyState) -> Option<KeyState> {
        let current = state.value.map(|(v, _)| v);
        match *self {
            Step::Get { kv: None, revision } => {
                (state.value.is_none() && revision >= state.floor).then_some(state.after(revision))
            }
            Step::Get {
                kv: Some((value, mod_revision)),
                revision,
            } => {
                let (held, held_rev) = state.value?;
                let rev_ok = if held_rev == UNKNOWN_REVISION {
                    // The unknown write happened after every change we know of.
                    mod_revision > state.floor
                } else {
                    mod_revision == held_rev
                };
                (held == value && rev_ok && revision >= mod_revision).then_some(KeyState {
                    value: Some((value, mod_revision)),
                    floor: state.floor.max(revision),
                })
            }
            Step::Put { value, revision } => (revision > state.floor).then_some(KeyState {
                value: Some((value, revision)),
                floor: revision,
            }),
            Step::PutUnknown { value } => Some(KeyState {
                value: Some((value, UNKNOWN_REVISION)),
                floor: state.floor,
            }),
            Step::Delete {
                deleted: true,
                revision,
            } => (state.value.is_some() && revision > state.floor).then_some(KeyState {
                value: None,
                floor: revision,
            }),
            Step::Delete {
                deleted: false,
                revision,
            } => {
                (state.value.is_none() && revision >= state.floor).then_some(state.after(revision))
            }
            Step::DeleteUnknown => Some(KeyState {
                value: None,
                floor: state.floor,
            }),
            Step::Cas {
                expect,
                value,
                succeeded,
                revision,
            } => {
                if (current == expect) != succeeded {
                    None
                } else if succeeded {
                    (revision > state.floor).then_some(KeyState {
                        value: Some((value, revision)),
                        floor: revision,
                    })
                } else {
                    (revision >= state.floor).then_some(state.after(revision))
                }
            }
            Step::CasUnknown { expect, value } => Some(if current == expect {
                KeyState {
                    value: Some((value, UNKNOWN_REVISION)),
                    floor: state.floor,
                }
            } else {
                *state
            }),
        }
    }
}

/// Interns value strings of one key's sub-history.
#[derive(Default)]
pub struct Values<'a> {
    ids: HashMap<&'a str, ValueId>,
}

impl<'a> Values<'a> {
    /// The id of `value`, allocating one on first sight (a read of a value never written gets
    /// an id no write holds, so the model rejects it).
    pub fn id(&mut self, value: &'a str) -> ValueId {
        let next = self.ids.len() as ValueId;
        *self.ids.entry(value).or_insert(next)
    }
}

/// Converts an operation into a model step: `None` when it is left out of the linearizability
/// search (failed ops, unknown reads, serializable reads, and outputs of the wrong shape, which
/// [`step_of`]'s caller reports separately).
pub fn step_of<'a>(op: &'a Operation, values: &mut Values<'a>) -> Option<Step> {
    let output = match &op.outcome {
        Outcome::Failed(_) => return None,
        Outcome::Unknown(_) => None,
        Outcome::Ok(output) => Some(output),
    };
    match (&op.input, output) {
        (
            Input::Get {
                linearizable: true, ..
            },
            Some(Output::Get { kv, revision }),
        ) => Some(Step::Get {
            kv: kv.as_ref().map(|(v, r)| (values.id(v), *r)),
            revision: *revision,
        }),
        (Input::Get { .. }, _) => None,
        (Input::Put { value, .. }, Some(Output::Put { revision })) => Some(Step::Put {
            value: values.id(value),
            revision: *revision,
        }),
        (Input::Put { value, .. }, None) => Some(Step::PutUnknown {
            value: values.id(value),
        }),
        (Input::Delete { .. }, Some(Output::Delete { deleted, revision })) => Some(Step::Delete {
            deleted: *deleted > 0,
            revision: *revision,
        }),
        (Input::Delete { .. }, None) => Some(Step::DeleteUnknown),
        (
            Input::Cas { expect, value, .. },
            Some(Output::Cas {
                succeeded,
                revision,
            }),
        ) => Some(Step::Cas {
            expect: expect.as_deref().map(|e| values.id(e)),
            value: values.id(value),
            succeeded: *succeeded,
            revision: *revision,
        }),
        (Input::Cas { expect, value, .. }, None) => Some(Step::CasUnknown {
            expect: expect.as_deref().map(|e| values.id(e)),
            value: values.id(value),
        }),
        // An Ok output of the wrong shape for its input: the harness recorded nonsense.
        _ => None,
    }
}
