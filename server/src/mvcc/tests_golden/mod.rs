//! Goldenscript scenario tests of the MVCC store: `mvcc/testscripts/*.txt`, one per theme.
//! Each script runs against a fresh store on a temporary sled tree (revision 1, as in etcd;
//! the first write makes revision 2). How to write and update them: `docs/testing.md`.
//!
//! Commands (request arguments: [`ops`]):
//! - `put`, `range`, `delete`, `txn [leases=ID,...]`, `compact REV`: one write txn each,
//!   printing the response (`txn ... leases=` checks puts' leases against that list, as
//!   apply does). Tags: `[events]` prints the committed events, `[abort]` drops the write
//!   txn instead of committing it. The runner checks that a committed response's header
//!   revision is the store's revision.
//! - `fill PREFIX COUNT VALUE`: puts `PREFIX00`..`PREFIX{COUNT-1}`, one revision each.
//! - `extra KEY VALUE [abort]`: a write txn that only stages a raw sled key (another module's
//!   write in the same batch); `raw KEY`: whether sled holds that key.
//! - `status`: current, compact and physical compact revision, index keys.
//! - `hash [REV]`: `HashKV`; `events FROM [TO] [limit=N]`: the event history.
//! - `leased_keys`, `records` (MVCC records in sled), `reopen` (a new store on the same
//!   tree), `reset` (a fresh store on a new tree), `inline_removals N` (removals done at
//!   commit before the rest goes to the background), `wait_physical REV` (background
//!   compaction reached REV, 20 s bound).

pub mod ops;
pub mod script;

use std::fmt::Write as _;
use std::time::Duration;

use keel_proto::etcdserverpb::request_op::Request;
use keel_proto::etcdserverpb::response_op::Response;
use script::{Cmd, Result};

use super::WriteTxn;
use super::tests_scenarios::{Fixture, fixture};

test_each_file::test_each_path! { in "server/src/mvcc/testscripts" as scripts => run_script }

fn run_script(path: &std::path::Path) {
    script::run(path, MvccRunner { f: Some(fixture()) })
}

/// Runs one script's commands against its own store.
struct MvccRunner {
    /// `None` only while `reopen` swaps it.
    f: Option<Fixture>,
}

impl MvccRunner {
    fn f(&self) -> &Fixture {
        self.f.as_ref().expect("fixture")
    }

