"""The server-side Connection, driven by a tiny client built from the codec (no sockets)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.protocol import (
    MQTT_5,
    MQTT_311,
    Auth,
    Connack,
    Connect,
    Connection,
    Decoder,
    Disconnect,
    MalformedPacket,
    MQTTError,
    PacketTooLarge,
    Pingreq,
    Pingresp,
    Properties,
    ProtocolError,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    State,
    Suback,
    Subscribe,
    SubscriptionRequest,
    encode,
    encode_publish_properties,
)

from .strategies import packets


class Client:
    """The client half of the pair: encodes what it sends, decodes what the server answers."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.decoder = Decoder(None, version)

    def wire(self, *packets) -> bytes:
        return b"".join(encode(p, self.version) for p in packets)

    def read(self, data: bytes | None) -> list:
        assert data is not None
        return self.decoder.feed(data)


def pair(version: int = MQTT_5, connect_props: Properties | None = None, accept: bool = True, **server):
    client = Client(version)
    conn = Connection(**server)
    events = conn.receive_data(client.wire(Connect("c1", version, properties=connect_props or Properties())))
    assert [type(e) for e in events] == [Connect]
    if accept:
        [connack] = client.read(conn.send(Connack()))
        assert connack.reason_code == ReasonCode.SUCCESS
    return client, conn


def error_of(conn: Connection, data: bytes) -> MQTTError:
    with pytest.raises(MQTTError) as info:
        conn.receive_data(data)
    return info.value


# ---- ordering: CONNECT first, once ---------------------------------------------------------------------------------

@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
def test_first_packet_must_be_connect_MQTT_3_1_0_1(version):
    conn = Connection()
    err = error_of(conn, b"\xc0\x00")  # PINGREQ
    assert isinstance(err, ProtocolError)
    assert conn.error_disconnect(err) is None  # no CONNACK for a client that never connected
    assert conn.closed


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
def test_second_connect_is_a_protocol_error_MQTT_3_1_0_2(version):
    client, conn = pair(version)
    err = error_of(conn, client.wire(Connect("c1", version)))
    assert err.reason_code == ReasonCode.PROTOCOL_ERROR
    answer = conn.error_disconnect(err)
    if version == MQTT_5:
        assert client.read(answer) == [Disconnect(ReasonCode.PROTOCOL_ERROR)]  # [MQTT-4.13.1-1]
    else:
        assert answer is None  # 3.1.1: just close the network connection
    assert conn.closed


def test_packets_pipelined_behind_connect_are_returned_in_order_MQTT_3_1_4_5():
    """Clients need not wait for CONNACK (MQTT 3.1.4); the broker handles them once CONNACK is sent."""
    client = Client(MQTT_311)
    conn = Connection()
    events = conn.receive_data(client.wire(Connect("c"), Subscribe(1, [SubscriptionRequest("a")]), Pingreq()))
    assert [type(e) for e in events] == [Connect, Subscribe, Pingreq]
    assert conn.state is State.AWAIT_CONNACK
    with pytest.raises(ProtocolError):
        conn.send(Pingresp())  # nothing but CONNACK (or AUTH) goes out first [MQTT-3.2.0-1]
    client.read(conn.send(Connack()))
    assert client.read(conn.send(Pingresp())) == [Pingresp()]


def test_enhanced_auth_allows_only_auth_or_disconnect_before_connack_MQTT_3_1_2_30():
    client, conn = pair(MQTT_5, Properties(authentication_method="SCRAM-SHA-1"), accept=False)
    assert conn.receive_data(client.wire(Auth(0x18, Properties(authentication_method="SCRAM-SHA-1")))) != []
    assert client.read(conn.send(Auth(0x18, Properties(authentication_method="SCRAM-SHA-1"))))[0].reason_code == 0x18
    err = error_of(conn, client.wire(Publish("a", b"x")))
    assert err.reason_code == ReasonCode.PROTOCOL_ERROR
    [connack] = client.read(conn.error_disconnect(err))  # before CONNACK the error goes out as a CONNACK
    assert connack == Connack(False, ReasonCode.PROTOCOL_ERROR)


