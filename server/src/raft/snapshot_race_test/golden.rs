//! Goldenscript scenario tests of snapshot export, compaction and install on members' state
//! machines: `raft/testscripts/*.txt`. Each member is a state machine on its own temporary
//! directory, fed entries it numbers itself; the runner owns a tokio runtime and bounds
//! every step by 20 s, so a deadlock fails the script. How to write and update them:
//! `docs/testing.md`.
//!
//! Commands (NAME is a member, SNAP a snapshot):
//! - `member NAME...`: fresh members.
//! - `load NAME keys=K rounds=R`: R versions of keys `key-0000`..; one apply call.
//! - operations, each run on the member's own task: `put NAME KEY VALUE`,
//!   `compact NAME REV` (physical), `install NAME SNAP`. They print their outcome; with
//!   `[background]` the runner waits only 300 ms and prints `still running` if the operation
//!   is blocked (`wait NAME` then collects it).
//! - `export NAME as=SNAP [hold=true]`: builds a snapshot; `hold` stops the export after it
//!   started (the export hook) until `release NAME`, which prints the finished snapshot.
//! - `corrupt SNAP`: flips one byte in the middle of a snapshot.
//! - `interrupt_install NAME SNAP`: the state a crash during an install leaves (the received
//!   file kept and the install marker written); `start NAME`: openraft's first call at
//!   start-up, which finishes such an install.
//! - `status NAME`: revision and compact revision; `hash NAME [REV]`;
//!   `wait_physical NAME REV` (background compaction reached REV).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use openraft::RaftSnapshotBuilder;
use openraft::storage::{RaftStateMachine, Snapshot};
use tokio::task::JoinHandle;

use super::{Built, Member, STEP};
use crate::mvcc::tests_golden::script::{self, Cmd, Result};
use crate::raft::types::{Entry, TypeConfig};

/// How long a blocked operation must stay blocked to count as waiting.
const STILL_BLOCKED: Duration = Duration::from_millis(300);

test_each_file::test_each_path! { in "server/src/raft/testscripts" as scripts => run_script }

fn run_script(path: &std::path::Path) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let runner = SnapshotRunner {
        rt,
        members: HashMap::new(),
        exports: HashMap::new(),
        snapshots: HashMap::new(),
    };
    script::run(path, runner)
}

/// A member, or the task that holds it while an operation runs (the task hands it back
/// with the operation's output).
enum Slot {
    Idle(Box<Member>),
    Busy(JoinHandle<(Member, std::result::Result<String, String>)>),
}

/// An export stopped by its hook, and what releases it.
struct HeldExport {
    task: JoinHandle<std::result::Result<Snapshot<TypeConfig>, openraft::StorageError<u64>>>,
    release: mpsc::Sender<()>,
    name: String,
}

struct SnapshotRunner {
    rt: tokio::runtime::Runtime,
    members: HashMap<String, Slot>,
    exports: HashMap<String, HeldExport>,
    /// Snapshots by name, with the member that built them.
    snapshots: HashMap<String, (Built, String)>,
}

/// What an operation does once it owns its member.
enum Op {
    Apply(Entry, &'static str),
    Install(Arc<Built>),
}

/// The member `name`, which must not be running an operation.
fn idle<'a>(members: &'a mut HashMap<String, Slot>, name: &str) -> Result<&'a mut Member> {
    match members.get_mut(name) {
        Some(Slot::Idle(m)) => Ok(m),
        Some(Slot::Busy(_)) => Err(format!("{name} is busy: wait for it first").into()),
        None => Err(format!("no member {name}").into()),
    }
}

impl SnapshotRunner {
    fn idle(&mut self, name: &str) -> Result<&mut Member> {
        idle(&mut self.members, name)
    }

    fn snapshot(&self, name: &str) -> Result<&(Built, String)> {
        self.snapshots
            .get(name)
            .ok_or_else(|| format!("no snapshot {name}").into())
    }

