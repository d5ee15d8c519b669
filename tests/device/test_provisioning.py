"""appliance-provision: 50 devices -> 50 bundles whose certificates verify; refusal without --force; bad rows."""

from __future__ import annotations

import hashlib
import json
import os
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from appliance.broker.acl import READ, WRITE, Acl
from appliance.broker.passwords import parse_password_file, verify_password
from appliance.server.config import load
from provisioning.cli import main

CLUSTERS = ["lab", "field-a", "field-b"]
N = 50


def no_tls(i: int) -> bool:
    """Devices provisioned without a certificate (tls=no): the whole of cluster field-b."""
    return i % 3 == 2


def inventory(n: int = N) -> str:
    rows = ["device_id,hostname,site,options"]
    for i in range(n):
        options = []
        if i % 5 == 0:
            options.append("users=sensor:write:sensors/# sensor:read:cmd/#")
        if no_tls(i):
            options.append("tls=no;ws=yes")
        rows.append(f'pi-{i:03d},node-{i:03d},{CLUSTERS[i % 3]},"{";".join(options)}"')
    return "\n".join(rows) + "\n"


def tree_hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("fleet")
    csv_path = root / "fleet.csv"
    csv_path.write_text(inventory())
    out = root / "out"
    assert main(["--inventory", str(csv_path), "--out", str(out), "--upload", "s3://fleet-logs/raw",
                 "--fleet", "test-fleet"]) == 0
    return csv_path, out


def test_fifty_devices_fifty_bundles(fleet: tuple[Path, Path]) -> None:
    _, out = fleet
    bundles = sorted(p.name for p in (out / "bundles").iterdir())
    assert bundles == [f"pi-{i:03d}" for i in range(N)]
    for i, name in enumerate(bundles):
        b = out / "bundles" / name
        files = {str(p.relative_to(b)) for p in b.rglob("*") if p.is_file()}
        expected = {"appliance.toml", "acl", "cluster-ca.crt", "bundle.json", "secrets/cluster.secret",
                    "secrets/passwd", "secrets/aws-credentials"}
        if not no_tls(i):
            expected |= {"node.crt", "secrets/node.key"}
        assert files == expected, name
        assert stat.S_IMODE(b.stat().st_mode) == 0o700
        for path in (b / "secrets").iterdir():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        config = load(b / "appliance.toml")  # the broker's own loader accepts it
        assert config.node_name == f"node-{i:03d}" and config.get("node", "fleet") == "test-fleet"
        assert config.extra["cluster"]["name"] == CLUSTERS[i % 3]
        assert ("tls_cert" in config.extra["cluster"]) == (not no_tls(i))
        assert config.get("auth", "allow_anonymous") is False
        assert bool(config.get("listener", "tls")) == (not no_tls(i))
        index = json.loads((b / "bundle.json").read_text())
        assert index["files"] == {rel: {"sha256": h, "mode": "0600" if rel.startswith("secrets/") else "0644"}
                                  for rel, h in tree_hashes(b).items() if rel != "bundle.json"}
    for ca_dir in (out / "ca").iterdir():
        assert stat.S_IMODE((ca_dir / "ca.key").stat().st_mode) == 0o600
        assert stat.S_IMODE((ca_dir / "cluster.secret").stat().st_mode) == 0o600
        assert stat.S_IMODE((ca_dir / "mqtt-users.txt").stat().st_mode) == 0o600


