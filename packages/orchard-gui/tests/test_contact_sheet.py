"""Contact sheets: the grid's size, the thumbnails' content, placeholders and captions."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from PIL import Image

from orchard_gui.contact_sheet import contact_sheet

sys.path.insert(0, str(Path(__file__).parent))
from gui_runs import VIEWPORT, make_trajectory

pytestmark = pytest.mark.fast


def test_grid_dimensions_and_thumbnails(tmp_path: Path) -> None:
    traj = make_trajectory(tmp_path, errors={2: "element not found"}, reward=0.0)
    out = contact_sheet(traj, tmp_path, tmp_path / "sheets" / "a.png", columns=4, thumb_width=160)
    assert out == tmp_path / "sheets" / "a.png"
    with Image.open(out) as sheet:
        width, height = sheet.size
        rgb = sheet.convert("RGB")
    # 6 cells (steps 0-4 with screenshots, the done step without) in 4 columns: 2 rows
    thumb_height = round(160 * VIEWPORT[1] / VIEWPORT[0])
    assert width == 4 * (160 + 8) + 8
    cell_height = thumb_height + 3 * 18 + 16
    header = height - 2 * cell_height
    assert 60 < header < 250
    # a thumbnail holds its screenshot's colour (step 1: (40, 200, 120)) in its middle
    r, g, b = rgb.getpixel((8 + 168 + 80, header + thumb_height // 2))  # type: ignore[misc]
    assert abs(r - 40) < 8 and abs(g - 200) < 8 and abs(b - 120) < 8
    # the failed step's frame is red
    assert rgb.getpixel((8 + 2 * 168, header + 5)) == (200, 0, 0)
    # the done step (second row, second cell) is a grey placeholder
    assert rgb.getpixel((8 + 168 + 80, header + cell_height + thumb_height // 2)) == (225, 225, 225)


def test_more_columns_and_missing_files(tmp_path: Path) -> None:
    traj = make_trajectory(
        tmp_path,
        instruction="A very long instruction " * 30,
        answer="x" * 500,
    )
    (tmp_path / traj.steps[1].artifacts["screenshot"].path).unlink()
    out = contact_sheet(traj, tmp_path, tmp_path / "b.png", columns=8, thumb_width=100)
    with Image.open(out) as sheet:
        assert sheet.width == 8 * 108 + 8
        thumb_height = round(100 * VIEWPORT[1] / VIEWPORT[0])
        header = sheet.height - (thumb_height + 3 * 18 + 16)
        # the instruction wraps to several lines but is capped, and so is the answer
        assert 150 < header < 400
        rgb = sheet.convert("RGB")
        assert rgb.getpixel((8 + 108 + 50, header + thumb_height // 2)) == (225, 225, 225)


def test_bad_arguments(tmp_path: Path) -> None:
    traj = make_trajectory(tmp_path)
    with pytest.raises(ValueError):
        contact_sheet(traj, tmp_path, tmp_path / "c.png", columns=0)