def test_auth_without_authentication_method_is_a_protocol_error():
    client, conn = pair(MQTT_5)
    err = error_of(conn, client.wire(Auth(0x19, Properties(authentication_method="x"))))
    assert err.reason_code == ReasonCode.PROTOCOL_ERROR
    with pytest.raises(ProtocolError):
        pair(MQTT_5)[1].send(Auth(0x18))


def test_disconnect_before_connack_is_allowed_from_the_client():
    client, conn = pair(MQTT_5, accept=False)
    assert conn.receive_data(client.wire(Disconnect())) == [Disconnect()]
    assert conn.closed


def test_server_sends_no_disconnect_before_connack_MQTT_3_14_0_1():
    _client, conn = pair(MQTT_5, accept=False)
    with pytest.raises(ProtocolError):
        conn.send(Disconnect(ReasonCode.SERVER_SHUTTING_DOWN))


def test_nothing_after_disconnect_MQTT_3_14_4_1():
    client, conn = pair(MQTT_5)
    conn.receive_data(client.wire(Disconnect()))
    assert conn.closed
    with pytest.raises(ProtocolError):
        conn.receive_data(client.wire(Pingreq()))
    assert conn.send(Pingresp()) == b""  # nothing goes out once closed
    assert conn.send_publish("t", b"late", 1, packet_id=1) == b""


def test_refused_connack_closes_and_clears_session_present_MQTT_3_2_2_6():
    client, conn = pair(MQTT_5, accept=False)
    [connack] = client.read(conn.send(Connack(True, ReasonCode.NOT_AUTHORIZED)))
    assert connack == Connack(False, ReasonCode.NOT_AUTHORIZED)
    assert conn.closed
    assert conn.send(Suback(1, [0])) == b""  # pipelined requests are not answered after a refusal [MQTT-3.1.4-5]


def test_disconnect_to_311_client_is_just_a_close():
    _client, conn = pair(MQTT_311)
    assert conn.send(Disconnect(ReasonCode.SESSION_TAKEN_OVER)) == b""
    assert conn.closed


def test_data_after_an_error_keeps_failing():
    client, conn = pair(MQTT_5)
    err = error_of(conn, b"\x00\x00")
    assert error_of(conn, client.wire(Pingreq())) is err


# ---- CONNECT-level refusals ----------------------------------------------------------------------------------------

def test_unsupported_level_gets_311_connack_0x01_MQTT_3_1_2_2():
    conn = Connection()
    body = b"\x00\x06MQIsdp\x03\x02\x00\x3c\x00\x01c"
    err = error_of(conn, bytes((0x10, len(body))) + body)
    assert conn.error_disconnect(err) == b"\x20\x02\x00\x01"


def test_v5_malformed_connect_is_answered_with_connack_0x81():
    client = Client(MQTT_5)
    conn = Connection()
    wire = bytearray(client.wire(Connect("c", MQTT_5)))
    wire[9] |= 0x01  # CONNECT reserved flag [MQTT-3.1.2-3]
    err = error_of(conn, bytes(wire))
    assert client.read(conn.error_disconnect(err)) == [Connack(False, ReasonCode.MALFORMED_PACKET)]


def test_311_empty_client_id_needs_clean_session_MQTT_3_1_3_8():
    client = Client(MQTT_311)
    conn = Connection()
    err = error_of(conn, client.wire(Connect("", MQTT_311, clean_start=False)))
    assert err.reason_code == ReasonCode.CLIENT_IDENTIFIER_NOT_VALID
    assert conn.error_disconnect(err) == b"\x20\x02\x00\x02"  # "identifier rejected"


def test_311_malformed_connect_is_closed_without_connack():
    conn = Connection()
    body = b"\x00\x04MQTT\x04\x03\x00\x3c\x00\x01c"  # reserved flag set
    err = error_of(conn, bytes((0x10, len(body))) + body)
    assert conn.error_disconnect(err) is None


# ---- topic aliases -------------------------------------------------------------------------------------------------

def test_inbound_topic_alias_is_resolved_for_the_broker_MQTT_3_3_2_3_4():
    client, conn = pair(MQTT_5, topic_alias_maximum=4)
    events = conn.receive_data(client.wire(
        Publish("room/1", b"a", properties=Properties(topic_alias=2)),
        Publish("", b"b", properties=Properties(topic_alias=2)),
        Publish("room/2", b"c", properties=Properties(topic_alias=2)),  # re-mapped
        Publish("", b"d", properties=Properties(topic_alias=2)),
    ))
    assert [(e.topic, e.payload, e.properties.topic_alias) for e in events] == [
        ("room/1", b"a", None), ("room/1", b"b", None), ("room/2", b"c", None), ("room/2", b"d", None)]


