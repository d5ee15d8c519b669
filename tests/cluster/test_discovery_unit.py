"""Discovery helpers without the network: TXT records both ways, seed parsing, option checks."""

from __future__ import annotations

import pytest

from appliance.cluster.discovery import Discovery, PeerInfo, build_txt, parse_peer, parse_seeds
from appliance.cluster.wire import PROTOCOL_VERSION


def as_txt(d: dict[str, str]) -> dict[bytes, bytes | None]:
    return {k.encode(): v.encode() for k, v in d.items()}


def test_txt_round_trip() -> None:
    txt = build_txt("lab", "n1", 7946, 1883, 8883)
    assert txt == {"cluster": "lab", "node": "n1", "proto": str(PROTOCOL_VERSION), "cport": "7946", "mqtt": "1883",
                   "mqtts": "8883"}
    peer = parse_peer(as_txt(txt), ["10.0.0.5", "fe80::1", "10.0.0.4"])
    assert peer == PeerInfo("n1", "lab", PROTOCOL_VERSION, ("10.0.0.4", "10.0.0.5", "fe80::1"), 7946, 1883, 8883)
    no_tls = parse_peer(as_txt(build_txt("lab", "n1", 7946, 1883, None)), ["10.0.0.5"])
    assert no_tls is not None and no_tls.mqtts_port is None


@pytest.mark.parametrize(
    "txt",
    [
        {"node": "n1", "proto": "1", "cport": "1"},  # no cluster
        {"cluster": "lab", "node": "", "proto": "1", "cport": "1"},
        {"cluster": "lab", "node": "n1", "proto": "x", "cport": "1"},
        {"cluster": "lab", "node": "n1", "proto": "1", "cport": "70000"},
        {"cluster": "lab", "node": "n1", "proto": "1", "cport": "1", "mqtt": "http"},
    ],
)
def test_malformed_txt_is_ignored(txt: dict[str, str]) -> None:
    assert parse_peer(as_txt(txt), ["10.0.0.1"]) is None


def test_peer_without_address_is_ignored() -> None:
    assert parse_peer(as_txt(build_txt("lab", "n1", 1, None, None)), []) is None


def test_seeds() -> None:
    assert parse_seeds(["10.0.0.1", "10.0.0.2:7000", "[fe80::1]:7001", " host.lan "], 7946) == [
        ("10.0.0.1", 7946), ("10.0.0.2", 7000), ("fe80::1", 7001), ("host.lan", 7946)]
    for bad in ["", "a:b", "h:0", "h:99999", "a b"]:
        with pytest.raises(ValueError, match="seed"):
            parse_seeds([bad], 7946)


def test_requery_must_refresh_records_before_they_expire() -> None:
    def noop(*_: object) -> None:
        return None

    with pytest.raises(ValueError, match="requery_interval"):
        Discovery(cluster="c", node_id="n", cluster_port=1, on_add=noop, on_update=noop, on_remove=noop, ttl=4,
                  requery_interval=3.5)
    d = Discovery(cluster="c", node_id="n", cluster_port=1, on_add=noop, on_update=noop, on_remove=noop, ttl=120)
    assert d.requery_interval == 40
