"""A persistent MQTT 5 publisher for scripted failover tests: chosen packet ids and DUP, one JSON line per event.

python -m tests.cluster_e2e.pub_client HOST CLIENT_ID TOPIC PID:PAYLOAD... [--qos 2] [--dup] [--no-wait] [--after F]
  {"connack": code, "present": bool}, {"sent": [pids]}, then {"ack": "puback"|"pubrec"|"pubcomp", "pid": n, "rc": rc}
Sends every PUBLISH under its packet id, answers PUBREC with PUBREL and ends once every flow is complete, or at
once after sending with --no-wait (the connection is dropped: a flow the broker never acknowledged stays open).
"""

from __future__ import annotations

import argparse
import asyncio
import os

from appliance.protocol.packets import Puback, Pubcomp, Publish, Pubrec, Pubrel
from tests.chaos.mqttio import Gone
from tests.cluster_e2e.step_client import async_open_session, emit


async def async_main(args: argparse.Namespace) -> None:
    opened = await async_open_session(args.host, args.client_id)
    if opened is None:
        return
    conn = opened[0]
    if args.after:  # publish once this file exists (the test prepares a fault meanwhile)
        while not os.path.exists(args.after):
            await asyncio.sleep(0.02)
    open_flows: set[int] = set()
    for item in args.messages:
        pid_text, payload = item.split(":", 1)
        pid = int(pid_text)
        conn.send(Publish(args.topic, payload.encode(), args.qos, False, args.dup, pid))
        open_flows.add(pid)
    emit(sent=sorted(open_flows))
    if args.no_wait:
        await conn.async_drain(5.0)
        await asyncio.sleep(0.2)
        conn.abort()
        return
    while open_flows:
        try:
            packet = await conn.async_recv(30.0)
        except Gone:
            emit(gone=sorted(open_flows))
            return
        if isinstance(packet, Puback | Pubrec | Pubcomp):
            emit(ack=type(packet).__name__.lower(), pid=packet.packet_id, rc=packet.reason_code)
            if isinstance(packet, Pubrec):
                conn.send(Pubrel(packet.packet_id))  # type: ignore[arg-type]
            else:
                open_flows.discard(packet.packet_id)
    conn.disconnect()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("host")
    ap.add_argument("client_id")
    ap.add_argument("topic")
    ap.add_argument("messages", nargs="+", help="PID:PAYLOAD")
    ap.add_argument("--qos", type=int, default=2)
    ap.add_argument("--dup", action="store_true")
    ap.add_argument("--no-wait", action="store_true")
    ap.add_argument("--after", default="", help="publish only once this file exists")
    asyncio.run(async_main(ap.parse_args()))


if __name__ == "__main__":
    main()