    /// Runs `op` on `name`'s member in a task: to completion (bounded by [`STEP`]), or under
    /// `background` for [`STILL_BLOCKED`] only.
    fn start(&mut self, name: &str, op: Op, background: bool) -> Result<String> {
        let Some(Slot::Idle(m)) = self.members.remove(name) else {
            return Err(format!("{name} is not an idle member").into());
        };
        let label = name.to_string();
        let mut m = *m;
        let task = self.rt.spawn(async move {
            let result = match op {
                Op::Apply(entry, what) => m.sm.apply(vec![entry]).await.map(|_| {
                    let store = m.shared.get();
                    format!(
                        "{label}: {what} applied, revision={} compact={}",
                        store.current_revision(),
                        store.compact_revision()
                    )
                }),
                Op::Install(snap) => snap
                    .install(&mut m.sm)
                    .await
                    .map(|()| format!("{label}: installed, revision={}", m.revision())),
            };
            (m, result.map_err(|e| format!("{label}: failed: {e}")))
        });
        self.members.insert(name.to_string(), Slot::Busy(task));
        if background {
            self.rt.block_on(tokio::time::sleep(STILL_BLOCKED));
            if let Some(Slot::Busy(task)) = self.members.get(name)
                && !task.is_finished()
            {
                return Ok(format!("{name}: still running"));
            }
        }
        self.wait(name)
    }

    /// Collects `name`'s operation, bounded by [`STEP`].
    fn wait(&mut self, name: &str) -> Result<String> {
        let Some(Slot::Busy(task)) = self.members.remove(name) else {
            return Err(format!("{name} runs no operation").into());
        };
        let _context = self.rt.enter();
        let (m, result) = self
            .rt
            .block_on(tokio::time::timeout(STEP, task))
            .map_err(|_| format!("{name}: deadlock (no progress in {STEP:?})"))??;
        self.members
            .insert(name.to_string(), Slot::Idle(Box::new(m)));
        Ok(result?)
    }
}

