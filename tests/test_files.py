"""Result files written whole or not at all (``headway._files``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from headway._files import replacing, staged_dir, write_atomic


def test_a_file_interrupted_while_written_keeps_its_earlier_content(tmp_path: Path) -> None:
    path = write_atomic(tmp_path / "result.json", '{"good": true}\n')
    with pytest.raises(KeyboardInterrupt), replacing(path) as fh:
        fh.write('{"partial": ')
        raise KeyboardInterrupt
    assert path.read_text() == '{"good": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]  # no temporary file left


def test_a_staged_folder_moves_its_files_in_only_when_the_block_ends_well(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with staged_dir(out) as stage:
        (stage / "a.csv").write_text("new a\n")
    assert (out / "a.csv").read_text() == "new a\n"
    with pytest.raises(KeyboardInterrupt), staged_dir(out) as stage:
        (stage / "a.csv").write_text("newer a\n")
        (stage / "b.csv").write_text("half of b")
        raise KeyboardInterrupt
    assert sorted(p.name for p in out.iterdir()) == ["a.csv"] and (out / "a.csv").read_text() == "new a\n"


def test_a_figure_interrupted_while_written_keeps_the_earlier_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # matplotlib writes a PNG through Pillow: a Ctrl-C after Pillow's first bytes left a cut-off PNG
    # behind when a figure was saved straight into its path
    from matplotlib.figure import Figure
    from PIL import Image

    from headway._files import save_figure

    fig = Figure(figsize=(2, 2))
    fig.subplots().plot([0, 1], [1, 0])
    path = save_figure(fig, tmp_path / "curves.png", dpi=50)
    before = path.read_bytes()
    assert before.startswith(b"\x89PNG\r\n\x1a\n") and len(before) > 100

    def cut_short(self: Image.Image, fp: Any, *args: object, **kwargs: object) -> None:
        if isinstance(fp, str | os.PathLike):  # (a path where a figure is saved straight into it)
            with open(fp, "wb") as fh:
                fh.write(b"\x89PNG\r\n\x1a\n")
        else:
            fp.write(b"\x89PNG\r\n\x1a\n")
        raise KeyboardInterrupt

    monkeypatch.setattr(Image.Image, "save", cut_short)
    with pytest.raises(KeyboardInterrupt):
        save_figure(fig, path, dpi=80)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.png"]  # no temporary file left


def test_a_figure_takes_its_format_from_the_suffix_or_says_it_has_none(tmp_path: Path) -> None:
    from matplotlib.figure import Figure

    from headway._files import save_figure

    fig = Figure(figsize=(2, 2))
    assert save_figure(fig, tmp_path / "f.svg").read_text().lstrip().startswith("<?xml")
    assert save_figure(fig, tmp_path / "f", format="pdf").read_bytes().startswith(b"%PDF")
    with pytest.raises(ValueError, match="no suffix"):
        save_figure(fig, tmp_path / "g")
    assert not (tmp_path / "g").exists()


def test_figures_are_saved_through_the_helper() -> None:
    # a figure saved straight into its path (fig.savefig(path)) is cut off by an interrupt
    import re

    root = Path(__file__).resolve().parents[1]
    allowed = {root / "src/headway/_files.py", root / "src/headway/metrics/_plots.py"}  # into memory only
    direct = [
        f"{path.relative_to(root)}:{n}"
        for folder in ("src", "benchmarks", "scripts")
        for path in sorted((root / folder).rglob("*.py"))
        if path not in allowed
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"\.savefig\(", line)
    ]
    assert direct == [], "save figures with headway._files.save_figure"


def test_the_data_reaches_the_disk_before_the_rename_and_the_rename_before_the_return(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a rename over a file whose data is still in the page cache can leave an empty file after a power
    # loss: the temporary file is synced first, then its folder, after the rename
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append("folder" if os.path.isdir(f"/proc/self/fd/{fd}") else "file")
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        calls.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_atomic(tmp_path / "state.json", "{}\n")
    assert calls == ["file", "rename", "folder"]
    assert (tmp_path / "state.json").read_text() == "{}\n"
