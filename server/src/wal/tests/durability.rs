//! Group commit: callbacks, waiting, sharing of fdatasyncs, failure and shutdown.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{append_each, data, opts};
use crate::wal::{Wal, WalError, WalOptions};

const TIMEOUT: Duration = Duration::from_secs(20);

#[test]
fn wal_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Wal>();
    assert_send_sync::<WalError>();
}

#[test]
fn on_durable_fires_after_a_sync_on_the_sync_thread() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Arc::new(Wal::open(dir.path(), WalOptions::default()).unwrap());
    let lsn = wal.append(&[(1, b"entry")]).unwrap();
    let (tx, rx) = mpsc::channel();
    let probe = Arc::clone(&wal);
    wal.on_durable(
        lsn,
        Box::new(move |res| {
            let thread = std::thread::current().name().map(str::to_string);
            tx.send((
                res.is_ok(),
                thread,
                probe.stats().sync_rounds,
                probe.lsns().1,
            ))
            .unwrap();
        }),
    );
    let (ok, thread, rounds, durable) = rx.recv_timeout(TIMEOUT).unwrap();
    assert!(ok);
    assert_eq!(thread.as_deref(), Some("keel-wal-sync"));
    assert!(rounds >= 1, "no fdatasync round before the callback");
    assert!(durable >= lsn);
}

#[test]
fn callbacks_fire_in_lsn_order_and_already_durable_ones_still_fire() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let lsns: Vec<u64> = (1..=5)
        .map(|i| wal.append(&[(i, &data(i, 10))]).unwrap())
        .collect();
    for &lsn in lsns.iter().rev() {
        let order = Arc::clone(&order);
        wal.on_durable(
            lsn,
            Box::new(move |res| order.lock().unwrap().push((lsn, res.is_ok()))),
        );
    }
    wal.sync().unwrap();
    let (tx, rx) = mpsc::channel();
    wal.on_durable(lsns[0], Box::new(move |res| tx.send(res.is_ok()).unwrap()));
    assert!(
        rx.recv_timeout(TIMEOUT).unwrap(),
        "already-durable callback fired Ok"
    );
    let got = order.lock().unwrap().clone();
    let mut sorted = got.clone();
    sorted.sort();
    assert_eq!(got.len(), 5);
    assert!(got.iter().all(|(_, ok)| *ok));
    assert_eq!(got, sorted, "fired in Lsn order");
}

#[test]
fn concurrent_appenders_share_fdatasyncs() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Arc::new(Wal::open(dir.path(), WalOptions::default()).unwrap());
    let next = Arc::new(Mutex::new(1u64));
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let (wal, next) = (Arc::clone(&wal), Arc::clone(&next));
            std::thread::spawn(move || {
                for _ in 0..40 {
                    // The index must be taken under the same order as the append.
                    let lsn = {
                        let mut n = next.lock().unwrap();
                        let lsn = wal.append(&[(*n, &data(*n, 300))]).unwrap();
                        *n += 1;
                        lsn
                    };
                    wal.wait_durable(lsn).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let stats = wal.stats();
    assert_eq!((stats.writes, stats.entries), (640, 640));
    assert!(stats.sync_rounds < 640, "no sharing: {stats:?}");
    assert!(stats.fdatasyncs >= stats.sync_rounds);
    assert_eq!(wal.last_index(), Some(640));
}

#[test]
fn wait_durable_returns_once_synced_and_lsns_track_it() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), opts(4096)).unwrap();
    let lsn = append_each(&wal, 1, 100, 64);
    assert_eq!(lsn, 100);
    wal.wait_durable(lsn).unwrap();
    let (written, durable) = wal.lsns();
    assert_eq!(written, 100);
    assert!(durable >= 100);
    wal.wait_durable(0).unwrap();
}

#[test]
fn a_failure_fails_waiters_callbacks_and_later_writes() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    let done = wal.append(&[(1, b"a")]).unwrap();
    wal.wait_durable(done).unwrap();
    wal.inject_failure("injected fdatasync error");
    // Writes are refused from now on.
    match wal.append(&[(2, b"b")]) {
        Err(WalError::Failed(reason)) => assert!(reason.contains("injected"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(wal.set_meta(1, b"v"), Err(WalError::Failed(_))));
    assert!(matches!(wal.truncate_from(1), Err(WalError::Failed(_))));
    assert!(matches!(wal.purge_to(1), Err(WalError::Failed(_))));
    // A not-yet-durable Lsn fails; an already durable one still reports Ok.
    let (tx, rx) = mpsc::channel();
    let tx2 = tx.clone();
    wal.on_durable(
        done + 1,
        Box::new(move |res| tx.send(("pending", res.is_ok())).unwrap()),
    );
    wal.on_durable(
        done,
        Box::new(move |res| tx2.send(("durable", res.is_ok())).unwrap()),
    );
    let mut got = vec![
        rx.recv_timeout(TIMEOUT).unwrap(),
        rx.recv_timeout(TIMEOUT).unwrap(),
    ];
    got.sort();
    assert_eq!(got, vec![("durable", true), ("pending", false)]);
    assert!(matches!(
        wal.wait_durable(done + 1),
        Err(WalError::Failed(_))
    ));
    assert_eq!(
        wal.read(1).unwrap().as_deref(),
        Some(&b"a"[..]),
        "reads still work"
    );
    drop(wal);
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    assert_eq!(wal.last_index(), Some(1), "reopen recovers");
}

#[test]
fn drop_makes_pending_writes_durable_and_fires_callbacks() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    let (tx, rx) = mpsc::channel();
    let lsn = wal.append(&[(1, b"last words")]).unwrap();
    wal.on_durable(lsn, Box::new(move |res| tx.send(res.is_ok()).unwrap()));
    drop(wal);
    assert!(rx.recv_timeout(TIMEOUT).unwrap());
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    assert_eq!(wal.read(1).unwrap().as_deref(), Some(&b"last words"[..]));
}

