"""The debounce record's scripts against a real redis-server (no worker)."""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator

import pytest
import redis

from celery_redlock.errors import ConfigurationError, DebounceUnavailable
from celery_redlock.tasks.debounce_store import DebounceStore, Verdict
from celery_redlock.tasks.key_templates import ArgumentPlan
from celery_redlock.tasks.policies import TaskPolicy
from celery_redlock.testing import RedisServer, ServerGroup

pytestmark = pytest.mark.integration

NAME = "debounce:proj.reindex:doc:7"


@pytest.fixture
def node(servers: ServerGroup) -> RedisServer:
    return servers[0]


@pytest.fixture
def store(node: RedisServer) -> Iterator[DebounceStore]:
    made = DebounceStore(node.url, key_prefix="t:")
    yield made
    made.close()


def record(node: RedisServer) -> dict[str, str]:
    raw = node.client().hgetall(f"t:debounce:{{{NAME}}}")
    return {key.decode(): value.decode() for key, value in raw.items()}


def pttl(node: RedisServer) -> int:
    return int(node.client().pttl(f"t:debounce:{{{NAME}}}"))


def wait_until_due(store: DebounceStore, task_id: str, seq: int) -> Verdict:
    """Check until the copy is due (each early verdict says how long to wait)."""
    deadline = time.monotonic() + 10
    while True:
        verdict = store.check(NAME, task_id, seq, ttl=60)
        if verdict.action != "early":
            return verdict
        assert time.monotonic() < deadline, "never due"
        time.sleep(verdict.wait)


def test_the_last_publish_is_the_one_that_runs(store: DebounceStore, node: RedisServer) -> None:
    # A delay no scheduling delay outlasts: copy4 is still early when checked.
    seqs = {f"copy{n}": store.publish(NAME, f"copy{n}", delay=1.5, ttl=60) for n in range(5)}
    assert list(seqs.values()) == sorted(set(seqs.values())), "sequences strictly increase"
    for n in range(4):
        verdict = store.check(NAME, f"copy{n}", seqs[f"copy{n}"], ttl=60)
        assert verdict == Verdict("superseded", latest="copy4")
    early = store.check(NAME, "copy4", seqs["copy4"], ttl=60)
    assert early.action == "early"
    assert 0 < early.wait <= 1.5
    assert wait_until_due(store, "copy4", seqs["copy4"]) == Verdict("run")
    # Still the latest: a retry of it runs again; the older ones still do not.
    assert store.check(NAME, "copy4", seqs["copy4"], ttl=60) == Verdict("run")
    assert store.check(NAME, "copy0", seqs["copy0"], ttl=60).action == "superseded"


def test_the_record_always_has_a_ttl(store: DebounceStore, node: RedisServer) -> None:
    sent = time.monotonic()
    store.publish(NAME, "a", delay=0.5, ttl=10)
    left = pttl(node)
    # The delay and the ttl, less no more than the time since the publish was sent.
    assert 10_500 - (time.monotonic() - sent) * 1000 - 1 <= left <= 10_500
    node.client().delete(f"t:debounce:{{{NAME}}}")
    assert store.check(NAME, "a", 1, ttl=7) == Verdict("run")  # claimed after the loss
    assert 0 < pttl(node) <= 7_000


def test_a_lost_record_lets_the_newest_copy_run(store: DebounceStore, node: RedisServer) -> None:
    # The store restarted empty (or the record expired) before the burst's
    # copies came up: whichever comes first, the newest publish still runs.
    old = store.publish(NAME, "old", delay=0.01, ttl=60)
    new = store.publish(NAME, "new", delay=0.01, ttl=60)
    node.client().delete(f"t:debounce:{{{NAME}}}")
    assert store.check(NAME, "old", old, ttl=60) == Verdict("run")
    assert store.check(NAME, "new", new, ttl=60) == Verdict("run")
    assert store.check(NAME, "old", old, ttl=60) == Verdict("superseded", latest="new")
    # And the other order: the newest first, then the older one is superseded.
    node.client().delete(f"t:debounce:{{{NAME}}}")
    assert store.check(NAME, "new", new, ttl=60) == Verdict("run")
    assert store.check(NAME, "old", old, ttl=60) == Verdict("superseded", latest="new")


def test_a_publish_after_a_lost_record_still_supersedes(
    store: DebounceStore, node: RedisServer
) -> None:
    old = store.publish(NAME, "old", delay=0.01, ttl=60)
    node.client().delete(f"t:debounce:{{{NAME}}}")
    later = store.publish(NAME, "later", delay=0.01, ttl=60)
    assert later > old
    assert store.check(NAME, "old", old, ttl=60) == Verdict("superseded", latest="later")


