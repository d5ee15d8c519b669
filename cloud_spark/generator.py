"""Synthetic fleet generator: delivery logs with injected faults whose exact counts go into a manifest.

Generated with Spark itself (one row per message, exploded into its events), so 10M events take a couple of minutes.
Every device runs one broker node with one publisher; each message has two intended subscribers, one on the same
node and one on the next device of the fleet (reached by forwarding). Faults are placed at fixed residues of 50-message
blocks, chosen per block by a seeded hash, so they never overlap and each one's effect on the report is known.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cloud_spark.schema import V1

BLOCK = 50
# residue within a block -> fault; the two messages after a reordered one are always clean, so its displacement is 2.
RESIDUE = {"unacked": 5, "loss": 10, "dup": 20, "reorder": 30, "drop": 40, "expire": 45}
REORDER_SPAN = 2
FIRMWARES = ("1.4.0", "1.4.2", "1.5.0")
CLOCK_SKEW_US = -3 * 86_400_000_000  # a Pi without RTC boots three days in the past until NTP syncs
EVENTS_PER_MESSAGE = 14  # without faults, with client logs and a remote subscriber


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


def _u(spec: FleetSpec, *parts: Column | str | int) -> Column:
    """A seeded uniform number in [0, 1) from the given parts."""
    h = F.xxhash64(F.lit(spec.seed), *[p if isinstance(p, Column) else F.lit(p) for p in parts])
    return F.pmod(h, F.lit(1_000_000)) / 1_000_000.0


def messages(spark: SparkSession, spec: FleetSpec) -> DataFrame:
    """One row per published message, with its fault flags (the ground truth)."""
    n, d_per = spec.messages, spec.devices
    total = spec.fleets * d_per * n
    df = spark.range(0, total, numPartitions=max(2, min(64, total // 200_000 + 2)))
    dev = (F.col("id") / n).cast("long")
    df = df.select(
        (dev / d_per).cast("int").alias("f"), (dev % d_per).cast("int").alias("d"),
        (F.col("id") % n).cast("long").alias("j"))
    block, res = (F.col("j") / BLOCK).cast("long"), F.col("j") % BLOCK
    guard = spec.grace_us // spec.interval_us + 2 * BLOCK
    eligible = (block + 1) * BLOCK <= n - guard
    flags = []
    for fault, r in RESIDUE.items():
        rate = getattr(spec, f"{fault}_rate")
        on = eligible & (res == r) & (_u(spec, fault, F.col("f"), F.col("d"), block) < rate)
        flags.append(on.alias(fault))
    peer = F.when(F.lit(d_per) > 1, (F.col("d") + 1) % d_per).otherwise(F.col("d"))
    df = df.select("*", *flags, peer.cast("int").alias("pd"),
                   (_u(spec, "sub", F.col("f"), F.col("d"), block) >= 0.5).cast("int").alias("fs"),
                   (F.col("j") >= n - spec.pending_tail).alias("tail"))
    return df.withColumn("t", F.lit(spec.start_us) + F.col("j") * spec.interval_us + F.col("d") * 997)


def _names(f: Column, d: Column) -> dict[str, Column]:
    fleet = F.format_string("fleet-%02d", f)
    node = F.format_string("node-%02d-%03d", f, d)
    return {"fleet": fleet, "device": F.format_string("dev-%02d-%03d", f, d), "node": node,
            "firmware": F.element_at(F.array(*[F.lit(x) for x in FIRMWARES]), (d % len(FIRMWARES)) + 1),
            "boot_id": F.concat(node, F.lit("-b1"))}


def _clock(spec: FleetSpec, true_us: Column, f: Column, d: Column) -> tuple[Column, Column, Column]:
    """(wall, mono, synced) of a broker node at true time; a few nodes run 3 days slow until NTP syncs."""
    jumped = (f * spec.devices + d) < spec.clock_jump_devices
    sync_at = spec.start_us + (spec.messages * spec.interval_us) * 3 // 10
    unsynced = jumped & (true_us < sync_at)
    wall = F.when(unsynced, true_us + CLOCK_SKEW_US).otherwise(true_us)
    mono = true_us - (spec.start_us - 600_000_000) + d * 1_000_003
    return wall, mono, ~unsynced


def events(msgs: DataFrame, spec: FleetSpec) -> DataFrame:
    """Explode messages into delivery-log events (schema v1) carrying `fleet`, `date`, `device` for partitioning."""
    f, d, j, t, pd = F.col("f"), F.col("d"), F.col("j"), F.col("t"), F.col("pd")
    a, b = _names(f, d), _names(f, pd)
    pub = F.format_string("pub-%02d-%03d", f, d)
    subs = [F.format_string("sub-%02d-%03d-0", f, d), F.format_string("sub-%02d-%03d-1", f, pd)]
    msg_id = F.format_string("%s-%d", a["node"], j)
    remote = F.lit(spec.devices > 1)

    def lat(salt: str, lo: int, span: int) -> Column:
        return (F.lit(lo) + F.pmod(F.xxhash64(F.lit(spec.seed), F.lit(salt), f, d, j), F.lit(span))).cast("long")

    def fault_on(name: str, s: int) -> Column:
        return F.col(name) & (F.col("fs") == s)

    templates: list[Column] = []

    def broker(slot: int, kind: str, side: dict[str, Column], sd: Column, at: Column, cond: Column,
               **extra: Column) -> None:
        wall, mono, synced = _clock(spec, at, f, sd)
        fields = {**side, "event_id": F.format_string("%s:%s:%d", side["node"], side["boot_id"], j * 64 + slot),
                  "source": F.lit("broker"), "ts_wall_us": wall, "ts_mono_us": mono, "clock_synced": synced,
                  "kind": F.lit(kind), "msg_id": msg_id, "publisher": pub, "publisher_seq": j,
                  "topic": F.format_string("fleet-%02d/dev-%03d/telemetry", f, d), "qos": F.lit(1), **extra}
        templates.append(F.when(cond, _record(fields, at)))

    def client(slot: int, kind: str, cid: Column, dev: dict[str, Column], at: Column, cond: Column,
               **extra: Column) -> None:
        boot = F.concat(cid, F.lit("-boot"))
        fields = {"fleet": dev["fleet"], "device": dev["device"], "node": cid, "firmware": F.lit("client-1.0"),
                  "boot_id": boot, "event_id": F.format_string("%s:%s:%d", cid, boot, j * 64 + slot),
                  "source": F.lit("client"), "ts_wall_us": at, "ts_mono_us": at - (spec.start_us - 300_000_000),
                  "clock_synced": F.lit(True), "kind": F.lit(kind), "publisher": pub, "publisher_seq": j,
                  "topic": F.format_string("fleet-%02d/dev-%03d/telemetry", f, d), "qos": F.lit(1), **extra}
        templates.append(F.when(cond & F.lit(spec.client_logs), _record(fields, at)))

    yes = F.lit(True)
    broker(0, "received", a, d, t, yes, payload_size=F.lit(64), publisher_packet_id=(j % 65535 + 1).cast("int"))
    broker(1, "committed", a, d, t + 150, yes)
    broker(2, "forwarded", a, d, t + 200, remote, peer_node=b["node"])
    broker(3, "forward_acked", a, d, t + 900, remote, peer_node=b["node"])
    client(0, "client_published", pub, a, t - 300, yes)
    client(1, "client_acked", pub, a, t + 400, yes)
    for s in (0, 1):
        side, sd = (a, d) if s == 0 else (b, pd)
        base = 16 + 16 * s
        sub = subs[s]
        arrive = t + (250 if s == 0 else 600) + lat(f"d{s}", 500, 2_000)
        arrive = F.when(fault_on("reorder", s), arrive + (2 * REORDER_SPAN + 1) * spec.interval_us // 2)\
            .otherwise(arrive)
        routed_at = t + (250 if s == 0 else 600)
        gone = fault_on("loss", s) | fault_on("drop", s) | fault_on("expire", s)
        kw = {"subscriber": sub, "filter": F.format_string("fleet-%02d/+/telemetry", f)}
        broker(base, "routed", side, sd, routed_at, yes, **kw)
        broker(base + 1, "dropped", side, sd, routed_at + 100, fault_on("drop", s), reason=F.lit("queue_full"), **kw)
        broker(base + 2, "queued_offline", side, sd, routed_at + 100, fault_on("expire", s), **kw)
        broker(base + 3, "expired", side, sd, routed_at + 30_000_000, fault_on("expire", s),
               reason=F.lit("message_expiry"), **kw)
        broker(base + 4, "delivered", side, sd, arrive, ~gone, dup=F.lit(False), attempt=F.lit(1), **kw)
        broker(base + 5, "delivered", side, sd, arrive + 5_000_000, fault_on("dup", s), dup=F.lit(True),
               attempt=F.lit(2), **kw)
        acked = ~gone & ~fault_on("unacked", s) & ~F.col("tail")
        broker(base + 6, "acked", side, sd, arrive + lat(f"a{s}", 300, 1_500), acked, **kw)
        rdev = a if s == 0 else b
        client(2 + s, "client_received", sub, rdev, arrive + 300, ~gone, subscriber=sub)
        client(4 + s, "client_received", sub, rdev, arrive + 5_000_300, fault_on("dup", s), subscriber=sub)
    exploded = msgs.select(F.explode(F.array(*templates)).alias("e")).where(F.col("e").isNotNull())
    return exploded.select("e.*")


def _record(fields: dict[str, Column], true_us: Column) -> Column:
    fields = {"schema_version": F.lit(1), **fields}
    cols = [(fields[fl.name] if fl.name in fields else F.lit(None)).cast(fl.dataType).alias(fl.name)
            for fl in V1.fields]
    cols.append(F.date_format(F.timestamp_micros(true_us), "yyyy-MM-dd").alias("date"))
    return F.struct(*cols)


def incident_events(spark: SparkSession, spec: FleetSpec) -> DataFrame:
    """node_start at boot for every node, plus the injected peer outages and node restarts (20 s and 10 s long)."""
    rows = []
    mid = spec.start_us + spec.messages * spec.interval_us // 2
    for f in range(spec.fleets):
        for d in range(spec.devices):
            g = f * spec.devices + d
            rows.append((f, d, (d + 1) % spec.devices, "node_start", spec.start_us - 1_000_000, 0))
            if g < spec.peer_outages:
                rows.append((f, d, (d + 1) % spec.devices, "peer_down", mid, 1))
                rows.append((f, d, (d + 1) % spec.devices, "peer_up", mid + 20_000_000, 2))
            if g < spec.node_restarts:
                rows.append((f, d, d, "node_stop", mid + 60_000_000, 3))
                rows.append((f, d, d, "node_start", mid + 70_000_000, 4))
    df = spark.createDataFrame(rows, "f int, d int, pd int, kind string, t long, slot int")
    f, d, t = F.col("f"), F.col("d"), F.col("t")
    a, b = _names(f, d), _names(f, F.col("pd"))
    wall, mono, synced = _clock(spec, t, f, d)
    fields = {**a, "event_id": F.format_string("%s:%s:x%d", a["node"], a["boot_id"], F.col("slot")),
              "source": F.lit("broker"), "ts_wall_us": wall, "ts_mono_us": mono, "clock_synced": synced,
              "kind": F.col("kind"),
              "peer_node": F.when(F.col("kind").startswith("peer"), b["node"])}
    return df.select(_record(fields, t).alias("e")).select("e.*")


def write_segments(df: DataFrame, out: str) -> None:
    """Write events as gzip JSON Lines under fleet=/date=/device= keys, files named *.jsonl.gz."""
    payload = df.select("fleet", "date", "device", F.to_json(F.struct(*V1.fieldNames())).alias("value"))
    (payload.write.mode("append").partitionBy("fleet", "date", "device")
     .option("compression", "gzip").text(out))
    for root, _dirs, files in os.walk(out):
        for name in files:
            if name.endswith(".txt.gz"):
                os.replace(os.path.join(root, name), os.path.join(root, name[:-len(".txt.gz")] + ".jsonl.gz"))
            elif name.endswith(".crc") or name == "_SUCCESS":
                os.remove(os.path.join(root, name))


def manifest(msgs: DataFrame, spec: FleetSpec) -> dict[str, object]:
    """The injected faults' exact counts and what the report must therefore say."""
    subs = 2
    row = msgs.agg(F.count(F.lit(1)).alias("messages"),
                   *[F.sum(F.col(k).cast("long")).alias(k) for k in RESIDUE]).first()
    assert row is not None
    c = {k: int(row[k] or 0) for k in ("messages", *RESIDUE)}
    pairs = c["messages"] * subs
    tail_pairs = spec.fleets * spec.devices * min(spec.pending_tail, spec.messages) * subs
    expected_fates = {"lost": c["loss"], "dropped": c["drop"], "expired": c["expire"],
                      "delivered_not_acked": c["unacked"], "pending": tail_pairs, "delivered": 0}
    expected_fates["acked"] = pairs - sum(expected_fates.values())
    return {
        "spec": asdict(spec), "messages": c["messages"], "pairs": pairs, "injected": c,
        "expected": {
            "fates": expected_fates, "duplicated": c["dup"], "late": c["reorder"],
            "inversions": c["reorder"] * REORDER_SPAN,
            "e2e": {"lost": c["loss"] if spec.client_logs else 0, "duplicated": c["dup"] if spec.client_logs else 0},
            "clock_stepped_boots": min(spec.clock_jump_devices, spec.fleets * spec.devices),
            "incidents": {"peer_down": min(spec.peer_outages, spec.fleets * spec.devices),
                          "node_stop": min(spec.node_restarts, spec.fleets * spec.devices)},
        },
    }


