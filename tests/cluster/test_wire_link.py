"""Cluster wire codec round trips and bad frames; sans-I/O link handshake, heartbeats, failure detection (pairs)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.broker.model import Message
from appliance.cluster import dvv, wire
from appliance.cluster.errors import AuthFailed, WireError
from appliance.cluster.link import Authenticated, LinkCore, LinkState, PeerLeft, Received, channel_binding
from appliance.protocol.packets import Properties

SECRET = b"s3cret-cluster-key"


def sample_message(**kw) -> Message:
    base = dict(msg_id="n1-42", topic="a/b", payload=b"\x00hello", qos=1, retain=True, publisher="pub-1",
                created=1700000000.25, expiry_at=1700000100.5,
                properties=Properties(content_type="text/plain", user_properties=[("k", "v"), ("k", "w")],
                                      correlation_data=b"\x01\x02"))
    base.update(kw)
    return Message(**base)


def all_messages() -> list[wire.ClusterMessage]:
    clock = dvv.update(dvv.EMPTY, {}, b"opts", "n1")
    return [
        wire.Hello("lab", "n1", wire.PROTOCOL_VERSION, 7, b"\x11" * 32),
        wire.Auth(b"\x22" * 32),
        wire.Heartbeat(123456789),
        wire.HeartbeatAck(2**63),
        wire.Goodbye("shutdown"),
        wire.Forward(1, sample_message(), ("c1", "c2")),
        wire.Forward(2**40, sample_message(qos=0, retain=False, expiry_at=None, properties=Properties())),
        wire.ForwardAck(99),
        wire.Digest("subs", (("c1", {"n1": 3, "n2": 1}), ("c2", {})), final=False, collected=(("c3", {"n2": 9}),)),
        wire.RepairRequest("retained", ("t/1", "t/2")),
        wire.Repair("subs", (("c1", clock),)),
        wire.SessionTakeover(5, "client-ü", "n3", True),
        wire.SessionState(5, "client-ü", True, b"blob", final=False),
        wire.SessionDone(5, "client-ü", 0x8E),
        wire.Replicate(10, "c1", 2, b"data"),
        wire.ReplAck(10, 0x97),
    ]


@pytest.mark.parametrize("msg", all_messages(), ids=lambda m: type(m).__name__)
def test_every_message_round_trips(msg: wire.ClusterMessage) -> None:
    frame = wire.encode(msg)
    assert wire.FrameDecoder().feed_all(frame) == [msg]


def test_decoder_handles_arbitrary_splits() -> None:
    msgs = all_messages()
    stream = b"".join(wire.encode(m) for m in msgs)
    dec = wire.FrameDecoder()
    got: list[wire.ClusterMessage] = []
    for i in range(0, len(stream), 7):
        got += dec.feed_all(stream[i : i + 7])
    assert got == msgs
    assert dec.buffered == 0


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_decoder_never_crashes_on_garbage(data: bytes) -> None:
    dec = wire.FrameDecoder(max_frame=1024)
    try:
        dec.feed_all(data)
    except WireError:
        pass


@pytest.mark.parametrize(
    ("frame", "why"),
    [
        (b"\x00\x00\x00\x01\x7f", "unknown cluster frame type"),
        (b"\x00\x00\x00\x00\x01", "frame length 0"),
        (b"\x00\x10\x00\x00\x01", "outside"),
        (wire.encode(wire.ForwardAck(1))[:-1] + b"\x81", "truncated integer"),
        (b"\x00\x00\x00\x03\x11\x01\x00", "trailing bytes"),
        (b"\x00\x00\x00\x03\x05\x01\xff", "not UTF-8"),
        (b"\x00\x00\x00\x05\x20\x00\x00\x02\x00", "neither 0 nor 1"),
    ],
)
def test_bad_frames_are_refused_with_a_reason(frame: bytes, why: str) -> None:
    with pytest.raises(WireError, match=why):
        wire.FrameDecoder(max_frame=1024).feed_all(frame)


def test_bad_message_properties_are_a_wire_error() -> None:
    good = wire.encode(wire.Forward(1, sample_message(properties=Properties())))
    # the properties field is the last-but-one field: length 1, body b"\x00"; make its body claim 5 bytes
    body = bytearray(good)
    assert body[-3:] == b"\x01\x00\x00"
    body[-2] = 0x05
    with pytest.raises(WireError, match="properties"):
        wire.FrameDecoder().feed_all(bytes(body))


# ---- link core ---------------------------------------------------------------------------------------------------
def pair(secret_i: bytes = SECRET, secret_r: bytes = SECRET, **kw) -> tuple[LinkCore, LinkCore]:
    binding = channel_binding(("10.0.0.1", 40000), ("10.0.0.2", 7000))
    common = dict(cluster=kw.pop("cluster", "lab"), now=0.0, binding=binding, heartbeat_interval=1.0, timeout=3.0)
    i = LinkCore(node_id="n1", secret=secret_i, initiator=True, **common, **kw)
    r = LinkCore(node_id="n2", secret=secret_r, initiator=False, **common)
    return i, r


def pump(a: LinkCore, b: LinkCore, now: float = 0.0) -> tuple[list, list]:
    """Exchange bytes until both sides are quiet; return each side's events."""
    ev_a: list = []
    ev_b: list = []
    for _ in range(10):
        out_a, out_b = a.take_outgoing(), b.take_outgoing()
        if not out_a and not out_b:
            break
        ev_b += b.receive_data(out_a, now)
        ev_a += a.receive_data(out_b, now)
    return ev_a, ev_b


