"""Backups of an image's compile caches on real folders and real tar files (seed 002: restoring them skips 30-45
minutes of compilation on a fresh deploy)."""

import io
import os
import stat
import tarfile

import pytest

from ansible_collections.sparkfleet.vllm.plugins.module_utils._compile_caches import ARCHIVE_SUFFIX, RECORD_SUFFIX, RESTORE_SUFFIX, CacheProblem, apply

STAMP, OTHER = "a" * 16, "b" * 16


def compiled(jit, *stamps, kernel=b"ptx"):
    """An image's folder after starts of ``stamps`` served on it."""
    (jit / "triton" / "k1").mkdir(parents=True)
    (jit / "triton" / "k1" / "kernel.cubin").write_bytes(kernel)
    (jit / "vllm" / "torch_compile_cache").mkdir(parents=True)
    (jit / "vllm" / "torch_compile_cache" / "graph.py").write_text("graph\n")
    (jit / "warm").mkdir()
    for stamp in stamps:
        (jit / "warm" / stamp).write_text("1\n")
    return jit


@pytest.fixture
def host(tmp_path):
    jit = tmp_path / "cache" / "jit" / ("c" * 16)
    (tmp_path / "disk").mkdir()
    return {"jit_dir": str(jit), "stamps": [STAMP], "backup": str(tmp_path / "disk" / "spark-1" / ("c" * 16))}


def files_under(folder):
    return sorted(os.path.relpath(os.path.join(parent, name), folder) for parent, _dirs, names in os.walk(folder) for name in names)


def test_a_reinstalled_host_gets_its_folder_backup_back_and_a_second_converge_changes_nothing(host, tmp_path):
    jit = compiled(tmp_path / "cache" / "jit" / ("c" * 16), STAMP)
    assert apply("back_up", [host], check_mode=True)["changed"] and not os.path.exists(host["backup"])
    backed = apply("back_up", [host], check_mode=False)
    assert backed["done"] == [{"jit_dir": host["jit_dir"], "to": host["backup"], "stamps": [STAMP]}]
    assert files_under(host["backup"]) == files_under(jit)
    assert not apply("back_up", [host], check_mode=False)["changed"], "the backup holds every stamp the host has"
    assert sorted(os.listdir(os.path.dirname(host["backup"]))) == ["c" * 16], "no temporary copy is left beside it"

    for parent, _dirs, names in os.walk(jit, topdown=False):
        for name in names:
            os.unlink(os.path.join(parent, name))
        os.rmdir(parent)
    jit.mkdir(parents=True)
    (jit / "triton").mkdir()
    assert apply("restore", [host], check_mode=True)["changed"] and not (jit / "warm").exists()
    restored = apply("restore", [host], check_mode=False)
    assert restored["done"] == [{"jit_dir": host["jit_dir"], "from": host["backup"], "stamps": [STAMP], "files": 3}]
    assert (jit / "warm" / STAMP).is_file() and (jit / "triton" / "k1" / "kernel.cubin").read_bytes() == b"ptx"
    assert not apply("restore", [host], check_mode=False)["changed"]


def test_a_backup_is_replaced_whole_once_the_host_holds_a_stamp_it_lacks(host, tmp_path):
    jit = compiled(tmp_path / "cache" / "jit" / ("c" * 16), STAMP)
    apply("back_up", [host], check_mode=False)
    (jit / "warm" / OTHER).write_text("1\n")
    (jit / "triton" / "k1" / "kernel.cubin").write_bytes(b"newer")
    assert apply("back_up", [host], check_mode=False)["done"][0]["stamps"] == [STAMP, OTHER]
    assert (tmp_path / "disk" / "spark-1" / ("c" * 16) / "triton" / "k1" / "kernel.cubin").read_bytes() == b"newer"


def test_a_restore_keeps_what_the_host_has_and_follows_no_link(host, tmp_path):
    backup = compiled(tmp_path / "disk" / "spark-1" / ("c" * 16), STAMP, kernel=b"from backup")
    secret = tmp_path / "secret"
    secret.write_text("root's\n")
    (backup / "triton" / "leak").symlink_to(secret)
    (backup / "linked").symlink_to(tmp_path)
    jit = tmp_path / "cache" / "jit" / ("c" * 16)
    (jit / "triton" / "k1").mkdir(parents=True)
    (jit / "triton" / "k1" / "kernel.cubin").write_bytes(b"host's own")
    apply("restore", [host], check_mode=False)
    assert (jit / "triton" / "k1" / "kernel.cubin").read_bytes() == b"host's own"
    assert not (jit / "triton" / "leak").exists() and not (jit / "linked").exists()


