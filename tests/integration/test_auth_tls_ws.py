"""Auth, ACL, TLS (with client certificates) and WebSocket, each exercised by a real client against our broker."""

from __future__ import annotations

import datetime
import queue
import ssl
import subprocess
from pathlib import Path

import paho.mqtt.client as mqtt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.support.broker import APPLIANCE, free_port, running_broker


def _paho(client_id: str, **kw: object) -> mqtt.Client:
    return mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, **kw)  # type: ignore[arg-type]


def _connect_rc(client: mqtt.Client, host: str, port: int) -> int:
    """Connect and return the CONNACK reason code value (0 = accepted)."""
    result: queue.Queue[int] = queue.Queue()
    client.on_connect = lambda c, u, f, rc, p=None: result.put(rc.value if hasattr(rc, "value") else int(rc))
    client.connect(host, port, keepalive=30)
    client.loop_start()
    try:
        return result.get(timeout=10)
    finally:
        pass


def _roundtrip(client: mqtt.Client, topic: str, payload: bytes) -> bytes:
    got: queue.Queue[bytes] = queue.Queue()
    client.on_message = lambda c, u, m: got.put(m.payload)
    client.subscribe(topic, 1)
    import time

    time.sleep(0.3)
    client.publish(topic, payload, 1).wait_for_publish(10)
    return got.get(timeout=10)


def _passwd(path: Path, user: str, password: str) -> None:
    subprocess.run([str(APPLIANCE), "passwd", str(path), user, "--password-stdin"], input=password + "\n",
                   text=True, check=True, timeout=60)


def test_password_file_and_acl_with_mosquitto_clients(tmp_path: Path) -> None:
    pw = tmp_path / "passwd"
    _passwd(pw, "alice", "s3cret")
    _passwd(pw, "bob", "hunter2")
    acl = tmp_path / "acl"
    acl.write_text("user alice\ntopic readwrite plant/#\nuser bob\ntopic read plant/temp\npattern write dev/%c/#\n")
    assert oct(pw.stat().st_mode & 0o777) == "0o600"
    conf = tmp_path / "a.toml"
    conf.write_text(f'[auth]\nallow_anonymous = false\npassword_file = "{pw}"\nacl_file = "{acl}"\n')
    with running_broker("ours", tmp_path / "d", ("--config", str(conf))) as b:
        base = ["-h", "127.0.0.1", "-p", str(b.port)]
        anon = subprocess.run(["mosquitto_pub", *base, "-t", "plant/temp", "-m", "x"], capture_output=True, text=True,
                              timeout=20)
        assert anon.returncode != 0  # not authorised
        wrong = subprocess.run(["mosquitto_pub", *base, "-u", "alice", "-P", "nope", "-t", "plant/temp", "-m", "x"],
                               capture_output=True, text=True, timeout=20)
        assert wrong.returncode != 0
        sub = subprocess.Popen(["mosquitto_sub", *base, "-u", "bob", "-P", "hunter2", "-t", "plant/temp", "-C", "1",
                                "-W", "15", "-q", "1"], stdout=subprocess.PIPE, text=True)
        import time

        time.sleep(1.0)
        ok = subprocess.run(["mosquitto_pub", *base, "-u", "alice", "-P", "s3cret", "-t", "plant/temp", "-m", "21.5",
                             "-q", "1"], capture_output=True, text=True, timeout=20)
        assert ok.returncode == 0, ok.stderr
        out, _ = sub.communicate(timeout=20)
        assert out.strip() == "21.5"
        # bob may not subscribe to plant/# (SUBACK 0x80 / 0x87): mosquitto_sub reports the refusal
        refused = subprocess.run(["mosquitto_sub", *base, "-u", "bob", "-P", "hunter2", "-t", "plant/#", "-C", "1",
                                  "-W", "3", "-V", "mqttv5"], capture_output=True, text=True, timeout=20)
        assert "subscription requests were denied" in refused.stderr
        # a publish outside alice's ACL is answered 0x87 in v5: mosquitto_pub reports the failure
        denied = subprocess.run(["mosquitto_pub", *base, "-u", "alice", "-P", "s3cret", "-t", "other/x", "-m", "x",
                                 "-q", "1", "-V", "mqttv5"], capture_output=True, text=True, timeout=20)
        assert "not authori" in (denied.stderr + denied.stdout).lower(), denied


def _make_pki(tmp: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate with CN=device-7."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
    files: dict[str, Path] = {}

    def issue(name: str, cn: str, server: bool) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
                   .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1)))
        if server:
            import ipaddress

            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        files[f"{name}_cert"] = tmp / f"{name}.crt"
        files[f"{name}_key"] = tmp / f"{name}.key"
        files[f"{name}_cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        files[f"{name}_key"].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                           serialization.PrivateFormat.PKCS8,
                                                           serialization.NoEncryption()))

    issue("server", "127.0.0.1", True)
    issue("client", "device-7", False)
    files["ca"] = tmp / "ca.crt"
    files["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return files


def test_tls_with_client_certificate_identity(tmp_path: Path) -> None:
    pki = _make_pki(tmp_path)
    tls_port = free_port()
    conf = tmp_path / "a.toml"
    conf.write_text(
        f'[listener]\ntls = "127.0.0.1:{tls_port}"\ncertfile = "{pki["server_cert"]}"\n'
        f'keyfile = "{pki["server_key"]}"\n'
        f'cafile = "{pki["ca"]}"\nrequire_client_cert = true\nuse_identity_as_username = true\n'
        f'[auth]\nallow_anonymous = false\n'
    )
    with running_broker("ours", tmp_path / "d", ("--config", str(conf))):
        good = _paho("tls-good")
        good.tls_set(ca_certs=str(pki["ca"]), certfile=str(pki["client_cert"]), keyfile=str(pki["client_key"]))
        assert _connect_rc(good, "127.0.0.1", tls_port) == 0
        assert _roundtrip(good, "tls/t", b"secure") == b"secure"
        good.loop_stop()
        good.disconnect()
        assert not _tls_mqtt_accepted(pki["ca"], tls_port)  # no client certificate: refused


def _tls_mqtt_accepted(ca: Path, port: int) -> bool:
    """Open TLS without a client certificate and send CONNECT: True only if a CONNACK comes back."""
    import socket

    from appliance.protocol.codec import encode
    from appliance.protocol.packets import Connect

    ctx = ssl.create_default_context(cafile=str(ca))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(encode(Connect("tls-nocert", 4), 4))
            return len(tls.recv(4)) == 4
    except (ssl.SSLError, ConnectionError, TimeoutError):
        return False


def test_websocket_listener_with_paho(tmp_path: Path) -> None:
    ws_port = free_port()
    conf = tmp_path / "a.toml"
    conf.write_text(f'[listener]\nws = "127.0.0.1:{ws_port}"\n')
    with running_broker("ours", tmp_path / "d", ("--config", str(conf))) as b:
        ws = _paho("ws-client", transport="websockets", protocol=mqtt.MQTTv5)
        assert _connect_rc(ws, "127.0.0.1", ws_port) == 0
        tcp = _paho("tcp-client")
        assert _connect_rc(tcp, "127.0.0.1", b.port) == 0
        got: queue.Queue[bytes] = queue.Queue()
        ws.on_message = lambda c, u, m: got.put(m.payload)
        ws.subscribe("ws/t", 1)
        import time

        time.sleep(0.5)
        tcp.publish("ws/t", b"over websocket", 1).wait_for_publish(10)
        assert got.get(timeout=10) == b"over websocket"
        for c in (ws, tcp):
            c.loop_stop()
            c.disconnect()
