"""A full disk while saving (issue 61): ``sixbit.save`` and ``save_pretrained`` failed with a bare
``OSError: [Errno 28]`` naming no file, and left the hidden ``.data`` temporary file and the new
folder behind (``SafetensorsWriter.abort`` closed the file first; the flush on close raised again
and the unlink was never reached). Here the files a save creates under ``tmp_path`` write to
``/dev/full``, which fails every flush with ENOSPC exactly as a full disk does."""

import errno
import os

import pytest
import torch

import sixbit
from fixtures.tiny_models import build_tiny
from sixbit.files.safetensors import SafetensorsWriter

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")


def _fill(monkeypatch, folder, name=""):
    """Every file opened for writing under ``folder`` (whose name holds ``name``) writes to /dev/full."""
    real = os.fdopen

    def fdopen(fd, mode="r", *args, **kwargs):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if "w" in mode and path.startswith(str(folder)) and name in os.path.basename(path):
            full = os.open("/dev/full", os.O_RDWR)
            os.dup2(full, fd)
            os.close(full)
        return real(fd, mode, *args, **kwargs)

    monkeypatch.setattr(os, "fdopen", fdopen)


@pytest.fixture
def disk_full(tmp_path, monkeypatch):
    _fill(monkeypatch, tmp_path)
    return tmp_path


def _left(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture(scope="module")
def converted():
    tm = build_tiny("wan")
    return sixbit.convert_model(tm.model, None, "w8a8")


def _refused_naming(path, call):
    with pytest.raises(OSError) as info:
        call()
    assert info.value.errno == errno.ENOSPC
    assert str(path) in str(info.value) and "free space" in str(info.value), str(info.value)


def test_sixbit_save_leaves_nothing_and_names_the_file(converted, disk_full):
    path = disk_full / "new" / "model.safetensors"
    _refused_naming(path, lambda: sixbit.save(converted, path))
    assert _left(disk_full) == []  # no temporary file, and not the folder the save created


def test_save_pretrained_leaves_nothing_and_names_the_folder(converted, disk_full):
    folder = disk_full / "new" / "q"
    _refused_naming(folder, lambda: converted.save_pretrained(folder))
    assert _left(disk_full) == []


def test_a_sharded_save_that_fails_on_config_json_removes_the_shards_it_wrote(converted, tmp_path, monkeypatch):
    _fill(monkeypatch, tmp_path, name="config.json")  # the shards are written, config.json (the last file) fails
    folder = tmp_path / "new" / "q"
    _refused_naming(folder / "config.json", lambda: converted.save_pretrained(folder, max_shard_size="20KB"))
    assert _left(tmp_path) == []


def test_a_failing_flush_on_finish_or_abort_leaves_no_temporary_file(disk_full):
    """A small tensor stays in the write buffer: the first flush (on finish, or on the close of
    abort) is the one that fails."""
    (disk_full / "old").mkdir()
    for finish in (True, False):
        writer = SafetensorsWriter(disk_full / "old" / "t.safetensors")
        writer.add("a", torch.ones(3))
        if finish:
            _refused_naming(disk_full / "old" / "t.safetensors", lambda: writer.finish({}))
        else:
            writer.abort()
        assert _left(disk_full) == ["old"]  # the folder was there before: it stays
