#!/usr/bin/env python3
"""Per-stage write-path timeline from the `keel::trace` events of a cluster's logs.

Run the members with `RUST_LOG=info,openraft=warn,keel::trace=debug` (text or JSON log
format), write to the leader, then:

    scripts/put-trace.py /tmp/keel-cluster/keel1.log /tmp/keel-cluster/keel2.log ...

The leader is the log holding `propose` events. Events are joined by log index (the members
of one machine share the wall clock; `t_us` is microseconds since the epoch). For every
client entry proposed on the leader it computes the stage intervals below and prints their
median, p90, p99 and count as a markdown table, plus how often the first AppendEntries for an
entry left the leader before the leader's own fdatasync of it finished (the overlap question
of issue 20). Stages (leader L, follower F; a follower row uses the first follower to
answer, the one that makes the quorum of 3):

  queue          L receive -> L propose        waiting in the proposer for an entry slot
  to_append      L propose -> L append         client_write until the log store is called
  leader_fsync   L append -> L durable         the leader's WAL write + fdatasync
  durable_to_ae  L durable -> L first ae_send  (negative = replication overlapped the fsync)
  append_to_ae   L append -> L first ae_send
  net_out        L ae_send -> F ae_recv        request transfer + follower decode
  f_to_append    F ae_recv -> F append
  f_fsync        F append -> F durable
  f_reply        F durable -> F ae_reply
  net_back       F ae_reply -> L ae_ack
  ack_to_commit  L first ae_ack -> L commit
  commit_apply   L commit -> L apply
  apply_resp     L apply -> L response
  total          L receive -> L response
"""

import json
import re
import sys
from bisect import bisect_left
from collections import defaultdict

FIELD = re.compile(r'(\w+)=("([^"]*)"|\S+)')


def events(path):
    """Yields (stage, first, last, peer, t_us, id) of every trace event in one log."""
    with open(path, errors="replace") as f:
        for line in f:
            if "keel::trace" not in line:
                continue
            if line.lstrip().startswith("{"):
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                d = d.get("fields", d)
            else:
                d = {m.group(1): m.group(3) if m.group(3) is not None else m.group(2)
                     for m in FIELD.finditer(line)}
            if "stage" not in d or "t_us" not in d:
                continue
            yield (str(d["stage"]), int(d["first"]), int(d["last"]), int(d.get("peer", 0)),
                   int(d["t_us"]), int(d.get("id", 0)))


class Member:
    """One member's events: the first time each stage covered each index."""

    def __init__(self, path):
        self.path = path
        self.first = defaultdict(dict)  # stage -> index -> t
        self.per_peer = defaultdict(lambda: defaultdict(dict))  # stage -> peer -> index -> t
        self.commits = []  # (t, committed index), in log order
        self.receive = {}  # request id -> t
        self.proposed = {}  # index -> request id
        for stage, first, last, peer, t, rid in events(path):
            if stage == "receive":
                self.receive[first] = t
                continue
            if stage == "commit":
                self.commits.append((t, last))
                continue
            if stage == "propose":
                self.proposed[first] = rid
            for i in range(first, last + 1):
                self.first[stage].setdefault(i, t)
                if peer:
                    self.per_peer[stage][peer].setdefault(i, t)
        self.commits.sort()
        # Commit times as a running maximum of the committed index, for "first t with c >= i".
        self.commit_t, self.commit_i, best = [], [], 0
        for t, c in self.commits:
            if c > best:
                best = c
                self.commit_t.append(t)
                self.commit_i.append(c)

    def committed_at(self, index):
        k = bisect_left(self.commit_i, index)
        return self.commit_t[k] if k < len(self.commit_t) else None