@pytest.mark.parametrize("alias", [0, 5])
def test_inbound_topic_alias_out_of_range_is_0x94_MQTT_3_3_2_9(alias):
    client, conn = pair(MQTT_5, topic_alias_maximum=4)
    err = error_of(conn, client.wire(Publish("t", b"", properties=Properties(topic_alias=alias))))
    assert err.reason_code == ReasonCode.TOPIC_ALIAS_INVALID
    assert client.read(conn.error_disconnect(err)) == [Disconnect(ReasonCode.TOPIC_ALIAS_INVALID)]


def test_inbound_topic_alias_when_none_allowed_is_0x94():
    client, conn = pair(MQTT_5)
    err = error_of(conn, client.wire(Publish("t", b"", properties=Properties(topic_alias=1))))
    assert err.reason_code == ReasonCode.TOPIC_ALIAS_INVALID


def test_unknown_topic_alias_with_empty_topic_is_a_protocol_error():
    client, conn = pair(MQTT_5, topic_alias_maximum=4)
    err = error_of(conn, client.wire(Publish("", b"", properties=Properties(topic_alias=3))))
    assert err.reason_code == ReasonCode.PROTOCOL_ERROR


def test_client_publish_with_subscription_identifier_is_a_protocol_error_MQTT_3_3_4_6():
    client, conn = pair(MQTT_5)
    err = error_of(conn, client.wire(Publish("t", b"", properties=Properties(subscription_identifiers=[3]))))
    assert err.reason_code == ReasonCode.PROTOCOL_ERROR


def test_outbound_topic_aliases_are_assigned_and_reused():
    client, conn = pair(MQTT_5, Properties(topic_alias_maximum=2))
    sent = [client.read(conn.send(Publish(t, b"x")))[0] for t in ["a/1", "a/2", "a/3", "a/1", "a/2", "a/3"]]
    wire = [(p.topic, p.properties.topic_alias) for p in sent]
    assert wire == [("a/1", 1), ("a/2", 2), ("a/3", None), ("", 1), ("", 2), ("a/3", None)]
    assert all(alias <= 2 for _t, alias in wire if alias is not None)  # [MQTT-3.3.2-8]


def test_no_outbound_aliases_unless_the_client_allows_them():
    client, conn = pair(MQTT_5)
    sent = [client.read(conn.send(Publish("a/1", b"x")))[0] for _ in range(2)]
    assert [(p.topic, p.properties.topic_alias) for p in sent] == [("a/1", None), ("a/1", None)]


def test_send_does_not_mutate_a_publish_shared_by_subscribers():
    _client, conn = pair(MQTT_5, Properties(topic_alias_maximum=5))
    shared = Publish("news", b"x", 1, packet_id=9, properties=Properties(subscription_identifiers=[4]))
    for _ in range(2):
        conn.send(shared)
    assert shared == Publish("news", b"x", 1, packet_id=9, properties=Properties(subscription_identifiers=[4]))


def test_send_publish_splices_cached_properties_and_subscription_ids():
    client, conn = pair(MQTT_5)
    props = Properties(content_type="text/plain", user_properties=[("k", "1"), ("k", "2")])
    cached = encode_publish_properties(props)
    [got] = client.read(conn.send_publish("t", b"p", 1, packet_id=7, properties=cached, subscription_ids=[5, 9]))
    assert got.properties.content_type == "text/plain"
    assert got.properties.user_properties == [("k", "1"), ("k", "2")]  # order kept [MQTT-3.3.2-18]
    assert got.properties.subscription_identifiers == [5, 9]
    assert (got.topic, got.packet_id, got.qos) == ("t", 7, 1)


def test_send_publish_to_311_client_drops_v5_properties():
    client, conn = pair(MQTT_311)
    cached = encode_publish_properties(Properties(content_type="x"))
    assert client.read(conn.send_publish("t", b"p", properties=cached, subscription_ids=[3])) == [Publish("t", b"p")]


