#!/usr/bin/env python3
"""Write the debugfs commands that turn the cached base ext4 into the final root: the tree lists' difference."""

from __future__ import annotations

import sys
from pathlib import Path

DIR, REG, LNK = "40000", "100000", "120000"


class DeltaError(Exception):
    """The final tree differs from the base in a way the delta cannot express (a removal, a changed file type)."""


def read_list(path: Path) -> dict[str, tuple[str, str, str, str, str]]:
    """treehash.py's list: path -> (kind, mode, uid:gid, mtime, detail)."""
    entries = {}
    for line in path.read_text(encoding="utf-8", errors="surrogateescape").splitlines():
        rel, _, desc = line.partition("\t")
        kind, mode, owner, mtime, detail = desc.split(" ", 4)
        entries[rel] = (kind, mode, owner, mtime, detail)
    return entries


def quoted(rel: str) -> str:
    """A path in the file system, quoted for debugfs (which has no escape for quotes or backslashes)."""
    if '"' in rel or "\\" in rel or "\n" in rel:
        raise DeltaError(f"debugfs cannot name {rel!r}")
    return '"/' + ("" if rel == "." else rel) + '"'


def commands(base: Path, final: Path, root: Path, epoch: int) -> list[str]:
    """debugfs commands: create what is new, rewrite changed files, set every touched inode's attributes."""
    old, new = read_list(base), read_list(final)
    removed = sorted(set(old) - set(new))
    if removed:
        raise DeltaError(f"{len(removed)} base entries are gone from the final tree, e.g. {removed[:3]}")
    out: list[str] = []
    for rel in sorted(new):  # parents sort before their children
        entry = new[rel]
        if old.get(rel) == entry:
            continue
        kind, mode, owner, mtime, detail = entry
        if rel in old and old[rel][0] != kind:
            raise DeltaError(f"{rel} changed type ({old[rel][0]} -> {kind})")
        name = quoted(rel)
        content_changed = rel not in old or old[rel][4] != detail
        if kind == DIR:
            if rel not in old:
                out.append(f"mkdir {name}")
        elif kind in (REG, LNK):
            if content_changed:
                if rel in old:
                    out.append(f"rm {name}")
                if kind == REG:
                    out.append(f'write "{root / rel}" {name}')
                else:
                    out.append(f'symlink {name} "{detail}"')
        else:
            raise DeltaError(f"{rel}: only directories, files and symlinks can be added (type {kind})")
        uid, gid = owner.split(":")
        times = mtime or str(epoch)  # the list has no mtime for a symlink
        out += [f"sif {name} mode 0{int(kind, 8) | int(mode, 8):o}", f"sif {name} uid {uid}", f"sif {name} gid {gid}",
                f"sif {name} mtime @{times}", f"sif {name} ctime @{epoch}", f"sif {name} atime @{epoch}"]
    return out


def main(argv: list[str]) -> int:
    """ext4delta.py BASE_LIST FINAL_LIST ROOT EPOCH > cmds: the changes as debugfs -w -f input."""
    if len(argv) != 5:
        print("usage: ext4delta.py BASE_LIST FINAL_LIST ROOT EPOCH", file=sys.stderr)
        return 2
    try:
        lines = commands(Path(argv[1]), Path(argv[2]), Path(argv[3]), int(argv[4]))
    except DeltaError as exc:
        print(f"ext4delta: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write("".join(line + "\n" for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