/// An export hook that announces the export started, then holds it until released; only
/// the first export it sees.
fn holding_hook() -> (
    crate::raft::export::ExportHook,
    mpsc::Receiver<()>,
    mpsc::Sender<()>,
) {
    let (started_tx, started_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let (started_tx, release_rx) = (Mutex::new(started_tx), Mutex::new(release_rx));
    let armed = AtomicBool::new(true);
    let hook = Arc::new(move || {
        if armed.swap(false, Ordering::AcqRel) {
            let _ = started_tx.lock().unwrap().send(());
            let _ = release_rx.lock().unwrap().recv_timeout(STEP);
        }
    });
    (hook, started_rx, release_tx)
}

fn describe(name: &str, snap: &Built) -> String {
    let index = snap.meta.last_log_id.map_or(0, |l| l.index);
    format!("{name}: snapshot at log index {index}")
}

impl script::Commands for SnapshotRunner {
    fn command(&mut self, cmd: &mut Cmd<'_>) -> Result<()> {
        let (name, args, ctx, out) = (cmd.name, &mut cmd.args, cmd.ctx, &mut cmd.out);
        let background = ctx.tags.contains("background");
        // Timers are created here, outside `block_on`: they need the runtime's context.
        let handle = self.rt.handle().clone();
        let _context = handle.enter();
        match name {
            "member" => {
                while let Some(name) = args.next_pos() {
                    self.members
                        .insert(name, Slot::Idle(Box::new(Member::new())));
                }
            }
            "load" => {
                let name = args.pos("member")?;
                let keys = args.num("keys", 1)?;
                let rounds = args.num("rounds", 1)?;
                let m = idle(&mut self.members, &name)?;
                self.rt
                    .block_on(tokio::time::timeout(STEP, m.load(keys, rounds)))?;
                writeln!(out, "{name}: revision={}", m.revision())?;
            }
            "put" => {
                let name = args.pos("member")?;
                let (key, value) = (args.pos("key")?, args.pos("value")?);
                let entry = self.idle(&name)?.put(&key, &value);
                writeln!(
                    out,
                    "{}",
                    self.start(&name, Op::Apply(entry, "put"), background)?
                )?;
            }
            "compact" => {
                let name = args.pos("member")?;
                let rev = args.pos_num("revision")?;
                let entry = self.idle(&name)?.compact(rev);
                let op = Op::Apply(entry, "compaction");
                writeln!(out, "{}", self.start(&name, op, background)?)?;
            }
            "install" => {
                let name = args.pos("member")?;
                let snap = args.pos("snapshot")?;
                let (built, _) = self.snapshot(&snap)?;
                let copy = Arc::new(Built {
                    meta: built.meta.clone(),
                    data: built.data.clone(),
                });
                writeln!(out, "{}", self.start(&name, Op::Install(copy), background)?)?;
            }
            "wait" => writeln!(out, "{}", self.wait(&args.pos("member")?)?)?,
            "export" => {
                let name = args.pos("member")?;
                let snap = args.take("as").ok_or("export needs as=SNAP")?;
                let hold = args.flag("hold")?;
                let rt = &self.rt;
                let m = match self.members.get_mut(&name) {
                    Some(Slot::Idle(m)) => m,
                    _ => return Err(format!("{name} is not an idle member").into()),
                };
                if hold {
                    let (hook, started, release) = holding_hook();
                    m.sm.set_export_hook(hook);
                    let mut builder = rt.block_on(m.sm.get_snapshot_builder());
                    let task = rt.spawn(async move { builder.build_snapshot().await });
                    started
                        .recv_timeout(STEP)
                        .map_err(|_| "export never started")?;
                    let held = HeldExport {
                        task,
                        release,
                        name: snap,
                    };
                    self.exports.insert(name.clone(), held);
                    writeln!(out, "{name}: export started and held")?;
                } else {
                    let built = rt.block_on(tokio::time::timeout(STEP, m.export()))?;
                    writeln!(out, "{}", describe(&snap, &built))?;
                    self.snapshots.insert(snap, (built, name));
                }
            }
            "release" => {
                let name = args.pos("member")?;
                let held = self.exports.remove(&name).ok_or("no held export")?;
                if held.task.is_finished() {
                    return Err(format!("{name}: the export finished before its release").into());
                }
                held.release.send(())?;
                let snap = self
                    .rt
                    .block_on(tokio::time::timeout(STEP, held.task))
                    .map_err(|_| format!("{name}: the export did not finish"))???;
                let built = self.rt.block_on(Built::read(snap));
                writeln!(out, "{}", describe(&held.name, &built))?;
                self.snapshots.insert(held.name, (built, name));
            }
            "corrupt" => {
                let snap = args.pos("snapshot")?;
                let (built, _) = self.snapshots.get_mut(&snap).ok_or("no such snapshot")?;
                let mid = built.data.len() / 2;
                built.data[mid] ^= 0xff;
            }
            "interrupt_install" => {
                let name = args.pos("member")?;
                let snap = args.pos("snapshot")?;
                let (built, source) = self.snapshot(&snap)?;
                let source_dir = match self.members.get(source) {
                    Some(Slot::Idle(m)) => m.dir.path().join("snap"),
                    _ => return Err(format!("{source} is not an idle member").into()),
                };
                let file = crate::raft::snapshot::file_name(&source_dir, &built.meta);
                let target_dir = self.idle(&name)?.dir.path().join("snap");
                let kept = target_dir.join(file.file_name().ok_or("snapshot file name")?);
                std::fs::copy(&file, &kept)?;
                let marker = kept.file_name().and_then(|f| f.to_str()).ok_or("name")?;
                std::fs::write(target_dir.join("INSTALLING"), marker)?;
            }
            "start" => {
                let name = args.pos("member")?;
                let m = idle(&mut self.members, &name)?;
                let (applied, _) = self.rt.block_on(m.sm.applied_state())?;
                let marker = m.dir.path().join("snap").join("INSTALLING").exists();
                writeln!(
                    out,
                    "{name}: applied log index {}, revision={}, install marker {}",
                    applied.map_or(0, |l| l.index),
                    m.revision(),
                    if marker { "present" } else { "gone" }
                )?;
            }
            "status" => {
                let name = args.pos("member")?;
                let store = self.idle(&name)?.shared.get();
                writeln!(
                    out,
                    "{name}: revision={} compact={}",
                    store.current_revision(),
                    store.compact_revision()
                )?;
            }
            "hash" => {
                let name = args.pos("member")?;
                let m = self.idle(&name)?;
                let rev = args.next_pos().map(|r| r.parse()).transpose()?;
                let rev = rev.unwrap_or_else(|| m.revision());
                let h = m.shared.get().hash_kv(rev)?;
                writeln!(out, "{name}: hash({rev})={:#010x}", h.hash)?;
            }
            "wait_physical" => {
                let name = args.pos("member")?;
                let rev = args.pos_num("revision")?;
                let store = self.idle(&name)?.shared.get();
                if !store.wait_physical_compaction(rev, STEP) {
                    return Err(format!("{name}: physical compaction did not reach {rev}").into());
                }
                writeln!(out, "{name}: physical compaction at {rev}")?;
            }
            name => return Err(format!("unknown command {name:?}").into()),
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        let busy: Vec<&String> = self
            .members
            .iter()
            .filter(|(_, s)| matches!(s, Slot::Busy(_)))
            .map(|(n, _)| n)
            .collect();
        if !busy.is_empty() || !self.exports.is_empty() {
            return Err(format!("operations left running: {busy:?}").into());
        }
        Ok(())
    }
}