# ---- flow control --------------------------------------------------------------------------------------------------

def test_receive_maximum_exceeded_is_0x93_MQTT_3_3_4_9():
    client, conn = pair(MQTT_5, receive_maximum=2)
    conn.receive_data(client.wire(Publish("t", b"", 1, packet_id=1), Publish("t", b"", 2, packet_id=2)))
    err = error_of(conn, client.wire(Publish("t", b"", 1, packet_id=3)))
    assert err.reason_code == ReasonCode.RECEIVE_MAXIMUM_EXCEEDED
    assert client.read(conn.error_disconnect(err)) == [Disconnect(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED)]


def test_receive_maximum_is_announced_in_connack():
    client, conn = pair(MQTT_5, accept=False, receive_maximum=7, topic_alias_maximum=3, max_packet_size=4096)
    [connack] = client.read(conn.send(Connack()))
    props = connack.properties
    assert (props.receive_maximum, props.topic_alias_maximum, props.maximum_packet_size) == (7, 3, 4096)


def test_quota_is_freed_by_puback_and_by_pubcomp_not_pubrec():
    client, conn = pair(MQTT_5, receive_maximum=1)
    conn.receive_data(client.wire(Publish("t", b"", 1, packet_id=1)))
    conn.send(Puback(1))
    conn.receive_data(client.wire(Publish("t", b"", 2, packet_id=2)))
    conn.send(Pubrec(2))
    with pytest.raises(ProtocolError):
        conn.receive_data(client.wire(Publish("t", b"", 1, packet_id=3)))  # QoS 2 flow still open [MQTT-4.9]
    client, conn = pair(MQTT_5, receive_maximum=1)
    conn.receive_data(client.wire(Publish("t", b"", 2, packet_id=2)))
    conn.send(Pubrec(2))
    conn.receive_data(client.wire(Pubrel(2)))
    conn.send(Pubcomp(2))
    assert conn.receive_data(client.wire(Publish("t", b"", 1, packet_id=3)))[0].packet_id == 3


def test_failed_pubrec_ends_the_qos2_flow():
    client, conn = pair(MQTT_5, receive_maximum=1)
    conn.receive_data(client.wire(Publish("t", b"", 2, packet_id=2)))
    conn.send(Pubrec(2, ReasonCode.NOT_AUTHORIZED))
    assert len(conn.receive_data(client.wire(Publish("t", b"", 2, packet_id=4)))) == 1


def test_redelivered_publish_with_the_same_packet_id_does_not_count_twice():
    client, conn = pair(MQTT_5, receive_maximum=1)
    conn.receive_data(client.wire(Publish("t", b"", 2, packet_id=5)))
    events = conn.receive_data(client.wire(Publish("t", b"", 2, dup=True, packet_id=5)))
    assert events[0].dup


def test_client_receive_maximum_is_exposed_for_the_broker_MQTT_3_3_4_7():
    _client, conn = pair(MQTT_5, Properties(receive_maximum=3))
    assert conn.client_receive_maximum == 3


# ---- packet size ---------------------------------------------------------------------------------------------------

def test_publish_larger_than_client_maximum_is_dropped_MQTT_3_1_2_24():
    client, conn = pair(MQTT_5, Properties(maximum_packet_size=64))
    assert conn.send(Publish("t", b"x" * 100)) == b""
    assert conn.send_publish("t", b"x" * 100, 1, packet_id=1) == b""
    assert client.read(conn.send(Publish("t", b"x" * 10))) == [Publish("t", b"x" * 10)]


def test_dropped_publish_does_not_consume_a_topic_alias():
    client, conn = pair(MQTT_5, Properties(maximum_packet_size=64, topic_alias_maximum=1))
    assert conn.send(Publish("big", b"x" * 100)) == b""
    [first] = client.read(conn.send(Publish("big", b"x")))
    assert (first.topic, first.properties.topic_alias) == ("big", 1)


def test_oversized_ack_loses_reason_string_and_user_properties_MQTT_3_4_2_2():
    client, conn = pair(MQTT_5, Properties(maximum_packet_size=20))
    conn.receive_data(client.wire(Subscribe(1, [SubscriptionRequest("a")])))
    big = Properties(reason_string="r" * 50, user_properties=[("k", "v" * 40)])
    [suback] = client.read(conn.send(Suback(1, [0], big)))
    assert suback == Suback(1, [0])


