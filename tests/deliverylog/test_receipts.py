"""Client receipt logger with real paho-mqtt MQTT 5 clients through a real broker: seq numbers end to end."""

import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from appliance.deliverylog import read_segments
from appliance.deliverylog.receipts import PahoReceipts, ReceiptLogger
from appliance.deliverylog.schema import record_problems

from .conftest import BOOT


def _client(client_id):
    return mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)


def _receipts(tmp_path, client_id, **kw):
    return ReceiptLogger(str(tmp_path / "receipts"), client_id=client_id, fleet="fleet-1", device="dev-1",
                         firmware="9.9", boot_id=BOOT, clock_synced=True, flush_interval_s=0.05, **kw)


def test_published_acked_and_received_are_recorded_with_sequence_numbers(broker, tmp_path):
    n = 25
    sub_log = _receipts(tmp_path, "sub-1")
    pub_log = _receipts(tmp_path, "pub-1")
    got_all = threading.Event()
    seen = []

    sub = _client("sub-1")
    sub_wired = PahoReceipts(sub_log, sub)
    sub_wired.on_message(lambda c, u, m: (seen.append(m.topic), len(seen) == n and got_all.set()))
    subscribed = threading.Event()
    sub.on_subscribe = lambda *a: subscribed.set()
    sub.connect(broker.host, broker.port)
    sub.loop_start()
    pub = _client("pub-1")
    pub_wired = PahoReceipts(pub_log, pub)
    pub.connect(broker.host, broker.port)
    pub.loop_start()
    try:
        sub.subscribe("receipts/#", qos=1)
        assert subscribed.wait(10)
        infos = [pub_wired.publish(f"receipts/{i % 3}", b"x" * i, qos=1) for i in range(n)]
        for info in infos:
            info.wait_for_publish(10)
        assert got_all.wait(10)
        deadline = time.monotonic() + 10
        while pub_log.in_flight and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        for c in (pub, sub):
            c.disconnect()
            c.loop_stop()
        pub_log.close()
        sub_log.close()

    records = read_segments(str(tmp_path / "receipts"), fill_nulls=False)
    assert all(record_problems(r) == [] for r in records)
    assert {r["source"] for r in records} == {"client"}
    by_kind = {k: [r for r in records if r["kind"] == k] for k in ("client_published", "client_acked",
                                                                  "client_received")}
    assert [r["publisher_seq"] for r in by_kind["client_published"]] == list(range(1, n + 1))
    assert sorted(r["publisher_seq"] for r in by_kind["client_acked"]) == list(range(1, n + 1))
    for published in by_kind["client_published"]:
        assert published["node"] == "pub-1" and published["publisher"] == "pub-1"
        assert published["payload_size"] == published["publisher_seq"] - 1
    pids = {r["publisher_seq"]: r["publisher_packet_id"] for r in by_kind["client_published"]}
    assert all(pids[r["publisher_seq"]] == r["publisher_packet_id"] for r in by_kind["client_acked"])
    received = by_kind["client_received"]
    assert sorted(r["publisher_seq"] for r in received) == list(range(1, n + 1))  # nothing lost, nothing twice
    assert {(r["publisher"], r["subscriber"], r["node"]) for r in received} == {("pub-1", "sub-1", "sub-1")}
    assert all(r["topic"] == f"receipts/{(r['publisher_seq'] - 1) % 3}" for r in received)


def test_seq_property_name_is_configurable_and_bad_values_are_flagged(tmp_path):
    log = _receipts(tmp_path, "c-1", seq_property="n", publisher_property=None)
    stamp = log.stamp("a/b", b"hello", qos=1)
    assert stamp.user_properties == [("n", "1")]
    assert log.received("a/b", b"hi", 0, False, [("n", "17"), ("seq", "3")]) == 17
    assert log.received("a/b", b"hi", 0, False, [("n", "seventeen")]) is None
    assert log.acked(999) is False  # unknown packet id: nothing recorded
    log.close()
    records = read_segments(str(tmp_path / "receipts"))
    assert [(r["kind"], r["publisher_seq"]) for r in records] == [("client_received", 17), ("client_received", None)]
    assert records[1]["reason"] == "bad n property 'seventeen'"


def test_paho_properties_carry_the_stamp(tmp_path):
    log = _receipts(tmp_path, "c-2")
    stamp = log.stamp("a/b", "text")
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = stamp.user_properties
    assert props.UserProperty == [("seq", "1"), ("pub", "c-2")]
    assert log.stamp("a/b", "text").seq == 2
    log.close()