def test_a_link_a_container_planted_in_its_cache_folder_is_never_written_through(host, tmp_path):
    """The containers write jit/<image key>/ as root: a link there to a host folder must not carry a restore out."""
    compiled(tmp_path / "disk" / "spark-1" / ("c" * 16), STAMP)
    outside = tmp_path / "etc-cron.d"
    outside.mkdir()
    jit = tmp_path / "cache" / "jit" / ("c" * 16)
    jit.mkdir(parents=True)
    (jit / "triton").symlink_to(outside)
    apply("restore", [host], check_mode=False)
    assert list(outside.iterdir()) == [] and (jit / "warm" / STAMP).is_file()


def test_nothing_is_restored_when_the_backup_lacks_the_planned_stamps(host, tmp_path):
    compiled(tmp_path / "disk" / "spark-1" / ("c" * 16), OTHER)
    assert apply("restore", [host], check_mode=False) == {"changed": False, "done": []}
    assert not os.path.exists(host["jit_dir"])


def test_the_controller_round_trip_archives_records_and_unpacks(host, tmp_path):
    jit = compiled(tmp_path / "cache" / "jit" / ("c" * 16), STAMP)
    host = {**host, "backup": str(tmp_path / "controller" / "spark-1" / ("c" * 16 + ".tar"))}
    archived = apply("archive", [host], check_mode=False)["done"]
    archive = host["jit_dir"] + ARCHIVE_SUFFIX
    assert archived == [{"jit_dir": host["jit_dir"], "archive": archive, "backup": host["backup"], "stamps": [STAMP]}]
    assert stat.S_IMODE(os.stat(archive).st_mode) == 0o644
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert names[-1] == f"warm/{STAMP}" and sorted(names) == files_under(jit), "the stamps travel last"
    os.makedirs(os.path.dirname(host["backup"]))
    os.replace(archive, host["backup"])  # what the role's fetch does
    assert apply("archived", [host], check_mode=False, archived_stamps={host["jit_dir"]: [STAMP]})["changed"]
    assert apply("archive", [host], check_mode=False) == {"changed": False, "done": []}, "the record says the controller has it"
    os.unlink(host["jit_dir"] + RECORD_SUFFIX)

    for name in ("warm", "triton", "vllm"):
        for parent, _dirs, files in os.walk(jit / name, topdown=False):
            for file in files:
                os.unlink(os.path.join(parent, file))
            os.rmdir(parent)
    lacking = apply("lacking", [host], check_mode=False)
    wanted = {"jit_dir": host["jit_dir"], "backup": host["backup"], "restore": host["jit_dir"] + RESTORE_SUFFIX, "stamps": [STAMP]}
    assert lacking == {"changed": False, "done": [wanted]}
    os.link(host["backup"], lacking["done"][0]["restore"])  # what the role's copy does
    unpacked = apply("unpack", [host], check_mode=False)["done"]
    assert unpacked == [{"jit_dir": host["jit_dir"], "from": host["jit_dir"] + RESTORE_SUFFIX, "files": 3, "stamps": [STAMP]}]
    assert (jit / "triton" / "k1" / "kernel.cubin").read_bytes() == b"ptx" and not os.path.exists(host["jit_dir"] + RESTORE_SUFFIX)
    assert apply("lacking", [host], check_mode=False)["done"] == []
    assert apply("archive", [host], check_mode=False)["done"] == [], "what came from the controller is not sent back to it"


def member(tar, name, kind=tarfile.REGTYPE, data=b"x", target=""):
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, len(data) if kind == tarfile.REGTYPE else 0, target
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def test_an_archive_extracts_plain_files_under_plain_names_only(host, tmp_path):
    """A controller folder anyone could write is no way into the host's files."""
    jit = tmp_path / "cache" / "jit" / ("c" * 16)
    jit.mkdir(parents=True)
    with tarfile.open(host["jit_dir"] + RESTORE_SUFFIX, "w") as tar:
        member(tar, "../../escaped", data=b"out")
        member(tar, "/abs/path", data=b"abs")
        member(tar, "triton/link", tarfile.SYMTYPE, target="/etc/shadow")
        member(tar, "triton/hard", tarfile.LNKTYPE, target="/etc/shadow")
        member(tar, "triton/./dot", data=b"dot")
        member(tar, "triton/ok.cubin", data=b"ok")
        member(tar, f"warm/{STAMP}", data=b"1\n")
    result = apply("unpack", [host], check_mode=False)
    assert result["done"][0]["files"] == 2 and files_under(jit) == ["triton/ok.cubin", f"warm/{STAMP}"]
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "cache" / "escaped").exists()


