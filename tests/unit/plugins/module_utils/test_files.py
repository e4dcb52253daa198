"""The one atomic file writer on real files: the exact mode from the file's creation on, whatever the umask,
no temporary file left behind, and the target as it was when writing fails."""

import os
import pathlib
import stat
import subprocess
import sys
import textwrap

import pytest

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import prune_oldest, write_atomically, write_changed


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask():
    """Set the process umask for one test, restored after."""
    previous = os.umask(0o022)
    yield os.umask
    os.umask(previous)


@pytest.mark.parametrize(("wanted", "mask"), [(0o600, 0o000), (0o644, 0o077), (0o644, 0o022)])
def test_the_file_has_the_mode_asked_for_whatever_the_umask(tmp_path, umask, wanted, mask):
    umask(mask)
    target = tmp_path / "plan.json"
    write_atomically(str(target), '{"schema_version": 1}\n', wanted)
    assert target.read_text() == '{"schema_version": 1}\n' and mode(target) == wanted
    assert os.listdir(tmp_path) == ["plan.json"]


def test_a_secret_is_never_readable_by_others_not_even_before_its_chmod(tmp_path, umask, monkeypatch):
    umask(0o000)
    created = []
    real_open = os.open

    def open_and_look(path, flags, *args):
        descriptor = real_open(path, flags, *args)
        if flags & os.O_CREAT:
            created.append((path, stat.S_IMODE(os.fstat(descriptor).st_mode)))
        return descriptor

    monkeypatch.setattr(os, "open", open_and_look)
    write_atomically(str(tmp_path / "config.yaml"), "master_key: os.environ/LITELLM_MASTER_KEY\n", 0o600)
    assert [(os.path.dirname(path), created_mode) for path, created_mode in created] == [(str(tmp_path), 0o600)]


def test_an_existing_file_is_replaced_and_takes_the_new_mode(tmp_path):
    target = tmp_path / "drained.json"
    target.write_text("old")
    target.chmod(0o666)
    write_atomically(str(target), "néw\n", 0o600)
    assert target.read_text(encoding="utf-8") == "néw\n" and mode(target) == 0o600
    assert os.listdir(tmp_path) == ["drained.json"]


def test_a_rename_that_fails_leaves_the_target_and_no_temporary_file(tmp_path):
    target = tmp_path / "results-x.json"
    target.mkdir()
    (target / "kept").write_text("inside")
    with pytest.raises(IsADirectoryError):
        write_atomically(str(target), "{}", 0o644)
    assert os.listdir(tmp_path) == ["results-x.json"] and (target / "kept").read_text() == "inside"


def test_a_missing_folder_fails_and_creates_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_atomically(str(tmp_path / "absent" / "plan.json"), "{}", 0o600)
    assert os.listdir(tmp_path) == []


def test_text_that_cannot_be_encoded_creates_nothing(tmp_path):
    with pytest.raises(UnicodeEncodeError):
        write_atomically(str(tmp_path / "plan.json"), "\ud800", 0o600)
    assert os.listdir(tmp_path) == []


def test_a_write_that_fails_midway_leaves_the_target_as_it_was_and_no_temporary_file(tmp_path):
    """A file size limit (RLIMIT_FSIZE) makes the write itself fail, as a full disk would, in a process of its own."""
    target = tmp_path / "plan.json"
    target.write_text("the old plan\n")
    target.chmod(0o600)
    script = textwrap.dedent(f"""
        import resource, signal, sys
        from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import write_atomically, write_changed
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            write_atomically({str(target)!r}, "x" * 100000, 0o600)
        except OSError as error:
            sys.exit(f"failed: {{error.strerror}}")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                          check=False, timeout=60)
    assert done.returncode == 1 and done.stderr.strip() == "failed: File too large", done.stderr
    assert target.read_text() == "the old plan\n" and mode(target) == 0o600
    assert os.listdir(tmp_path) == ["plan.json"]


def test_reports_are_written_whole_readable_by_all_and_only_when_their_content_changed(tmp_path, umask):
    umask(0o077)
    dest = tmp_path / "reports"
    changed, paths = write_changed(str(dest), {"report.md": b"# one\n", "report.png": b"\x89PNG"}, check_mode=False)
    assert changed and [mode(path) for path in paths] == [0o644, 0o644]
    written = os.stat(paths[0]).st_mtime_ns
    changed, _paths = write_changed(str(dest), {"report.md": b"# one\n", "report.png": b"\x89PNG"}, check_mode=False)
    assert not changed and os.stat(paths[0]).st_mtime_ns == written
    changed, _paths = write_changed(str(dest), {"report.md": b"# two\n"}, check_mode=True)
    assert changed and (dest / "report.md").read_bytes() == b"# one\n", "check mode writes nothing"
    assert sorted(p.name for p in dest.iterdir()) == ["report.md", "report.png"]


def test_pruning_keeps_the_newest_of_its_own_names_and_never_follows_a_link(tmp_path):
    for index in range(5):
        path = tmp_path / f"sparkfleet-diagnose-h-{index}.tar.gz"
        path.write_bytes(b"x")
        os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))
    operator = tmp_path / "operators-archive.tar.gz"
    operator.write_bytes(b"mine")
    os.utime(operator, (1_600_000_000, 1_600_000_000))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "target.tar.gz").write_bytes(b"t")
    (tmp_path / "sparkfleet-diagnose-link.tar.gz").symlink_to(elsewhere / "target.tar.gz")
    removed = prune_oldest(str(tmp_path), "sparkfleet-diagnose-", ".tar.gz", 2)
    assert sorted(pathlib.Path(path).name for path in removed) == [f"sparkfleet-diagnose-h-{index}.tar.gz" for index in range(3)]
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "elsewhere", "operators-archive.tar.gz", "sparkfleet-diagnose-h-3.tar.gz", "sparkfleet-diagnose-h-4.tar.gz", "sparkfleet-diagnose-link.tar.gz"]
    assert (elsewhere / "target.tar.gz").exists()
    assert prune_oldest(str(tmp_path / "missing"), "", ".tar.gz", 2) == []
