"""Result files written whole or not at all (``headway._files``)."""

from __future__ import annotations

from pathlib import Path

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