def test_inbound_packet_too_large_is_0x95():
    client, conn = pair(MQTT_5, max_packet_size=100)
    err = error_of(conn, client.wire(Publish("t", b"x" * 200)))
    assert isinstance(err, PacketTooLarge)
    assert client.read(conn.error_disconnect(err)) == [Disconnect(ReasonCode.PACKET_TOO_LARGE)]


def test_malformed_after_connack_is_disconnect_0x81_in_v5_and_close_in_311():
    client, conn = pair(MQTT_5)
    err = error_of(conn, b"\x60\x02\x00\x01")  # PUBREL with flags 0 [MQTT-2.1.3-1]
    assert isinstance(err, MalformedPacket)
    assert client.read(conn.error_disconnect(err)) == [Disconnect(ReasonCode.MALFORMED_PACKET)]
    client, conn = pair(MQTT_311)
    assert conn.error_disconnect(error_of(conn, b"\x60\x02\x00\x01")) is None


# ---- keepalive and DISCONNECT --------------------------------------------------------------------------------------

def test_keepalive_deadline_is_one_and_a_half_times_MQTT_3_1_2_22():
    client = Client(MQTT_311)
    conn = Connection()
    conn.receive_data(client.wire(Connect("c", keepalive=10)), now=100.0)
    conn.send(Connack())
    assert conn.keepalive_deadline(101.0) == 115.0
    conn.receive_data(client.wire(Pingreq()), now=110.0)
    assert conn.keepalive_deadline(111.0) == 125.0
    conn.receive_data(client.wire()[:0], now=200.0)  # no packet: the clock does not restart
    assert conn.keepalive_deadline(200.0) == 125.0


def test_keepalive_zero_means_no_deadline():
    client = Client(MQTT_311)
    conn = Connection()
    conn.receive_data(client.wire(Connect("c", keepalive=0)), now=1.0)
    assert conn.keepalive_deadline(5.0) is None


def test_server_keep_alive_overrides_the_clients_MQTT_3_2_2_21():
    client, conn = pair(MQTT_5, accept=False)
    conn.send(Connack(properties=Properties(server_keep_alive=20)))
    conn.receive_data(client.wire(Pingreq()), now=0.0)
    assert conn.keepalive_deadline(0.0) == 30.0


def test_disconnect_may_not_set_session_expiry_after_zero_MQTT_3_14_2_2():
    client, conn = pair(MQTT_5)
    err = error_of(conn, client.wire(Disconnect(properties=Properties(session_expiry_interval=60))))
    assert err.reason_code == ReasonCode.PROTOCOL_ERROR
    client, conn = pair(MQTT_5, Properties(session_expiry_interval=10))
    assert conn.receive_data(client.wire(Disconnect(properties=Properties(session_expiry_interval=60))))


@pytest.mark.parametrize("packet", [Connack(), Suback(1, [0]), Pingresp()], ids=["CONNACK", "SUBACK", "PINGRESP"])
def test_client_may_not_send_server_packets(packet):
    client, conn = pair(MQTT_5)
    assert error_of(conn, client.wire(packet)).reason_code == ReasonCode.PROTOCOL_ERROR


@pytest.mark.parametrize("packet", [Connect("x", MQTT_5), Subscribe(1, [SubscriptionRequest("a")]), Pingreq()],
                         ids=["CONNECT", "SUBSCRIBE", "PINGREQ"])
def test_server_may_not_send_client_packets(packet):
    _client, conn = pair(MQTT_5)
    with pytest.raises(ProtocolError):
        conn.send(packet)


def test_publish_above_announced_maximum_qos_is_0x9b_MQTT_3_2_2_11():
    client, conn = pair(MQTT_5, accept=False)
    conn.send(Connack(properties=Properties(maximum_qos=1)))
    assert conn.receive_data(client.wire(Publish("t", b"", 1, packet_id=1)))
    err = error_of(conn, client.wire(Publish("t", b"", 2, packet_id=2)))
    assert err.reason_code == ReasonCode.QOS_NOT_SUPPORTED
    assert client.read(conn.error_disconnect(err)) == [Disconnect(ReasonCode.QOS_NOT_SUPPORTED)]


