"""Synthetic fleet generator: delivery logs with injected faults whose exact counts go into a manifest.

Vectorised with numpy and Arrow (no JVM): each device's messages are arrays, each event kind a column-wise Arrow batch
(Parquet segments, the default, as the appliance's delivery log closes them) or JSON build (gzip JSON Lines),
one process per core.
Every device runs one broker node with one publisher; each message has two intended subscribers, one on the same
node and one on the next device of the fleet (reached by forwarding). Faults are placed at fixed residues of 50-message
blocks, chosen per block by a seeded hash, so they never overlap and each one's effect on the report is known.
"""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

BLOCK = 50
# residue within a block -> fault; the two messages after a reordered one are always clean, so its displacement is 2.
RESIDUE = {"unacked": 5, "loss": 10, "dup": 20, "reorder": 30, "drop": 40, "expire": 45}
REORDER_SPAN = 2
FIRMWARES = ("1.4.0", "1.4.2", "1.5.0")
CLOCK_SKEW_US = -3 * 86_400_000_000  # a Pi without RTC boots three days in the past until NTP syncs
EVENTS_PER_MESSAGE = 14  # without faults, with client logs and a remote subscriber
GZIP_LEVEL = 1
FORMATS = ("parquet", "jsonl")
# schema v1 as Arrow types (cloud_spark.schema.V1 without importing Spark into the generator's worker processes)
_V1_ARROW = pa.schema([
    ("event_id", pa.string()), ("schema_version", pa.int32()), ("source", pa.string()), ("fleet", pa.string()),
    ("device", pa.string()), ("node", pa.string()), ("firmware", pa.string()), ("boot_id", pa.string()),
    ("ts_wall_us", pa.int64()), ("ts_mono_us", pa.int64()), ("clock_synced", pa.bool_()), ("kind", pa.string()),
    ("msg_id", pa.string()), ("publisher", pa.string()), ("publisher_packet_id", pa.int32()),
    ("publisher_seq", pa.int64()), ("topic", pa.string()), ("qos", pa.int32()), ("retain", pa.bool_()),
    ("payload_size", pa.int32()), ("subscriber", pa.string()), ("filter", pa.string()), ("peer_node", pa.string()),
    ("reason", pa.string()), ("dup", pa.bool_()), ("attempt", pa.int32()),
])


