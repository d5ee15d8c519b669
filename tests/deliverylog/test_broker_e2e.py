"""End to end: real paho clients (with receipts) through our broker with delivery logging on; join the two logs."""

import threading
import time
from collections import defaultdict

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from appliance.deliverylog import read_segments
from appliance.deliverylog.receipts import PahoReceipts, ReceiptLogger
from appliance.deliverylog.schema import record_problems
from tests.support.broker import running_broker

N = 20


def _client(client_id):
    return mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)


def test_broker_log_and_client_receipts_tell_the_same_story(tmp_path):
    broker_logs = tmp_path / "broker-log"
    config = tmp_path / "appliance.toml"
    config.write_text(f'[node]\nfleet = "fleet-e2e"\ndevice = "dev-e2e"\n'
                      f'[deliverylog]\nenabled = true\ndir = "{broker_logs}"\nseq_property = "n"\n')
    receipts_dir = str(tmp_path / "receipts")
    pub_log = ReceiptLogger(receipts_dir, client_id="pub-e2e", fleet="fleet-e2e", device="dev-e2e", firmware="t",
                            seq_property="n")
    sub_log = ReceiptLogger(receipts_dir, client_id="sub-e2e", fleet="fleet-e2e", device="dev-e2e", firmware="t",
                            seq_property="n")
    with running_broker("ours", tmp_path / "data", ("--config", str(config))) as broker:
        got = threading.Event()
        seen = []
        sub = _client("sub-e2e")
        PahoReceipts(sub_log, sub).on_message(lambda c, u, m: (seen.append(1), len(seen) == N and got.set()))
        subscribed = threading.Event()
        sub.on_subscribe = lambda *a: subscribed.set()
        session = Properties(PacketTypes.CONNECT)
        session.SessionExpiryInterval = 300  # a persistent session: the broker stores (commits) before it acks
        sub.connect(broker.host, broker.port, clean_start=False, properties=session)
        sub.loop_start()
        pub = _client("pub-e2e")
        wired = PahoReceipts(pub_log, pub)
        pub.connect(broker.host, broker.port)
        pub.loop_start()
        try:
            sub.subscribe("e2e/#", qos=1)
            assert subscribed.wait(10)
            for info in [wired.publish(f"e2e/{i % 2}", b"p" * i, qos=1) for i in range(N)]:
                info.wait_for_publish(10)
            assert got.wait(10)
            deadline = time.monotonic() + 10
            while pub_log.in_flight and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            for c in (pub, sub):
                c.disconnect()
                c.loop_stop()
            pub_log.close()
            sub_log.close()
    # the broker has stopped: its log is closed (node_stop written)
    records = read_segments(str(broker_logs), fill_nulls=False)
    assert all(record_problems(r) == [] for r in records), [record_problems(r) for r in records][:3]
    assert records[0]["kind"] == "node_start" and records[-1]["kind"] == "node_stop"
    assert {(r["fleet"], r["device"], r["source"]) for r in records} == {("fleet-e2e", "dev-e2e", "broker")}
    by_msg = defaultdict(list)
    for r in records:
        if "msg_id" in r:
            by_msg[r["msg_id"]].append(r)
    assert len(by_msg) == N
    seqs = set()
    for msg_id, events in by_msg.items():
        kinds = [e["kind"] for e in events]
        for kind in ("received", "committed", "routed", "delivered", "acked"):
            assert kinds.count(kind) == 1, (msg_id, kinds)
        received = events[kinds.index("received")]
        assert received["publisher"] == "pub-e2e" and received["qos"] == 1
        seqs.add(received["publisher_seq"])
        assert events[kinds.index("routed")]["subscriber"] == "sub-e2e"
        assert events[kinds.index("delivered")]["attempt"] == 1
    client = read_segments(receipts_dir, fill_nulls=False)
    published = {r["publisher_seq"] for r in client if r["kind"] == "client_published"}
    received_by_client = sorted(r["publisher_seq"] for r in client if r["kind"] == "client_received")
    assert seqs == published == set(range(1, N + 1))  # the broker saw every seq the client sent, by the same name
    assert received_by_client == list(range(1, N + 1))
