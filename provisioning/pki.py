"""Per-cluster certificate authority and per-node certificates (EC P-256), using the cryptography package."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .files import write_private

CA_DAYS = 3650
CLOCK_SKEW = dt.timedelta(hours=1)  # devices without an RTC boot with a clock that may lag until NTP syncs


@dataclass(slots=True)
class ClusterCA:
    """A cluster's CA key and self-signed certificate."""

    cluster: str
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @property
    def cert_pem(self) -> bytes:
        """The CA certificate in PEM."""
        return self.cert.public_bytes(serialization.Encoding.PEM)


@dataclass(slots=True)
class NodeCert:
    """A node's fresh private key and the certificate the cluster CA issued for it."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @property
    def key_pem(self) -> bytes:
        """The private key, unencrypted PKCS#8 PEM (it lives only in the bundle and on the device, 0600)."""
        return self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())

    @property
    def cert_pem(self) -> bytes:
        """The certificate in PEM."""
        return self.cert.public_bytes(serialization.Encoding.PEM)


def fingerprint(cert: x509.Certificate) -> str:
    """SHA-256 fingerprint of the DER certificate, lower-case hex."""
    return cert.fingerprint(hashes.SHA256()).hex()


def load_or_create_ca(directory: Path, cluster: str, now: dt.datetime | None = None) -> tuple[ClusterCA, bool]:
    """Load DIR/ca.key + ca.crt, or create them (key 0600); returns (ca, created)."""
    key_path, cert_path = directory / "ca.key", directory / "ca.crt"
    if key_path.exists() and cert_path.exists():
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
            raise ValueError(f"{directory}: ca.key does not belong to ca.crt")
        return ClusterCA(cluster, key, cert), False
    if key_path.exists() or cert_path.exists():
        raise ValueError(f"{directory}: only one of ca.key and ca.crt exists; restore the other or remove both")
    now = now or dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "appliance fleet"),
        x509.NameAttribute(NameOID.COMMON_NAME, f"appliance cluster {cluster} CA"),
    ])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_private(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return ClusterCA(cluster, key, cert), True


def issue_node_cert(ca: ClusterCA, hostname: str, device_id: str, days: int,
                    addresses: list[str] | None = None, now: dt.datetime | None = None) -> NodeCert:
    """Issue a server+client certificate for one node: CN=hostname, SAN hostname, hostname.local (+ addresses)."""
    now = now or dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(hostname), x509.DNSName(f"{hostname}.local")]
    for address in addresses or []:
        ip = ipaddress.ip_address(address)
        if not ip.is_unspecified:
            names.append(x509.IPAddress(ip))
    subject = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "appliance fleet"),
        x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ca.cluster),
        x509.NameAttribute(NameOID.SERIAL_NUMBER, device_id),
        x509.NameAttribute(NameOID.COMMON_NAME, hostname),
    ])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(min(now + dt.timedelta(days=days), ca.cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=True, key_cert_sign=False, crl_sign=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return NodeCert(key, cert)