def generate(spark: SparkSession, spec: FleetSpec, out: str) -> dict[str, object]:
    """Write the synthetic fleet's segments under `out` and return (and store as _manifest.json) its manifest."""
    shutil.rmtree(out, ignore_errors=True)
    msgs = messages(spark, spec)
    write_segments(events(msgs, spec).unionByName(incident_events(spark, spec)), out)
    man = manifest(msgs, spec)
    Path(out, "_manifest.json").write_text(json.dumps(man, indent=2))
    return man


BAD_LINES = {
    "malformed JSON": lambda good: json.dumps(good)[:-7],
    "missing required field: ts_wall_us": lambda good: json.dumps({k: v for k, v in good.items() if k != "ts_wall_us"}),
    "unknown schema_version: 99": lambda good: json.dumps({**good, "schema_version": 99}),
    "bad type for field: ts_mono_us": lambda good: json.dumps({**good, "ts_mono_us": "soon"}),
    "unknown kind: teleported": lambda good: json.dumps({**good, "kind": "teleported"}),
    "fleet differs from upload path": lambda good: json.dumps({**good, "fleet": "elsewhere"}),
    "empty record": lambda good: "",
}


def inject_upload_faults(out: str, bad_per_reason: int = 2, reuploads: int = 1) -> dict[str, int]:
    """Add a segment of bad records (each reason `bad_per_reason` times) and re-upload copies of existing segments."""
    segs = sorted((str(p) for p in Path(out).rglob("*.jsonl.gz")), key=lambda p: (-os.path.getsize(p), p))
    with gzip.open(segs[0], "rt") as fh:
        good = json.loads(fh.readline())
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
        dst = src[:-len(".jsonl.gz")] + "-reupload.jsonl.gz"
        shutil.copyfile(src, dst)
        with gzip.open(dst, "rt") as fh:
            copied += sum(1 for _ in fh)
    return {"quarantined": counts, "duplicates": copied}
