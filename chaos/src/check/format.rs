//! Human-readable one-line renderings of operations for reports.

use crate::history::{Input, Operation, Outcome, Output};

/// Formats nanoseconds since run start as seconds with microsecond precision.
pub fn format_ns(ns: u64) -> String {
    format!(
        "{}.{:06}s",
        ns / 1_000_000_000,
        (ns % 1_000_000_000) / 1_000
    )
}

/// `[invoke .. return] client C @member M: put(k, v) -> ok rev 12`; the return is `?` for an
/// unknown outcome and `inf` for a write the minimiser freed of its real-time bound.
pub fn format_operation(op: &Operation) -> String {
    let returned = match op.outcome {
        Outcome::Unknown(_) => "?".to_string(),
        // The minimiser frees acknowledged writes of their real-time bound this way.
        _ if op.return_ns == u64::MAX => "inf".to_string(),
        _ => format_ns(op.return_ns),
    };
    format!(
        "[{} .. {}] client {} @member {}: {} -> {}",
        format_ns(op.invoke_ns),
        returned,
        op.client,
        op.member,
        format_input(&op.input),
        format_outcome(&op.outcome)
    )
}

/// `get(k)`, `get(k, serializable)`, `put(k, v)`, `delete(k)`, `cas(k, absent -> v)`.
pub fn format_input(input: &Input) -> String {
    match input {
        Input::Get {
            key,
            linearizable: true,
        } => format!("get({key})"),
        Input::Get {
            key,
            linearizable: false,
        } => format!("get({key}, serializable)"),
        Input::Put { key, value } => format!("put({key}, {value})"),
        Input::Delete { key } => format!("delete({key})"),
        Input::Cas { key, expect, value } => {
            format!(
                "cas({key}, {} -> {value})",
                expect.as_deref().unwrap_or("absent")
            )
        }
    }
}

/// `ok <output>`, `failed (reason)`, `unknown (reason)`.
pub fn format_outcome(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Ok(output) => format!("ok {}", format_output(output)),
        Outcome::Failed(why) => format!("failed ({why})"),
        Outcome::Unknown(why) => format!("unknown ({why})"),
    }
}

fn format_output(output: &Output) -> String {
    match output {
        Output::Get {
            kv: Some((value, mod_revision)),
            revision,
        } => {
            format!("{value} mod_rev {mod_revision} (rev {revision})")
        }
        Output::Get { kv: None, revision } => format!("absent (rev {revision})"),
        Output::Put { revision } => format!("rev {revision}"),
        Output::Delete { deleted, revision } => format!("deleted {deleted} rev {revision}"),
        Output::Cas {
            succeeded,
            revision,
        } => format!("succeeded {succeeded} rev {revision}"),
    }
}
