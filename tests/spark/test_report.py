"""The HTML report renders, and its PNG plots have real content."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from cloud_spark import report

pytestmark = pytest.mark.spark


def test_report_html_and_pngs_render(spark: Any, generated: dict[str, Any], tmp_path: Path) -> None:
    index = report.render(spark, generated["out"], str(tmp_path / "report"))
    page = index.read_text()
    summary = generated["summary"]
    assert f"{summary['pairs']} (message, subscriber) pairs; {summary['fates']['lost']} lost" in page
    for name in report.PLOTS:
        assert f'src="{name}"' in page
        with Image.open(index.parent / name) as img:
            pixels = np.asarray(img.convert("RGB"), dtype=np.int32)
        assert pixels.shape[0] > 200 and pixels.shape[1] > 400, name
        colours = np.unique(pixels.reshape(-1, 3), axis=0)
        assert len(colours) > 20, f"{name} is (nearly) uniform"
        assert (pixels != 255).any(axis=2).mean() > 0.02, f"{name} is blank"
