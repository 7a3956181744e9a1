"""A streamed conversion resumed after an interruption (issue 63, item 5): interrupted after
part k (the layers outside the blocks, then each block) and run again with the same arguments,
it writes the very bytes an uninterrupted conversion writes; a finished part whose bytes no
longer match its recorded sha256 is converted again; other arguments are refused, changing nothing."""

import dataclasses
import os
import pathlib
import signal
import subprocess
import sys

import pytest
import torch

import sixbit
from sixbit.checkpoint import resume
from sixbit.cli import main
from fixtures.tiny_models import build_tiny, sample

BLOCKS = 4  # parts: the layers outside the blocks, then 4 blocks


@pytest.fixture(scope="module")
def tiny():
    """A tiny Wan with 4 blocks (the shipped fixture has 2), saved in 8 KB shards."""
    tm = build_tiny("wan")
    torch.manual_seed(0)
    model = type(tm.model).from_config({**tm.model.config, "num_layers": BLOCKS})
    return dataclasses.replace(tm, model=model)


@pytest.fixture(scope="module")
def folder(tiny, tmp_path_factory):
    path = tmp_path_factory.mktemp("source") / "model"
    tiny.model.save_pretrained(path, max_shard_size="8KB")
    return path


def _calibration(tiny, runs=None):
    def calibration(transformer):
        if runs is not None:
            runs.append(1)
        return sample(dataclasses.replace(tiny, model=transformer), 1)  # one step: the test stays short
    return calibration


