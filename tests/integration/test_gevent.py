"""Lock calls in green processes (gevent, and eventlet where it differs), against real servers.

Each scenario runs in a subprocess of its own (monkey-patching is for a whole process): a long
loop's pause lets a sleeping greenlet's timer run; a renewal killed wherever it yields leaves no
lease taken; a leader killed in its pause between two chunks of replies leaves no other caller's
reply in the buffer; a thread of gevent's pool polls on its own loop although the main thread
polled first; a process patched after its first lock call does not block every greenlet in its
polls.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

#: A greenlet sleeps 1 ms; the main one works 2 ms between pauses (so the
#: timer is due at each) and counts the pauses made before the sleeper ran.
SLEEPER_UNDER_LOAD = """
from gevent import monkey

monkey.patch_all()

import json
import time

import gevent

from celery_redlock import _clock

state = {"pauses": 0, "woke": None}


def sleeper():
    gevent.sleep(0.001)
    state["woke"] = state["pauses"]


gevent.spawn(sleeper)
gevent.sleep(0)  # the sleeper starts and sets its timer
while state["woke"] is None and state["pauses"] < 500:
    busy_until = time.monotonic() + 0.002
    while time.monotonic() < busy_until:
        pass
    _clock.pause()
    state["pauses"] += 1
print(json.dumps({"woke": state["woke"]}))
"""


#: Holds LOCKS locks, then kills a renewal of all of them at its 1st, 2nd, ... switch to the
#: loop (every point where it yields), and after each kill asks whether any lease is still
#: taken (a second renewal answers BUSY for it: its mutex was never given back).
KILLED_RENEWAL = """
from gevent import monkey

monkey.patch_all()

import json
import sys
import uuid

import gevent
import greenlet

from celery_redlock import Redlock
from celery_redlock.lock.quorum import BUSY

url, count = sys.argv[1], int(sys.argv[2])
redlock = Redlock([url], node_timeout=2.0)
prefix = uuid.uuid4().hex
locks = [redlock.lock(f"{prefix}:{n}", ttl=60.0) for n in range(count)]
for lock in locks:
    assert lock.acquire(blocking=False)

state = {"renewer": None, "switches": 0}


def trace(event, args):
    if event in ("switch", "throw") and args[0] is state["renewer"]:
        state["switches"] += 1


greenlet.settrace(trace)
kills = []
at = 1
while at < 200:
    state["switches"] = 0
    renewer = state["renewer"] = gevent.spawn(redlock.renew, locks)
    while not renewer.dead and state["switches"] < at:
        gevent.sleep(0)
    if renewer.dead:
        break  # it finished in fewer switches: every one was tried
    where = state["switches"]
    renewer.kill()
    state["renewer"] = None
    busy = redlock.renew(locks).count(BUSY)
    kills.append([where, busy])
    if busy:
        break  # taken for good: the next kills would all see them
    at += 1
greenlet.settrace(None)
print(json.dumps({"kills": kills}))
"""

#: The main thread takes a lock (the hub's first poll), then a thread of gevent's pool takes
#: another while the main thread computes (its loop not running) for up to 3 s.
POOL_THREAD_AFTER_MAIN = """
from gevent import monkey

monkey.patch_all()

import json
import sys
import time
import uuid

import gevent

from celery_redlock import Redlock

redlock = Redlock([sys.argv[1]], node_timeout=1.0)
prefix = uuid.uuid4().hex
first = redlock.lock(prefix + ":main", ttl=10.0)
assert first.acquire(blocking=False)
assert first.release()
found = {}


def in_pool_thread():
    started = time.monotonic()
    try:
        lock = redlock.lock(prefix + ":thread", ttl=10.0)
        found["acquired"] = lock.acquire(blocking=False)
        found["released"] = lock.release() if found["acquired"] else None
    except Exception as exc:
        found["error"] = f"{type(exc).__name__}: {exc}"
    found["seconds"] = time.monotonic() - started


task = gevent.get_hub().threadpool.spawn(in_pool_thread)
busy_until = time.monotonic() + 3.0
while "seconds" not in found and time.monotonic() < busy_until:
    pass  # CPU work in the main thread: its gevent loop does not run meanwhile
task.get()
print(json.dumps(found))
"""

#: A fan-out before gevent's monkey-patching, then one waiting 0.5 s for its reply (BLPOP on
#: an empty list) while a greenlet ticks every 10 ms: the ticks made during that wait.
PATCHED_AFTER_FIRST_USE = """
import json
import sys
import time

from celery_redlock.transport.nodes import Command, fan_out, make_nodes

nodes = make_nodes([sys.argv[1]], 2.0)
assert fan_out(nodes, [[Command(("PING",))]], 2.0) == [[b"PONG"]]

from gevent import monkey

monkey.patch_all()

import gevent

ticks = []


def ticker():
    while True:
        ticks.append(time.monotonic())
        gevent.sleep(0.01)


ticking = gevent.spawn(ticker)
gevent.sleep(0.05)
started = time.monotonic()
result = fan_out(nodes, [[Command(("BLPOP", "nothing-here", "0.5"))]], 2.0)
took = time.monotonic() - started
ticking.kill()
print(json.dumps({
    "result": repr(result),
    "took": took,
    "ticks": len([tick for tick in ticks if tick > started]),
}))
"""


#: Green thread A sends 600 calls (an EVAL that keeps the node busy a moment, then 600 PINGs)
#: and leads; green thread B, a follower, queues 100 ECHOs on the same bulk connection while it
#: is still connecting, so both batches leave in one write and their replies come back in one
#: read. A third kills A where it yields in Hub.handle, between two chunks of 256 replies (a
#: gevent.Timeout or a kill of the task that leads). B's replies are already in the link's
#: buffer then: B should have them at once. The library: gevent or eventlet (argument 2).
LEADER_KILLED_IN_ITS_PAUSE = """
import sys