#[test]
fn dropping_the_last_handle_inside_a_callback_does_not_deadlock() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Arc::new(Wal::open(dir.path(), WalOptions::default()).unwrap());
    let lsn = wal.append(&[(1, b"x")]).unwrap();
    let (tx, rx) = mpsc::channel();
    let owned = Arc::clone(&wal);
    wal.on_durable(
        lsn,
        Box::new(move |_| {
            drop(owned);
            tx.send(()).unwrap();
        }),
    );
    drop(wal);
    let start = Instant::now();
    rx.recv_timeout(TIMEOUT).unwrap();
    assert!(start.elapsed() < TIMEOUT);
    // The lock was released: the directory opens again (retry while the thread winds down).
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match Wal::open(dir.path(), WalOptions::default()) {
            Ok(w) => {
                assert_eq!(w.last_index(), Some(1));
                break;
            }
            Err(WalError::Locked { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn a_panicking_callback_does_not_stop_group_commit() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    let lsn = wal.append(&[(1, b"a")]).unwrap();
    wal.on_durable(lsn, Box::new(|_| panic!("callback bug")));
    wal.wait_durable(lsn).unwrap();
    let lsn = wal.append(&[(2, b"b")]).unwrap();
    let (tx, rx) = mpsc::channel();
    wal.on_durable(lsn, Box::new(move |res| tx.send(res.is_ok()).unwrap()));
    assert!(
        rx.recv_timeout(TIMEOUT).unwrap(),
        "sync thread still running"
    );
}

#[test]
fn failure_reports_the_first_error_and_whether_the_disk_was_full() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    let done = wal.append(&[(1, b"a")]).unwrap();
    wal.wait_durable(done).unwrap();
    assert_eq!(wal.failure(), None);
    wal.inject_io_failure("write seg", std::io::Error::from_raw_os_error(libc::ENOSPC));
    // A later, different error does not replace the first one.
    wal.inject_io_failure(
        "fdatasync seg",
        std::io::Error::from_raw_os_error(libc::EIO),
    );
    let f = wal.failure().expect("the WAL failed");
    assert!(f.no_space);
    assert!(
        f.reason.starts_with("write seg: No space left on device"),
        "{}",
        f.reason
    );
    match wal.append(&[(2, b"b")]) {
        Err(WalError::Failed(reason)) => assert_eq!(reason, f.reason),
        other => panic!("{other:?}"),
    }
    // EIO is not a full disk.
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    wal.inject_io_failure(
        "fdatasync seg",
        std::io::Error::from_raw_os_error(libc::EIO),
    );
    assert!(!wal.failure().unwrap().no_space);
}

#[test]
fn a_lazy_meta_write_starts_no_sync_round_and_rides_on_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), WalOptions::default()).unwrap();
    wal.wait_durable(wal.append(&[(1, b"entry 1")]).unwrap())
        .unwrap();
    let rounds = wal.stats().sync_rounds;
    let lazy = wal.set_meta_lazy(2, b"committed 1").unwrap();
    assert_eq!(
        wal.meta(2).as_deref(),
        Some(&b"committed 1"[..]),
        "readable at once"
    );
    // Nothing asks for it: the sync thread stays asleep (it would start within microseconds).
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        wal.stats().sync_rounds,
        rounds,
        "a lazy write started a round"
    );
    assert!(
        wal.lsns().1 < lazy,
        "a lazy write became durable on its own"
    );
    // The next append's round covers it too.
    let next = wal.append(&[(2, b"entry 2")]).unwrap();
    assert!(next > lazy);
    wal.wait_durable(next).unwrap();
    assert_eq!(wal.stats().sync_rounds, rounds + 1);
    assert!(wal.lsns().1 >= lazy);
}

#[test]
fn waiting_for_a_lazy_meta_write_makes_it_durable() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Arc::new(Wal::open(dir.path(), WalOptions::default()).unwrap());
    let first = wal.set_meta_lazy(2, b"committed 1").unwrap();
    let (tx, rx) = mpsc::channel();
    wal.on_durable(first, Box::new(move |res| tx.send(res.is_ok()).unwrap()));
    assert!(
        rx.recv_timeout(TIMEOUT).unwrap(),
        "on_durable of a lazy write fired Ok"
    );
    assert!(wal.lsns().1 >= first);
    let second = wal.set_meta_lazy(2, b"committed 2").unwrap();
    let waiter = Arc::clone(&wal);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(waiter.wait_durable(second).is_ok()).unwrap());
    assert!(
        rx.recv_timeout(TIMEOUT).unwrap(),
        "wait_durable of a lazy write returned Ok"
    );
    assert!(wal.lsns().1 >= second);
}