def _files(path: pathlib.Path) -> dict[str, bytes]:
    """Every file of a checkpoint (the file itself, or a folder's files) and its bytes."""
    if path.is_file():
        return {path.name: path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _interrupt_after(monkeypatch, k: int) -> None:
    """Ctrl-C right after part ``k`` is recorded as finished."""
    real, done = resume.Progress.add_part, []

    def add_part(self, *args, **kwargs):
        seconds = real(self, *args, **kwargs)
        done.append(1)
        if len(done) == k:
            raise KeyboardInterrupt
        return seconds

    monkeypatch.setattr(resume.Progress, "add_part", add_part)


@pytest.fixture(scope="module")
def uninterrupted(tiny, folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    files = {}
    for preset, name in [("w8a8", "q"), ("w4a8", "q.safetensors")]:
        calibration = _calibration(tiny) if preset == "w4a8" else None
        result = sixbit.convert_pretrained(folder, preset, out / name, calibration, progress=False)
        assert result.resumed_parts == 0
        files[preset] = _files(result.path)
    return files


@pytest.mark.parametrize("preset,k", [("w8a8", 1), ("w8a8", 2), ("w8a8", 1 + BLOCKS),
                                      ("w4a8", 2)])  # w4a8: GPTQ, the next block's kept inputs are saved
def test_an_interrupted_conversion_resumes_bit_identical(preset, k, tiny, folder, uninterrupted, tmp_path, monkeypatch):
    out = tmp_path / ("q" if preset == "w8a8" else "q.safetensors")  # a diffusers folder, or the single file
    runs = []
    calibration = _calibration(tiny, runs) if preset == "w4a8" else None
    with monkeypatch.context() as m:
        _interrupt_after(m, k)
        with pytest.raises(KeyboardInterrupt):
            sixbit.convert_pretrained(folder, preset, out, calibration, progress=False)
    progress = resume.progress_folder(out)
    assert not out.exists() and sorted(p.name for p in progress.glob("part-*")) == [f"part-{i:05d}.safetensors" for i in range(k)]
    result = sixbit.convert_pretrained(folder, preset, out, calibration, progress=False)
    assert result.resumed_parts == k
    assert list(result.part_seconds) == [f"blocks.{i}" for i in range(k - 1, BLOCKS)]  # only those not finished
    # the interrupted run's parts keep the times it recorded (and its calibration's): every part's time is known
    finished = ["outside blocks"] + [f"blocks.{i}" for i in range(k - 1)]
    assert sorted(result.resumed_seconds) == sorted(finished + (["calibration runs"] if preset == "w4a8" else []))
    assert all(t > 0 for t in result.resumed_seconds.values())
    assert runs == ([1] if preset == "w4a8" else [])  # the kept inputs came from disk: no calibration again
    assert _files(result.path) == uninterrupted[preset]
    assert not progress.exists()


@pytest.mark.parametrize("preset", ["w8a8", "w4a8"])
def test_a_corrupted_finished_part_is_converted_again(preset, tiny, folder, uninterrupted, tmp_path, monkeypatch):
    out = tmp_path / ("q" if preset == "w8a8" else "q.safetensors")
    runs = []
    calibration = _calibration(tiny, runs) if preset == "w4a8" else None
    with monkeypatch.context() as m:
        _interrupt_after(m, 3)
        with pytest.raises(KeyboardInterrupt):
            sixbit.convert_pretrained(folder, preset, out, calibration, progress=False)
    part = resume.progress_folder(out) / "part-00001.safetensors"  # block 0
    data = bytearray(part.read_bytes())
    data[-1] ^= 1  # one bit of its last tensor
    part.write_bytes(bytes(data))
    result = sixbit.convert_pretrained(folder, preset, out, calibration, progress=False)
    assert _files(result.path) == uninterrupted[preset]
    if preset == "w8a8":  # the parts are independent: block 0 is converted again, and those never finished
        assert result.resumed_parts == 2 and list(result.part_seconds) == ["blocks.0", "blocks.2", "blocks.3"]
    else:  # block 1 saw block 0's outputs: the calibration runs again and every block is redone
        assert result.resumed_parts == 1 and runs == [1, 1]
        assert list(result.part_seconds) == ["calibration runs"] + [f"blocks.{i}" for i in range(BLOCKS)]
        assert list(result.resumed_seconds) == ["outside blocks"]  # the calibration ran again: its new time counts


def test_kept_inputs_are_read_back_exactly_and_only_while_they_verify(tmp_path):
    """The kept inputs a GPTQ resume starts from: every call's arguments (tensors, tuples, ``None``,
    dicts) read back bit for bit, for the block they were saved for, and not at all once a bit
    of their file flips (the resume then runs the calibration again)."""
    calls = [((torch.randn(2, 3), None), {"temb": torch.randn(4).to(torch.bfloat16), "rotary": (torch.ones(2), torch.zeros(2)),
                                          "attention_kwargs": {"scale": 0.5}, "flag": True}) for _ in range(3)]
    progress = resume.Progress(tmp_path / "p", {"a": 1}, restart=False)
    progress.start()
    progress.add_part(0, "outside blocks", torch.nn.Linear(3, 2), "Linear", inputs=(1, calls))
    again = resume.Progress(tmp_path / "p", {"a": 1}, restart=False)
    assert again.verified(["outside blocks"]) == {"outside blocks"}
    assert again.kept_inputs(0, None) is None  # saved for block 1
    got = again.kept_inputs(1, None)

    def flat(value) -> list:  # every tensor, in order
        if isinstance(value, torch.Tensor):
            return [value]
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
        return [t for item in items for t in flat(item)]

    assert [type(a) for a, _ in got] == [tuple] * 3 and [(a[1], k["attention_kwargs"], k["flag"]) for a, k in got] == \
        [(None, {"scale": 0.5}, True)] * 3
    assert all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(flat(got), flat(calls), strict=True))
    (inputs,) = (tmp_path / "p").glob("inputs-*.safetensors")
    data = bytearray(inputs.read_bytes())
    data[-1] ^= 1
    inputs.write_bytes(bytes(data))
    assert resume.Progress(tmp_path / "p", {"a": 1}, restart=False).kept_inputs(1, None) is None


def test_other_arguments_are_refused_changing_nothing(tiny, folder, tmp_path, monkeypatch, capsys):
    out = tmp_path / "q"
    with monkeypatch.context() as m:
        _interrupt_after(m, 2)
        assert main(["convert", "--model", str(folder), "--config", "w8a8", "-o", str(out)]) == 130
    progress = resume.progress_folder(out)
    assert str(progress) in capsys.readouterr().out  # where the finished blocks wait, said before they do
    before = _files(progress)
    with pytest.raises(ValueError, match=r"other arguments \(config\..*weight_format: \"int8\" then, \"nvfp4\" now.*restart=True, `sixbit convert --restart`"):
        sixbit.convert_pretrained(folder, "w4a8-rtn", out, progress=False)
    with pytest.raises(ValueError, match=r"torch_dtype: null then, \"torch.bfloat16\" now"):
        sixbit.convert_pretrained(folder, "w8a8", out, torch_dtype=torch.bfloat16, progress=False)
    assert main(["convert", "--model", str(folder), "--config", "w4a8-rtn", "-o", str(out)]) == 2
    assert "--restart" in capsys.readouterr().err
    assert _files(progress) == before and not out.exists()

    assert main(["convert", "--model", str(folder), "--config", "w4a8-rtn", "-o", str(out), "--restart"]) == 0
    assert "resumed" not in capsys.readouterr().out and not progress.exists()
    fresh = sixbit.convert_pretrained(folder, "w4a8-rtn", tmp_path / "fresh", progress=False)
    assert _files(out) == _files(fresh.path)

    with monkeypatch.context() as m:  # and the same arguments resume, saying so
        _interrupt_after(m, 3)
        assert main(["convert", "--model", str(folder), "--config", "w8a8", "-o", str(out)]) == 130
    assert main(["convert", "--model", str(folder), "--config", "w8a8", "-o", str(out)]) == 0
    assert "3 finished parts verified and skipped" in capsys.readouterr().out


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_disk_stops_it_and_a_rerun_goes_on(folder, uninterrupted, tmp_path, monkeypatch):
    """Part 2's file is written to /dev/full, which fails every flush with ENOSPC as a full disk does."""
    out, real = tmp_path / "q", os.fdopen

    def fdopen(fd, mode="r", *args, **kwargs):
        if "w" in mode and "part-00002" in os.readlink(f"/proc/self/fd/{fd}"):
            full = os.open("/dev/full", os.O_RDWR)
            os.dup2(full, fd)
            os.close(full)
        return real(fd, mode, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(os, "fdopen", fdopen)
        with pytest.raises(OSError, match="no space left on the device"):
            sixbit.convert_pretrained(folder, "w8a8", out, progress=False)
    assert sorted(os.listdir(resume.progress_folder(out))) == ["part-00000.safetensors", "part-00001.safetensors",
                                                               "progress.json"]  # no temporary file
    result = sixbit.convert_pretrained(folder, "w8a8", out, progress=False)  # space freed: the same command
    assert result.resumed_parts == 2 and _files(result.path) == uninterrupted["w8a8"]


_CHILD = """
import os, signal, sys
import sixbit
from sixbit.checkpoint import resume

folder, out, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
real, done = resume.Progress.add_part, []

def add_part(self, *args, **kwargs):
    seconds = real(self, *args, **kwargs)
    done.append(1)
    if len(done) == k:
        os.kill(os.getpid(), signal.SIGKILL)  # nothing runs after it: no handler, no cleanup
    return seconds

resume.Progress.add_part = add_part
sixbit.convert_pretrained(folder, "w8a8", out, progress=False)
print("finished")
"""


def test_a_sigkilled_conversion_resumes_bit_identical(folder, uninterrupted, tmp_path):
    out = tmp_path / "q"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pathlib.Path(sixbit.__file__).parents[1]),
                                                          os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(folder), str(out), "3"], env=env, check=False,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    result = sixbit.convert_pretrained(folder, "w8a8", out, progress=False)
    assert result.resumed_parts == 3
    assert _files(result.path) == uninterrupted["w8a8"]
    assert not [p for p in tmp_path.rglob(".*")]  # the killed run's temporary files were removed
