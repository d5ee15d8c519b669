"""kill -9 durability: every message the broker acknowledged reaches the persistent subscriber after restarts.

A publisher streams QoS1/QoS2 messages while a killer thread SIGKILLs and restarts the broker at random moments.
The publisher resends what was not acknowledged (DUP) after each reconnect, as a client must. At the end a persistent
subscriber drains its queue: every PUBACKed (QoS1) / PUBRECed (QoS2) payload must arrive; QoS2 exactly once.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from appliance.protocol.packets import Puback, Pubcomp, Publish, Pubrec, Pubrel
from tests.support.broker import BrokerProcess, running_broker
from tests.support.raw import Closed, RawClient

pytestmark = pytest.mark.slow


def _connect(broker: BrokerProcess, client_id: str, deadline: float) -> RawClient:
    """Connect with clean_session=0, retrying while the broker restarts."""
    while True:
        try:
            client = RawClient(broker.port, 4, timeout=5)
            connack = client.connect(client_id, clean=False)
            assert connack.reason_code == 0
            return client
        except (OSError, Closed, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Killer(threading.Thread):
    """SIGKILLs and restarts the broker `times` times at random moments."""

    def __init__(self, broker: BrokerProcess, times: int, seed: int) -> None:
        super().__init__(daemon=True)
        self.broker, self.times, self.rng = broker, times, random.Random(seed)
        self.kills = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for _ in range(self.times):
                time.sleep(self.rng.uniform(0.2, 0.8))
                self.broker.kill()
                self.kills += 1
                self.broker.start()
        except BaseException as exc:  # surfaced by the test
            self.error = exc


def _publish_through_kills(broker: BrokerProcess, qos: int, cap: int, kills: int, seed: int) -> set[bytes]:
    """Publish until the killer is done (at most `cap` messages), resending across kills; return what was acked."""
    deadline = time.monotonic() + 120
    killer = Killer(broker, kills, seed)
    killer.start()
    acked: set[bytes] = set()
    unacked: dict[int, bytes] = {}  # packet id -> payload awaiting PUBACK / PUBREC
    releasing: set[int] = set()  # QoS2 packet ids awaiting PUBCOMP
    next_index = 0
    window = 64
    client = _connect(broker, f"pub-{qos}-{seed}", deadline)
    resend = False
    while (killer.is_alive() or unacked or releasing) and time.monotonic() < deadline:
        try:
            if resend:  # after a reconnect: the same packet ids, DUP set [MQTT-4.4.0-1]
                client.send(*[Publish("dur/t", p, qos, dup=True, packet_id=pid) for pid, p in unacked.items()])
                client.send(*[Pubrel(pid) for pid in releasing])
                resend = False
            fresh = []
            while killer.is_alive() and next_index < cap and len(unacked) + len(releasing) < window:
                pid = next_index % 60000 + 1
                payload = b"m%06d" % next_index
                unacked[pid] = payload
                fresh.append(Publish("dur/t", payload, qos, packet_id=pid))
                next_index += 1
            if fresh:
                client.send(*fresh)
            packet = client.recv(0.5)
            if isinstance(packet, Puback) and packet.packet_id in unacked:
                acked.add(unacked.pop(packet.packet_id))
            elif isinstance(packet, Pubrec) and packet.packet_id in unacked:
                acked.add(unacked.pop(packet.packet_id))
                releasing.add(packet.packet_id)
                client.send(Pubrel(packet.packet_id))
            elif isinstance(packet, Pubcomp):
                releasing.discard(packet.packet_id)
        except (OSError, Closed):
            client.close()
            client = _connect(broker, f"pub-{qos}-{seed}", deadline)
            resend = True
    client.close()
    killer.join(60)
    assert killer.error is None, f"killer failed: {killer.error}"
    assert killer.kills == kills
    assert len(acked) == next_index, f"only {len(acked)} of {next_index} acknowledged before the deadline"
    assert next_index > 1000, f"only {next_index} messages published: the kills did not hit a busy broker"
    return acked


def _drain(broker: BrokerProcess, client_id: str, expect_at_least: int) -> list[bytes]:
    """Connect the persistent subscriber and collect everything queued, honouring QoS2 receiver rules."""
    sub = RawClient(broker.port, 4)
    connack = sub.connect(client_id, clean=False)
    assert connack.session_present  # [MQTT-3.2.2-2]
    got: list[bytes] = []
    pending_qos2: set[int] = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        packet = sub.recv(2.0 if len(got) >= expect_at_least else 10.0)
        if packet is None:
            break
        if isinstance(packet, Publish):
            if packet.qos == 2:
                if packet.packet_id not in pending_qos2:  # a resent QoS2 PUBLISH is not a new message [MQTT-4.3.3]
                    got.append(packet.payload)
                    pending_qos2.add(packet.packet_id)  # type: ignore[arg-type]
            else:
                got.append(packet.payload)
            sub.ack(packet)
        elif isinstance(packet, Pubrel):
            pending_qos2.discard(packet.packet_id)
            sub.send(Pubcomp(packet.packet_id))
    sub.disconnect()
    return got


def _subscribe_offline(broker: BrokerProcess, client_id: str, qos: int) -> None:
    sub = RawClient(broker.port, 4)
    sub.connect(client_id, clean=False)
    suback = sub.subscribe("dur/#", qos)
    assert suback.reason_codes == [qos]
    sub.disconnect()


CAP = 200_000  # messages published at most
QUEUE_LIMIT = 2 * CAP  # [limits] max_queued_messages: its drop-oldest policy must not be what this test measures


def _config(tmp_path: Path) -> Path:
    """A config whose per-session queue limit the publisher cannot reach (the default, 100,000, it can)."""
    path = tmp_path / "appliance.toml"
    path.write_text(f"[limits]\nmax_queued_messages = {QUEUE_LIMIT}\n")
    return path


@pytest.mark.parametrize("qos", [1, 2])
def test_acknowledged_messages_survive_sigkill(tmp_path: Path, qos: int) -> None:
    seed = 1000 + qos
    with running_broker("ours", tmp_path / "data", ("--config", str(_config(tmp_path)))) as broker:
        _subscribe_offline(broker, f"sub-{qos}", qos)
        acked = _publish_through_kills(broker, qos, cap=CAP, kills=6, seed=seed)
        got = _drain(broker, f"sub-{qos}", len(acked))
        missing = acked - set(got)
        assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"
        if qos == 2:
            dups = len(got) - len(set(got))
            assert dups == 0, f"{dups} duplicates delivered at QoS2"


def test_delivered_but_unacked_messages_survive_sigkill(tmp_path: Path) -> None:
    with running_broker("ours", tmp_path / "data") as broker:
        sub = RawClient(broker.port, 4)
        sub.connect("holder", clean=False)
        sub.subscribe("hold/#", 1)
        pub = RawClient(broker.port, 4)
        pub.connect("holder-pub")
        for i in range(100):
            pub.publish("hold/t", b"h%03d" % i, 1, packet_id=i + 1)
        acks = [pub.expect(Puback) for _ in range(100)]
        assert len(acks) == 100
        received = sub.collect(100, auto_ack=False)
        unacked = set()
        for packet in received:  # acknowledge only the even ones; the odd ones stay inflight
            if int(packet.payload[1:]) % 2 == 0:
                sub.ack(packet)
            else:
                unacked.add(packet.payload)
        time.sleep(0.5)  # let the acks be processed (duplicates of acked ones are allowed either way)
        broker.kill()
        broker.start()
        again = RawClient(broker.port, 4)
        assert again.connect("holder", clean=False).session_present
        redelivered = {p.payload: p for p in again.collect(len(unacked), timeout=20)}
        missing = unacked - set(redelivered)
        assert not missing, f"unacknowledged messages lost by kill -9: {sorted(missing)[:5]}"
        assert all(p.dup for p in redelivered.values() if p.payload in unacked)  # resent with DUP [MQTT-3.3.1-1]
        again.disconnect()
        pub.close()
        sub.close()
