"""A contact sheet of a GUI trajectory: one PNG with every step's screenshot in a grid.

The header names the task, the instruction (wrapped), how the run ended, the verdict and
reward and the final answer; each cell shows a step's screenshot scaled to
``thumb_width`` with a caption (step index, the action in text form, the URL after it,
and the error in red when the action failed, the cell framed in red too). A step without
a screenshot (the final ``done``) or whose file is missing gets a grey placeholder that
says so.
"""

from __future__ import annotations

import os
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from orchard_env_client.trajectory import Trajectory, artifact_path

from .trajectory_view import action_text, instruction_of

__all__ = ["contact_sheet"]

_PAD = 8
_FONT_SIZE = 14
_LINE = 18
_CAPTION_LINES = 3
_BACKGROUND = (255, 255, 255)
_INK = (20, 20, 20)
_MUTED = (110, 110, 110)
_ERROR = (200, 0, 0)
_PLACEHOLDER = (225, 225, 225)

Font = ImageFont.FreeTypeFont | ImageFont.ImageFont


def _font(size: int) -> Font:
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError):  # Pillow without FreeType: the fixed bitmap font
        return ImageFont.load_default()


def _wrap(text: str, font: Font, width: int, max_lines: int) -> list[str]:
    """``text`` broken into lines of at most ``width`` pixels; the last kept line ends in
    an ellipsis when text was dropped."""
    lines: list[str] = []
    for paragraph in text.splitlines() or [""]:
        line = ""
        for word in paragraph.split(" "):
            candidate = f"{line} {word}" if line else word
            if font.getlength(candidate) <= width:
                line = candidate
                continue
            if line:
                lines.append(line)
            while font.getlength(word) > width:  # a word wider than the cell (a URL)
                cut = len(word)
                while cut > 1 and font.getlength(word[:cut]) > width:
                    cut -= 1
                lines.append(word[:cut])
                word = word[cut:]
            line = word
        lines.append(line)
    if len(lines) > max_lines:
        last = lines[max_lines - 1]
        while last and font.getlength(last + "\u2026") > width:
            last = last[:-1]
        lines = [*lines[: max_lines - 1], last + "\u2026"]
    return lines


def _thumb(path: Path, width: int, height: int) -> Image.Image:
    with Image.open(path) as image:
        rgb = image.convert("RGB")
    rgb.thumbnail((width, height))
    return rgb


def _placeholder(
    draw: ImageDraw.ImageDraw, box: tuple[int, int, int, int], text: str, font: Font
) -> None:
    draw.rectangle(box, fill=_PLACEHOLDER)
    x0, y0, x1, _ = box
    for i, line in enumerate(_wrap(text, font, x1 - x0 - 2 * _PAD, 4)):
        draw.text((x0 + _PAD, y0 + _PAD + i * _LINE), line, fill=_MUTED, font=font)


def contact_sheet(
    traj: Trajectory,
    jsonl_dir: str | os.PathLike[str],
    out_png: str | os.PathLike[str],
    *,
    columns: int = 4,
    thumb_width: int = 320,
) -> Path:
    """Draw the contact sheet of ``traj`` (screenshots under ``jsonl_dir``) to ``out_png``.

    Returns the path written. Every step gets a cell, in step order (see the module doc).
    """
    if columns < 1 or thumb_width < 32:
        raise ValueError("contact_sheet needs columns >= 1 and thumb_width >= 32")
    font = _font(_FONT_SIZE)
    title_font = _font(_FONT_SIZE + 4)
    cells = []
    aspect: float | None = None  # of the first screenshot found
    for step in traj.steps:
        artifact = step.artifacts.get("screenshot")
        path = artifact_path(jsonl_dir, artifact) if artifact is not None else None
        cells.append((step, path))
        if path is not None and path.is_file() and aspect is None:
            with Image.open(path) as image:
                aspect = image.height / max(1, image.width)
    thumb_height = max(1, round(thumb_width * (aspect or 9 / 16)))
    cell_width = thumb_width + _PAD
    cell_height = thumb_height + _CAPTION_LINES * _LINE + 2 * _PAD
    width = columns * cell_width + _PAD
    text_width = width - 2 * _PAD

    meta = traj.metadata
    reward = "-" if meta.reward is None else f"{meta.reward:g}"
    header: list[tuple[str, Font, tuple[int, int, int]]] = [
        (f"{meta.task_id}  (attempt {meta.attempt}, {meta.model or 'model ?'})", title_font, _INK)
    ]
    header += [
        (line, font, _INK) for line in _wrap(f"Task: {instruction_of(traj)}", font, text_width, 6)
    ]
    status = (
        f"verdict: {meta.verdict or '-'}   reward: {reward}   exit: {meta.exit_status or '-'}   "
        f"model calls: {meta.steps}   duration: {meta.duration_s:.1f} s"
    )
    header.append((status, font, _ERROR if meta.verdict == "failure" else _MUTED))
    if meta.final_output:
        header += [
            (line, font, _INK)
            for line in _wrap(f"Answer: {meta.final_output}", font, text_width, 3)
        ]
    if meta.error:
        header += [
            (line, font, _ERROR) for line in _wrap(f"Error: {meta.error}", font, text_width, 2)
        ]
    header_height = _PAD + len(header) * (_LINE + 2) + 4 + _PAD

    rows = max(1, -(-len(cells) // columns))
    sheet = Image.new("RGB", (width, header_height + rows * cell_height), _BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    y = _PAD
    for line, line_font, colour in header:
        draw.text((_PAD, y), line, fill=colour, font=line_font)
        y += _LINE + 2 + (4 if line_font is title_font else 0)

    for n, (step, path) in enumerate(cells):
        x0 = _PAD + (n % columns) * cell_width
        y0 = header_height + (n // columns) * cell_height
        box = (x0, y0, x0 + thumb_width - 1, y0 + thumb_height - 1)
        if path is None:
            _placeholder(draw, box, "no screenshot", font)
        elif not path.is_file():
            _placeholder(draw, box, f"missing: {path.name}", font)
        else:
            thumb = _thumb(path, thumb_width, thumb_height)
            sheet.paste(thumb, (x0, y0))
        draw.rectangle(box, outline=_ERROR if step.error else _MUTED, width=3 if step.error else 1)
        caption = f"#{step.index} {action_text(step.action)}"
        lines = [(line, _INK) for line in _wrap(caption, font, thumb_width, 2)]
        if step.error:
            lines.append((f"ERROR: {' '.join(step.error.split())}", _ERROR))
        elif url := step.observation.get("url"):
            lines.append((str(url), _MUTED))
        for i, (line, colour) in enumerate(lines[:_CAPTION_LINES]):
            if font.getlength(line) > thumb_width:
                line = _wrap(line, font, thumb_width, 1)[0]
            draw.text((x0, y0 + thumb_height + 4 + i * _LINE), line, fill=colour, font=font)

    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(out, format="PNG")
    return out
