"""``sentinel://`` node URLs: kombu's syntax, each a master found through its Sentinels."""

from __future__ import annotations

import logging

import pytest

from celery_redlock.errors import ConfigurationError
from celery_redlock.transport.nodes import make_nodes
from celery_redlock.transport.sentinel import SentinelMaster
from celery_redlock.transport.url_options import redact


def test_kombus_form_with_the_master_name_as_a_query_option() -> None:
    master = SentinelMaster.from_url(
        "sentinel://:secret@s1:26380;sentinel://s2;sentinel://s3:26381/2?master_name=locks1"
    )
    assert master.master_name == "locks1"
    assert master.sentinels == (("s1", 26380), ("s2", 26379), ("s3", 26381))
    assert (master.db, master.username, master.password) == (2, None, "secret")
    assert "secret" not in master.name
    endpoint = master.master("10.0.0.7", 6380)
    assert (endpoint.host, endpoint.port, endpoint.db, endpoint.password) == (
        "10.0.0.7",
        6380,
        2,
        "secret",
    )


def test_sentinel_credentials_are_query_options_and_are_redacted() -> None:
    url = "sentinel://s1?master_name=m&sentinel_username=watch&sentinel_password=hush"
    master = SentinelMaster.from_url(url)
    assert (master.sentinel_username, master.sentinel_password) == ("watch", "hush")
    assert "hush" not in redact(url)
    assert "hush" not in master.name


@pytest.mark.parametrize(
    ("url", "option", "words"),
    [
        pytest.param("sentinel://s1:26379", "master_name", "names no master", id="no-master"),
        pytest.param(
            "sentinel://s1;redis://r1?master_name=m",
            "nodes",
            "every part of a Sentinel URL",
            id="mixed-schemes",
        ),
        pytest.param(
            "sentinel://s1?master_name=m&ssl_cert_reqs=none",
            "ssl_cert_reqs",
            "TLS to Sentinel-managed masters is not supported",
            id="tls",
        ),
        pytest.param(
            "sentinel://s1?master_name=m&service_name=x", "service_name", "unknown", id="unknown"
        ),
        pytest.param(
            "sentinel://s1?master_name=m;sentinel://s2?master_name=n",
            "master_name",
            "twice",
            id="twice",
        ),
        pytest.param(
            "sentinel://a:1@s1;sentinel://b:2@s2?master_name=m",
            "nodes",
            "two different logins",
            id="two-logins",
        ),
        pytest.param("sentinel://s1/x?master_name=m", "nodes", "database 'x'", id="bad-db"),
    ],
)
def test_bad_sentinel_urls_name_the_option(url: str, option: str, words: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        make_nodes([url], 0.05)
    assert caught.value.option == option
    assert words in str(caught.value)


def test_timeouts_in_the_url_are_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="celery_redlock.nodes"):
        master = SentinelMaster.from_url("sentinel://s1?master_name=m&socket_timeout=5")
    assert master.master_name == "m"
    assert "socket_timeout=... is ignored" in caplog.text


def test_one_master_named_twice_through_a_shared_sentinel_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="are the same Redis server"):
        make_nodes(
            [
                "sentinel://127.0.0.1:26379;sentinel://s2?master_name=locks",
                "sentinel://localhost:26379?master_name=locks",
            ],
            0.05,
        )
    nodes = make_nodes(
        [
            "sentinel://s1;sentinel://s2?master_name=locks1",
            "sentinel://s1;sentinel://s2?master_name=locks2",
            "redis://r3:6379/0",
        ],
        0.05,
    )
    assert [node.sentinel is not None for node in nodes] == [True, True, False]
    for node in nodes:
        node.close()
