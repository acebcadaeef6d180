//! Goldenscript scenario tests of the watch hub and one stream session against a real MVCC
//! store: `watch/testscripts/*.txt`. Writes go through the store and their committed
//! events to the hub, as apply does; `recv` prints exactly what a client would receive
//! (etcd 3.4 behaviour, `../shared/conformance/cases/{watch,grpc-watch}`). Every script ends
//! with the hub's invariant check. How to write and update them: `docs/testing.md`.
//!
//! Commands:
//! - `hub [buffer_len=N] [batch_max_revisions=N] [max_response_bytes=N]`: a fresh store and
//!   hub with these limits (the defaults otherwise).
//! - writes, each one committed entry notified to the hub: `put`, `delete`, `txn` (the
//!   arguments of `mvcc::tests_golden::ops`), `compact REV`, `puts KEY COUNT` (COUNT puts of
//!   values 0, 1, ...). `store_put KEY VALUE` writes without telling the hub (what a
//!   snapshot brings); `begin_install` and `finish_install` frame a snapshot install.
//! - the stream (created at first use): `watch KEY [END] [prefix=true] [from_key=true]
//!   [start_revision=R] [prev_kv=true] [progress_notify=true] [fragment=true] [watch_id=N]
//!   [filters=noput,nodelete]`, `cancel ID`, `progress`, `empty_request`, `tick` (the
//!   periodic progress timer), `stream_len`, `drop_stream`.
//! - `recv [n=N]`: the responses ready now (up to N, a slow client); `recv_wait N`: waits up
//!   to 10 s for N responses (the sync thread); `sync`: sync rounds until settled;
//!   `sync_round`; `catch_up`: receive and sync until the hub is idle, printing every
//!   response; `spawn_sync_thread`; `stats`.

use std::fmt::Write as _;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::Stream;
use futures::task::noop_waker;
use keel_proto::etcdserverpb::watch_create_request::FilterType;
use keel_proto::etcdserverpb::watch_request::RequestUnion;
use keel_proto::etcdserverpb::{
    PutRequest, WatchCancelRequest, WatchCreateRequest, WatchProgressRequest, WatchRequest,
    WatchResponse,
};

use super::{Harness, read};
use crate::mvcc::tests_golden::ops;
use crate::mvcc::tests_golden::script::{self, Args, Cmd, Result};
use crate::watch::sync::SyncOutcome;
use crate::watch::{WatchConfig, WatchOutput, WatchStream};

test_each_file::test_each_path! { in "server/src/watch/testscripts" as scripts => run_script }

fn run_script(path: &std::path::Path) {
    let runner = WatchRunner {
        h: Harness::new(WatchConfig::default()),
        stream: None,
        output: None,
    };
    script::run(path, runner)
}

struct WatchRunner {
    h: Harness,
    stream: Option<WatchStream>,
    output: Option<WatchOutput>,
}

/// Whether a poll found the output's end.
enum Polled {
    Open,
    Ended,
}

impl WatchRunner {
    fn stream(&mut self) -> &mut WatchStream {
        if self.stream.is_none() {
            let (s, out) = WatchStream::new(self.h.hub.clone());
            (self.stream, self.output) = (Some(s), Some(out));
        }
        self.stream.as_mut().expect("stream")
    }

    fn request(&mut self, union: RequestUnion) {
        self.stream().handle(WatchRequest {
            request_union: Some(union),
        });
    }

    /// Up to `max` responses ready now, and whether the output has ended.
    fn poll(&mut self, max: usize, got: &mut Vec<WatchResponse>) -> Polled {
        let Some(output) = self.output.as_mut() else {
            return Polled::Open;
        };
        got.extend(read(output, max - got.len()));
        let waker = noop_waker();
        let polled = std::pin::Pin::new(output).poll_next(&mut Context::from_waker(&waker));
        match polled {
            Poll::Ready(None) => Polled::Ended,
            Poll::Ready(Some(r)) => {
                got.push(r);
                Polled::Open
            }
            Poll::Pending => Polled::Open,
        }
    }

