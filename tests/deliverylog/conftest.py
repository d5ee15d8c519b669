"""Shared helpers: a DeliveryLog factory with a fixed identity, and per-kind sample fields."""

import pytest

from appliance.deliverylog import DeliveryLog

BOOT = "3f0c9a52-6d1e-4b7a-9c2f-1e8d7a6b5c40"

# Representative fields per kind, as the broker (or a client) would pass them to emit().
SAMPLES = {
    "received": dict(msg_id="n1:1", publisher="pub-1", publisher_packet_id=7, publisher_seq=41, topic="a/b", qos=1,
                     retain=False, payload_size=12),
    "committed": dict(msg_id="n1:1"),
    "routed": dict(msg_id="n1:1", subscriber="sub-1", filter="a/+", qos=1),
    "forwarded": dict(msg_id="n1:1", peer_node="n2"),
    "forward_acked": dict(msg_id="n1:1", peer_node="n2"),
    "replicated": dict(msg_id="n1:1", peer_node="n3"),
    "queued_offline": dict(msg_id="n1:1", subscriber="sub-2", qos=1),
    "delivered": dict(msg_id="n1:1", subscriber="sub-1", dup=True, attempt=2, qos=1),
    "acked": dict(msg_id="n1:1", subscriber="sub-1"),
    "released": dict(msg_id="n1:2", subscriber="sub-1", qos=2),
    "expired": dict(msg_id="n1:3", subscriber="sub-2", reason="message_expiry"),
    "dropped": dict(msg_id="n1:4", subscriber="sub-2", reason="queue_full"),
    "migrated": dict(subscriber="sub-3", peer_node="n2"),
    "takeover": dict(subscriber="sub-3", peer_node="n2", reason="session_taken_over"),
    "node_start": {},
    "node_stop": dict(reason="shutdown"),
    "peer_up": dict(peer_node="n2"),
    "peer_down": dict(peer_node="n2", reason="keepalive_timeout"),
    "log_evicted": dict(reason="disk_budget events=1 bytes=2"),
    "client_published": dict(publisher="pub-1", publisher_packet_id=3, publisher_seq=9, topic="a/b", qos=2,
                             retain=True, payload_size=0),
    "client_acked": dict(publisher="pub-1", publisher_packet_id=3, publisher_seq=9, topic="a/b", qos=2),
    "client_received": dict(publisher="pub-1", publisher_seq=9, topic="a/b", qos=1, retain=False, payload_size=5,
                            subscriber="sub-1", dup=False),
}


SUFFIXES = {"parquet": ".parquet", "jsonl.gz": ".jsonl.gz"}


@pytest.fixture(params=[(True, "parquet", None), (False, "parquet", None), (True, "jsonl.gz", None),
                        (True, "parquet", False)],
                ids=["process", "thread", "process-jsonl", "process-pure"])
def make_log(tmp_path, request):
    """Open DeliveryLogs in tmp_path/log with a fixed identity, writer in a child process or a thread, and a format.

    The hot events go to the C recorder where it is built (test_recorder fails where it should be and is not),
    and to the pure-Python lanes in `process-pure`.

    `make.suffix` is the closed segments' file suffix for the format under test.
    """
    opened = []
    process, fmt, native = request.param

    def make(directory=None, **kw):
        opts = dict(fleet="fleet-1", device="dev-1", node="n1", firmware="1.2.3", boot_id=BOOT, clock_synced=True,
                    flush_interval_s=0.05, process=process, format=fmt, native=native)
        opts.update(kw)
        log = DeliveryLog(str(directory or tmp_path / "log"), **opts)
        opened.append(log)
        return log

    make.format = fmt
    make.suffix = SUFFIXES[fmt]
    yield make
    for log in opened:
        try:
            log.close()
        except Exception:
            pass


from tests.support.fixtures import broker  # noqa: E402 - real brokers (ours and mosquitto) for the receipt tests

__all__ = ["BOOT", "SAMPLES", "broker", "make_log"]