def test_certificates_verify_against_their_cluster_ca(fleet: tuple[Path, Path]) -> None:
    _, out = fleet
    cas = {c: x509.load_pem_x509_certificate((out / "ca" / c / "ca.crt").read_bytes()) for c in CLUSTERS}
    manifest = json.loads((out / "manifest.json").read_text())
    checked = 0
    for i in range(N):
        b = out / "bundles" / f"pi-{i:03d}"
        ca = cas[CLUSTERS[i % 3]]
        assert (b / "cluster-ca.crt").read_bytes() == (out / "ca" / CLUSTERS[i % 3] / "ca.crt").read_bytes()
        if no_tls(i):
            continue
        cert = x509.load_pem_x509_certificate((b / "node.crt").read_bytes())
        cert.verify_directly_issued_by(ca)  # raises if the signature or issuer is wrong
        for other in set(CLUSTERS) - {CLUSTERS[i % 3]}:
            with pytest.raises((ValueError, Exception)):
                cert.verify_directly_issued_by(cas[other])
        key = serialization.load_pem_private_key((b / "secrets" / "node.key").read_bytes(), None)
        assert key.public_key() == cert.public_key()
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert set(san.get_values_for_type(x509.DNSName)) == {f"node-{i:03d}", f"node-{i:03d}.local"}
        entry = manifest["devices"][f"pi-{i:03d}"]["certificate"]
        assert entry["serial"] == format(cert.serial_number, "x")
        assert entry["fingerprint_sha256"] == cert.fingerprint(cert.signature_hash_algorithm).hex()
        checked += 1
    assert checked == N - len([i for i in range(N) if no_tls(i)])


def test_tls_handshake_with_issued_certificate(fleet: tuple[Path, Path]) -> None:
    """A real TLS handshake: node-000 serving its key, a client trusting only the cluster CA, checking the name."""
    _, out = fleet
    b = out / "bundles" / "pi-000"
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(b / "node.crt", b / "secrets" / "node.key")
    client_ctx = ssl.create_default_context(cafile=str(b / "cluster-ca.crt"))
    wrong_ctx = ssl.create_default_context(cafile=str(out / "ca" / "field-a" / "ca.crt"))
    assert _handshake(server_ctx, client_ctx, "node-000.local") is None
    assert "certificate verify failed" in str(_handshake(server_ctx, wrong_ctx, "node-000.local"))
    assert "mismatch" in str(_handshake(server_ctx, client_ctx, "node-001.local")).lower()


def _handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, name: str) -> Exception | None:
    s_in, s_out, c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname=name)
    done = {"s": False, "c": False}
    for _ in range(20):
        for key, conn in (("c", client), ("s", server)):
            if not done[key]:
                try:
                    conn.do_handshake()
                    done[key] = True
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLError as exc:
                    return exc
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return None
    return RuntimeError("handshake did not finish")


def test_cluster_secret_users_and_acl(fleet: tuple[Path, Path]) -> None:
    _, out = fleet
    secrets = {c: set() for c in CLUSTERS}
    for i in range(N):
        b = out / "bundles" / f"pi-{i:03d}"
        secrets[CLUSTERS[i % 3]].add((b / "secrets" / "cluster.secret").read_text())
    assert all(len(s) == 1 for s in secrets.values())  # one secret per cluster ...
    assert len({next(iter(s)) for s in secrets.values()}) == 3  # ... different between clusters
    assert all(len(bytes.fromhex(next(iter(s)).strip())) == 32 for s in secrets.values())
    # Passwords: the bundle's hashes verify the operator's plaintext, checked once per cluster (scrypt is slow).
    for cluster, device in (("lab", 0), ("field-a", 1)):
        plain = dict(line.split(":", 1) for line in (out / "ca" / cluster / "mqtt-users.txt").read_text().split())
        hashes = parse_password_file((out / "bundles" / f"pi-{device:03d}" / "secrets" / "passwd").read_text())
        assert verify_password(plain["admin"], hashes["admin"])
        assert not verify_password(plain["admin"] + "x", hashes["admin"])
    acl = Acl.parse((out / "bundles" / "pi-000" / "acl").read_text())
    assert acl.allowed(WRITE, "sensor", "c1", "sensors/t1") and not acl.allowed(WRITE, "sensor", "c1", "cmd/x")
    assert acl.allowed(READ, "sensor", "c1", "cmd/x") and not acl.allowed(READ, "sensor", "c1", "sensors/t1")
    assert acl.allowed(WRITE, "admin", "c2", "anything/at/all")
    assert "sensor" not in (out / "bundles" / "pi-001" / "secrets" / "passwd").read_text()