def test_a_withdrawn_publish_gives_way_to_the_one_before(
    store: DebounceStore, node: RedisServer
) -> None:
    first = store.publish(NAME, "first", delay=0.01, ttl=60)
    store.publish(NAME, "unsent", delay=0.01, ttl=60)
    assert store.withdraw(NAME, "unsent")
    assert record(node)["id"] == "first"
    assert pttl(node) > 0
    assert wait_until_due(store, "first", first) == Verdict("run")
    # Nothing to undo once a later publish replaced it.
    store.publish(NAME, "second", delay=0.01, ttl=60)
    assert not store.withdraw(NAME, "first")
    assert record(node)["id"] == "second"
    # The only publish withdrawn: no record is left behind.
    assert store.withdraw(NAME, "second")
    assert record(node) == {}


def test_two_unsent_publishes_give_way_to_the_copy_that_was_sent(
    store: DebounceStore, node: RedisServer
) -> None:
    """Two publishers whose sends both fail, the earlier one's first: neither is the latest.

    The copy sent before them is the one that comes up; it must not be
    superseded by a publish that was taken back.
    """
    sent = store.publish(NAME, "sent", delay=0.01, ttl=60)
    store.publish(NAME, "unsent-a", delay=0.01, ttl=60)
    store.publish(NAME, "unsent-b", delay=0.01, ttl=60)
    assert not store.withdraw(NAME, "unsent-a")  # a later publish replaced it: nothing to undo
    assert store.withdraw(NAME, "unsent-b")
    assert record(node).get("id") != "unsent-a"
    assert wait_until_due(store, "sent", sent) == Verdict("run")


@pytest.mark.parametrize(
    ("task_id", "delay", "ttl"),
    [("", 1.0, 1.0), ("a", 1e12, 1.0), ("a", 1.0, 1e12)],
)
def test_bad_input_is_refused_before_anything_is_written(
    store: DebounceStore, node: RedisServer, task_id: str, delay: float, ttl: float
) -> None:
    with pytest.raises(DebounceUnavailable):
        store.publish(NAME, task_id, delay=delay, ttl=ttl)
    assert node.client().keys("*") == []


def test_a_key_of_another_type_is_refused_not_overwritten(
    store: DebounceStore, node: RedisServer
) -> None:
    node.client().set(f"t:debounce:{{{NAME}}}", "mine")
    with pytest.raises(DebounceUnavailable):
        store.publish(NAME, "a", delay=1.0, ttl=1.0)
    with pytest.raises(DebounceUnavailable):
        store.check(NAME, "a", 1, ttl=1.0)
    assert node.client().get(f"t:debounce:{{{NAME}}}") == b"mine"


def test_a_store_that_is_down_raises(store: DebounceStore, node: RedisServer) -> None:
    node.kill()
    with pytest.raises(DebounceUnavailable):
        store.publish(NAME, "a", delay=1.0, ttl=1.0)


def test_a_client_object_works_as_the_store(node: RedisServer) -> None:
    client = redis.Redis.from_url(node.url)
    made = DebounceStore(client, key_prefix="t:")
    try:
        seq = made.publish(NAME, "a", delay=0.01, ttl=5)
        assert wait_until_due(made, "a", seq) == Verdict("run")
    finally:
        made.close()
        client.close()


YEAR = 365 * 24 * 3600.0
PLAN = ArgumentPlan(inspect.signature(lambda doc_id: None))


@pytest.mark.parametrize(("delay", "ttl"), [(YEAR - 3600, 3600.0), (0.0001, 3600.0), (1.0, 1.0)])
def test_a_debounce_the_options_accept_can_be_recorded(
    store: DebounceStore, delay: float, ttl: float
) -> None:
    made = TaskPolicy.from_options("proj.reindex", PLAN, {"debounce": delay, "debounce_ttl": ttl})
    policy = made.debounce
    assert policy is not None
    seq = store.publish(NAME, "copy", delay=policy.delay, ttl=policy.ttl)
    assert store.check(NAME, "copy", seq, ttl=policy.ttl).action in {"run", "early"}


@pytest.mark.parametrize(("delay", "ttl"), [(YEAR, 3600.0), (1.0, YEAR), (1e9, 1.0)])
def test_a_debounce_the_store_cannot_record_is_refused_at_definition(
    store: DebounceStore, delay: float, ttl: float
) -> None:
    """Accepted, every publish would go out unrecorded and every copy be re-queued for ever."""
    with pytest.raises(DebounceUnavailable):
        store.publish(NAME, "copy", delay=delay, ttl=ttl)
    with pytest.raises(ConfigurationError) as refused:
        TaskPolicy.from_options("proj.reindex", PLAN, {"debounce": delay, "debounce_ttl": ttl})
    assert refused.value.option in {"debounce", "debounce_ttl"}
