"""A persistent MQTT 5 subscriber for scripted failover tests; prints one JSON line per event and exits.

python -m tests.cluster_e2e.step_client HOST CLIENT_ID TOPIC [--qos 2] [--count N] [--quiet S] [--no-ack]
  {"connack": code, "present": bool}   then, per PUBLISH: {"payload": ..., "pid": ..., "dup": ..., "qos": ...}
Subscribes only when the session is new. With --no-ack it never answers a PUBLISH (the broker keeps it in flight).
Ends after `count` publishes, after `quiet` seconds without one, or at once when the CONNACK refuses.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from appliance.protocol.packets import (
    Connack,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    SubscriptionRequest,
)
from tests.chaos.mqttio import Conn, Gone

SESSION_EXPIRY = 3600


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def async_open_session(host: str, client_id: str) -> tuple[Conn, Connack] | None:
    """Connect a persistent session and print its CONNACK line; None (after printing why) when it is refused."""
    conn = await Conn.async_open(host, 1883, 0, 10.0)
    try:
        connack = await conn.async_connect(client_id, False, SESSION_EXPIRY, 10.0)
    except Gone as exc:
        emit(connack=str(exc))
        return None
    emit(connack=connack.reason_code, present=connack.session_present)
    return conn, connack


async def async_main(args: argparse.Namespace) -> None:
    opened = await async_open_session(args.host, args.client_id)
    if opened is None:
        return
    conn, connack = opened
    if not connack.session_present:
        conn.send(Subscribe(1, [SubscriptionRequest(args.topic, args.qos)]))
        packet = await conn.async_recv(10.0)
        assert isinstance(packet, Suback), packet
        emit(suback=list(packet.reason_codes))
    got = 0
    loop = asyncio.get_running_loop()
    linger_until: float | None = None  # after the last publish: answer PUBRELs a moment longer
    while True:
        if linger_until is None and args.count is not None and got >= args.count:
            linger_until = loop.time() + 0.5
        wait = args.quiet if linger_until is None else linger_until - loop.time()
        if wait <= 0:
            break
        try:
            packet = await conn.async_recv(wait)
        except Gone:
            break
        if isinstance(packet, Publish):
            got += 1
            emit(payload=packet.payload.decode(), pid=packet.packet_id, dup=packet.dup, qos=packet.qos)
            if args.no_ack:
                continue
            if packet.qos == 1:
                conn.send(Puback(packet.packet_id))  # type: ignore[arg-type]
            elif packet.qos == 2:
                conn.send(Pubrec(packet.packet_id))  # type: ignore[arg-type]
        elif isinstance(packet, Pubrel):
            emit(pubrel=packet.packet_id)
            conn.send(Pubcomp(packet.packet_id))
    await asyncio.sleep(0.1)  # let the last acks leave
    conn.disconnect()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("host")
    ap.add_argument("client_id")
    ap.add_argument("topic")
    ap.add_argument("--qos", type=int, default=2)
    ap.add_argument("--count", type=int, default=None)
    ap.add_argument("--quiet", type=float, default=3.0)
    ap.add_argument("--no-ack", action="store_true")
    asyncio.run(async_main(ap.parse_args()))


if __name__ == "__main__":
    main()
