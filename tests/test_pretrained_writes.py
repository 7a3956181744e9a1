"""Where a streamed conversion writes: an output folder it cannot write to is refused before
any block is read (issue 48: a raw OSError naming the temporary file, after the work)."""

import os
import stat

import pytest

import sixbit
from sixbit import io, streaming
from fixtures.tiny_models import build_tiny


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("source") / "model"
    build_tiny("wan").model.save_pretrained(folder, max_shard_size="8KB")
    return folder


def _no_block_read(monkeypatch):
    def load(self, keys):
        raise AssertionError("the output should have been refused before any block is read")

    monkeypatch.setattr(streaming._Streamed, "load", load)


def _deny_creating_files_in(monkeypatch, locked):
    """What the kernel answers for a folder without write permission, for a user root is not:
    creating a file in it (named or nameless, O_TMPFILE) fails with EACCES."""
    real_open, creating = os.open, os.O_CREAT | getattr(os, "O_TMPFILE", 0)

    def open_(path, flags, *args, **kwargs):
        inside = os.path.abspath(path) == str(locked) or os.path.dirname(os.path.abspath(path)) == str(locked)
        if inside and flags & creating:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)


@pytest.mark.parametrize("sub", ["", "new/"])
def test_an_unwritable_output_folder_is_refused_before_any_block_is_read(sub, model_folder, tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    _no_block_read(monkeypatch)
    _deny_creating_files_in(monkeypatch, locked)
    out = locked / sub / "q.safetensors"
    with pytest.raises(ValueError) as info:
        sixbit.convert_pretrained(model_folder, "w8a8", out, progress=False)
    message = str(info.value)
    assert message == (f"cannot write {str(out)!r}: no file can be created in the folder {str(locked)!r} "
                       "(Permission denied); write to a folder you can write to, or make this one writable")
    assert os.listdir(locked) == []


def test_a_read_only_folder_is_refused_for_real(model_folder, tmp_path, monkeypatch):
    """The same with real permissions (skipped where they do not bind, e.g. as root)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        try:
            (locked / "probe").touch()
        except PermissionError:
            pass
        else:
            pytest.skip("this user can write to a read-only folder (root)")
        _no_block_read(monkeypatch)
        with pytest.raises(ValueError, match=f"no file can be created in the folder {str(locked)!r}"):
            sixbit.convert_pretrained(model_folder, "w8a8", locked / "q.safetensors", progress=False)
        assert os.listdir(locked) == []
    finally:
        locked.chmod(stat.S_IRWXU)


def test_the_writer_itself_refuses_an_unwritable_folder_in_one_line(tmp_path, monkeypatch):
    """sixbit.save and every other writer: a ValueError naming the folder, not an OSError naming a temporary file."""
    locked = tmp_path / "locked"
    locked.mkdir()
    _deny_creating_files_in(monkeypatch, locked)
    with pytest.raises(ValueError, match=f"no file can be created in the folder {str(locked)!r}"):
        io.SafetensorsWriter(locked / "q.safetensors")
    assert os.listdir(locked) == []
