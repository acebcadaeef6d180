//! Goldenscript scenario tests of the lessor with the real applier and MVCC store:
//! `lease/testscripts/*.txt`. Each script drives one member's apply path (entries applied
//! in log order, no raft) and the lessor's leader-side schedule. How to write and update
//! them: `docs/testing.md`.
//!
//! Commands:
//! - entries, each applied as one raft entry: `grant ID TTL`, `revoke ID`, `expire ID...`
//!   (the leader's `LeaseExpire` batch), `checkpoint ID=REMAINING...`, and `put`,
//!   `delete`, `txn` with the arguments of `mvcc::tests_golden::ops`. They print the
//!   response and the store revision after the entry; an apply error is the command's error
//!   (`!grant ...` prints it with its gRPC code and the revision).
//! - `revoke_direct ID...`: a revocation through a write txn outside apply, printing its
//!   outcome and the committed events.
//! - `reopen`: a new applier and lessor over the same sled tree (a restart); `reset`: a
//!   fresh member.
//! - state: `keys` (every live key and its lease), `leases`, `info ID` (TTL and keys),
//!   `owner KEY`, `stats`.
//! - the leader's schedule: `promote [extend=S] [checkpoint=S]`, `demote`, `renew ID`,
//!   `remaining ID [within=LO..HI]` (seconds left, rounded down, are time-dependent: a
//!   `Secs` answer must fall within the given bounds and prints them).

use std::fmt::Write as _;
use std::time::Duration;

use keel_proto::etcdserverpb::request_op::Request;
use keel_proto::etcdserverpb::response_op::Response;
use keel_proto::etcdserverpb::{
    LeaseCheckpoint, LeaseCheckpointRequest, LeaseGrantRequest, LeaseRevokeRequest,
};
use keel_proto::keelpb::raft_response::Response as Rs;
use keel_proto::keelpb::{LeaseExpire, RaftResponse, raft_request::Request as Rq};

use super::Member;
use crate::lease::{PrimaryConfig, Remaining};
use crate::mvcc::tests_golden::ops;
use crate::mvcc::tests_golden::script::{self, Args, Cmd, Result};

test_each_file::test_each_path! { in "server/src/lease/testscripts" as scripts => run_script }

fn run_script(path: &std::path::Path) {
    script::run(path, LeaseRunner { m: Member::new() })
}

struct LeaseRunner {
    m: Member,
}

/// Prints an applied entry's response, or returns its apply error. Every response names
/// the store revision after the entry: a KV response as its header revision (checked
/// against it), a lease response as `revision=R`.
fn response(out: &mut String, resp: RaftResponse) -> Result<()> {
    let rev = resp.revision;
    let kv = match &resp.response {
        Some(Rs::Error(e)) => {
            return Err(format!("{} (code {}) revision={rev}", e.message, e.code).into());
        }
        Some(Rs::LeaseGrant(g)) => {
            writeln!(out, "grant: id={} ttl={} revision={rev}", g.id, g.ttl)?;
            return Ok(());
        }
        Some(Rs::LeaseRevoke(_)) => return Ok(writeln!(out, "revoke: revision={rev}")?),
        Some(Rs::LeaseExpire(e)) => {
            return Ok(writeln!(
                out,
                "expire: revoked={} revision={rev}",
                e.revoked
            )?);
        }
        Some(Rs::LeaseCheckpoint(_)) => return Ok(writeln!(out, "checkpoint: revision={rev}")?),
        Some(Rs::Put(p)) => Response::ResponsePut(p.clone()),
        Some(Rs::DeleteRange(d)) => Response::ResponseDeleteRange(d.clone()),
        Some(Rs::Txn(t)) => Response::ResponseTxn(t.clone()),
        other => return Err(format!("unexpected response {other:?}").into()),
    };
    ops::response(out, 0, &kv);
    match ops::header_of(&kv) {
        Some(h) if h == rev => Ok(()),
        h => Err(format!("header revision {h:?} is not the entry's revision {rev}").into()),
    }
}

fn ids(args: &mut Args) -> Result<Vec<i64>> {
    let mut ids = Vec::new();
    while let Some(id) = args.next_pos() {
        ids.push(id.parse()?);
    }
    Ok(ids)
}