if sys.argv[2] == "gevent":
    from gevent import monkey

    monkey.patch_all()
    import gevent

    spawn, yield_now = gevent.spawn, lambda: gevent.sleep(0)

    def kill(glet):
        glet.kill(block=False)

    def wait(glets):
        gevent.joinall(glets, timeout=10)

else:
    import eventlet

    eventlet.monkey_patch()
    spawn, yield_now = eventlet.spawn, lambda: eventlet.sleep(0)

    def kill(glet):
        eventlet.spawn_n(glet.kill)

    def wait(glets):
        for glet in glets:
            try:
                glet.wait()
            except BaseException as exc:  # the leader's GreenletExit
                state.setdefault("errors", []).append(repr(exc))


import json
import time

from celery_redlock.transport.nodes import Command, fan_out, make_nodes

nodes = make_nodes([sys.argv[1]], 1.0)
# A counted loop, not TIME: Valkey's TIME stands still inside a script.
BUSY = "local x = 0 for i = 1, 3000000 do x = x + i end return 1"
assert fan_out(nodes, [[Command(("PING",))]], 1.0) == [[b"PONG"]]
state = {}


def in_the_hubs_pause(glet):
    frame, names = glet.gr_frame, []
    while frame is not None:
        names.append((frame.f_code.co_name, frame.f_code.co_filename))
        frame = frame.f_back
    return any(n == "pause" and f.endswith("_clock.py") for n, f in names) and any(
        n == "handle" and f.endswith("hub.py") for n, f in names
    )


def killer():
    for _ in range(100000):
        if leader.dead:
            return
        if in_the_hubs_pause(leader):
            state["killed"] = True
            kill(leader)
            return
        yield_now()


def lead():
    fan_out(nodes, [[Command(("EVAL", BUSY, "0"))] + [Command(("PING",))] * 600], 1.0)


def follow():
    started = time.monotonic()
    result = fan_out(nodes, [[Command(("ECHO", "b"))] * 100], 1.0)
    state["result"] = repr(result)[:300]
    state["ok"] = result == [[b"b"] * 100]
    state["took"] = time.monotonic() - started


leader = spawn(lead)
follower = spawn(follow)
spawn(killer)
wait([leader, follower])
print(json.dumps(state))
"""


def run(script: str, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_gevent_pool_thread_polls_on_its_own_loop_after_the_main_thread_did(servers):
    pytest.importorskip("gevent")
    # The hub kept the poller the main thread made first: gevent's poll watches on the loop of
    # the thread that made it, so the pool thread's poll waited on the main thread's loop,
    # which does not run while the main thread computes: no reply, QuorumUnavailable after 1 s.
    found = run(POOL_THREAD_AFTER_MAIN, servers[0].url)
    assert found.get("error") is None, found
    assert found["acquired"] is True, found
    assert found["released"] is True, found


def test_gevent_patching_after_the_first_call_leaves_no_poll_blocking_every_greenlet(servers):
    pytest.importorskip("gevent")
    # The poller is chosen per poll "as patching may come later": a kept select.poll made
    # before monkey.patch_all() blocks the whole process in every later poll (no tick, or one,
    # during a 0.5 s wait for a reply, where gevent's poll lets the ticker run ~50 times).
    found = run(PATCHED_AFTER_FIRST_USE, servers[0].url)
    assert found["result"] == "[[None]]", found
    assert found["took"] >= 0.45, found
    assert found["ticks"] >= 5, found


def test_a_renewal_killed_wherever_it_yields_gives_every_lease_back_under_gevent(servers):
    pytest.importorskip("gevent")
    # 600 leases: the clean-up (end_renewal of each) pauses after the 256th and 512th. A
    # GreenletExit (gevent.kill, a gevent.Timeout) delivered in one of those pauses left the
    # leases after it taken for good: every later renewal, extend or release of them BUSY.
    found = run(KILLED_RENEWAL, servers[0].url, "600")
    kills = found["kills"]
    assert kills, found
    stuck = [(switch, busy) for switch, busy in kills if busy]
    assert stuck == [], f"killed at switch {stuck[0][0]}: {stuck[0][1]} of 600 leases still taken"


def test_a_pause_in_a_long_loop_lets_a_due_timer_run_under_gevent():
    pytest.importorskip("gevent")
    # sleep(0) only queued the caller behind the ready greenlets: the loop ran
    # about 50 such turns before it polled and ran expired timers again, so a
    # 10,000-lock renewal kept a sleeping greenlet waiting for 27-48 ms.
    found = run(SLEEPER_UNDER_LOAD)
    assert found["woke"] == 0  # woken in the first pause after it was due


def test_a_leader_killed_in_its_pause_leaves_no_follower_reply_stranded_under_gevent(servers):
    pytest.importorskip("gevent")
    # Hub.handle releases the lock and pauses between chunks of 256 replies; a kill there
    # (GreenletExit, gevent.Timeout) left the rest of the link's buffer undispatched. The next
    # leader only polls the socket, which has nothing more to read: the follower whose replies
    # sat in that buffer waited out its whole node timeout and got a NodeFailure (TimeoutError).
    found = run(LEADER_KILLED_IN_ITS_PAUSE, servers[0].url, "gevent")
    assert found.get("killed"), found
    assert found.get("ok"), found


def test_a_leader_killed_in_its_pause_leaves_no_follower_reply_stranded_under_eventlet(servers):
    # eventlet is not imported here: its import makes every later fork in this process warn.
    found = run(LEADER_KILLED_IN_ITS_PAUSE, servers[0].url, "eventlet")
    assert found.get("killed"), found
    assert found.get("ok"), found