def pct(sorted_values, q):
    if not sorted_values:
        return None
    k = min(len(sorted_values) - 1, int(round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


def analyse(paths):
    """(leader, followers, rows, overlap) of the logs at `paths`; see the module docs."""
    members = [Member(p) for p in paths]
    leaders = [m for m in members if m.proposed]
    if not leaders:
        sys.exit("put-trace: no `propose` events; was keel::trace=debug set and the leader written to?")
    leader = max(leaders, key=lambda m: len(m.proposed))
    followers = {}
    for m in members:
        if m is leader:
            continue
        for peer in m.per_peer.get("ae_recv", {}):
            followers[peer] = m
    rows = defaultdict(list)
    overlap = [0, 0]
    for index in sorted(leader.proposed):
        L = leader.first
        get = lambda stage: L[stage].get(index)
        recv = leader.receive.get(leader.proposed[index])
        prop, app, dur = get("propose"), get("append"), get("durable")
        apply_, resp = get("apply"), get("response")
        commit = leader.committed_at(index)
        sends = {p: d[index] for p, d in leader.per_peer["ae_send"].items() if index in d}
        acks = {p: d[index] for p, d in leader.per_peer["ae_ack"].items() if index in d}

        def add(name, a, b):
            if a is not None and b is not None:
                rows[name].append((b - a) / 1000.0)

        add("queue", recv, prop)
        add("to_append", prop, app)
        add("leader_fsync", app, dur)
        if sends:
            first_send = min(sends.values())
            add("durable_to_ae", dur, first_send)
            add("append_to_ae", app, first_send)
            if dur is not None:
                overlap[0] += first_send < dur
                overlap[1] += 1
        if acks:
            quorum_peer = min(acks, key=acks.get)
            add("ack_to_commit", acks[quorum_peer], commit)
            f = followers.get(quorum_peer)
            if f is not None:
                ff = lambda stage: f.per_peer[stage].get(quorum_peer, {}).get(index)
                fr, fa, fd, fp = ff("ae_recv"), f.first["append"].get(index), \
                    f.first["durable"].get(index), ff("ae_reply")
                add("net_out", sends.get(quorum_peer), fr)
                add("f_to_append", fr, fa)
                add("f_fsync", fa, fd)
                add("f_reply", fd, fp)
                add("net_back", fp, acks[quorum_peer])
        add("commit_apply", commit, apply_)
        add("apply_resp", apply_, resp)
        add("total", recv, resp)
    return leader, followers, rows, overlap


ORDER = ["queue", "to_append", "leader_fsync", "durable_to_ae", "append_to_ae", "net_out",
         "f_to_append", "f_fsync", "f_reply", "net_back", "ack_to_commit", "commit_apply",
         "apply_resp", "total"]


def main(paths):
    leader, followers, rows, overlap = analyse(paths)
    order = ORDER
    print(f"leader log: {leader.path}; {len(leader.proposed)} client entries; followers: "
          f"{', '.join(f'{p:x}={m.path}' for p, m in followers.items()) or 'none'}")
    print()
    print("| stage | median ms | p90 ms | p99 ms | entries |")
    print("|---|---|---|---|---|")
    for name in order:
        v = sorted(rows.get(name, []))
        if not v:
            continue
        print(f"| {name} | {pct(v, 0.5):.3f} | {pct(v, 0.9):.3f} | {pct(v, 0.99):.3f} | {len(v)} |")
    print()
    if overlap[1]:
        print(f"first AppendEntries sent before the leader's own fdatasync finished: "
              f"{overlap[0]} of {overlap[1]} entries ({100.0 * overlap[0] / overlap[1]:.1f}%)")


def self_test():
    """Synthetic logs of one entry, text format on the leader and JSON on the follower:
    every interval must come out as written, and the overlap must be seen."""
    import os
    import tempfile
    lead = [("receive", 7, 7, 0, 100, None), ("propose", 5, 5, 0, 110, 7),
            ("append", 4, 5, 0, 120, None), ("ae_send", 5, 6, 9, 150, None),
            ("durable", 4, 5, 0, 220, None), ("ae_ack", 5, 6, 9, 500, None),
            ("commit", 3, 3, 0, 505, None), ("commit", 6, 6, 0, 510, None),
            ("apply", 5, 5, 0, 600, None), ("response", 5, 5, 0, 650, None)]
    foll = [("ae_recv", 5, 6, 9, 260), ("append", 5, 6, 0, 270), ("durable", 5, 6, 0, 400),
            ("ae_reply", 5, 6, 9, 420)]
    with tempfile.TemporaryDirectory() as d:
        lp, fp = os.path.join(d, "l.log"), os.path.join(d, "f.log")
        with open(lp, "w") as f:
            for st, a, b, p, t, rid in lead:
                extra = f" id={rid}" if rid is not None else ""
                f.write(f'2026-12-01T00:00:00Z DEBUG keel::trace: trace stage="{st}" '
                        f"first={a} last={b} peer={p} t_us={t}{extra}\n")
        with open(fp, "w") as f:
            for st, a, b, p, t in foll:
                f.write(json.dumps({"level": "DEBUG", "target": "keel::trace", "stage": st,
                                    "first": a, "last": b, "peer": p, "t_us": t}) + "\n")
        leader, followers, rows, overlap = analyse([fp, lp])
        assert leader.path == lp and list(followers) == [9], (leader.path, followers)
        want = {"queue": 10, "to_append": 10, "leader_fsync": 100, "durable_to_ae": -70,
                "append_to_ae": 30, "net_out": 110, "f_to_append": 10, "f_fsync": 130,
                "f_reply": 20, "net_back": 80, "ack_to_commit": 10, "commit_apply": 90,
                "apply_resp": 50, "total": 550}
        got = {k: round(v[0] * 1000) for k, v in rows.items()}
        assert got == want, got
        assert overlap == [1, 1], overlap
    print("put-trace.py self-test: ok")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
    elif len(sys.argv) < 2:
        sys.exit(__doc__)
    else:
        main(sys.argv[1:])
