"""Fleet inventory CSV: parse and validate every row into Device records; errors name the CSV line."""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field

from appliance.broker.passwords import PasswordFormatError, check_username
from appliance.protocol.topics import is_valid_topic_filter

# Columns: device_id, hostname, cluster (or "site"), options. Options are `key=value` pairs separated by ';':
#   tls=yes|no        per-node certificate + MQTT-over-TLS listener on 8883 (default yes); the same for a whole cluster
#   ws=yes|no         MQTT over WebSocket listener on 8080 (default no)
#   listen=ADDR       address the listeners bind (default 0.0.0.0)
#   anonymous=yes|no  accept clients without a user name (default no)
#   users=NAME:ACCESS:FILTER ...   extra MQTT users (space separated); ACCESS is read, write or readwrite;
#                     a user may appear several times with different filters. `admin` (readwrite #) always exists.
#   upload=off|s3://BUCKET/PREFIX  override the fleet-wide --upload destination for this device
#   ssh=yes|no        enable sshd with the operator's --ssh-authorized-keys for root (default no: ssh stays off)
REQUIRED = ("device_id", "hostname", "cluster", "options")
ACCESS = ("read", "write", "readwrite")
_DEVICE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_CLUSTER = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_BOOL = {"yes": True, "true": True, "1": True, "no": False, "false": False, "0": False}
MAX_DEVICES = 100_000


class InventoryError(ValueError):
    """One or more bad inventory rows; `problems` holds (line, message) pairs and str() lists them all."""

    def __init__(self, problems: list[tuple[int, str]]) -> None:
        self.problems = problems
        super().__init__("\n".join(f"line {line}: {message}" for line, message in problems))


@dataclass(frozen=True, slots=True)
class UserGrant:
    """One MQTT user permission: `name` may ACCESS topics matching `topic_filter`."""

    name: str
    access: str
    topic_filter: str


@dataclass(slots=True)
class Device:
    """A validated inventory row."""

    line: int
    device_id: str
    hostname: str
    cluster: str
    tls: bool = True
    ws: bool = False
    listen: str = "0.0.0.0"
    anonymous: bool = False
    ssh: bool = False
    upload: str | None = None  # None: the fleet-wide default; "off": disabled; else s3://bucket/prefix
    grants: list[UserGrant] = field(default_factory=list)


def parse_inventory(text: str) -> list[Device]:
    """Parse inventory CSV text; raise InventoryError listing every bad row with its line number."""
    problems: list[tuple[int, str]] = []
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, None)
    except csv.Error as exc:
        raise InventoryError([(1, f"unreadable CSV: {exc}")]) from None
    if header is None:
        raise InventoryError([(1, "empty inventory: expected a header device_id,hostname,cluster,options")])
    columns = [h.strip().lower().lstrip("\ufeff") for h in header]
    columns = ["cluster" if c == "site" else c for c in columns]
    missing = [c for c in REQUIRED if c not in columns]
    if missing or len(set(columns)) != len(columns):
        raise InventoryError([(1, f"header must name {', '.join(REQUIRED)} once each (site= may stand for cluster); "
                                  f"got {', '.join(header)}")])
    index = {c: columns.index(c) for c in REQUIRED}
    devices: list[Device] = []
    seen_id: dict[str, int] = {}
    seen_host: dict[str, int] = {}
    while True:
        line = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            problems.append((line, f"unreadable CSV: {exc}"))
            break
        line = reader.line_num  # the row's last physical line (quoted fields may span lines)
        if not row or all(not cell.strip() for cell in row) or row[0].lstrip().startswith("#"):
            continue
        if len(row) != len(columns):
            problems.append((line, f"expected {len(columns)} fields, got {len(row)}"))
            continue
        if len(devices) >= MAX_DEVICES:
            problems.append((line, f"more than {MAX_DEVICES} devices"))
            break
        try:
            device = _parse_row(line, {c: row[i].strip() for c, i in index.items()})
        except ValueError as exc:
            problems.append((line, str(exc)))
            continue
        for key, seen in ((device.device_id, seen_id), (device.hostname, seen_host)):
            if key in seen:
                problems.append((line, f"duplicate {key!r} (first on line {seen[key]})"))
                break
            seen[key] = line
        else:
            devices.append(device)
    first_of: dict[str, Device] = {}
    for device in devices:  # peer links are mutual TLS or not for a whole cluster
        first = first_of.setdefault(device.cluster, device)
        if device.tls != first.tls:
            problems.append((device.line, f"tls={'yes' if device.tls else 'no'} differs from cluster {device.cluster!r}"
                                          f" (tls={'yes' if first.tls else 'no'} on line {first.line})"))
    if not devices and not problems:
        problems.append((1, "the inventory lists no devices"))
    if problems:
        raise InventoryError(sorted(problems))
    return devices


def _parse_row(line: int, cells: dict[str, str]) -> Device:
    device_id, hostname, cluster = cells["device_id"], cells["hostname"], cells["cluster"]
    if not _DEVICE_ID.match(device_id):
        raise ValueError(f"device_id {device_id!r}: use 1-64 letters, digits, '.', '_' or '-', starting alphanumeric")
    labels = hostname.split(".")
    if len(hostname) > 253 or not all(_LABEL.match(label) for label in labels) or hostname.endswith(".local"):
        raise ValueError(f"hostname {hostname!r}: use lower-case DNS labels (a-z, 0-9, '-'), without '.local'")
    if not _CLUSTER.match(cluster):
        raise ValueError(f"cluster {cluster!r}: use 1-63 lower-case letters, digits or '-', starting alphanumeric")
    device = Device(line, device_id, hostname, cluster)
    _apply_options(device, cells["options"])
    return device


def _apply_options(device: Device, text: str) -> None:
    seen: set[str] = set()
    for item in filter(None, (part.strip() for part in text.split(";"))):
        key, sep, value = item.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep:
            raise ValueError(f"option {item!r}: expected key=value")
        if key in seen:
            raise ValueError(f"option {key!r} given twice")
        seen.add(key)
        if key in ("tls", "ws", "anonymous", "ssh"):
            if value.lower() not in _BOOL:
                raise ValueError(f"option {key}={value!r}: expected yes or no")
            setattr(device, key, _BOOL[value.lower()])
        elif key == "listen":
            device.listen = _check_address(value)
        elif key == "upload":
            if value != "off" and not re.match(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[A-Za-z0-9._/=-]*)?$", value):
                raise ValueError(f"option upload={value!r}: expected off or s3://BUCKET/PREFIX")
            device.upload = value
        elif key == "users":
            device.grants = [_parse_grant(entry) for entry in value.split()]
        else:
            raise ValueError(f"unknown option {key!r} (known: tls, ws, listen, anonymous, users, upload, ssh)")


def _parse_grant(entry: str) -> UserGrant:
    parts = entry.split(":", 2)
    if len(parts) != 3:
        raise ValueError(f"users entry {entry!r}: expected NAME:ACCESS:FILTER")
    name, access, topic_filter = parts
    try:
        check_username(name)
    except PasswordFormatError as exc:
        raise ValueError(f"users entry {entry!r}: {exc}") from None
    if access not in ACCESS:
        raise ValueError(f"users entry {entry!r}: access must be one of {', '.join(ACCESS)}")
    if not is_valid_topic_filter(topic_filter) or topic_filter.startswith("$share/"):
        raise ValueError(f"users entry {entry!r}: {topic_filter!r} is not a valid topic filter")
    return UserGrant(name, access, topic_filter)


def _check_address(value: str) -> str:
    import ipaddress

    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError(f"option listen={value!r}: expected an IPv4 or IPv6 address") from None
