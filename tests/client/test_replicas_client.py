"""The client over several replicas: one channel over a list of addresses or a ``dns:///`` name, each call to the next
replica (round robin), and an UNAVAILABLE answer (a replica draining, or gone) retried on another one."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from structspec.client import AsyncClient, Client, RetryPolicy
from structspec.client.channel import channel_options, channel_target
from tests.service.fakes import FakeEngine
from tests.service.harness import ServerThread, settings_for

FAST_RETRY = RetryPolicy(max_attempts=4, initial_backoff=0.05, max_backoff=0.2)


def test_channel_targets() -> None:
    assert channel_target("dns:///structspec.ns.svc:50051") == "dns:///structspec.ns.svc:50051"
    assert channel_target(["127.0.0.1:1"]) == "127.0.0.1:1"
    assert channel_target(["127.0.0.1:1", "127.0.0.2:2"]) == "ipv4:127.0.0.1:1,127.0.0.2:2"
    assert channel_target(["[::1]:1", "[::2]:2"]) == "ipv6:[::1]:1,[::2]:2"
    resolved = {info[4][0] for info in socket.getaddrinfo("localhost", 7, type=socket.SOCK_STREAM)}
    if "127.0.0.1" in resolved:  # a name is resolved once, IPv4 preferred
        assert channel_target(["localhost:7", "127.0.0.2:8"]) == "ipv4:127.0.0.1:7,127.0.0.2:8"
    for bad in ([], ["nohost", "127.0.0.1:1"], ["127.0.0.1:x", "127.0.0.1:1"], ["127.0.0.1:1", "[::1]:2"]):
        with pytest.raises(ValueError):
            channel_target(bad)
    assert ("grpc.service_config", '{"loadBalancingConfig": [{"round_robin": {}}]}') in channel_options(None)
    with pytest.raises(ValueError, match="load_balancing"):
        channel_options(None, "random")


@pytest.fixture
def replicas(tmp_path: Path):
    engines = [FakeEngine(), FakeEngine()]
    with ServerThread(settings_for(tmp_path / "a"), engines[0]) as a, \
            ServerThread(settings_for(tmp_path / "b"), engines[1]) as b:
        yield [a, b], engines


def test_calls_go_round_robin_and_a_draining_replica_is_retried_on_the_other(replicas) -> None:
    (a, b), (ea, eb) = replicas
    with Client([a.target, b.target], retry=FAST_RETRY, timeout=20) as c:
        c.wait_until_serving(10)
        for n in range(1, 41):  # noqa: B007 (n is read after the loop)  round robin over the connected replicas: soon both take calls, in turn
            c.extract("INVOICE 7", schema_id="invoice")
            if len(ea.requests) >= 3 and len(eb.requests) >= 3:
                break
        assert len(ea.requests) >= 3 and len(eb.requests) >= 3 and len(ea.requests) + len(eb.requests) == n
        a.call(lambda: setattr(a.server._slot, "draining", True))  # a answers UNAVAILABLE DRAINING from now on
        before = len(ea.requests), len(eb.requests)
        for _ in range(6):
            c.extract("INVOICE 7", schema_id="invoice")  # each refused by a is retried on b
        assert (len(ea.requests), len(eb.requests)) == (before[0], before[1] + 6)
        a.run(a.server.stop(0))  # gone: its address refuses connections, and the balancer skips it
        for _ in range(4):
            c.extract("INVOICE 7", schema_id="invoice")
        assert len(eb.requests) == before[1] + 10


def test_a_dns_target_and_the_async_client(replicas) -> None:
    (a, b), (ea, eb) = replicas
    port = a.server.port  # type: ignore[union-attr]
    with Client(f"dns:///localhost:{port}", timeout=20) as c:  # localhost may also name ::1, where nothing listens
        assert c.extract("INVOICE 7", schema_id="invoice")

    before = len(ea.requests), len(eb.requests)

    async def run() -> None:
        async with AsyncClient([a.target, b.target], retry=FAST_RETRY, timeout=20) as ac:
            await ac.wait_until_serving(10)
            for _ in range(40):
                await ac.extract("INVOICE 7", schema_id="invoice")
                if len(ea.requests) - before[0] >= 2 and len(eb.requests) - before[1] >= 2:
                    return

    asyncio.run(run())
    assert len(ea.requests) - before[0] >= 2 and len(eb.requests) - before[1] >= 2


def test_connections_closed_at_their_age_are_reopened_without_failing_a_call(tmp_path: Path) -> None:
    """max_connection_age_seconds: the server closes each connection after that long (so a dns:/// client resolves
    again and reaches replicas started since); calls go on over a new connection."""
    import time

    with ServerThread(settings_for(tmp_path, max_connection_age_seconds=0.3), FakeEngine()) as st, \
            Client(st.target, retry=FAST_RETRY, timeout=20) as c:
        end, n = time.monotonic() + 1.5, 0
        while time.monotonic() < end:
            assert c.extract("INVOICE 7", schema_id="invoice")
            n += 1
            time.sleep(0.05)
        assert n >= 10
