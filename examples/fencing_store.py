"""Fencing tokens: a storage layer that turns away a paused lock holder's late write.

A lock alone cannot stop a holder that pauses (a long GC pause, a stopped VM,
a slow disk) past its lease: when it wakes, it still believes it holds the
lock and writes. Every acquisition comes with a fencing token, larger than
any earlier one for the same key; a store that remembers the largest token
it has seen, and refuses writes with a smaller one, turns that late write
away.

Timeline (lock ttl 0.5 s):

    A  acquires, token n  ...... pauses for 1 s ...... wakes, writes with n    -> rejected
    B             waits ... lease expires: acquires, token m > n, writes     -> accepted

    python examples/fencing_store.py                     # local redis-server nodes
    python examples/fencing_store.py --nodes URL URL URL
"""

from __future__ import annotations

import sys
import threading
import time

from _support import elapsed, parse_args, redis_urls, say

from celery_redlock import Redlock

KEY = "invoice:42"
a_holds = threading.Event()


class StaleToken(Exception):
    """A write carried a fencing token older than one the store has seen."""


class FencedStore:
    """A toy key-value store that accepts a write only with a token >= the last one seen."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}
        self.highest: dict[str, int] = {}
        self._mutex = threading.Lock()

    def write(self, key: str, value: str, token: int) -> None:
        with self._mutex:  # check and write as one step, as a database would
            seen = self.highest.get(key, 0)
            if token < seen:
                raise StaleToken(f"token {token} < {seen} already seen for {key!r}")
            self.highest[key] = token
            self.data[key] = value


def log(who: str, message: str) -> None:
    say(f"{elapsed():5.2f} s  {who}  {message}")


def client_a(
    redlock: Redlock, store: FencedStore, naive: dict[str, str], out: dict[str, str]
) -> None:
    lock = redlock.lock(KEY, ttl=0.5)
    lock.acquire()
    token = lock.fencing_token
    assert token is not None
    log("A", f"acquired {KEY!r} (ttl 0.5 s), fencing token {token}")
    a_holds.set()
    log("A", "pauses for 1 s (think: a stop-the-world GC pause)")
    time.sleep(1.0)
    log("A", f"wakes; its lock is gone (locked()={lock.locked()}), but it writes anyway")
    naive[KEY] = "total=100 (A)"
    try:
        store.write(KEY, "total=100 (A)", token)
        out["A"] = "accepted"
        log("A", f"write with token {token}: accepted")
    except StaleToken as exc:
        out["A"] = "rejected"
        log("A", f"write with token {token}: REJECTED ({exc})")


def client_b(
    redlock: Redlock, store: FencedStore, naive: dict[str, str], out: dict[str, str]
) -> None:
    a_holds.wait(10)  # A goes first
    log("B", f"waits for {KEY!r}")
    with redlock.lock(KEY, ttl=5.0, timeout=5.0) as lock:
        token = lock.fencing_token
        assert token is not None
        log("B", f"acquired it as A's lease ran out, fencing token {token}")
        naive[KEY] = "total=120 (B)"
        store.write(KEY, "total=120 (B)", token)
        out["B"] = "accepted"
        log("B", f"write with token {token}: accepted")
        time.sleep(0.8)  # still working when A wakes up


def main() -> int:
    options = parse_args(__doc__, broker=False)
    with redis_urls(options, broker=False) as nodes:
        redlock = Redlock(nodes, key_prefix="examples:fencing_store:")
        store = FencedStore()
        naive: dict[str, str] = {}  # the same writes, into a store that checks nothing
        out: dict[str, str] = {}
        threads = [
            threading.Thread(target=client, args=(redlock, store, naive, out))
            for client in (client_a, client_b)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        redlock.close()

    say()
    say(f"fenced store holds:  {store.data[KEY]}")
    say(f"a store without the check would hold:  {naive[KEY]}  (B's write lost)")
    ok = out == {"A": "rejected", "B": "accepted"} and store.data[KEY] == "total=120 (B)"
    say("OK: the late write with the older token was rejected" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
