#!/usr/bin/env python3
"""Write the image figures (stage times with machine load, size, boot-to-ready) as bench/RESULTS.md's image section."""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "RESULTS.md"
HEADING = "## SD-card image"
STAGES = ("rootfs", "wheels", "appliance", "base", "configure", "disk")


def stage_rows(out: Path) -> list[list[str]]:
    """timings.tsv rows: stage, seconds, note, load average when the stage ended."""
    return [line.split("\t") for line in (out / "timings.tsv").read_text().splitlines() if line.strip()]


def describe(label: str, out: Path) -> str:
    """One table row for a build directory: seconds per stage, total, the 1-minute load average during it."""
    rows = stage_rows(out)
    times = {row[0]: float(row[1]) for row in rows}
    loads = [float(row[3]) for row in rows if len(row) > 3 and row[3]]
    cells = " | ".join(f"{times[s]:.0f}" if s in times else "-" for s in STAGES)
    load = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "?"
    return f"| {label} | {cells} | **{sum(times.values()):.0f}** | {load} |"


def section(builds: list[tuple[str, Path]], boot: Path | None, note: str) -> str:
    """The markdown section."""
    info = json.loads((builds[-1][1] / "build-info.json").read_text())
    xz_mib = (info["xz_bytes"] or 0) / 2**20
    lines = [
        f"{HEADING} (image/build.sh, tests/image), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
        "Debian bookworm arm64, built under qemu-user on a shared 2-core x86_64 machine; the last column is the "
        "1-minute load average at the end of each stage (other jobs share the two cores).", "",
        "| build | rootfs s | wheels s | appliance s | base s | configure s | disk (incl. xz) s | total s | load |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *(describe(label, out) for label, out in builds),
        "",
        f"Compressed image: **{xz_mib:.0f} MiB** (`appliance-arm64.img.xz`, xz -{info.get('xz_level', '?')}, "
        f"target <= 400 MB); raw {info['raw_mib']} MiB, root file system {info['root_used_mib']} MiB of files "
        "(before the appliance). Cached rebuild target <= 180 s.",
    ]
    if note:
        lines += ["", note]
    if boot:
        data = json.loads(boot.read_text())
        lines += ["", f"Boot under `qemu-system-aarch64 -M virt -cpu cortex-a72 -m 1024` (TCG, {data['kernel']}, "
                  "first boot: grow root, apply provisioning bundle): broker ready (first CONNACK through hostfwd) "
                  f"**{data['ready_s']} s** after power-on; first QoS1 publish/subscribe round trip at "
                  f"{data['first_round_trip_s']} s."]
    return "\n".join(lines) + "\n"


def replace_section(text: str, new: str) -> str:
    """RESULTS.md with its image section replaced (or appended when there is none); other sections untouched."""
    match = re.search(rf"^{re.escape(HEADING)}.*?(?=^## |\Z)", text, flags=re.S | re.M)
    if not match:
        return text.rstrip("\n") + "\n\n" + new
    return text[:match.start()] + new + ("\n" if match.end() < len(text) else "") + text[match.end():]


def main() -> int:
    """record_bench.py --build LABEL=OUT [--build ...] [--boot boot-timing.json] [--note TEXT]."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--build", action="append", required=True, metavar="LABEL=OUT",
                   help="a table row: label and the build's out directory (timings.tsv, build-info.json)")
    p.add_argument("--boot", type=Path, help="boot-timing.json written by tests/image/test_image_boot.py")
    p.add_argument("--note", default="", help="a paragraph under the table (cold build figures, method, ...)")
    args = p.parse_args()
    builds = [(label, Path(out)) for label, _, out in (b.partition("=") for b in args.build)]
    new = section(builds, args.boot, args.note)
    RESULTS.write_text(replace_section(RESULTS.read_text(), new))
    print(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
