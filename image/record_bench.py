#!/usr/bin/env python3
"""Append the image figures (size, cold/cached build times, boot-to-ready) to bench/RESULTS.md as one section."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def stage_times(out: Path) -> dict[str, float]:
    """Stage name -> seconds from a build's timings.tsv."""
    rows = (line.split("\t") for line in (out / "timings.tsv").read_text().splitlines() if line.strip())
    return {row[0]: float(row[1]) for row in rows}


def describe(label: str, out: Path) -> str:
    """One table row for a build directory."""
    times = stage_times(out)
    cells = " | ".join(f"{times.get(s, 0.0):.0f}" for s in ("rootfs", "wheels", "appliance", "configure", "disk"))
    return f"| {label} | {cells} | **{sum(times.values()):.0f}** |"


def main() -> int:
    """record_bench.py --cold OUT1 --cached OUT2 [--boot OUT/boot-timing.json]."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cold", type=Path, required=True, help="out dir of a build that made the rootfs")
    p.add_argument("--cached", type=Path, required=True, help="out dir of a rebuild after an appliance code change")
    p.add_argument("--boot", type=Path, help="boot-timing.json written by tests/image/test_image_boot.py")
    p.add_argument("--note", default="", help="extra sentence (machine load, ...)")
    args = p.parse_args()
    info = json.loads((args.cached / "build-info.json").read_text())
    xz_mib = (info["xz_bytes"] or 0) / 2**20
    load = os.getloadavg()[0]
    lines = [
        "", f"## SD-card image (image/build.sh, tests/image), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
        f"Debian bookworm arm64, built under qemu-user on a shared 2-core x86_64 machine (load average {load:.0f} "
        f"when recorded). {args.note}".rstrip(), "",
        "| build | rootfs s | wheels s | appliance s | configure s | disk (incl. xz) s | total s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        describe("cold (empty image/cache)", args.cold),
        describe("cached rebuild after an appliance code change", args.cached),
        "",
        f"Compressed image: **{xz_mib:.0f} MiB** (`appliance-arm64.img.xz`, target <= 400 MB); raw "
        f"{info['raw_mib']} MiB, root file system {info['root_used_mib']} MiB of files. "
        "Cached rebuild target <= 180 s.",
    ]
    if args.boot:
        boot = json.loads(args.boot.read_text())
        lines += ["", f"Boot under `qemu-system-aarch64 -M virt -cpu cortex-a72 -m 1024` (TCG, {boot['kernel']}, "
                  "first boot: grow root, apply provisioning bundle): "
                  f"`appliance.service` READY **{boot['ready_s']} s** "
                  f"after power-on; first QoS1 publish/subscribe round trip through hostfwd at "
                  f"{boot['first_round_trip_s']} s."]
    with (REPO / "bench" / "RESULTS.md").open("a") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
