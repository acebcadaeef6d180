//! Goldenscript scenario tests of QoS: `qos/testscripts/*.txt`. Each script drives one
//! member's [`Admission`] whose token buckets run on a fake clock (governor's
//! `FakeRelativeClock`), so bucket accounting is exact. How to write and update them:
//! `docs/testing.md`.
//!
//! Commands:
//! - rules: `file YAML` (a rule file, put in force as a `replace` change), `add RULE
//!   [before=NAME]`, `update RULE`, `remove NAME` (`RULE` is one rule in YAML or JSON). Each
//!   change is encoded and decoded as the raft entry would be, applied to the rules in
//!   force, and on success put in force; it prints the new version and rule order. A
//!   refused change prints its error and changes nothing. `rules` prints the version and
//!   each rule in its normal form (canonical JSON); `encode` prints the set's encoding;
//!   `decode TEXT` decodes an encoding and prints its rules.
//! - requests: `match METHOD [key=K] [range_end=E] [user=U] [limit=N count=N
//!   bytes_per_kv=N count_only=BOOL] [proposal=BOOL]` prints the governing rule and the
//!   priority. `admit` takes the same arguments plus `[n=N] [hold=LABEL]`: it admits the
//!   request N times (default 1), printing how many were allowed and refused, by reason;
//!   a single refused request is the command's error (etcd's text and code). `hold=LABEL`
//!   keeps the permits alive until `release LABEL`. `flood REQUEST n=N every=DURATION
//!   for=DURATION` offers N requests per tick of the fake clock (each answered at once)
//!   and prints the totals.
//! - time and load: `advance DURATION` (`250ms`, `2s`) moves the fake clock; `gauge
//!   [applied=I] [committed=I] [queued=N]` sets the member's load; `decide PRIORITY
//!   applied=I committed=I [queued=N]` prints the pure overload decision.
//! - `stats`: every rule's counters and the overload refusals of unmatched requests.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::sync::Arc;
use std::time::Duration;

use governor::clock::FakeRelativeClock;
use keel_proto::rpctypes::RpcError;

use crate::mvcc::tests_golden::script::{self, Args, Cmd, Result};
use crate::qos::{
    Admission, Load, Method, Permit, Priority, RangeCost, Refused, RequestInfo, Rule, RuleChange,
    RuleSet, Thresholds, overload, rules,
};

test_each_file::test_each_path! { in "server/src/qos/testscripts" as scripts => run_script }

fn run_script(path: &std::path::Path) {
    let clock = FakeRelativeClock::default();
    let admission = Admission::with_clock(
        RuleSet::empty(),
        Thresholds::default(),
        Arc::default(),
        clock.clone(),
    );
    script::run(
        path,
        QosRunner {
            clock,
            admission,
            held: HashMap::new(),
        },
    )
}

struct QosRunner {
    clock: FakeRelativeClock,
    admission: Admission<FakeRelativeClock>,
    held: HashMap<String, Vec<Permit>>,
}

/// An owned request, borrowed as a [`RequestInfo`].
struct Request {
    method: Method,
    key: String,
    range_end: String,
    user: Option<String>,
    range: Option<RangeCost>,
    proposal: Option<bool>,
}

impl Request {
    fn parse(args: &mut Args) -> Result<Request> {
        let method = args.pos("method")?.parse::<Method>()?;
        let (limit, count) = (args.take("limit"), args.take("count"));
        let range = if limit.is_some() || count.is_some() {
            Some(RangeCost::estimate(
                limit.map_or(Ok(0), |v| v.parse())?,
                count.map_or(Ok(0), |v| v.parse())?,
                args.flag("count_only")?,
                args.num("bytes_per_kv", 0)?,
            ))
        } else {
            None
        };
        Ok(Request {
            method,
            key: args.take("key").unwrap_or_default(),
            range_end: args.take("range_end").unwrap_or_default(),
            user: args.take("user"),
            range,
            proposal: args.take("proposal").map(|v| v.parse()).transpose()?,
        })
    }

    fn info(&self) -> RequestInfo<'_> {
        let mut info = RequestInfo::new(self.method)
            .keys(self.key.as_bytes(), self.range_end.as_bytes())
            .user(self.user.as_deref());
        if let Some(cost) = self.range {
            info = info.range_cost(cost);
        }
        if let Some(p) = self.proposal {
            info = info.proposal(p);
        }
        info
    }
}

/// Outcomes of many admissions: allowed, and refused by reason in first-seen order.
#[derive(Default)]
struct Tally {
    allowed: usize,
    refused: Vec<(String, usize)>,
}

impl Tally {
    fn add(&mut self, outcome: std::result::Result<(), Refused>) {
        let why = match outcome {
            Ok(()) => return self.allowed += 1,
            Err(why) => why.to_string(),
        };
        match self.refused.iter_mut().find(|(w, _)| *w == why) {
            Some((_, c)) => *c += 1,
            None => self.refused.push((why, 1)),
        }
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total: usize = self.refused.iter().map(|(_, c)| c).sum();
        write!(f, "allowed={} refused={total}", self.allowed)?;
        for (why, c) in &self.refused {
            write!(f, " [{c}× {why}]")?;
        }
        Ok(())
    }
}

fn duration(text: &str) -> Result<Duration> {
    if let Some(ms) = text.strip_suffix("ms") {
        return Ok(Duration::from_millis(ms.parse()?));
    }
    if let Some(s) = text.strip_suffix('s') {
        return Ok(Duration::from_secs(s.parse()?));
    }
    Err(format!("duration {text:?}: want e.g. 250ms or 2s").into())
}

