"""The leaf I/O helpers: files.replacing / write_text_atomic (a destination is replaced whole or not at all) and
jsonl's whole-file reader and writer."""

import json

import pytest

from dcoco.files import replacing, write_text_atomic
from dcoco.jsonl import BadLine, read_lines, read_records, write_records


def test_a_write_replaces_the_file_whole_or_not_at_all(tmp_path):
    path = tmp_path / "run.json"
    write_text_atomic(path, "old")
    with pytest.raises(RuntimeError):
        with replacing(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["run.json"]
    write_text_atomic(path, "new")
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_a_folder_another_process_finished_first_is_kept(tmp_path):
    path = tmp_path / "cache"
    with replacing(path) as tmp:
        tmp.mkdir()
        (tmp / "a").write_text("first")
    with replacing(path, keep_existing=True) as tmp:
        tmp.mkdir()
        (tmp / "a").write_text("second")
    assert (path / "a").read_text() == "first" and [p.name for p in tmp_path.iterdir()] == ["cache"]


def test_jsonl_written_whole_reads_back(tmp_path):
    recs = [{"turns": ["a\u2028b"]}, {"n": 2}]
    write_records(tmp_path / "s.jsonl", recs)
    assert read_records(tmp_path / "s.jsonl") == recs
    assert list(read_lines(json.dumps({"t": "x\u2028y"}, ensure_ascii=False) + "\n\n[1]\n")) == \
        [(1, {"t": "x\u2028y"}), (3, [1])]
    with pytest.raises(BadLine, match="Unterminated string") as e:
        list(read_lines('{"a": 1}\n{"cut'))
    assert e.value.line == 2