@pytest.mark.parametrize(("cache", "fragment"), [
    ({"jit_dir": "/var/lib/sparkfleet", "stamps": [], "backup": "/mnt/b/x"}, "is not an image's compile-cache folder"),
    ({"jit_dir": "relative/jit/" + "c" * 16, "stamps": [], "backup": "/mnt/b/x"}, "jit_dir"),
    ({"jit_dir": "/var/cache/jit/" + "c" * 16, "stamps": ["../x"], "backup": "/mnt/b/spark-1/" + "c" * 16}, "stamps must be the plan's"),
    ({"jit_dir": "/var/cache/jit/" + "c" * 16, "stamps": [], "backup": "/"}, "backup"),
    # A backup is replaced whole (the old copy removed): a path that is no image's copy is never touched.
    ({"jit_dir": "/var/cache/jit/" + "c" * 16, "stamps": [], "backup": "/etc/ssh"}, "is not an image's backup"),
])
def test_caches_not_as_the_plan_gives_them_are_refused_before_anything_is_read(cache, fragment):
    with pytest.raises(CacheProblem, match="caches: ") as raised:
        apply("restore", [cache], check_mode=False)
    assert fragment in str(raised.value)


def test_a_backup_folder_that_is_not_there_is_a_share_not_mounted_and_fails_both_ways(host, tmp_path):
    compiled(tmp_path / "cache" / "jit" / ("c" * 16), STAMP)
    (tmp_path / "disk").rmdir()
    for action in ("back_up", "restore"):
        with pytest.raises(CacheProblem, match="vllm_cache_backup_dir: .*/disk does not exist on the host"):
            apply(action, [host], check_mode=False)
    assert not (tmp_path / "disk").exists(), "the root disk is not filled in the share's place"


def test_a_failed_swap_keeps_the_old_backup(host, tmp_path, monkeypatch):
    compiled(tmp_path / "cache" / "jit" / ("c" * 16), STAMP)
    apply("back_up", [host], check_mode=False)
    (tmp_path / "cache" / "jit" / ("c" * 16) / "warm" / OTHER).write_text("1\n")
    renames = []

    def failing_second_rename(source, target):
        renames.append(target)
        if len(renames) == 2:
            raise OSError(28, "No space left on device")
        real_rename(source, target)

    real_rename = os.rename
    monkeypatch.setattr(os, "rename", failing_second_rename)
    with pytest.raises(CacheProblem, match="No space left on device"):
        apply("back_up", [host], check_mode=False)
    monkeypatch.undo()
    assert sorted(os.listdir(host["backup"] + "/warm")) == [STAMP], "the old copy is back in its place"
    assert os.listdir(tmp_path / "disk" / "spark-1") == ["c" * 16]


def test_a_fifo_or_device_swapped_in_after_the_listing_is_not_read(host, tmp_path, monkeypatch):
    """A container may mknod or mkfifo in its cache folder between the listing and the copy: neither is read."""
    from ansible_collections.sparkfleet.vllm.plugins.module_utils import _compile_caches

    jit = compiled(tmp_path / "cache" / "jit" / ("c" * 16), STAMP)
    os.mkfifo(jit / "triton" / "pipe")
    listed = _compile_caches.regular_files(str(jit))
    monkeypatch.setattr(_compile_caches, "regular_files", lambda folder: [*listed, "triton/pipe"] if folder == str(jit) else [])
    backed = apply("back_up", [host], check_mode=False)
    assert backed["changed"] and not os.path.exists(host["backup"] + "/triton/pipe")
    archived = apply("archive", [{**host, "backup": host["backup"] + ".tar"}], check_mode=False)["done"][0]
    with tarfile.open(archived["archive"]) as tar:
        assert "triton/pipe" not in tar.getnames()


def test_a_backup_folder_that_cannot_be_written_fails_naming_it(host, tmp_path):
    compiled(tmp_path / "cache" / "jit" / ("c" * 16), STAMP)
    (tmp_path / "disk" / "spark-1").write_text("a file where the folder belongs\n")
    with pytest.raises(CacheProblem, match=r"cannot be backed up to .*/disk/spark-1/c{16} \(") as raised:
        apply("back_up", [host], check_mode=False)
    assert "free space" in str(raised.value)