def test_manifest_holds_no_private_material(fleet: tuple[Path, Path]) -> None:
    _, out = fleet
    text = (out / "manifest.json").read_text()
    manifest = json.loads(text)
    assert len(manifest["devices"]) == N and set(manifest["clusters"]) == set(CLUSTERS)
    assert "PRIVATE KEY" not in text
    for path in list((out / "bundles").rglob("secrets/*")) + list((out / "ca").rglob("*")):
        if path.is_file() and path.suffix != ".crt":
            for line in path.read_text().splitlines():
                value = line.split(":", 1)[-1].split("=", 1)[-1].strip().strip('"')
                if len(value) >= 16 and not line.startswith(("#", "aws_access_key_id")):  # key ids: public
                    assert value not in text, path
    uploads = (out / "cloud" / "upload-credentials.csv").read_text().splitlines()
    assert len(uploads) == N + 1 and stat.S_IMODE((out / "cloud" / "upload-credentials.csv").stat().st_mode) == 0o600


def test_upload_config_and_key_work_with_appliance_upload(fleet: tuple[Path, Path], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`appliance upload` accepts the [upload] section; boto3 finds the key where the upload unit points it."""
    from appliance.deliverylog.upload import _parser, load_config

    _, out = fleet
    b = out / "bundles" / "pi-004"
    cfg = load_config(_parser().parse_args(["--config", str(b / "appliance.toml"), "--log-dir", str(tmp_path)]))
    assert (cfg.bucket, cfg.prefix) == ("fleet-logs", "raw")
    boto3 = pytest.importorskip("boto3")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(b / "secrets" / "aws-credentials"))
    creds = boto3.session.Session().get_credentials()
    rows = dict((r.split(",")[0], r.split(",")) for r in (out / "cloud" / "upload-credentials.csv").read_text().split())
    assert creds is not None and creds.access_key == rows["pi-004"][2] and creds.secret_key == rows["pi-004"][3]
    unit = (Path(__file__).resolve().parents[2] / "systemd" / "appliance-upload.service").read_text()
    assert "AWS_SHARED_CREDENTIALS_FILE=/etc/appliance/secrets/aws-credentials" in unit


def test_second_run_refuses_without_force_and_force_reissues(fleet: tuple[Path, Path], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    csv_path, out = fleet
    before = tree_hashes(out)
    assert main(["--inventory", str(csv_path), "--out", str(out)]) == 1
    assert "already exist" in capsys.readouterr().err
    assert tree_hashes(out) == before  # nothing touched
    # --force on a copy: new node keys and serials, the same CA and cluster secret.
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    assert main(["--inventory", str(csv_path), "--out", str(copy), "--force", "--device", "pi-000"]) == 0
    assert (copy / "bundles/pi-000/node.crt").read_bytes() != (out / "bundles/pi-000/node.crt").read_bytes()
    assert (copy / "ca/lab/ca.crt").read_bytes() == (out / "ca/lab/ca.crt").read_bytes()
    assert (copy / "bundles/pi-000/secrets/cluster.secret").read_bytes() == \
        (out / "bundles/pi-000/secrets/cluster.secret").read_bytes()
    assert (copy / "bundles/pi-001").exists() and not list(copy.glob(".staging-*"))


BAD = """device_id,hostname,cluster,options
ok-1,node-1,lab,
bad id!,node-2,lab,
ok-3,Node_3,lab,
ok-1,node-4,lab,
ok-5,node-5,lab,colour=blue
ok-6,node-6,lab
ok-7,node-7,lab,users=sensor:write:a/#/b
ok-8,node-8,LAB,
ok-9,node-9,lab,tls=maybe
ok-10,node-10,lab,tls=no
"""


def test_bad_rows_reported_by_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv_path = tmp_path / "fleet.csv"
    csv_path.write_text(BAD)
    out = tmp_path / "out"
    assert main(["--inventory", str(csv_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    by_line = {int(line.split(":")[2]): line for line in err}
    assert sorted(by_line) == [3, 4, 5, 6, 7, 8, 9, 10, 11], err
    assert "device_id 'bad id!'" in by_line[3]
    assert "hostname 'Node_3'" in by_line[4]
    assert "duplicate 'ok-1' (first on line 2)" in by_line[5]
    assert "unknown option 'colour'" in by_line[6]
    assert "expected 4 fields, got 3" in by_line[7]
    assert "not a valid topic filter" in by_line[8]
    assert "cluster 'LAB'" in by_line[9]
    assert "tls='maybe'" in by_line[10]
    assert "tls=no differs from cluster 'lab' (tls=yes on line 2)" in by_line[11]
    assert not out.exists()  # nothing issued from a bad inventory


@pytest.mark.parametrize(("text", "message"), [
    ("", "empty inventory"),
    ("id,name\n", "header must name"),
    ("device_id,hostname,cluster,options\n", "lists no devices"),
    ('device_id,hostname,cluster,options\n"unterminated,x,y,z\n', "unreadable CSV"),
])
def test_bad_files(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str) -> None:
    csv_path = tmp_path / "fleet.csv"
    csv_path.write_text(text)
    assert main(["--inventory", str(csv_path), "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err


def test_shared_upload_key_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    csv_path = tmp_path / "fleet.csv"
    csv_path.write_text(inventory(2))
    monkeypatch.setenv("APPLIANCE_UPLOAD_ACCESS_KEY_ID", "AKSHARED")
    monkeypatch.setenv("APPLIANCE_UPLOAD_SECRET_ACCESS_KEY", "shared-secret-value")
    assert main(["--inventory", str(csv_path), "--out", str(tmp_path / "out"), "--upload", "s3://b/p"]) == 0
    creds = (tmp_path / "out/bundles/pi-001/secrets/aws-credentials").read_text()
    assert "aws_access_key_id = AKSHARED\n" in creds and not (tmp_path / "out/cloud").exists()
    monkeypatch.delenv("APPLIANCE_UPLOAD_SECRET_ACCESS_KEY")
    assert main(["--inventory", str(csv_path), "--out", str(tmp_path / "o2"), "--upload", "s3://b/p"]) == 2


def test_umask_does_not_widen_secrets(tmp_path: Path) -> None:
    csv_path = tmp_path / "fleet.csv"
    csv_path.write_text(inventory(1))
    old = os.umask(0)
    try:
        assert main(["--inventory", str(csv_path), "--out", str(tmp_path / "out")]) == 0
    finally:
        os.umask(old)
    for path in (tmp_path / "out").rglob("*"):
        if "secrets" in path.parts or path.name in ("ca.key", "cluster.secret", "mqtt-users.txt"):
            assert stat.S_IMODE(path.stat().st_mode) in (0o600, 0o700), path


KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFkLQ3mFq1cQ0bD2JbJ9S0xqv8c0S4Hj0d3a0bKq9vJr operator@laptop\n"


def test_ssh_only_where_asked_and_only_with_valid_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv_path = tmp_path / "fleet.csv"
    csv_path.write_text("device_id,hostname,cluster,options\na,node-a,lab,ssh=yes\nb,node-b,lab,\n")
    assert main(["--inventory", str(csv_path), "--out", str(tmp_path / "o1")]) == 2
    assert "fleet.csv:2: ssh=yes needs --ssh-authorized-keys" in capsys.readouterr().err
    bad = tmp_path / "bad.pub"
    bad.write_text('command="rm -rf /" ssh-ed25519 AAAA x\n')
    assert main(["--inventory", str(csv_path), "--out", str(tmp_path / "o2"), "--ssh-authorized-keys", str(bad)]) == 2
    assert "bad.pub:1: not an OpenSSH public key line" in capsys.readouterr().err
    keys = tmp_path / "ops.pub"
    keys.write_text("# operators\n" + KEY)
    out = tmp_path / "o3"
    assert main(["--inventory", str(csv_path), "--out", str(out), "--ssh-authorized-keys", str(keys)]) == 0
    assert (out / "bundles/a/ssh/authorized_keys").read_text() == "# operators\n" + KEY
    assert not (out / "bundles/b/ssh").exists()
    assert "ssh/authorized_keys" in json.loads((out / "bundles/a/bundle.json").read_text())["files"]
