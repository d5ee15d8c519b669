"""Command line: generate | ingest | analyze | report | run. Bad arguments exit non-zero with a message."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from cloud_spark.fate import DEFAULT_GRACE_US


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m cloud_spark", description="Fleet delivery analytics on Spark.")
    p.add_argument("--master", help="Spark master (default local[*]; ignored under spark-submit unless given)")
    p.add_argument("--driver-memory", default=None, help="driver memory in local mode, e.g. 4g")
    p.add_argument("--shuffle-partitions", type=int, default=None)
    sub = p.add_subparsers(dest="job", required=True)

    g = sub.add_parser("generate", help="write a synthetic fleet's delivery logs with injected faults")
    g.add_argument("out")
    g.add_argument("--events", type=int, help="approximate number of events (sets messages per device)")
    g.add_argument("--fleets", type=int, default=1)
    g.add_argument("--devices", type=int, default=4, help="devices per fleet")
    g.add_argument("--messages", type=int, default=1000, help="messages per device")
    g.add_argument("--seed", type=int, default=7)
    g.add_argument("--bad-records", type=int, default=0, help="bad records per quarantine reason to add")
    g.add_argument("--reuploads", type=int, default=0, help="segments to upload twice")
    g.add_argument("--format", choices=("parquet", "jsonl"), default="parquet",
                   help="segment format: Parquet (default, as the appliance closes segments) or gzip JSON Lines")

    for name, text in (("ingest", "segments -> events + quarantine"), ("run", "ingest, analyze and report")):
        s = sub.add_parser(name, help=text)
        s.add_argument("src", help="root of the uploaded segments (local dir or object-store URL)")
        s.add_argument("out", help="output root for the tables")
        s.add_argument("--fleet", action="append", help="only this fleet (repeatable)")
        s.add_argument("--date", action="append", help="only this date YYYY-MM-DD (repeatable)")
        s.add_argument("--parquet", action="store_true",
                       help="accepted for old command lines: *.parquet and *.jsonl.gz are always both read")
    for s in (sub.choices["run"], sub.add_parser("analyze", help="events -> tables + summary.json")):
        if s.prog.endswith("analyze"):
            s.add_argument("out")
        s.add_argument("--window-end-us", type=int, default=None, help="analysis window end (default: last event)")
        s.add_argument("--grace-s", type=float, default=DEFAULT_GRACE_US / 1e6,
                       help="outcomes younger than this at the window end are 'pending'")
    for s in (sub.choices["run"], sub.add_parser("report", help="tables -> HTML report with PNG plots")):
        if s.prog.endswith("report"):
            s.add_argument("out")
        s.add_argument("--report-dir", default=None, help="local directory for the report (default OUT/report)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, start Spark, run the job; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.job == "generate":
        return _generate(args)
    from cloud_spark import jobs, report
    from cloud_spark.session import get_spark

    spark = get_spark(f"cloud_spark-{args.job}", args.master, args.driver_memory, args.shuffle_partitions)
    try:
        result: object
        if args.job == "ingest":
            result = jobs.ingest_job(spark, args.src, args.out, args.fleet, args.date)
        elif args.job == "analyze":
            result = jobs.analyze_job(spark, args.out, args.window_end_us, int(args.grace_s * 1e6))
        elif args.job == "report":
            result = str(report.render(spark, args.out, args.report_dir or f"{args.out}/report"))
        else:
            stats = jobs.ingest_job(spark, args.src, args.out, args.fleet, args.date)
            result = jobs.analyze_job(spark, args.out, args.window_end_us, int(args.grace_s * 1e6), stats)
            with jobs.step("report"):
                report.render(spark, args.out, args.report_dir or f"{args.out}/report")
        print(json.dumps(result, indent=2, default=str))
        return 0
    except Exception as exc:  # one place turns failures into a message and a non-zero exit
        print(f"cloud_spark {args.job}: error: {exc}", file=sys.stderr)
        return 1
    finally:
        spark.stop()


def _generate(args: argparse.Namespace) -> int:
    """The generator needs no Spark: numpy and Arrow, one process per core."""
    from cloud_spark.generator import FleetSpec, generate, inject_upload_faults

    spec = (FleetSpec.for_events(args.events, fleets=args.fleets, devices=args.devices, seed=args.seed)
            if args.events else FleetSpec(fleets=args.fleets, devices=args.devices, messages=args.messages,
                                          seed=args.seed))

    def progress(done: int, total: int) -> None:
        print(f"\r[cloud_spark] generate: {done}/{total} devices", end="" if done < total else "\n",
              file=sys.stderr, flush=True)

    try:
        result = generate(spec, args.out, progress=progress, fmt=args.format)
        if args.bad_records or args.reuploads:
            result = {**result, "upload_faults": inject_upload_faults(args.out, args.bad_records, args.reuploads)}
    except (OSError, ValueError) as exc:
        print(f"cloud_spark generate: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2, default=str))
    return 0