def test_retained_publish_when_retain_unavailable_is_0x9a_MQTT_3_2_2_14():
    client, conn = pair(MQTT_5, accept=False)
    conn.send(Connack(properties=Properties(retain_available=0)))
    err = error_of(conn, client.wire(Publish("t", b"", retain=True)))
    assert err.reason_code == ReasonCode.RETAIN_NOT_SUPPORTED


def test_no_reason_string_when_problem_information_is_off_MQTT_3_1_2_29():
    client, conn = pair(MQTT_5, Properties(request_problem_information=0))
    conn.receive_data(client.wire(Publish("t", b"", 1, packet_id=1)))
    diag = Properties(reason_string="why", user_properties=[("a", "b")])
    assert client.read(conn.send(Puback(1, ReasonCode.NOT_AUTHORIZED, diag))) == [Puback(1, 0x87)]
    [disconnect] = client.read(conn.send(Disconnect(ReasonCode.SERVER_SHUTTING_DOWN, diag)))
    assert disconnect.properties.reason_string == "why"  # DISCONNECT may still carry it


def test_response_information_only_when_requested_MQTT_3_1_2_28():
    client, conn = pair(MQTT_5, accept=False)
    [connack] = client.read(conn.send(Connack(properties=Properties(response_information="resp/"))))
    assert connack.properties.response_information is None
    client, conn = pair(MQTT_5, Properties(request_response_information=1), accept=False)
    [connack] = client.read(conn.send(Connack(properties=Properties(response_information="resp/"))))
    assert connack.properties.response_information == "resp/"


def test_connack_maximum_packet_size_is_enforced_inbound():
    client, conn = pair(MQTT_5, accept=False, max_packet_size=1000)
    conn.send(Connack(properties=Properties(maximum_packet_size=50)))
    assert isinstance(error_of(conn, client.wire(Publish("t", b"x" * 60))), PacketTooLarge)


_CLIENT_PACKETS = {v: st.one_of([s for name, s in packets(v).items()
                                 if name not in ("CONNACK", "SUBACK", "UNSUBACK", "PINGRESP")] +
                                [packets(v)["CONNACK"]])  # one server packet type, to hit refusals too
                   for v in (MQTT_311, MQTT_5)}


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_client_sequence_yields_packets_or_an_mqtt_error(version, data):
    """Whatever a client sends, receive_data returns packets or raises MQTTError; the answer always decodes."""
    client = Client(version)
    conn = Connection(receive_maximum=data.draw(st.integers(1, 3)), topic_alias_maximum=data.draw(st.integers(0, 3)))
    sequence = data.draw(st.lists(_CLIENT_PACKETS[version], max_size=6))
    if data.draw(st.booleans()):
        sequence.insert(0, Connect("c", version))
    for packet in sequence:
        try:
            events = conn.receive_data(client.wire(packet))
        except MQTTError as err:
            answer = conn.error_disconnect(err)
            if answer is not None:
                [reply] = Decoder(None, version).feed(answer)
                assert isinstance(reply, (Connack, Disconnect))
                assert reply.reason_code >= 0x80
            assert conn.closed
            return
        for event in events:
            if isinstance(event, Connect):
                reply: Connack | Puback = Connack()
            elif isinstance(event, Publish) and event.qos == 1:
                reply = Puback(event.packet_id)
            else:
                continue
            try:
                data = conn.send(reply)
            except PacketTooLarge:  # the client's Maximum Packet Size is below the smallest such packet [MQTT-3.1.2-24]
                limit = conn.client_maximum_packet_size
                assert limit is not None and limit < len(encode(reply, version))
                return
            client.read(data)


def test_garbage_first_byte_is_refused_before_a_whole_packet_arrives_MQTT_3_1_0_1():
    """An HTTP request (or any non-CONNECT first byte) fails at once instead of waiting for a remaining length."""
    conn = Connection()
    with pytest.raises(ProtocolError):
        conn.receive_data(b"GET ")
    conn = Connection()
    assert conn.receive_data(b"\x10") == []  # a CONNECT split after its first byte is still fine
    assert conn.decoder.buffered == 1