impl QosRunner {
    /// Applies `change` as apply would: through its raft encoding, to the rules in force.
    fn change(&mut self, out: &mut String, change: RuleChange) -> Result<()> {
        let change = RuleChange::decode(&change.encode())?;
        let next = self.admission.rules().apply(&change)?;
        let order: Vec<&str> = next.rules().iter().map(|r| r.name.as_str()).collect();
        writeln!(
            out,
            "version={} rules=[{}]",
            next.version(),
            order.join(", ")
        )?;
        self.admission.set_rules(next);
        Ok(())
    }

    fn print_rules(out: &mut String, set: &RuleSet) -> Result<()> {
        writeln!(out, "version={}", set.version())?;
        for rule in set.rules() {
            writeln!(out, "{}", serde_json::to_string(rule)?)?;
        }
        Ok(())
    }
}

impl script::Commands for QosRunner {
    fn command(&mut self, cmd: &mut Cmd<'_>) -> Result<()> {
        let (args, out) = (&mut cmd.args, &mut cmd.out);
        match cmd.name {
            "file" => {
                let rules = rules::parse_file(&args.pos("rule file")?)?;
                self.change(out, RuleChange::Replace { rules })?;
            }
            "add" => {
                let rule = Rule::from_yaml(&args.pos("rule")?)?;
                let before = args.take("before");
                self.change(out, RuleChange::Add { rule, before })?;
            }
            "update" => {
                let rule = Rule::from_yaml(&args.pos("rule")?)?;
                self.change(out, RuleChange::Update { rule })?;
            }
            "remove" => {
                let name = args.pos("name")?;
                self.change(out, RuleChange::Remove { name })?;
            }
            "rules" => Self::print_rules(out, &self.admission.rules())?,
            "encode" => writeln!(
                out,
                "{}",
                String::from_utf8(self.admission.rules().encode())?
            )?,
            "decode" => {
                Self::print_rules(out, &RuleSet::decode(args.pos("encoding")?.as_bytes())?)?
            }
            "match" => {
                let req = Request::parse(args)?;
                let set = self.admission.rules();
                let matcher = crate::qos::Matcher::new(set.rules());
                let info = req.info();
                let (name, priority) = match matcher.first_match(&info) {
                    Some(i) => {
                        let rule = &set.rules()[i];
                        (
                            rule.name.as_str(),
                            rule.priority.unwrap_or(req.method.default_priority()),
                        )
                    }
                    None => ("none", req.method.default_priority()),
                };
                writeln!(out, "rule={name} priority={priority}")?;
            }
            "admit" => {
                let n: usize = args.num("n", 1)?;
                let hold = args.take("hold");
                let req = Request::parse(args)?;
                let info = req.info();
                let mut tally = Tally::default();
                for _ in 0..n {
                    match self.admission.check(&info) {
                        Ok(permit) => {
                            if let Some(label) = &hold {
                                self.held.entry(label.clone()).or_default().push(permit);
                            }
                            tally.add(Ok(()));
                        }
                        Err(why) if n == 1 => {
                            let e = RpcError::from(why);
                            return Err(format!("{} ({:?}; {why})", e.message(), e.code()).into());
                        }
                        Err(why) => tally.add(Err(why)),
                    }
                }
                writeln!(out, "{tally}")?;
            }
            "flood" => {
                let per_tick: usize = args.num("n", 1)?;
                let every = duration(&args.take("every").ok_or("missing every=")?)?;
                let total = duration(&args.take("for").ok_or("missing for=")?)?;
                let req = Request::parse(args)?;
                let info = req.info();
                let mut tally = Tally::default();
                let mut t = Duration::ZERO;
                while t < total {
                    for _ in 0..per_tick {
                        tally.add(self.admission.check(&info).map(drop));
                    }
                    self.clock.advance(every);
                    t += every;
                }
                writeln!(out, "{tally}")?;
            }
            "release" => {
                let label = args.pos("label")?;
                let permits = self.held.remove(&label).ok_or("no such label")?;
                writeln!(out, "released {}", permits.len())?;
            }
            "advance" => self.clock.advance(duration(&args.pos("duration")?)?),
            "gauge" => {
                let g = self.admission.load();
                let now = g.load();
                g.set_applied(args.num("applied", now.applied)?);
                g.set_committed(args.num("committed", now.committed)?);
                g.set_queued(args.num("queued", now.queued)?);
                let l = g.load();
                writeln!(out, "apply_lag={} queued={}", l.apply_lag(), l.queued)?;
            }
            "decide" => {
                let priority: Priority = args.pos("priority")?.parse()?;
                let load = Load {
                    applied: args.num("applied", 0)?,
                    committed: args.num("committed", 0)?,
                    queued: args.num("queued", 0)?,
                };
                match overload::decide(load, priority, self.admission.thresholds()) {
                    Ok(()) => writeln!(out, "{priority}: admit")?,
                    Err(o) => writeln!(out, "{priority}: refuse ({o})")?,
                }
            }
            "stats" => {
                let s = self.admission.stats();
                for r in &s.rules {
                    writeln!(
                        out,
                        "{}: allowed={} refused_rate={} refused_in_flight={} refused_overload={} in_flight={}",
                        r.name,
                        r.allowed,
                        r.refused_rate,
                        r.refused_in_flight,
                        r.refused_overload,
                        r.in_flight
                    )?;
                }
                let [low, normal, high] = s.unmatched_refused_overload;
                writeln!(
                    out,
                    "unmatched: refused_overload low={low} normal={normal} high={high}"
                )?;
            }
            other => return Err(format!("unknown command {other:?}").into()),
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        // Every permit a script holds is released by the end: in_flight must return to 0.
        self.held.clear();
        for r in self.admission.stats().rules {
            if r.in_flight != 0 {
                return Err(
                    format!("rule {}: {} in flight after release", r.name, r.in_flight).into(),
                );
            }
        }
        Ok(())
    }
}