@dataclass(frozen=True)
class FleetSpec:
    """What to generate; rates are per 50-message block, per fault kind."""

    fleets: int = 1
    devices: int = 4  # per fleet
    messages: int = 1_000  # per device (its one publisher)
    interval_us: int = 100_000
    start_us: int = 1_795_132_800_000_000  # 2026-11-20T00:00:00Z
    seed: int = 7
    loss_rate: float = 0.2
    dup_rate: float = 0.2
    reorder_rate: float = 0.2
    drop_rate: float = 0.1
    expire_rate: float = 0.1
    unacked_rate: float = 0.1
    clock_jump_devices: int = 1
    peer_outages: int = 1
    node_restarts: int = 1
    pending_tail: int = 2
    grace_us: int = 60_000_000
    client_logs: bool = True

    @staticmethod
    def for_events(events: int, **kw: object) -> FleetSpec:
        """A spec producing about `events` events over `devices` devices (default 100)."""
        devices = int(kw.pop("devices", 100))  # type: ignore[call-overload]
        fleets = int(kw.pop("fleets", 2))  # type: ignore[call-overload]
        per = max(BLOCK * 4, events // (EVENTS_PER_MESSAGE * devices * fleets))
        return FleetSpec(fleets=fleets, devices=devices, messages=per, **kw)  # type: ignore[arg-type]


# (device, date) -> Arrow pieces of its segment: JSON line arrays or record batches
Groups = dict[tuple[str, str], list[pa.Array | pa.RecordBatch]]
FAULT_SALT = {name: i + 1 for i, name in enumerate((*RESIDUE, "sub"))}


def _mix(*parts: np.ndarray | int) -> np.ndarray:
    """splitmix64 over the parts: a seeded, vectorised, well-spread hash."""
    h = np.zeros(1, dtype=np.uint64)
    for p in parts:
        h = h ^ np.asarray(p, dtype=np.uint64)
        h = h + np.uint64(0x9E3779B97F4A7C15)
        h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        h = h ^ (h >> np.uint64(31))
    return h


def _uniform(*parts: np.ndarray | int) -> np.ndarray:
    return (_mix(*parts) >> np.uint64(11)).astype(np.float64) / float(1 << 53)


class _Device:
    """Names and clock of one device's broker node."""

    def __init__(self, spec: FleetSpec, f: int, d: int) -> None:
        self.f, self.d, self.spec = f, d, spec
        self.fleet, self.device = f"fleet-{f:02d}", f"dev-{f:02d}-{d:03d}"
        self.node = f"node-{f:02d}-{d:03d}"
        self.boot = f"{self.node}-b1"
        self.firmware = FIRMWARES[d % len(FIRMWARES)]
        self.jumped = f * spec.devices + d < spec.clock_jump_devices

    def clock(self, true_us: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(wall, mono, synced) at true time; a jumped node runs 3 days slow until NTP syncs."""
        spec = self.spec
        sync_at = spec.start_us + (spec.messages * spec.interval_us) * 3 // 10
        unsynced = np.full(true_us.shape, self.jumped) & (true_us < sync_at)
        wall = np.where(unsynced, true_us + CLOCK_SKEW_US, true_us)
        mono = true_us - (spec.start_us - 600_000_000) + self.d * 1_000_003
        return wall, mono, ~unsynced


def _lines(fields: list[tuple[str, object]]) -> pa.Array:
    """JSON Lines (one per row) from constant and per-row values, built column-wise by Arrow."""
    pieces: list[object] = []
    for k, (name, val) in enumerate(fields):
        lit = ("{" if k == 0 else ",") + f'"{name}":'
        if isinstance(val, tuple):  # a string made of constant and per-row parts
            pieces += [lit + '"', *val, '"']
        elif isinstance(val, str):
            pieces.append(lit + json.dumps(val))
        elif isinstance(val, bool):
            pieces.append(lit + ("true" if val else "false"))
        elif isinstance(val, int):
            pieces.append(lit + str(val))
        elif isinstance(val, np.ndarray) and val.dtype == np.bool_:
            pieces += [lit, pc.if_else(pa.array(val), "true", "false")]
        else:
            pieces += [lit, val]
    pieces.append("}\n")
    merged: list[object] = []
    for p in pieces:
        if isinstance(p, np.ndarray):
            p = pa.array(p).cast(pa.string())
        if isinstance(p, str) and merged and isinstance(merged[-1], str):
            merged[-1] += p
        else:
            merged.append(p)
    return pc.binary_join_element_wise(*merged, "")


def _batch(fields: list[tuple[str, object]], n: int) -> pa.RecordBatch:
    """One Arrow batch of n schema-v1 records from constant and per-row values (absent fields are null)."""
    given = dict(fields)
    cols = []
    for fld in _V1_ARROW:
        val = given.get(fld.name)
        if val is None:
            cols.append(pa.nulls(n, fld.type))
        elif isinstance(val, tuple):  # a string made of constant and per-row parts
            parts = [pa.array(p).cast(pa.string()) if isinstance(p, np.ndarray) else p for p in val]
            cols.append(pc.binary_join_element_wise(*parts, ""))
        elif isinstance(val, np.ndarray):
            cols.append(pa.array(val).cast(fld.type))
        else:
            cols.append(pa.repeat(pa.scalar(val, fld.type), n))
    return pa.RecordBatch.from_arrays(cols, schema=_V1_ARROW)


def _device_events(spec: FleetSpec, f: int, d: int, fmt: str = "parquet") -> tuple[Groups, dict[str, int]]:
    """All events caused by device d's messages, by (device, date) they belong to, and the faults injected."""
    n = spec.messages
    a = _Device(spec, f, d)
    pd = (d + 1) % spec.devices if spec.devices > 1 else d
    b = _Device(spec, f, pd)
    remote = spec.devices > 1
    j = np.arange(n, dtype=np.int64)
    t = spec.start_us + j * spec.interval_us + d * 997
    block, res = j // BLOCK, j % BLOCK
    guard = spec.grace_us // spec.interval_us + 2 * BLOCK
    eligible = (block + 1) * BLOCK <= n - guard
    on = {k: eligible & (res == r) & (_uniform(spec.seed, FAULT_SALT[k], f, d, block) < getattr(spec, f"{k}_rate"))
          for k, r in RESIDUE.items()}
    fs = (_uniform(spec.seed, FAULT_SALT["sub"], f, d, block) >= 0.5).astype(np.int64)
    tail = j >= n - spec.pending_tail
    later = min(5_000_000, spec.grace_us // 2)  # redelivery / expiry delay: always before the window's end
    pub = f"pub-{f:02d}-{d:03d}"
    subs = (f"sub-{f:02d}-{d:03d}-0", f"sub-{f:02d}-{pd:03d}-1")
    topic = f"fleet-{f:02d}/dev-{d:03d}/telemetry"
    out: Groups = {}

    def emit(device: str, at: np.ndarray, fields: list[tuple[str, object]]) -> None:
        lines = _batch(fields, len(at)) if fmt == "parquet" else _lines(fields)
        day = at // 86_400_000_000
        for dv in np.unique(day):
            date = time.strftime("%Y-%m-%d", time.gmtime(int(dv) * 86_400))
            sel = lines if len(np.unique(day)) == 1 else lines.filter(pa.array(day == dv))
            out.setdefault((device, date), []).append(sel)

    def broker(slot: int, kind: str, side: _Device, at: np.ndarray, cond: np.ndarray | bool, **extra: object) -> None:
        idx = np.nonzero(np.broadcast_to(cond, j.shape))[0]
        if idx.size == 0:
            return
        jj, tt = j[idx], at[idx]
        wall, mono, synced = side.clock(tt)
        fields: list[tuple[str, object]] = [
            ("event_id", (f"{side.node}:{side.boot}:", jj * 64 + slot)), ("schema_version", 1),
            ("source", "broker"), ("fleet", side.fleet), ("device", side.device), ("node", side.node),
            ("firmware", side.firmware), ("boot_id", side.boot), ("ts_wall_us", wall), ("ts_mono_us", mono),
            ("clock_synced", synced), ("kind", kind), ("msg_id", (f"{a.node}-", jj)), ("publisher", pub),
            ("publisher_seq", jj), ("topic", topic), ("qos", 1)]
        fields += [(k, v[idx] if isinstance(v, np.ndarray) else v) for k, v in extra.items()]
        emit(side.device, tt, fields)

    def client(slot: int, kind: str, cid: str, dev: _Device, at: np.ndarray, cond: np.ndarray | bool,
               **extra: object) -> None:
        if not spec.client_logs:
            return
        idx = np.nonzero(np.broadcast_to(cond, j.shape))[0]
        if idx.size == 0:
            return
        jj, tt = j[idx], at[idx]
        boot = f"{cid}-boot"
        fields: list[tuple[str, object]] = [
            ("event_id", (f"{cid}:{boot}:", jj * 64 + slot)), ("schema_version", 1), ("source", "client"),
            ("fleet", dev.fleet), ("device", dev.device), ("node", cid), ("firmware", "client-1.0"),
            ("boot_id", boot), ("ts_wall_us", tt), ("ts_mono_us", tt - (spec.start_us - 300_000_000)),
            ("clock_synced", True), ("kind", kind), ("publisher", pub), ("publisher_seq", jj), ("topic", topic),
            ("qos", 1), *extra.items()]
        emit(dev.device, tt, fields)

    def jitter(salt: int, lo: int, span: int) -> np.ndarray:
        return lo + (_mix(spec.seed, 1000 + salt, f, d, j) % np.uint64(span)).astype(np.int64)

    broker(0, "received", a, t, True, payload_size=64, publisher_packet_id=j % 65535 + 1)
    broker(1, "committed", a, t + 150, True)
    broker(2, "forwarded", a, t + 200, remote, peer_node=b.node)
    broker(3, "forward_acked", a, t + 900, remote, peer_node=b.node)
    client(0, "client_published", pub, a, t - 300, True)
    client(1, "client_acked", pub, a, t + 400, True)
    for s in (0, 1):
        side = a if s == 0 else b
        base, sub = 16 + 16 * s, subs[s]
        mine = {k: v & (fs == s) for k, v in on.items()}
        routed_at = t + (250 if s == 0 else 600)
        arrive = routed_at + jitter(2 * s, 500, 2_000)
        arrive = np.where(mine["reorder"], arrive + (2 * REORDER_SPAN + 1) * spec.interval_us // 2, arrive)
        gone = mine["loss"] | mine["drop"] | mine["expire"]
        kw = {"subscriber": sub, "filter": f"fleet-{f:02d}/+/telemetry"}
        broker(base, "routed", side, routed_at, True, **kw)
        broker(base + 1, "dropped", side, routed_at + 100, mine["drop"], reason="queue_full", **kw)
        broker(base + 2, "queued_offline", side, routed_at + 100, mine["expire"], **kw)
        broker(base + 3, "expired", side, routed_at + later, mine["expire"], reason="message_expiry", **kw)
        broker(base + 4, "delivered", side, arrive, ~gone, dup=False, attempt=1, **kw)
        broker(base + 5, "delivered", side, arrive + later, mine["dup"], dup=True, attempt=2, **kw)
        acked = ~gone & ~mine["unacked"] & ~tail
        broker(base + 6, "acked", side, arrive + jitter(2 * s + 1, 300, 1_500), acked, **kw)
        client(2 + s, "client_received", sub, side, arrive + 300, ~gone, subscriber=sub)
        client(4 + s, "client_received", sub, side, arrive + later + 300, mine["dup"], subscriber=sub)
    counts = {k: int(v.sum()) for k, v in on.items()}
    return out, counts


def _incident_events(spec: FleetSpec, f: int, d: int) -> list[tuple[str, int, str, str | None, int]]:
    """(kind, true time, event-id suffix, peer node) for node_start at boot and the injected outages/restarts."""
    run = spec.messages * spec.interval_us
    at = {k: spec.start_us + run * pct // 100 for k, pct in
          (("peer_down", 50), ("peer_up", 60), ("node_stop", 70), ("node_start", 75))}
    g, peer = f * spec.devices + d, f"node-{f:02d}-{(d + 1) % spec.devices:03d}"
    rows: list[tuple[str, int, str, str | None, int]] = [("node_start", spec.start_us - 1_000_000, "x0", None, 0)]
    if g < spec.peer_outages:
        rows += [("peer_down", at["peer_down"], "x1", peer, 0), ("peer_up", at["peer_up"], "x2", peer, 0)]
    if g < spec.node_restarts:
        rows += [("node_stop", at["node_stop"], "x3", None, 0), ("node_start", at["node_start"], "x4", None, 0)]
    return rows


def _write_device(args: tuple[FleetSpec, int, int, str, str]) -> dict[str, int]:
    """Generate and write everything device (f, d)'s messages caused; one segment per target device and date."""
    spec, f, d, out, fmt = args
    groups, counts = _device_events(spec, f, d, fmt)
    dev = _Device(spec, f, d)
    for kind, at, suffix, peer, _ in _incident_events(spec, f, d):
        wall, mono, synced = dev.clock(np.array([at]))
        rec = {"event_id": f"{dev.node}:{dev.boot}:{suffix}", "schema_version": 1, "source": "broker",
               "fleet": dev.fleet, "device": dev.device, "node": dev.node, "firmware": dev.firmware,
               "boot_id": dev.boot, "ts_wall_us": int(wall[0]), "ts_mono_us": int(mono[0]),
               "clock_synced": bool(synced[0]), "kind": kind, **({"peer_node": peer} if peer else {})}
        date = time.strftime("%Y-%m-%d", time.gmtime(at // 1_000_000))
        one = _batch(list(rec.items()), 1) if fmt == "parquet" else pa.array([json.dumps(rec) + "\n"])
        groups.setdefault((dev.device, date), []).append(one)
    fleet = f"fleet-{f:02d}"
    for (device, date), arrays in groups.items():
        folder = Path(out, f"fleet={fleet}", f"date={date}", f"device={device}")
        folder.mkdir(parents=True, exist_ok=True)
        if fmt == "parquet":
            table = pa.Table.from_batches(arrays, schema=_V1_ARROW)
            pq.write_table(table, folder / f"seg-{dev.node}.parquet", compression="zstd", compression_level=1,
                           row_group_size=1 << 20)
            continue
        joined = pa.concat_arrays(arrays)
        offsets = np.frombuffer(joined.buffers()[1], dtype=np.int32)[joined.offset: joined.offset + len(joined) + 1]
        data = joined.buffers()[2].to_pybytes()[offsets[0]: offsets[-1]]
        with open(folder / f"seg-{dev.node}.jsonl.gz", "wb") as fh:
            fh.write(gzip.compress(data, compresslevel=GZIP_LEVEL))
    counts["events"] = sum(len(x) for arrays in groups.values() for x in arrays)
    return counts


def generate(spec: FleetSpec, out: str, processes: int | None = None,
             progress: Callable[[int, int], None] | None = None, fmt: str = "parquet") -> dict[str, object]:
    """Write the synthetic fleet's segments (`fmt`: parquet or jsonl) under `out`; returns the manifest.

    The manifest is also stored as `out/_manifest.json`.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown segment format {fmt!r} (one of {', '.join(FORMATS)})")
    shutil.rmtree(out, ignore_errors=True)
    Path(out).mkdir(parents=True)
    work = [(spec, f, d, out, fmt) for f in range(spec.fleets) for d in range(spec.devices)]
    procs = processes or min(len(work), os.cpu_count() or 1)
    totals: dict[str, int] = {k: 0 for k in (*RESIDUE, "events")}
    if procs <= 1:
        results: Iterable[dict[str, int]] = map(_write_device, work)
    else:
        pool = multiprocessing.get_context("spawn").Pool(procs)
        results = pool.imap_unordered(_write_device, work)
    try:
        for done, c in enumerate(results, 1):
            for k, v in c.items():
                totals[k] += v
            if progress:
                progress(done, len(work))
    finally:
        if procs > 1:
            pool.close()
            pool.join()
    man = manifest(spec, totals)
    Path(out, "_manifest.json").write_text(json.dumps(man, indent=2))
    return man


def manifest(spec: FleetSpec, c: dict[str, int]) -> dict[str, object]:
    """The injected faults' exact counts and what the report must therefore say."""
    subs = 2
    messages = spec.fleets * spec.devices * spec.messages
    pairs = messages * subs
    tail_pairs = spec.fleets * spec.devices * min(spec.pending_tail, spec.messages) * subs
    expected_fates = {"lost": c["loss"], "dropped": c["drop"], "expired": c["expire"],
                      "delivered_not_acked": c["unacked"], "pending": tail_pairs, "delivered": 0}
    expected_fates["acked"] = pairs - sum(expected_fates.values())
    devices = spec.fleets * spec.devices
    return {
        "spec": asdict(spec), "events": c.get("events", 0), "messages": messages, "pairs": pairs,
        "injected": {k: c[k] for k in RESIDUE},
        "expected": {
            "fates": expected_fates, "duplicated": c["dup"], "late": c["reorder"],
            "inversions": c["reorder"] * REORDER_SPAN,
            "e2e": {"lost": c["loss"] if spec.client_logs else 0, "duplicated": c["dup"] if spec.client_logs else 0},
            "clock_stepped_boots": min(spec.clock_jump_devices, devices),
            "incidents": {"peer_down": min(spec.peer_outages, devices),
                          "node_stop": min(spec.node_restarts, devices)},
        },
    }

BAD_LINES = {
    "malformed JSON": lambda good: json.dumps(good)[:-7],
    "missing required field: ts_wall_us": lambda good: json.dumps({k: v for k, v in good.items() if k != "ts_wall_us"}),
    "unknown schema_version: 99": lambda good: json.dumps({**good, "schema_version": 99}),
    "bad type for field: ts_mono_us": lambda good: json.dumps({**good, "ts_mono_us": "soon"}),
    "unknown kind: teleported": lambda good: json.dumps({**good, "kind": "teleported"}),
    "fleet differs from upload path": lambda good: json.dumps({**good, "fleet": "elsewhere"}),
    "empty record": lambda good: "",
}


def _segments(out: str) -> list[str]:
    """Every segment under out (either format), largest first."""
    found = [str(p) for suffix in ("*.parquet", "*.jsonl.gz") for p in Path(out).rglob(suffix)]
    return sorted(found, key=lambda p: (-os.path.getsize(p), p))


def _first_record(path: str) -> dict[str, object]:
    if path.endswith(".parquet"):
        row = pq.ParquetFile(path).read_row_group(0).slice(0, 1).to_pylist()[0]
        return {k: v for k, v in row.items() if v is not None}
    with gzip.open(path, "rt") as fh:
        return dict(json.loads(fh.readline()))


def _rows(path: str) -> int:
    if path.endswith(".parquet"):
        return int(pq.ParquetFile(path).metadata.num_rows)
    with gzip.open(path, "rt") as fh:
        return sum(1 for _ in fh)


def inject_upload_faults(out: str, bad_per_reason: int = 2, reuploads: int = 1) -> dict[str, object]:
    """Add a JSON Lines segment of bad records (each reason `bad_per_reason` times) and re-upload copies of segments."""
    segs = _segments(out)
    good = _first_record(segs[0])
    counts = {}
    lines = []
    for n, (reason, make) in enumerate(BAD_LINES.items()):
        for k in range(bad_per_reason):
            rec = {**good, "event_id": f"bad:{n}:{k}"}
            lines.append(make(rec))
        counts[reason] = bad_per_reason
    with gzip.open(str(Path(segs[0]).parent / "zz-bad.jsonl.gz"), "wt") as fh:
        fh.write("\n".join(lines) + "\n")
    copied = 0
    for src in segs[:reuploads]:
        suffix = ".parquet" if src.endswith(".parquet") else ".jsonl.gz"
        dst = src[:-len(suffix)] + "-reupload" + suffix
        shutil.copyfile(src, dst)
        copied += _rows(dst)
    return {"quarantined": counts, "duplicates": copied}
