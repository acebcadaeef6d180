//! The rewrite equals the live tree at the switch, whatever the writers did during the copy,
//! and the new file holds only the live data.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use super::*;
use crate::backend::{Backend, generation};

fn contents(t: &sled::Tree) -> Vec<(IVec, IVec)> {
    t.iter().collect::<Result<_, _>>().unwrap()
}

/// A live member database in `dir/db` (through its generation link).
fn live_in(dir: &Path) -> (LiveTree, PathBuf) {
    let link = dir.join("db");
    let real = generation::prepare(&link).unwrap();
    (Backend::open(&real).unwrap().into_live(), link)
}

#[test]
fn writes_during_the_copy_land_in_the_new_generation() {
    let d = tempfile::tempdir().unwrap();
    let (live, link) = live_in(d.path());
    let tree = live.tree();
    for i in 0..30_000u32 {
        tree.insert(i.to_be_bytes(), vec![1u8; 64]).unwrap();
    }
    live.get()
        .db()
        .unwrap()
        .open_tree("local")
        .unwrap()
        .insert(b"member_id", b"7".as_slice())
        .unwrap();
    let mut rw = Rewrite::open(&live, &generation::next(&link).unwrap()).unwrap();
    rw.follow().unwrap();
    // A writer overwrites, removes and adds keys in both halves while the copy runs.
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(Barrier::new(2));
    let writer = {
        let (tree, stop, started) = (tree.clone(), stop.clone(), started.clone());
        std::thread::spawn(move || {
            started.wait();
            let mut round = 0u32;
            while !stop.load(Ordering::Acquire) || round < 3 {
                for i in (round % 7..30_000).step_by(97) {
                    if i % 2 == 0 {
                        tree.remove(i.to_be_bytes()).unwrap();
                    } else {
                        tree.insert(i.to_be_bytes(), round.to_be_bytes().to_vec())
                            .unwrap();
                    }
                }
                tree.insert((40_000 + round).to_be_bytes(), b"new".as_slice())
                    .unwrap();
                round += 1;
            }
            round
        })
    };
    started.wait();
    let copied = rw.copy(&|_| {}).unwrap();
    // Keys the writer removed before the copy reached them are not copied.
    assert!(copied > 25_000, "copied {copied}");
    stop.store(true, Ordering::Release);
    let rounds = writer.join().unwrap();
    assert!(rounds >= 3);
    // Writers are quiet now: the switch.
    let (next, followed) = rw.finish().unwrap();
    assert!(
        followed > 0,
        "the writer's changes came through the follower"
    );
    assert_eq!(contents(next.tree()), contents(&tree));
    assert_eq!(
        next.db()
            .unwrap()
            .open_tree("local")
            .unwrap()
            .get(b"member_id")
            .unwrap()
            .unwrap(),
        b"7"
    );
}

#[test]
fn the_new_generation_holds_only_the_live_data() {
    let d = tempfile::tempdir().unwrap();
    let (live, link) = live_in(d.path());
    let tree = live.tree();
    for i in 0..20_000u32 {
        tree.insert(i.to_be_bytes(), vec![7u8; 1024]).unwrap();
    }
    live.flush().unwrap();
    for i in 0..15_000u32 {
        tree.remove(i.to_be_bytes()).unwrap();
    }
    live.flush().unwrap();
    let before = live.size_on_disk().unwrap();
    let next_dir = generation::next(&link).unwrap();
    let mut rw = Rewrite::open(&live, &next_dir).unwrap();
    rw.follow().unwrap();
    rw.copy(&|_| {}).unwrap();
    let (next, _) = rw.finish().unwrap();
    let old_dir = generation::current(&link).unwrap().1;
    generation::point(&link, &next_dir).unwrap();
    live.switch(next, old_dir.clone());
    drop(tree);
    let after = live.size_on_disk().unwrap();
    assert_eq!(live.tree().len(), 5_000);
    assert!(
        after * 100 <= before * 60,
        "the file shrinks to at most 60%: {before} -> {after} bytes"
    );
    // The old generation goes once its last handle is gone (a thread closes and removes it).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while old_dir.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!old_dir.exists(), "the old generation is removed");
    assert_eq!(generation::prepare(&link).unwrap(), next_dir);
}

/// sled's `apply_batch` holds its process-wide lock exclusively while it waits for room in
/// each subscriber's channel (1,024 slots); a follower that needed that lock to drain the
/// channel deadlocked with the first batch larger than the room left (CI, 2026-12-01).
#[test]
fn batches_larger_than_the_change_channel_do_not_wait_for_the_follower() {
    let d = tempfile::tempdir().unwrap();
    let (live, link) = live_in(d.path());
    let tree = live.tree();
    let mut rw = Rewrite::open(&live, &generation::next(&link).unwrap()).unwrap();
    rw.follow().unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    let writer = {
        let tree = tree.clone();
        std::thread::spawn(move || {
            for round in 0..5u32 {
                let mut batch = sled::Batch::default();
                for i in 0..5_000u32 {
                    batch.insert(&i.to_be_bytes(), &round.to_be_bytes());
                }
                tree.apply_batch(batch).unwrap();
            }
            done.send(()).unwrap();
        })
    };
    // Bounded: a deadlock fails here instead of hanging the test binary (the stuck
    // threads are leaked: dropping the rewrite would wait for them).
    if finished.recv_timeout(Duration::from_secs(60)).is_err() {
        std::mem::forget(rw);
        panic!("five 5,000-key batches did not finish within 60 s while the rewrite followed");
    }
    writer.join().unwrap();
    rw.copy(&|_| {}).unwrap();
    let (next, followed) = rw.finish().unwrap();
    assert_eq!(followed, 25_000, "every change, and not the fence");
    assert_eq!(contents(next.tree()), contents(&tree));
    assert_eq!(tree.get(FENCE).unwrap(), None, "the fence writes nothing");
    assert_eq!(next.tree().get(FENCE).unwrap(), None);
}
