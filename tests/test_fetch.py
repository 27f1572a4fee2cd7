"""``python -m labkit notebooks DIR`` after an upgrade: the fetch's manifest tells a file the
learner never edited (brought up to the package's copy) from one they did (kept), on a fake
package folder so no lesson runs."""

from __future__ import annotations

import json

import pytest

import labkit.classroom.fetch as fetch_module
from labkit.classroom.fetch import MANIFEST, fetch, report


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package's materials folder whose files the test rewrites to play an upgrade."""
    folder = tmp_path / "package"
    (folder / "quizzes").mkdir(parents=True)
    (folder / "solutions").mkdir()
    (folder / "00_lesson.ipynb").write_text("lesson 0, version 1")
    (folder / "01_lesson.ipynb").write_text("lesson 1, version 1")
    (folder / "quizzes" / "00_lesson.json").write_text("quiz, version 1")
    (folder / "solutions" / "00_lesson.json").write_text("answers")

    def materials():
        return sorted((p.relative_to(folder).as_posix(), p) for p in folder.rglob("*")
                      if p.is_file())

    monkeypatch.setattr(fetch_module, "material_files", materials)
    monkeypatch.setattr(fetch_module, "learners_notebooks", lambda: folder)
    return folder


def test_the_first_fetch_records_what_it_copied(package, tmp_path):
    lessons = tmp_path / "lessons"
    result = fetch(lessons)
    assert sorted(p.relative_to(lessons).as_posix() for p in result.written) == \
        ["00_lesson.ipynb", "01_lesson.ipynb", "quizzes/00_lesson.json"]
    manifest = json.loads((lessons / MANIFEST).read_text())
    assert manifest["labkit"] == fetch_module.__version__
    assert sorted(manifest["files"]) == ["00_lesson.ipynb", "01_lesson.ipynb",
                                         "quizzes/00_lesson.json"]
    assert [p.name for p in lessons.iterdir() if p.name.startswith(MANIFEST + ".")] == []
    again = fetch(lessons)
    assert len(again.unchanged) == 3 and not (again.written or again.updated or again.kept)


def test_an_unedited_notebook_is_updated_and_an_edited_one_kept(package, tmp_path):
    lessons = tmp_path / "lessons"
    fetch(lessons)
    (lessons / "01_lesson.ipynb").write_text("lesson 1, with my answers")
    for name in ("00_lesson.ipynb", "01_lesson.ipynb", "quizzes/00_lesson.json"):
        (package / name).write_text((package / name).read_text().replace("1", "2"))

    result = fetch(lessons)
    assert result.updated == [lessons / "00_lesson.ipynb", lessons / "quizzes/00_lesson.json"]
    assert result.kept == [lessons / "01_lesson.ipynb"]
    assert (lessons / "00_lesson.ipynb").read_text() == "lesson 0, version 2"
    assert (lessons / "01_lesson.ipynb").read_text() == "lesson 1, with my answers"
    lines = report(result)
    assert f"updated {lessons / '00_lesson.ipynb'} to the suite's copy (you had not edited " \
        "it)" in lines
    assert any(line.startswith(f"kept {lessons / '01_lesson.ipynb'}: ") and "--force" in line
               for line in lines)
    assert "2 file(s) written to" in lines[-2] and "(2 updated)" in lines[-2]

    # the next upgrade: the edited file is still the learner's, whatever the package holds
    (package / "01_lesson.ipynb").write_text("lesson 1, version 3")
    assert fetch(lessons).kept == [lessons / "01_lesson.ipynb"]
    assert (lessons / "01_lesson.ipynb").read_text() == "lesson 1, with my answers"


def test_force_overwrites_an_edited_notebook(package, tmp_path):
    lessons = tmp_path / "lessons"
    fetch(lessons)
    (lessons / "00_lesson.ipynb").write_text("my edits")
    result = fetch(lessons, force=True)
    assert result.replaced == [lessons / "00_lesson.ipynb"]
    assert (lessons / "00_lesson.ipynb").read_text() == "lesson 0, version 1"
    # recorded as copied: the next upgrade updates it
    (package / "00_lesson.ipynb").write_text("lesson 0, version 2")
    assert fetch(lessons).updated == [lessons / "00_lesson.ipynb"]


def test_a_file_the_manifest_does_not_name_is_kept(package, tmp_path):
    lessons = tmp_path / "lessons"
    lessons.mkdir()
    (lessons / "00_lesson.ipynb").write_text("lesson 0, an older copy")  # no manifest yet
    result = fetch(lessons)
    assert result.kept == [lessons / "00_lesson.ipynb"] and not result.manifest_problem
    assert (lessons / "00_lesson.ipynb").read_text() == "lesson 0, an older copy"
    assert "00_lesson.ipynb" not in json.loads((lessons / MANIFEST).read_text())["files"]


@pytest.mark.parametrize("manifest", ["{not json", '{"files": ["00_lesson.ipynb"]}',
                                      '{"labkit": "0.2.0"}', b"\xff\xfe"])
def test_a_corrupt_manifest_keeps_every_differing_file(package, tmp_path, manifest):
    lessons = tmp_path / "lessons"
    fetch(lessons)
    (lessons / "01_lesson.ipynb").write_text("lesson 1, with my answers")
    (package / "00_lesson.ipynb").write_text("lesson 0, version 2")
    path = lessons / MANIFEST
    path.write_bytes(manifest if isinstance(manifest, bytes) else manifest.encode())

    result = fetch(lessons)
    assert result.manifest_problem.startswith(str(path))
    assert result.kept == [lessons / "00_lesson.ipynb", lessons / "01_lesson.ipynb"]
    assert (lessons / "00_lesson.ipynb").read_text() == "lesson 0, version 1"
    assert (lessons / "01_lesson.ipynb").read_text() == "lesson 1, with my answers"
    assert report(result)[0].startswith("cannot read the record of what was copied here")
    # a fresh manifest names only what this fetch knows it copied
    assert sorted(json.loads(path.read_text())["files"]) == ["quizzes/00_lesson.json"]


def test_the_manifest_is_written_whole_or_not_at_all(package, tmp_path, monkeypatch):
    lessons = tmp_path / "lessons"
    fetch(lessons)
    before = (lessons / MANIFEST).read_bytes()
    (package / "00_lesson.ipynb").write_text("lesson 0, version 2")

    def interrupted(source, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fetch_module.os, "replace", interrupted)
    with pytest.raises(fetch_module.FetchError, match="No space left on device"):
        fetch(lessons)
    assert (lessons / MANIFEST).read_bytes() == before
    assert sorted(p.name for p in lessons.iterdir() if p.name.startswith(".")) == [MANIFEST]