    /// A committed write, notified to the hub, printed as its response.
    fn write(
        &self,
        out: &mut String,
        op: impl FnOnce(&mut crate::mvcc::WriteTxn<'_>, &mut String) -> Result<()>,
    ) -> Result<()> {
        let mut result = Ok(());
        self.h.commit(|w| result = op(w, out));
        result
    }
}

/// `id=N rev=R [created] [canceled] [fragment] [compact_revision=C] [reason="..."]` and
/// one indented line per event.
fn print_responses(out: &mut String, got: &[WatchResponse]) -> Result<()> {
    for r in got {
        write!(out, "id={} rev={}", r.watch_id, ops::header(&r.header))?;
        for (set, name) in [
            (r.created, " created"),
            (r.canceled, " canceled"),
            (r.fragment, " fragment"),
        ] {
            if set {
                out.push_str(name);
            }
        }
        if r.compact_revision != 0 {
            write!(out, " compact_revision={}", r.compact_revision)?;
        }
        if !r.cancel_reason.is_empty() {
            write!(out, " reason={:?}", r.cancel_reason)?;
        }
        writeln!(out)?;
        for e in &r.events {
            writeln!(out, "  {}", ops::event(e))?;
        }
    }
    Ok(())
}

fn create_request(args: &mut Args) -> Result<WatchCreateRequest> {
    let (key, range_end) = ops::key_range(args)?;
    let filters = match args.take("filters") {
        None => Vec::new(),
        Some(list) => list
            .split(',')
            .map(|f| match f {
                "noput" => Ok(FilterType::Noput as i32),
                "nodelete" => Ok(FilterType::Nodelete as i32),
                f => Err(format!("filter {f:?}")),
            })
            .collect::<std::result::Result<_, _>>()?,
    };
    Ok(WatchCreateRequest {
        key,
        range_end,
        start_revision: args.num("start_revision", 0)?,
        progress_notify: args.flag("progress_notify")?,
        filters,
        prev_kv: args.flag("prev_kv")?,
        watch_id: args.num("watch_id", 0)?,
        fragment: args.flag("fragment")?,
    })
}

impl script::Commands for WatchRunner {
    fn command(&mut self, cmd: &mut Cmd<'_>) -> Result<()> {
        let (name, args, out) = (cmd.name, &mut cmd.args, &mut cmd.out);
        match name {
            "hub" => {
                let d = WatchConfig::default();
                let config = WatchConfig {
                    buffer_len: args.num("buffer_len", d.buffer_len)?,
                    batch_max_revisions: args.num("batch_max_revisions", d.batch_max_revisions)?,
                    max_response_bytes: args.num("max_response_bytes", d.max_response_bytes)?,
                    ..d
                };
                (self.stream, self.output) = (None, None);
                self.h = Harness::new(config);
            }
            "put" | "delete" | "txn" => {
                let req = ops::request(name, args)?.ok_or("not a KV request")?;
                self.write(out, |w, out| {
                    ops::response(out, 0, &ops::apply(w, &req)?);
                    Ok(())
                })?;
            }
            "compact" => {
                let rev = args.pos_num("revision")?;
                self.write(out, |w, out| {
                    let resp = w.compact(rev)?;
                    writeln!(out, "compact: rev={}", ops::header(&resp.header))?;
                    Ok(())
                })?;
            }
            "puts" => {
                let key = args.pos("key")?;
                let count: usize = args.pos_num("count")?;
                let revs: Vec<i64> = (0..count)
                    .map(|i| self.h.put(&key, &i.to_string()))
                    .collect();
                writeln!(out, "revisions {:?}", revs)?;
            }
            "store_put" => {
                let req = PutRequest {
                    key: args.pos("key")?.into_bytes(),
                    value: args.pos("value")?.into_bytes(),
                    ..Default::default()
                };
                let mut w = self.h.store.write();
                w.put(&req)?;
                writeln!(out, "store revision={}", w.commit()?.revision)?;
            }
            "begin_install" => self.h.hub.begin_install(),
            "finish_install" => self.h.hub.finish_install(),
            "watch" => {
                let req = create_request(args)?;
                self.request(RequestUnion::CreateRequest(req));
            }
            "cancel" => {
                let watch_id = args.pos_num("watch id")?;
                self.request(RequestUnion::CancelRequest(WatchCancelRequest { watch_id }));
            }
            "progress" => self.request(RequestUnion::ProgressRequest(WatchProgressRequest {})),
            "empty_request" => self.stream().handle(WatchRequest {
                request_union: None,
            }),
            "tick" => self.stream().progress_tick(),
            "stream_len" => writeln!(out, "watchers on the stream: {}", self.stream().len())?,
            "drop_stream" => self.stream = None,
            "recv" => {
                let max = args.num("n", usize::MAX)?;
                let mut got = Vec::new();
                let polled = self.poll(max, &mut got);
                print_responses(out, &got)?;
                if let Polled::Ended = polled {
                    writeln!(out, "end of stream")?;
                } else if got.is_empty() {
                    writeln!(out, "no responses")?;
                }
            }
            "recv_wait" => {
                let want: usize = args.pos_num("count")?;
                let deadline = Instant::now() + Duration::from_secs(10);
                let mut got = Vec::new();
                while got.len() < want && Instant::now() < deadline {
                    self.poll(want, &mut got);
                    std::thread::sleep(Duration::from_millis(5));
                }
                print_responses(out, &got)?;
                if got.len() < want {
                    return Err(format!("{} of {want} responses in 10 s", got.len()).into());
                }
            }
            "sync" => self.h.sync_all(),
            "sync_round" => writeln!(out, "{:?}", self.h.hub.sync_round())?,
            "catch_up" => {
                let mut got = Vec::new();
                let mut rounds = 0;
                loop {
                    self.poll(usize::MAX, &mut got);
                    let outcome = self.h.hub.sync_round();
                    rounds += 1;
                    if outcome == SyncOutcome::Idle && self.h.hub.stats().unsynced == 0 {
                        break;
                    }
                    if rounds == 100 {
                        return Err("not caught up after 100 sync rounds".into());
                    }
                }
                self.poll(usize::MAX, &mut got);
                print_responses(out, &got)?;
            }
            "spawn_sync_thread" => self.h.hub.spawn_sync_thread()?,
            "stats" => {
                let s = self.h.hub.stats();
                writeln!(
                    out,
                    "revision={} watchers={} synced={} unsynced={}",
                    s.revision, s.watchers, s.synced, s.unsynced
                )?;
            }
            name => return Err(format!("unknown command {name:?}").into()),
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        self.h.hub.check_invariants();
        Ok(())
    }
}
