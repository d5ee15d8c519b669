"""Every broker-side event kind is emitted where it happens: real clients drive a real node, the test reads segments."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from appliance.deliverylog.segments import read_segments
from appliance.protocol.packets import MQTT_5, Properties, Puback, Pubcomp, Publish, Pubrec, Pubrel
from tests.support.broker import running_broker
from tests.support.raw import RawClient

CONFIG = """
[node]
fleet = "test-fleet"
device = "dev-1"
firmware = "fw-9"
[limits]
max_queued_messages = 3
queue_full_policy = "drop-new"
[deliverylog]
enabled = true
"""


def _scenario(port: int) -> None:
    pub = RawClient(port, MQTT_5)
    pub.connect("pub")
    # online QoS1 subscriber: received, committed, routed, delivered, acked
    live = RawClient(port)
    live.connect("live", clean=False)
    live.subscribe("ev/live", 1)
    pub.publish("ev/live", b"one", 1, packet_id=1, properties=Properties(user_properties=[("seq", "41")]))
    pub.expect(Puback)
    live.collect(1)
    # QoS2 subscriber: released after PUBREC
    q2 = RawClient(port)
    q2.connect("q2")
    q2.subscribe("ev/q2", 2)
    pub.publish("ev/q2", b"two", 2, packet_id=2)
    pub.expect(Pubrec)
    pub.send(Pubrel(2))
    pub.expect(Pubcomp)
    got = q2.expect(Publish)
    q2.send(Pubrec(got.packet_id))  # type: ignore[arg-type]
    q2.expect(Pubrel)
    q2.send(Pubcomp(got.packet_id))  # type: ignore[arg-type]
    # offline persistent subscriber: queued_offline, expired, dropped (queue full, drop-new)
    off = RawClient(port, MQTT_5)
    off.connect("off", clean=False, properties=Properties(session_expiry_interval=300))
    off.subscribe("ev/off", 1)
    off.disconnect()
    pub.publish("ev/off", b"short", 1, packet_id=3, properties=Properties(message_expiry_interval=1))
    for i in range(4):
        pub.publish("ev/off", b"q%d" % i, 1, packet_id=10 + i)
    for _ in range(5):
        pub.expect(Puback)
    time.sleep(1.5)
    # redelivery: delivered with dup after reconnect without acking
    back = RawClient(port, MQTT_5)
    back.connect("off", clean=False, properties=Properties(session_expiry_interval=300))
    first = back.collect(2, auto_ack=False)
    back.close()
    again = RawClient(port, MQTT_5)
    again.connect("off", clean=False, properties=Properties(session_expiry_interval=300))
    again.collect(len(first))
    # takeover
    twins = [RawClient(port, MQTT_5), RawClient(port, MQTT_5)]
    for twin in twins:
        twin.connect("twin")
    twins[0].expect_closed()


def test_each_event_kind_is_recorded_with_its_fields(tmp_path: Path) -> None:
    conf = tmp_path / "appliance.toml"
    conf.write_text(CONFIG)
    data = tmp_path / "data"
    with running_broker("ours", data, ("--config", str(conf), "--node-name", "n1")) as broker:
        _scenario(broker.port)
    records = read_segments(str(data / "deliverylog"))
    kinds = Counter(r["kind"] for r in records)
    for kind in ("node_start", "received", "committed", "routed", "delivered", "acked", "released",
                 "queued_offline", "expired", "dropped", "takeover", "node_stop"):
        assert kinds[kind] > 0, f"no {kind!r} event; got {dict(kinds)}"
    assert {r["schema_version"] for r in records} == {1}
    assert len({r["event_id"] for r in records}) == len(records)
    assert {(r["fleet"], r["device"], r["node"], r["firmware"]) for r in records} == {("test-fleet", "dev-1", "n1",
                                                                                        "fw-9")}
    received = next(r for r in records if r["kind"] == "received" and r["topic"] == "ev/live")
    assert (received["publisher"], received["qos"], received["payload_size"], received["publisher_seq"]) == (
        "pub", 1, 3, 41)
    msg = received["msg_id"]
    life = [r["kind"] for r in records if r["msg_id"] == msg]
    assert life.index("received") < life.index("committed")
    assert {"routed", "delivered", "acked"} <= set(life)
    assert any(r["kind"] == "dropped" and r["reason"] == "queue_full" for r in records)
    expired = [r for r in records if r["kind"] == "expired"]
    assert expired and expired[0]["subscriber"] == "off"
    redelivered = [r for r in records if r["kind"] == "delivered" and r["subscriber"] == "off" and r["dup"]]
    assert redelivered and all(r["attempt"] >= 2 for r in redelivered)
    assert all("payload" not in r for r in records)  # never the payload itself
