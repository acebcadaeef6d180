//! The human-readable report of a run. Its last line is always
//! `chaos: N ops, F faults, V violations` (N operations recorded, F faults injected, V checker
//! violations plus exceeded resource bounds), which scripts and tests match.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::RunResult;
use super::faults::describe;
use crate::history::{Input, Outcome};

/// What the report says about the run's set-up.
pub struct RunHeader {
    pub seed: u64,
    pub nodes: usize,
    pub faults: String,
    pub inject: Option<String>,
    pub binary: String,
    pub dir: String,
}

/// Renders the whole report, ending with [`last_line`].
pub fn render(header: &RunHeader, result: &RunResult) -> String {
    let mut out = String::new();
    let h = &result.history;
    let _ = writeln!(out, "==== keel-chaos report");
    let _ = writeln!(out, "seed: {}", header.seed);
    let _ = writeln!(
        out,
        "cluster: {} members, binary {}, dir {}",
        header.nodes, header.binary, header.dir
    );
    let _ = writeln!(
        out,
        "faults enabled: {}{}",
        header.faults,
        header
            .inject
            .as_ref()
            .map(|i| format!(", injected bug: {i}"))
            .unwrap_or_default()
    );
    let _ = writeln!(out, "workload: {:.1}s", result.workload_time.as_secs_f64());
    let _ = writeln!(out, "faults injected ({}):", result.faults.len());
    for f in &result.faults {
        let _ = writeln!(out, "  {}", describe(f));
    }
    let _ = writeln!(out, "operations ({}):", h.operations.len());
    let mut by_kind: BTreeMap<&str, [usize; 3]> = BTreeMap::new();
    for op in &h.operations {
        let kind = match &op.input {
            Input::Get {
                linearizable: true, ..
            } => "get",
            Input::Get { .. } => "get (serializable)",
            Input::Put { .. } => "put",
            Input::Delete { .. } => "delete",
            Input::Cas { .. } => "cas",
        };
        let slot = match op.outcome {
            Outcome::Ok(_) => 0,
            Outcome::Failed(_) => 1,
            Outcome::Unknown(_) => 2,
        };
        by_kind.entry(kind).or_default()[slot] += 1;
    }
    for (kind, [ok, failed, unknown]) in &by_kind {
        let _ = writeln!(
            out,
            "  {kind:<20} ok {ok:>6}  failed {failed:>6}  unknown {unknown:>6}"
        );
    }
    let events: usize = h
        .watches
        .iter()
        .flat_map(|w| &w.responses)
        .map(|r| r.events.len())
        .sum();
    let _ = writeln!(
        out,
        "watch streams: {}, events received: {events}",
        h.watches.len()
    );
    if let Some(k) = &result.kubernetes {
        let _ = writeln!(out, "kubernetes traffic ({} ops):", k.ops());
        for (kind, [ok, failed]) in &k.counts {
            let _ = writeln!(out, "  {kind:<22} ok {ok:>6}  failed {failed:>6}");
        }
        let _ = writeln!(
            out,
            "watch caches: {} lists, {} events, {} re-dials, {} checkpoints compared",
            k.caches, k.events, k.redials, k.checkpoints
        );
    }
    for f in &h.finals {
        let _ = writeln!(
            out,
            "final: member {} revision {} compact revision {} hash {:08x}",
            f.member, f.revision, f.compact_revision, f.hash
        );
    }
    let s = &result.report.stats;
    let _ = writeln!(
        out,
        "check: {} of {} keys searched to the end, {} search states, {} watch events, {:.1}s",
        s.keys_checked,
        s.keys,
        s.search_states,
        s.watch_events,
        s.elapsed.as_secs_f64()
    );
    for line in &result.report.inconclusive {
        let _ = writeln!(out, "inconclusive: {line}");
    }
    out.push_str(&super::resource_summary::render(&result.resources));
    for e in &result.errors {
        let _ = writeln!(out, "harness error: {e}");
    }
    let _ = writeln!(out, "violations ({}):", result.report.violations.len());
    for v in &result.report.violations {
        let _ = writeln!(out, "  {}", v.to_string().replace('\n', "\n  "));
    }
    out.push_str(&last_line(result));
    out.push('\n');
    out
}

/// `chaos: N ops, F faults, V violations`.
pub fn last_line(result: &RunResult) -> String {
    format_totals(Totals {
        ops: result.history.operations.len() as u64
            + result.kubernetes.as_ref().map_or(0, |k| k.ops()),
        faults: result.faults.len() as u64,
        violations: (result.report.violations.len() + result.resources.violations.len()) as u64,
    })
}

/// The counts of a report's last line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Totals {
    /// Operations recorded.
    pub ops: u64,
    /// Faults injected.
    pub faults: u64,
    /// Checker violations.
    pub violations: u64,
}

fn format_totals(t: Totals) -> String {
    format!(
        "chaos: {} ops, {} faults, {} violations",
        t.ops, t.faults, t.violations
    )
}

/// Reads the totals back from a report's last line (`None` if `line` is not one), for scripts
/// and tests that run `keel-chaos`.
pub fn parse_totals(line: &str) -> Option<Totals> {
    let rest = line.strip_prefix("chaos: ")?;
    let mut parts = rest.split(", ");
    let mut count = |unit: &str| -> Option<u64> {
        let (n, found) = parts.next()?.split_once(' ')?;
        (found == unit).then_some(())?;
        n.parse().ok()
    };
    let totals = Totals {
        ops: count("ops")?,
        faults: count("faults")?,
        violations: count("violations")?,
    };
    parts.next().is_none().then_some(totals)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_line_parses_back() {
        let t = Totals {
            ops: 1234,
            faults: 5,
            violations: 0,
        };
        assert_eq!(parse_totals(&format_totals(t)), Some(t));
        assert_eq!(parse_totals("chaos: 3 ops, 1 faults"), None);
        assert_eq!(parse_totals("chaos: seed 7, run dir /tmp/x"), None);
    }
}