impl script::Commands for LeaseRunner {
    fn command(&mut self, cmd: &mut Cmd<'_>) -> Result<()> {
        let (name, args, out) = (cmd.name, &mut cmd.args, &mut cmd.out);
        let lessor = self.m.lessor();
        match name {
            "grant" => {
                let id = args.pos_num("id")?;
                let ttl = args.pos_num("ttl")?;
                response(
                    out,
                    self.m.apply(Rq::LeaseGrant(LeaseGrantRequest { id, ttl })),
                )?;
            }
            "revoke" => {
                let id = args.pos_num("id")?;
                response(
                    out,
                    self.m.apply(Rq::LeaseRevoke(LeaseRevokeRequest { id })),
                )?;
            }
            "expire" => {
                let ids = ids(args)?;
                response(out, self.m.apply(Rq::LeaseExpire(LeaseExpire { ids })))?;
            }
            "checkpoint" => {
                let checkpoints = std::iter::from_fn(|| args.next_key())
                    .map(|(id, ttl)| {
                        Ok(LeaseCheckpoint {
                            id: id.parse()?,
                            remaining_ttl: ttl.parse()?,
                        })
                    })
                    .collect::<Result<_>>()?;
                let req = LeaseCheckpointRequest { checkpoints };
                response(out, self.m.apply(Rq::LeaseCheckpoint(req)))?;
            }
            "put" | "delete" | "txn" => {
                let entry = match ops::request(name, args)?.ok_or("not a KV request")? {
                    Request::RequestPut(p) => Rq::Put(p),
                    Request::RequestDeleteRange(d) => Rq::DeleteRange(d),
                    Request::RequestTxn(t) => Rq::Txn(t),
                    Request::RequestRange(_) => return Err("a range is no entry".into()),
                };
                response(out, self.m.apply(entry))?;
            }
            "revoke_direct" => {
                let ids = ids(args)?;
                let store = self.m.applier.store().clone();
                let mut w = store.write();
                let outcome = lessor.apply_revoke(&mut w, &ids, true)?;
                let committed = w.commit()?;
                lessor.publish(Some(outcome.clone()), &committed.events);
                writeln!(out, "{outcome:?} revision={}", committed.revision)?;
                for e in &committed.events {
                    writeln!(out, "event: {}", ops::event(e))?;
                }
            }
            "reopen" => self.m.reopen(),
            "reset" => self.m = Member::new(),
            "keys" => {
                let keys = self.m.keys();
                if keys.is_empty() {
                    writeln!(out, "no keys")?;
                }
                for (key, lease) in keys {
                    writeln!(out, "{} lease={lease}", ops::quoted(key.as_bytes()))?;
                }
            }
            "leases" => writeln!(out, "leases={:?}", lessor.ids())?,
            "info" => {
                let id = args.pos_num("id")?;
                match lessor.info(id, true) {
                    None => writeln!(out, "lease {id}: not found")?,
                    Some(info) => {
                        let keys: Vec<String> = info.keys.iter().map(|k| ops::quoted(k)).collect();
                        writeln!(
                            out,
                            "lease {id}: ttl={} keys=[{}]",
                            info.ttl,
                            keys.join(", ")
                        )?
                    }
                }
            }
            "owner" => {
                let key = args.pos("key")?;
                let owner = lessor.owner(key.as_bytes());
                writeln!(out, "owner {}: {owner:?}", ops::quoted(key.as_bytes()))?;
            }
            "stats" => {
                let s = lessor.stats();
                writeln!(
                    out,
                    "leases={} attached_keys={} primary={} expiry={:?} checkpoints={:?}",
                    s.leases,
                    s.attached_keys,
                    lessor.is_primary(),
                    s.primary_expiry,
                    s.primary_checkpoints
                )?;
            }
            "promote" => {
                let extend = Duration::from_secs(args.num("extend", 0)?);
                let checkpoint = args.take("checkpoint").map(|s| s.parse()).transpose()?;
                lessor.promote(PrimaryConfig {
                    extend,
                    checkpoint_interval: checkpoint.map(Duration::from_secs),
                    revoke_retry: Duration::from_secs(5),
                });
            }
            "demote" => lessor.demote(),
            "renew" => writeln!(out, "{:?}", lessor.renew(args.pos_num("id")?))?,
            "remaining" => {
                let id = args.pos_num("id")?;
                let within = args.take("within");
                match (lessor.remaining(id), within) {
                    (Remaining::Secs(n), Some(w)) => {
                        let (lo, hi) = w.split_once("..").ok_or("within=LO..HI")?;
                        let (lo, hi): (i64, i64) = (lo.parse()?, hi.parse()?);
                        if !(lo..=hi).contains(&n) {
                            return Err(format!("remaining {n} s, not within {lo}..={hi}").into());
                        }
                        writeln!(out, "Secs({lo}..={hi})")?;
                    }
                    (Remaining::Secs(n), None) => {
                        return Err(format!("remaining {n} s: give within=LO..HI").into());
                    }
                    (other, _) => writeln!(out, "{other:?}")?,
                }
            }
            name => return Err(format!("unknown command {name:?}").into()),
        }
        Ok(())
    }
}
