"""Known-answer tests: packets against bytes written by hand from the spec's field layouts (chapter 3).

Round trips cannot catch an encoder and decoder that are wrong in the same way; these fixed vectors can.
"""

from __future__ import annotations

import pytest

from appliance.protocol import (
    MQTT_5,
    MQTT_311,
    Auth,
    Connack,
    Connect,
    Decoder,
    Disconnect,
    MQTTError,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    Will,
    encode,
)

VECTORS = [
    # CONNECT 3.1.1: name "MQTT", level 4, flags clean session, keepalive 60, client id "c1" [MQTT-3.1.2]
    ("connect-311", MQTT_311, Connect("c1", MQTT_311, keepalive=60), "100e00044d5154540402003c00026331"),
    # all flags: user 0x80, password 0x40, will retain 0x20, will QoS 1 0x08, will 0x04, clean 0x02 = 0xEE
    ("connect-311-will-user-pass", MQTT_311,
     Connect("c", MQTT_311, True, 10, "u", b"p", Will("w", b"m", 1, True)),
     "101900044d51545404ee000a0001630001770001" "6d0001750001" "70"),
    # CONNECT 5: property block 0x05 = Session Expiry Interval (0x11) 10
    ("connect-5-session-expiry", MQTT_5, Connect("c1", MQTT_5, properties=Properties(session_expiry_interval=10)),
     "101400044d5154540502003c05110000000a00026331"),
    ("connack-311-session-present", MQTT_311, Connack(True), "20020100"),
    ("connack-311-not-authorized", MQTT_311, Connack(False, ReasonCode.NOT_AUTHORIZED), "20020005"),
    ("connack-5-not-authorized", MQTT_5, Connack(False, ReasonCode.NOT_AUTHORIZED), "2003008700"),
    # PUBLISH QoS 1 retain: 0x33, topic "a/b", packet id 10, payload "hi"
    ("publish-311-qos1-retain", MQTT_311, Publish("a/b", b"hi", 1, True, packet_id=10), "3309000361" "2f62000a6869"),
    ("publish-311-qos2-dup", MQTT_311, Publish("t", b"", 2, dup=True, packet_id=1), "3c050001740001"),
    # PUBLISH 5 with Topic Alias (0x23) 1
    ("publish-5-topic-alias", MQTT_5, Publish("t", b"x", properties=Properties(topic_alias=1)), "30080001740323000178"),
    # PUBLISH 5: two user properties with the same name, order kept [MQTT-3.3.2-18]
    ("publish-5-user-properties", MQTT_5,
     Publish("t", b"", properties=Properties(user_properties=[("k", "1"), ("k", "2")])),
     "3012000174" "0e" "260001" "6b" "0001" "31" "260001" "6b" "0001" "32"),
    ("puback-311", MQTT_311, Puback(7), "40020007"),
    ("puback-5-success-short-form", MQTT_5, Puback(7), "40020007"),
    ("puback-5-no-matching-subscribers", MQTT_5, Puback(7, ReasonCode.NO_MATCHING_SUBSCRIBERS), "4003000710"),
    ("pubrec-5-unspecified-error", MQTT_5, Pubrec(7, ReasonCode.UNSPECIFIED_ERROR), "5003000780"),
    ("pubrel-311-flags-0010", MQTT_311, Pubrel(7), "62020007"),
    ("pubrel-5-not-found", MQTT_5, Pubrel(7, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND), "6203000792"),
    ("pubcomp-311", MQTT_311, Pubcomp(7), "70020007"),
    # PUBACK with a Reason String (0x1F) "r": reason code and property block are both present
    ("puback-5-reason-string", MQTT_5, Puback(7, 0x80, Properties(reason_string="r")), "4008000780041f000172"),
    ("subscribe-311", MQTT_311, Subscribe(1, [SubscriptionRequest("a/#", 1)]), "82080001000361" "2f2301"),
    # options: QoS 2 | No Local 0x04 | Retain As Published 0x08 | Retain Handling 1 << 4 = 0x1E; sub id 5
    ("subscribe-5-options-and-id", MQTT_5,
     Subscribe(1, [SubscriptionRequest("a", 2, True, True, 1)], Properties(subscription_identifiers=[5])),
     "820900010" "20b05000161" "1e"),
    ("suback-311-failure", MQTT_311, Suback(1, [0, 0x80]), "900400010080"),
    ("suback-5", MQTT_5, Suback(1, [0, ReasonCode.NOT_AUTHORIZED]), "90050001000087"),
    ("unsubscribe-311", MQTT_311, Unsubscribe(2, ["a"]), "a20500020001" "61"),
    ("unsubscribe-5", MQTT_5, Unsubscribe(2, ["a"]), "a2060002000001" "61"),
    ("unsuback-311", MQTT_311, Unsuback(2), "b0020002"),
    ("unsuback-5", MQTT_5, Unsuback(2, [ReasonCode.NO_SUBSCRIPTION_EXISTED]), "b00400020011"),
    ("pingreq", MQTT_311, Pingreq(), "c000"),
    ("pingresp", MQTT_5, Pingresp(), "d000"),
    ("disconnect-311", MQTT_311, Disconnect(), "e000"),
    ("disconnect-5-normal-short-form", MQTT_5, Disconnect(), "e000"),
    ("disconnect-5-session-taken-over", MQTT_5, Disconnect(ReasonCode.SESSION_TAKEN_OVER), "e0018e"),
    # AUTH: reason 0x18, Authentication Method (0x15) "m"
    ("auth-5-continue", MQTT_5, Auth(0x18, Properties(authentication_method="m")), "f006180415" "00016d"),
]


