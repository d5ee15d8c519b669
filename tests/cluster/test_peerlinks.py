"""Peer links over real loopback TCP: authentication, one link per pair, failure detection and redial."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from pathlib import Path

import pytest

from appliance.cluster import wire
from appliance.cluster.peerlinks import PeerLinks, _Connection, mutual_tls_contexts
from tests.cluster.conftest import LOOP_BLOCK_LIMIT, _SlowCallbacks

SECRET = b"loopback-secret"
WAIT = 15.0  # upper bound for an expected event; never a pass/fail timing


class Node:
    """A PeerLinks plus records of what its callbacks saw."""

    def __init__(self, node_id: str, secret: bytes = SECRET, cluster: str = "lab", **kw) -> None:
        self.up: list[str] = []
        self.down: list[tuple[str, str]] = []
        self.messages: list[tuple[str, wire.ClusterMessage]] = []
        self.changed = asyncio.Event()
        self.links = PeerLinks(node_id, cluster, secret, host="127.0.0.1", on_up=self._up, on_down=self._down,
                               on_message=self._msg, heartbeat_interval=0.1, timeout=0.6, backoff_initial=0.05,
                               backoff_max=0.3, **kw)

    def _up(self, peer: str) -> None:
        self.up.append(peer)
        self.changed.set()

    def _down(self, peer: str, reason: str) -> None:
        self.down.append((peer, reason))
        self.changed.set()

    def _msg(self, peer: str, msg: wire.ClusterMessage) -> None:
        self.messages.append((peer, msg))
        self.changed.set()

    async def until(self, predicate, what: str) -> None:
        deadline = time.monotonic() + WAIT
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"{self.links.node_id}: timed out waiting for {what}")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(remaining, 0.1))


@contextlib.asynccontextmanager
async def running(*nodes: Node):
    for n in nodes:
        await n.links.async_start()
    try:
        yield
    finally:
        for n in nodes:
            await n.links.async_stop()


async def test_two_nodes_dialling_each_other_end_with_one_authenticated_link() -> None:
    a, b = Node("a"), Node("b")
    async with running(a, b):
        a.links.async_add_peer("b", "127.0.0.1", b.links.port)
        b.links.async_add_peer("a", "127.0.0.1", a.links.port)
        await a.until(lambda: a.links.is_up("b"), "link a->b")
        await b.until(lambda: b.links.is_up("a"), "link b->a")
        assert a.links.async_send("b", wire.ForwardAck(7))
        await b.until(lambda: b.messages, "message at b")
        assert b.messages == [("a", wire.ForwardAck(7))]
        # both sides agree on the same single connection: each side's view of the remote is the other's local end
        ra = a.links._peers["b"].link
        rb = b.links._peers["a"].link
        assert ra is not None and rb is not None
        assert ra.writer.get_extra_info("sockname")[:2] == rb.remote
        [row] = a.links.status()
        assert row.peer_id == "b" and row.state == "up"
    assert not a.links.is_up("b")


async def test_wrong_secret_is_refused_logged_and_learns_nothing(caplog: pytest.LogCaptureFixture) -> None:
    a, intruder = Node("a"), Node("x", secret=b"guess")
    caplog.set_level(logging.WARNING, "appliance.cluster.link")
    async with running(a, intruder):
        intruder.links.async_add_peer("a", "127.0.0.1", a.links.port)
        await a.until(lambda: any("refused" in r.getMessage() for r in caplog.records), "refusal logged")
        assert not a.links.is_up("x") and not intruder.links.is_up("a")
        assert a.up == [] and intruder.up == []
        assert not a.links.async_send("x", wire.ForwardAck(1))
        assert intruder.messages == [] and a.messages == []
        assert any("cluster-secret" in r.getMessage() for r in caplog.records)


async def test_other_cluster_name_is_refused() -> None:
    a, other = Node("a"), Node("o", cluster="elsewhere")
    async with running(a, other):
        other.links.async_add_peer("a", "127.0.0.1", a.links.port)
        a.links.async_add_peer("o", "127.0.0.1", other.links.port)
        await asyncio.sleep(0.5)
        assert a.up == [] and other.up == []


class Blackhole:
    """A TCP forwarder that can silently drop all traffic (a partition between two loopback nodes)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.dropping = False
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await r.read(65536):
                if not self.dropping:
                    w.write(data)
        w.close()

    async def _conn(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        if self.dropping:
            w.close()
            return
        ur, uw = await asyncio.open_connection("127.0.0.1", self.target_port)
        for coro in (self._pipe(r, uw), self._pipe(ur, w)):
            t = asyncio.get_running_loop().create_task(coro)
            self.tasks.add(t)
            t.add_done_callback(self.tasks.discard)

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def test_relay_through_a_forwarder_is_refused_by_channel_binding(caplog: pytest.LogCaptureFixture) -> None:
    a, b = Node("a"), Node("b")
    caplog.set_level(logging.WARNING, "appliance.cluster.link")
    async with running(a, b):
        hole = Blackhole(b.links.port)
        port = await hole.start()
        try:
            a.links.async_add_peer("b", "127.0.0.1", port)
            await b.until(lambda: any("refused" in r.getMessage() for r in caplog.records), "relay refused")
            assert a.up == [] and b.up == []
        finally:
            await hole.stop()


async def test_silent_peer_is_detected_down_and_redialled_after_heal() -> None:
    # The forwarder changes the TCP endpoints, as NAT would: channel binding off for this pair.
    a, b = Node("a", bind_channel=False), Node("b", bind_channel=False)
    async with running(a, b):
        hole = Blackhole(b.links.port)
        port = await hole.start()
        try:
            a.links.async_add_peer("b", "127.0.0.1", port)  # only a dials, through the forwarder
            await a.until(lambda: a.links.is_up("b"), "first link")
            hole.dropping = True
            await a.until(lambda: a.down, "failure detected at a")
            await b.until(lambda: b.down, "failure detected at b")
            # whichever side times out first closes; the other may then see the close instead of the silence
            assert any("no traffic" in reason for _, reason in a.down + b.down)
            hole.dropping = False
            await a.until(lambda: len(a.up) == 2, "redial after heal")
            assert a.links.async_send("b", wire.ForwardAck(2))
            await b.until(lambda: ("a", wire.ForwardAck(2)) in b.messages, "message after heal")
        finally:
            await hole.stop()


async def test_restarted_peer_replaces_its_stale_link() -> None:
    a, b = Node("a"), Node("b", incarnation=1)
    async with running(a, b):
        b.links.async_add_peer("a", "127.0.0.1", a.links.port)
        await a.until(lambda: a.links.is_up("b"), "first link")
        b2 = Node("b", incarnation=2)  # same id, newer start: the old connection is still open at a
        async with running(b2):
            b2.links.async_add_peer("a", "127.0.0.1", a.links.port)
            await b2.until(lambda: b2.links.is_up("a"), "link from restarted b")
            await a.until(lambda: a.down, "stale link replaced")
            assert a.links._peers["b"].link.core.peer_incarnation == 2


async def test_what_is_sent_while_a_replaced_link_is_reported_down_follows_the_up_report() -> None:
    """b dialled a; then a dials b: both keep the new link (dialled by the smaller id), and a reports b down then up.
    What a's down callback sends (an ack it released runs a write) reaches b after what the up callback sends (the
    streams' resend of what the old link lost): sent first, a stream write overtook that resend and b dropped the
    resend as released (chaos seed 40071). Meanwhile b counts as reachable (a replacement is no minority side)."""
    a, b = Node("a"), Node("b")
    up_during_down: list[bool] = []

    def down(peer: str, reason: str) -> None:
        up_during_down.append(a.links.is_up(peer))
        a.links.async_send(peer, wire.ForwardAck(1))

    def up(peer: str) -> None:
        a.links.async_send(peer, wire.ForwardAck(2))

    async with running(a, b):
        b.links.async_add_peer("a", "127.0.0.1", a.links.port)
        await a.until(lambda: a.links.is_up("b"), "link dialled by b")
        a.links._on_down, a.links._on_up = down, up
        reader, writer = await a.links._async_open("127.0.0.1", b.links.port)
        conn = _Connection(a.links, reader, writer, initiator=True, expected_peer="b")
        task = asyncio.get_running_loop().create_task(conn.async_run())
        await b.until(lambda: len(b.messages) == 2, "both messages at b")
        assert b.messages == [("a", wire.ForwardAck(2)), ("a", wire.ForwardAck(1))]
        assert up_during_down == [True]
        task.cancel()


class FrozenNode:
    """A PeerLinks on its own thread's event loop, so that loop can be stopped (like SIGSTOP) while ours runs."""

    def __init__(self, node_id: str) -> None:
        self.messages: list[wire.ClusterMessage] = []
        self.down: list[str] = []
        self.frozen = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.links = self.call(self._start(node_id))

    async def _start(self, node_id: str) -> PeerLinks:
        links = PeerLinks(node_id, "lab", SECRET, host="127.0.0.1", on_up=lambda _p: None,
                          on_down=lambda _p, reason: self.down.append(reason),
                          on_message=lambda _p, m: self.messages.append(m), heartbeat_interval=0.1, timeout=0.6,
                          backoff_initial=0.05, backoff_max=0.3)
        await links.async_start()
        return links

    def call(self, coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WAIT)

    def freeze(self, seconds: float) -> None:
        """Stop this node's loop for `seconds` (nothing is read, sent or timed meanwhile)."""
        def stop() -> None:
            self.frozen.set()
            time.sleep(seconds)
            self.frozen.clear()
        self.loop.call_soon_threadsafe(stop)

    def close(self) -> None:
        self.call(self.links.async_stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT)
        self.loop.close()


async def test_what_a_stopped_node_reads_on_a_link_its_peer_gave_up_is_not_handled() -> None:
    """Chaos seeds 30657 and 30675: an owner SIGSTOPped longer than failure_timeout read, once continued, a takeover
    question its asker had sent on the link it then dropped (it refused its client, which resumed elsewhere), and
    let the session go to that asker: a second live copy of the session (reordered / QoS2 twice). Bytes read after
    the link expired are the peer's last words on a link it has given up: not handled, the link closes; what matters
    is resent on the next one."""
    a, b = FrozenNode("a"), Node("b")
    try:
        async with running(b):
            b.links.async_add_peer("a", "127.0.0.1", a.links.port)
            await b.until(lambda: b.links.is_up("a"), "link b->a")
            await b.until(lambda: a.links.is_up("b"), "link a->b")
            a.freeze(1.5)  # 2.5 x the timeout
            await b.until(a.frozen.is_set, "a stopped")
            assert b.links.async_send("a", wire.ForwardAck(99))  # the question, sent just before b gives up
            await b.until(lambda: b.down, "b drops the silent link")
            await b.until(lambda: not a.frozen.is_set() and a.down, "a continued and saw the link end")
            await b.until(lambda: len(b.up) == 2 and a.links.is_up("b"), "a new link")
            assert b.links.async_send("a", wire.ForwardAck(100))
            await b.until(lambda: wire.ForwardAck(100) in a.messages, "a message on the new link")
            assert wire.ForwardAck(99) not in a.messages
    finally:
        a.close()


def test_watchdog_catches_a_blocking_callback() -> None:
    """The fixture's detector really fires when a callback holds the loop past the limit."""
    handler = _SlowCallbacks()
    log = logging.getLogger("asyncio")
    log.addHandler(handler)

    async def block() -> None:
        time.sleep(LOOP_BLOCK_LIMIT + 0.1)

    try:
        loop = asyncio.new_event_loop()
        loop.set_debug(True)
        loop.slow_callback_duration = LOOP_BLOCK_LIMIT
        loop.run_until_complete(block())
        loop.close()
    finally:
        log.removeHandler(handler)
    assert handler.records


def write_node_pki(tmp: Path, ca, name: str) -> tuple[Path, Path, Path]:
    from provisioning.pki import issue_node_cert

    node = issue_node_cert(ca, name, f"dev-{name}", 30, ["127.0.0.1"])
    (tmp / f"{name}.crt").write_bytes(node.cert_pem)
    (tmp / f"{name}.key").write_bytes(node.key_pem)
    (tmp / f"{name}-ca.crt").write_bytes(ca.cert_pem)
    return tmp / f"{name}-ca.crt", tmp / f"{name}.crt", tmp / f"{name}.key"


@pytest.fixture
def tls_contexts(tmp_path: Path) -> dict[str, object]:
    """Mutual-TLS contexts for nodes a and b (one cluster CA) and x (another CA), made off the event loop."""
    pki = pytest.importorskip("provisioning.pki")
    ca, _ = pki.load_or_create_ca(tmp_path / "ca", "lab")
    other_ca, _ = pki.load_or_create_ca(tmp_path / "other", "lab")
    return {name: mutual_tls_contexts(*write_node_pki(tmp_path, authority, name))
            for name, authority in (("a", ca), ("b", ca), ("x", other_ca))}


async def test_mutual_tls_links_and_a_foreign_ca_is_refused(tls_contexts: dict[str, object],
                                                          caplog: pytest.LogCaptureFixture) -> None:
    a, b = Node("a", tls=tls_contexts["a"]), Node("b", tls=tls_contexts["b"])
    x = Node("x", tls=tls_contexts["x"])  # right secret, wrong CA
    caplog.set_level(logging.WARNING, "appliance.cluster.link")
    async with running(a, b, x):
        a.links.async_add_peer("b", "127.0.0.1", b.links.port)
        await a.until(lambda: a.links.is_up("b") and b.links.is_up("a"), "TLS link a-b")
        assert a.links._peers["b"].link.writer.get_extra_info("ssl_object") is not None
        assert a.links.async_send("b", wire.ForwardAck(5))
        await b.until(lambda: b.messages, "message over TLS")
        x.links.async_add_peer("a", "127.0.0.1", a.links.port)
        await x.until(lambda: any("TLS handshake failed" in r.getMessage() for r in caplog.records), "x refused")
        assert not x.links.is_up("a") and x.up == [] and x.messages == []
        assert "x" not in a.up
