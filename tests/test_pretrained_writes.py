"""Where a streamed conversion writes: an output folder it cannot write to is refused before
any block is read (issue 48: a raw OSError naming the temporary file, after the work), and a
SIGTERM mid-stream leaves no temporary file, as SIGINT does not."""

import os
import pathlib
import signal
import stat
import subprocess
import sys
import threading

import pytest

import sixbit
from sixbit import checkpoint, streaming
from sixbit.builder import ShardedModel
from sixbit.files import safetensors as io, tempfiles
from fixtures.tiny_models import build_tiny


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("source") / "model"
    build_tiny("wan").model.save_pretrained(folder, max_shard_size="8KB")
    return folder


def _no_block_read(monkeypatch):
    def load(self, keys):
        raise AssertionError("the output should have been refused before any block is read")

    monkeypatch.setattr(ShardedModel, "load", load)


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


# ---- SIGTERM mid-stream: no temporary file left (issue 48: a hidden ~25 MB data file stayed; SIGINT left none) ----

# The child converts and sends itself SIGTERM at a chosen moment: after a block was written to
# its part file ("blocks"), or while the finished file is copied into place ("install").
_CHILD = """
import os, shutil, signal, sys
import sixbit
from sixbit import checkpoint

folder, out, moment = sys.argv[1:]
if moment == "blocks":
    real_add, added = checkpoint.CheckpointWriter.add, []

    def add(self, *args, **kwargs):
        real_add(self, *args, **kwargs)
        added.append(1)
        if len(added) == 2:  # the layers outside the blocks and the first block are in the data file
            os.kill(os.getpid(), signal.SIGTERM)

    checkpoint.CheckpointWriter.add = add
else:
    real_copy = shutil.copyfileobj

    def copy(src, dst, length=0):
        if ".sixbit-progress" in os.readlink(f"/proc/self/fd/{dst.fileno()}"):  # a finished part
            return real_copy(src, dst, length)
        dst.write(src.read(1000))
        dst.flush()
        os.kill(os.getpid(), signal.SIGTERM)
        real_copy(src, dst, length)

    shutil.copyfileobj = copy
sixbit.convert_pretrained(folder, "w8a8", out, progress=False)
print("finished")
"""


@pytest.mark.parametrize("moment", ["blocks", "install"])
def test_sigterm_mid_stream_leaves_no_temporary_file(moment, model_folder, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "q.safetensors"
    out.write_bytes(b"previous")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pathlib.Path(sixbit.__file__).parents[1]),
                                                          os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(model_folder), str(out), moment], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-2000:]  # ended by SIGTERM, as without sixbit
    assert "finished" not in proc.stdout
    # no hidden .q.safetensors.<pid>.*.data / .tmp; the finished parts wait for a resume (tests/test_resume.py)
    assert sorted(os.listdir(out_dir)) == ["q.safetensors", "q.safetensors.sixbit-progress"]
    assert not [f for f in os.listdir(out_dir / "q.safetensors.sixbit-progress") if f.startswith(".")]
    assert out.read_bytes() == b"previous"  # never half-written


def test_sigterm_handling_lasts_only_while_writing_and_never_replaces_a_callers_handler(model_folder, tmp_path,
                                                                                      monkeypatch):
    seen = []
    real_add = checkpoint.CheckpointWriter.add
    monkeypatch.setattr(checkpoint.CheckpointWriter, "add",
                        lambda self, *a, **k: (seen.append(signal.getsignal(signal.SIGTERM)), real_add(self, *a, **k)))
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        sixbit.convert_pretrained(model_folder, "w8a8", tmp_path / "a.safetensors", progress=False)
        assert seen and all(getattr(h, "__module__", None) == tempfiles.__name__ for h in seen)  # installed while the data file exists
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # and the default is back afterwards

        def mine(signum, frame):
            raise SystemExit(1)

        for handler in (mine, signal.SIG_IGN):
            seen.clear()
            signal.signal(signal.SIGTERM, handler)
            sixbit.convert_pretrained(model_folder, "w8a8", tmp_path / "b.safetensors", progress=False)
            assert seen and all(h is handler for h in seen) and signal.getsignal(signal.SIGTERM) is handler
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_conversion_on_another_thread_leaves_the_signal_handlers_alone(model_folder, tmp_path):
    before, errors = signal.getsignal(signal.SIGTERM), []

    def run():
        try:
            sixbit.convert_pretrained(model_folder, "w8a8", tmp_path / "q.safetensors", progress=False)
        except BaseException as e:  # reported below
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert errors == [] and (tmp_path / "q.safetensors").is_file()
    assert signal.getsignal(signal.SIGTERM) is before