@pytest.mark.parametrize(("version", "packet", "wire"), [v[1:] for v in VECTORS], ids=[v[0] for v in VECTORS])
def test_encode_gives_the_spec_bytes(version, packet, wire):
    assert encode(packet, version).hex() == wire


@pytest.mark.parametrize(("version", "packet", "wire"), [v[1:] for v in VECTORS], ids=[v[0] for v in VECTORS])
def test_decode_of_the_spec_bytes(version, packet, wire):
    decoder = Decoder(None, None if isinstance(packet, Connect) else version)
    assert decoder.feed(bytes.fromhex(wire)) == [packet]


def test_v5_codes_map_to_311_return_codes_on_encode():
    """3.1.1 SUBACK knows only 0x80 for failure [MQTT-3.9.3]; CONNACK return codes are 1..5 [MQTT-3.2.2.3]."""
    suback = Suback(1, [2, ReasonCode.NOT_AUTHORIZED, ReasonCode.QUOTA_EXCEEDED])
    assert encode(suback, MQTT_311).hex() == "9005000102" "8080"
    assert encode(Connack(False, ReasonCode.BAD_USER_NAME_OR_PASSWORD), MQTT_311).hex() == "20020004"
    assert encode(Connack(False, ReasonCode.QUOTA_EXCEEDED), MQTT_311).hex() == "20020003"  # no 3.1.1 code: unavailable


@pytest.mark.parametrize(("packet", "version"), [
    (Publish("t", b"", 3, packet_id=1), MQTT_311),  # [MQTT-3.3.1-4]
    (Publish("t", b"", 1), MQTT_5),  # QoS>0 needs a packet identifier [MQTT-2.2.1-3]
    (Publish("t", b"", 0, dup=True), MQTT_311),  # [MQTT-3.3.1-2]
    (Publish("t\x00", b""), MQTT_311),  # [MQTT-1.5.4-2]
    (Subscribe(1, []), MQTT_5),  # [MQTT-3.8.3-3]
    (Unsubscribe(1, []), MQTT_311),  # [MQTT-3.10.3-2]
    (Puback(0), MQTT_311),  # [MQTT-2.2.1-3]
    (Connect("c", MQTT_311, password=b"p"), MQTT_311),  # [MQTT-3.1.2-22]
    (Connect("c", MQTT_5), MQTT_311),  # level and encoding disagree
    (Auth(), MQTT_311),  # AUTH is v5 only
    (Puback(1, 300), MQTT_5),  # a reason code is one byte
], ids=["qos3", "qos1-no-id", "dup-qos0", "nul-topic", "subscribe-empty", "unsubscribe-empty", "packet-id-0",
        "311-password-only", "version-mismatch", "auth-311", "reason-code-300"])
def test_encoder_refuses_invalid_packets_with_mqtt_errors(packet, version):
    with pytest.raises(MQTTError):
        encode(packet, version)
