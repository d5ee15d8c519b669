"""An MQTT 5 client that connects once, never reconnects, and reports how its connection ended.

python -m tests.cluster_e2e.hold_client HOST CLIENT_ID  -> prints "connected", then "disconnect 0x8e" or "closed"
"""

from __future__ import annotations

import socket
import sys

from appliance.protocol.codec import encode
from appliance.protocol.packets import MQTT_5, Connect, Properties


def main() -> None:
    host, client_id = sys.argv[1], sys.argv[2]
    sock = socket.create_connection((host, 1883), timeout=10)
    props = Properties(session_expiry_interval=3600)
    connect = Connect(client_id=client_id, protocol_version=MQTT_5, clean_start=False, keepalive=0, properties=props)
    sock.sendall(encode(connect, MQTT_5))
    data = sock.recv(64)
    if not data or data[0] != 0x20 or data[3] != 0:
        print(f"refused {data.hex()}", flush=True)
        return
    print("connected", flush=True)
    sock.settimeout(None)
    buf = data[2 + data[1]:]
    while True:
        if buf and buf[0] == 0xE0:
            print(f"disconnect 0x{buf[2]:02x}" if len(buf) > 2 else "disconnect 0x00", flush=True)
            return
        chunk = sock.recv(4096)
        if not chunk:
            print("closed", flush=True)
            return
        buf += chunk


if __name__ == "__main__":
    main()