def test_correct_secret_authenticates_both_ways_and_messages_flow() -> None:
    i, r = pair()
    ev_i, ev_r = pump(i, r)
    assert ev_i == [Authenticated("n2", 0)]
    assert ev_r == [Authenticated("n1", 0)]
    assert i.state is r.state is LinkState.OPEN
    i.send(wire.ForwardAck(3))
    r.send(wire.Digest("subs", ()))
    ev_i, ev_r = pump(i, r)
    assert ev_r == [Received(wire.ForwardAck(3))]
    assert ev_i == [Received(wire.Digest("subs", ()))]


def test_wrong_secret_is_refused_and_responder_never_sends_its_proof() -> None:
    i, r = pair(secret_i=b"wrong")
    r.receive_data(i.take_outgoing(), 0.0)  # Hello
    i.receive_data(r.take_outgoing(), 0.0)  # Hello -> initiator answers with Auth
    with pytest.raises(AuthFailed, match="cluster-secret"):
        r.receive_data(i.take_outgoing(), 0.0)
    assert r.take_outgoing() == b""  # the impostor learns nothing more than the Hello
    with pytest.raises(WireError):
        r.send(wire.ForwardAck(1))


def test_responder_without_the_secret_is_refused_by_initiator() -> None:
    i, r = pair()
    r.receive_data(i.take_outgoing(), 0.0)
    i.receive_data(r.take_outgoing(), 0.0)
    i.take_outgoing()  # the initiator's proof never reaches the impostor, who answers with a guess
    with pytest.raises(AuthFailed):
        i.receive_data(wire.encode(wire.Auth(b"\x00" * 32)), 0.0)
    assert i.state is LinkState.HANDSHAKE
    with pytest.raises(WireError):
        i.send(wire.ForwardAck(1))


def test_reflected_proof_is_refused() -> None:
    i, r = pair()
    r.receive_data(i.take_outgoing(), 0.0)
    i.receive_data(r.take_outgoing(), 0.0)
    proof = i.take_outgoing()
    with pytest.raises(AuthFailed):
        i.receive_data(proof, 0.0)  # the initiator's own proof sent back to it


def test_proof_from_another_connection_is_refused() -> None:
    i, r = pair()
    other = LinkCore(node_id="n2", cluster="lab", secret=SECRET, initiator=False, now=0.0,
                     binding=channel_binding(("10.0.0.9", 1), ("10.0.0.2", 7000)), nonce=r._nonce)
    other.receive_data(i.take_outgoing(), 0.0)
    i.receive_data(r.take_outgoing(), 0.0)
    with pytest.raises(AuthFailed):
        other.receive_data(i.take_outgoing(), 0.0)


@pytest.mark.parametrize(
    ("kw", "why"), [({"cluster": "other"}, "cluster"), ({"expected_peer": "n9"}, "dialled")]
)
def test_hello_checks(kw: dict, why: str) -> None:
    cluster = kw.pop("cluster", None)
    if cluster:
        i = LinkCore(node_id="n1", cluster=cluster, secret=SECRET, initiator=True, now=0.0)
        r = LinkCore(node_id="n2", cluster="lab", secret=SECRET, initiator=False, now=0.0)
    else:
        i, r = pair(**kw)
    with pytest.raises(AuthFailed, match=why):
        i.receive_data(r.take_outgoing(), 0.0) if not cluster else r.receive_data(i.take_outgoing(), 0.0)


def test_self_connection_and_application_data_before_auth_are_refused() -> None:
    a = LinkCore(node_id="n1", cluster="lab", secret=SECRET, initiator=True, now=0.0)
    b = LinkCore(node_id="n1", cluster="lab", secret=SECRET, initiator=False, now=0.0)
    with pytest.raises(AuthFailed, match="ourselves"):
        b.receive_data(a.take_outgoing(), 0.0)
    _, r = pair()
    with pytest.raises(AuthFailed, match="expected Hello"):
        r.receive_data(wire.encode(wire.ForwardAck(1)), 0.0)


def test_unauthenticated_peer_cannot_send_big_frames() -> None:
    _, r = pair()
    with pytest.raises(WireError, match="outside"):
        r.receive_data(b"\x00\x10\x00\x00\x01", 0.0)


def test_heartbeats_measure_rtt_and_silence_expires_the_link() -> None:
    i, r = pair()
    pump(i, r)
    i.tick(1.0)
    r.receive_data(i.take_outgoing(), 1.05)
    i.receive_data(r.take_outgoing(), 1.1)
    assert i.rtt == pytest.approx(0.1)
    assert not i.expired(1.1 + 2.9)
    assert i.expired(1.1 + 3.1)  # r silent beyond the timeout
    assert r.expired(1.05 + 3.1)
    assert 0 <= i.next_deadline(1.5) <= 1.0


def test_goodbye_is_reported_and_closes() -> None:
    i, r = pair()
    pump(i, r)
    i.close("shutdown")
    assert i.state is LinkState.CLOSED
    events = r.receive_data(i.take_outgoing(), 0.0)
    assert events == [PeerLeft("shutdown")]
    assert r.state is LinkState.CLOSED


def test_channel_binding_folds_ipv4_mapped_addresses() -> None:
    assert channel_binding(("::ffff:10.0.0.1", 5), ("10.0.0.2", 6)) == b"10.0.0.1:5>10.0.0.2:6"
