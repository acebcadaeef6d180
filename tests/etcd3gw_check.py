#!/usr/bin/env python3
"""openstack's etcd3gw (the grpc-gateway client OpenStack tooz uses) against a Keel member.

Usage: etcd3gw_check.py HOST PORT. Exercises put, get, get_prefix, create, lease grant, ttl,
refresh, keys and revoke, watch, lock and delete; asserts each answer's values; exits
non-zero (with the failing step) on the first mismatch. etcd3gw reads /version first to
pick the /v3/ prefix. scripts/test.sh runs it in CI from a venv with etcd3gw installed.
"""
import sys
import threading
import time

import etcd3gw


def main() -> int:
    host, port = sys.argv[1], int(sys.argv[2])
    c = etcd3gw.client(host=host, port=port, timeout=10)
    assert c.api_path.endswith("/v3/"), c.api_path

    assert c.put("gw/a", "1") is True
    assert c.put("gw/b", "2") is True
    assert c.get("gw/a") == [b"1"], c.get("gw/a")
    assert c.get("gw/none") == [], c.get("gw/none")
    values = sorted(v for v, _ in c.get_prefix("gw/"))
    assert values == [b"1", b"2"], values

    # create: only when absent.
    assert c.create("gw/c", "3") is True
    assert c.create("gw/c", "4") is False
    assert c.get("gw/c") == [b"3"]

    lease = c.lease(ttl=60)
    assert lease.id > 0, lease.id
    ttl = lease.ttl()
    assert 55 <= ttl <= 60, ttl
    assert c.put("gw/leased", "x", lease=lease) is True
    assert lease.keys() == [b"gw/leased"], lease.keys()
    assert lease.refresh() == 60
    assert lease.revoke() is True
    assert c.get("gw/leased") == []

    # watch: the event of a put made after the watch starts.
    events, cancel = c.watch("gw/w")
    got = []
    reader = threading.Thread(target=lambda: got.append(next(iter(events))), daemon=True)
    reader.start()
    time.sleep(0.5)
    assert c.put("gw/w", "seen") is True
    reader.join(10)
    cancel()
    assert got and got[0]["kv"]["value"] == b"seen", got

    lock = c.lock("gw-lock", ttl=30)
    assert lock.acquire() is True
    assert lock.is_acquired() is True
    other = c.lock("gw-lock", ttl=30)
    assert other.acquire() is False
    assert lock.release() is True
    assert other.acquire() is True
    assert other.release() is True

    assert c.delete("gw/a") is True
    assert c.delete("gw/a") is False
    assert c.delete_prefix("gw/") is True
    assert c.get_prefix("gw/") == []
    print("etcd3gw: put, get, get_prefix, create, lease, watch, lock, delete: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