    /// Runs `op` in one write txn and commits it (or drops it under `[abort]`), printing
    /// what `op` prints and, under `[events]`, the committed events. `op` returns the
    /// response header revision, checked against the committed store revision.
    fn write(
        &self,
        ctx: &goldenscript::Context,
        out: &mut String,
        op: impl FnOnce(&mut WriteTxn<'_>, &mut String) -> Result<Option<i64>>,
    ) -> Result<()> {
        let mut w = self.f().store.write();
        let header = op(&mut w, out)?;
        if ctx.tags.contains("abort") {
            drop(w);
            writeln!(out, "aborted")?;
            return Ok(());
        }
        let committed = w.commit()?;
        if let Some(h) = header
            && h != committed.revision
        {
            return Err(format!(
                "header revision {h} != store revision {}",
                committed.revision
            )
            .into());
        }
        if ctx.tags.contains("events") {
            for e in &committed.events {
                writeln!(out, "event: {}", ops::event(e))?;
            }
        }
        Ok(())
    }
}

impl script::Commands for MvccRunner {
    fn command(&mut self, cmd: &mut Cmd<'_>) -> Result<()> {
        let (name, args, ctx, out) = (cmd.name, &mut cmd.args, cmd.ctx, &mut cmd.out);
        match name {
            "put" | "range" | "delete" | "txn" => {
                let leases: Option<Vec<i64>> = match name {
                    "txn" => args.take("leases"),
                    _ => None,
                }
                .map(|l| l.split(',').map(str::parse).collect())
                .transpose()?;
                let req = ops::request(name, args)?.ok_or("not a KV request")?;
                if let Request::RequestRange(r) = &req {
                    let resp = Response::ResponseRange(self.f().store.range(r)?);
                    ops::response(out, 0, &resp);
                    return Ok(());
                }
                self.write(ctx, out, |w, out| {
                    let resp = match (&req, &leases) {
                        (Request::RequestTxn(t), Some(ids)) => Response::ResponseTxn(
                            w.txn_with_lease_check(t, &|id| ids.contains(&id))?,
                        ),
                        _ => ops::apply(w, &req)?,
                    };
                    ops::response(out, 0, &resp);
                    Ok(ops::header_of(&resp))
                })?;
            }
            "compact" => {
                let rev = args.pos_num("revision")?;
                self.write(ctx, out, |w, out| {
                    let resp = w.compact(rev)?;
                    writeln!(out, "compact: rev={}", ops::header(&resp.header))?;
                    Ok(resp.header.map(|h| h.revision))
                })?;
            }
            "fill" => {
                let prefix = args.pos("prefix")?;
                let count: usize = args.pos_num("count")?;
                let value = args.pos("value")?;
                let width = (count.max(2) - 1).to_string().len();
                for i in 0..count {
                    let mut w = self.f().store.write();
                    w.put(&keel_proto::etcdserverpb::PutRequest {
                        key: format!("{prefix}{i:0width$}").into_bytes(),
                        value: value.clone().into_bytes(),
                        ..Default::default()
                    })?;
                    w.commit()?;
                }
                writeln!(out, "rev={}", self.f().store.current_revision())?;
            }
            "extra" => {
                let key = args.pos("key")?;
                let value = args.pos("value")?;
                self.write(ctx, out, |w, out| {
                    w.batch_mut().insert(key.as_bytes(), value.as_bytes());
                    writeln!(out, "staged {}", ops::quoted(key.as_bytes()))?;
                    Ok(None)
                })?;
            }
            "raw" => {
                let key = args.pos("key")?;
                let tree = self.f().db.open_tree("keel")?;
                let found = tree.get(key.as_bytes())?;
                let shown = found.map_or("absent".into(), |v| ops::quoted(&v));
                writeln!(out, "{} → {shown}", ops::quoted(key.as_bytes()))?;
            }
            "status" => {
                let store = &self.f().store;
                let stats = store.index_stats();
                writeln!(
                    out,
                    "revision={} compact={} physical={} keys={} live={}",
                    store.current_revision(),
                    store.compact_revision(),
                    store.physical_compact_revision(),
                    stats.keys,
                    stats.live_keys
                )?;
            }
            "hash" => {
                let rev = args.next_pos().map(|r| r.parse()).transpose()?.unwrap_or(0);
                let h = self.f().store.hash_kv(rev)?;
                writeln!(
                    out,
                    "hash={:#010x} hash_revision={} compact_revision={} current_revision={}",
                    h.hash, h.hash_revision, h.compact_revision, h.current_revision
                )?;
            }
            "events" => {
                let from = args.pos_num("from")?;
                let to = args
                    .next_pos()
                    .map(|r| r.parse())
                    .transpose()?
                    .unwrap_or(i64::MAX);
                let limit = args.num("limit", 0)?;
                let batch = self.f().store.events(from, to, limit)?;
                for e in &batch.events {
                    writeln!(out, "{}", ops::event(e))?;
                }
                writeln!(out, "last_revision={}", batch.last_revision)?;
            }
            "leased_keys" => {
                let keys = self.f().store.leased_keys();
                if keys.is_empty() {
                    writeln!(out, "no leased keys")?;
                }
                for (key, lease) in keys {
                    writeln!(out, "{} lease={lease}", ops::quoted(&key))?;
                }
            }
            "records" => {
                let tree = self.f().db.open_tree("keel")?;
                writeln!(out, "records={}", tree.scan_prefix(b"k").count())?;
            }
            "reopen" => {
                self.f = Some(self.f.take().expect("fixture").reopen());
                let store = &self.f().store;
                writeln!(
                    out,
                    "reopened: revision={} compact={}",
                    store.current_revision(),
                    store.compact_revision()
                )?;
            }
            "reset" => self.f = Some(fixture()),
            "inline_removals" => self.f().store.set_inline_removals(args.pos_num("count")?),
            "wait_physical" => {
                let rev = args.pos_num("revision")?;
                let store = &self.f().store;
                if !store.wait_physical_compaction(rev, Duration::from_secs(20)) {
                    return Err(format!("physical compaction did not reach {rev}").into());
                }
                writeln!(out, "physical={}", store.physical_compact_revision())?;
            }
            name => return Err(format!("unknown command {name:?}").into()),
        }
        Ok(())
    }
}
