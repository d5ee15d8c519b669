"""The code base stays ruff- and mypy-clean, and the layering rules of the design card hold."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_ruff_is_clean() -> None:
    proc = subprocess.run([str(BIN / "ruff"), "check", "."], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]


def test_mypy_is_clean() -> None:
    proc = subprocess.run([str(BIN / "mypy")], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]


def _imports(package: Path) -> set[tuple[str, str]]:
    """(module file, imported appliance/cloud_spark module) for every import under `package`."""
    found = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add((str(path.relative_to(REPO)), node.module))
            elif isinstance(node, ast.Import):
                found.update((str(path.relative_to(REPO)), alias.name) for alias in node.names)
    return found


def test_imports_point_one_way() -> None:
    """protocol <- broker <- adapters (never each other) <- server/cli; cloud_spark never imports appliance."""
    allowed = {
        "appliance/protocol": ("appliance.protocol",),
        "appliance/broker": ("appliance.protocol", "appliance.broker"),
        "appliance/store": ("appliance.protocol", "appliance.broker", "appliance.store"),
        "appliance/cluster": ("appliance.protocol", "appliance.broker", "appliance.cluster"),
        "appliance/deliverylog": ("appliance.protocol", "appliance.broker", "appliance.deliverylog"),
    }
    bad = []
    for folder, ok in allowed.items():
        for path, module in _imports(REPO / folder):
            if module.startswith("appliance") and module != "appliance" and not module.startswith(ok):
                bad.append(f"{path} imports {module}")
    for path, module in _imports(REPO / "cloud_spark"):
        if module.split(".")[0] == "appliance":
            bad.append(f"{path} imports {module}")
    assert not bad, "\n".join(sorted(bad))


def test_protocol_uses_only_the_standard_library() -> None:
    stdlib = set(sys.stdlib_module_names)
    bad = [f"{p} imports {m}" for p, m in _imports(REPO / "appliance/protocol")
           if m.split(".")[0] not in stdlib and not m.startswith("appliance.protocol") and m != "__future__"]
    assert not bad, "\n".join(bad)
