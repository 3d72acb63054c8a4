"""The run-folder format: atomic writes, versioning, and status read from what is there."""

from __future__ import annotations

import json

import pytest

from latsim.errors import LatsimError
from latsim.run.folder import FORMAT_VERSION, INCOMPLETE, read_run_folder, write_json


def test_a_failed_atomic_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "summary.json"
    write_json(target, {"a": 1})
    with pytest.raises(TypeError):
        write_json(target, {"a": object()})  # not JSON: fails while writing the temporary
    blocker = tmp_path / "config.json"
    blocker.mkdir()  # renaming a file onto a folder fails after the temporary was written
    with pytest.raises(OSError):
        write_json(blocker, {"b": 2})
    assert json.loads(target.read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "summary.json"]


def _folder(tmp_path, config, summary=None):
    (tmp_path / "jobs.csv").write_text("policy,K,run\n")
    write_json(tmp_path / "config.json", config)
    if summary is not None:
        write_json(tmp_path / "summary.json", summary)
    return read_run_folder(tmp_path)


def test_status_is_derived_from_what_the_folder_holds(tmp_path):
    config = {"format_version": FORMAT_VERSION, "kind": "measured", "status": "running"}
    assert _folder(tmp_path, config).status == INCOMPLETE  # a killed writer
    done = {**config, "status": "complete"}
    assert _folder(tmp_path, done).status == INCOMPLETE  # no summary yet
    assert _folder(tmp_path, done, {"L50": 1.0}).complete


def test_a_newer_format_is_refused_with_one_line(tmp_path):
    with pytest.raises(LatsimError, match="newer than this latsim reads"):
        _folder(tmp_path, {"format_version": FORMAT_VERSION + 1, "kind": "measured"})
