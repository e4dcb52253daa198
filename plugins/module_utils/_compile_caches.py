# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The compile caches of an image on a host (jit/<image key>/: vLLM's torch.compile artifacts, FlashInfer's and
Triton's JIT kernels, and the warm stamps of the settings that started well on them), kept where a reinstall does
not wipe them and brought back by the next converge (seed 002: "Backup JIT caches after successful first boot ...
Restoring these skips the 30-45 min compilation entirely on fresh deploys").

Two places: a folder on the host (another disk, or a mounted share) holding a copy of each image's folder, replaced
whole and atomically; or the controller, which receives a tar of the folder (the role fetches it) and sends it back.
A backup is made when the host holds stamps the last one lacks; a restore copies in what the host lacks, stamps
last, so a restore cut short never stamps a start warm on kernels that are not there. Only folders and regular files
travel: a link in a backup (a share anyone can write) is never followed or recreated.

Private to the collection; the compile_caches module is its caller.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import tarfile
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import FileProblem, read_file, temporary_path, write_atomically
from ansible_collections.sparkfleet.vllm.plugins.module_utils._settings import path_problem

WARM = "warm"
STAMP = re.compile(r"[0-9a-f]{16}")
# The host's record of the stamps its last backup to the controller held (the controller's copy is not read from the host).
RECORD_SUFFIX = ".backed-up"
ARCHIVE_SUFFIX = ".backup.tar"
RESTORE_SUFFIX = ".restore.tar"


class CacheProblem(FileProblem):
    """A cache folder or backup that cannot be read or written, with the fix."""


class NotRegular(OSError):
    """What was listed as a regular file is something else by the time it is opened: skipped."""


def cache_problem(cache: t.Any) -> str | None:
    """Why ``cache`` is not an entry of the plan's compile_caches (None: it is)."""
    if not isinstance(cache, dict):
        return "caches: each entry is one of the plan's compile_caches (jit_dir, stamps, backup)"
    for key in ("jit_dir", "backup"):
        problem = path_problem(cache.get(key), 2)
        if problem:
            return f"caches: {key} {cache.get(key)!r} {problem}; give the plan's compile_caches (__vllm_plan.compile_caches)"
    if not re.fullmatch(r".+/jit/[0-9a-f]{16}", cache["jit_dir"]):
        return f"caches: jit_dir {cache['jit_dir']!r} is not an image's compile-cache folder (<vllm_cache_dir>/jit/<image key>)"
    # A backup folder is replaced whole: never anything but one image's copy under the operator's backup folder.
    if not re.fullmatch(r".+/[^/]+/[0-9a-f]{16}(\.tar)?", cache["backup"]):
        return f"caches: backup {cache['backup']!r} is not an image's backup (<vllm_cache_backup_dir>/<host>/<image key>)"
    stamps = cache.get("stamps")
    if not isinstance(stamps, list) or not all(isinstance(s, str) and STAMP.fullmatch(s) for s in stamps):
        return "caches: stamps must be the plan's warm stamps (16 hex digits each)"
    return None


def stamps_in(folder: str) -> set[str]:
    """The warm stamps an image's folder (on the host or its backup copy) holds."""
    try:
        return {name for name in os.listdir(os.path.join(folder, WARM)) if STAMP.fullmatch(name)
                and stat.S_ISREG(os.lstat(os.path.join(folder, WARM, name)).st_mode)}
    except (FileNotFoundError, NotADirectoryError):
        return set()
    except OSError as error:
        raise CacheProblem(f"{folder}: its warm stamps cannot be read ({error.strerror}); run the task as root") from error


def regular_files(folder: str) -> list[str]:
    """The regular files under ``folder``, relative, the warm stamps last; links and other kinds are left out."""
    found = []
    for parent, folders, files in os.walk(folder, followlinks=False):
        folders[:] = sorted(name for name in folders if not os.path.islink(os.path.join(parent, name)))
        found += [os.path.relpath(os.path.join(parent, name), folder) for name in sorted(files)
                  if stat.S_ISREG(os.lstat(os.path.join(parent, name)).st_mode)]
    return sorted(found, key=lambda path: path.split(os.sep)[0] == WARM)


def open_beneath(root: str, relative: str, create: bool) -> int:
    """A descriptor of ``relative`` under ``root``, every folder on the way opened without following a link (the
    containers write these folders: one could plant a link to a host folder, or swap a file for one, meanwhile).
    ``create`` makes the missing folders and creates the file, failing when it exists (FileExistsError)."""
    parts = relative.split(os.sep)
    folder = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=folder)
                except FileExistsError:
                    pass
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=folder)
            os.close(folder)
            folder = inner
        # Never blocking on a FIFO, never a terminal: a file swapped for either, or for a device node, is no regular file.
        flags = (os.O_WRONLY | os.O_CREAT | os.O_EXCL) if create else (os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        descriptor = os.open(parts[-1], flags | os.O_NOFOLLOW, 0o644, dir_fd=folder)
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            os.close(descriptor)
            raise NotRegular(relative)
        return descriptor
    finally:
        os.close(folder)


def crosses_link(error: OSError) -> bool:
    """A path a link interrupts (a folder or the file itself replaced by one), or no regular file: skipped, never followed."""
    return isinstance(error, (NotADirectoryError, NotRegular)) or error.errno == errno.ELOOP


def copy_stream(reader: t.BinaryIO, target: str, relative: str) -> bool:
    """Write ``relative`` under ``target`` from ``reader`` unless it is there; False when it was there."""
    try:
        descriptor = open_beneath(target, relative, create=True)
    except FileExistsError:
        return False
    except OSError as error:
        if crosses_link(error):
            return False
        raise
    with os.fdopen(descriptor, "wb") as writer:
        os.fchmod(writer.fileno(), 0o644)
        shutil.copyfileobj(reader, writer)
    return True


def readable_files(folder: str) -> t.Iterator[tuple[str, t.BinaryIO]]:
    """(relative name, open file) of each regular file under ``folder``, the stamps last; a file gone or behind a link
    by the time it is opened is left out."""
    for relative in regular_files(folder):
        try:
            descriptor = open_beneath(folder, relative, create=False)
        except FileNotFoundError:
            continue
        except OSError as error:
            if crosses_link(error):
                continue
            raise
        with os.fdopen(descriptor, "rb") as reader:
            yield relative, reader


def copy_missing(source: str, target: str) -> list[str]:
    """Copy the files of ``source`` that ``target`` lacks (the stamps last); what is there already stays as it is."""
    return [relative for relative, reader in readable_files(source) if copy_stream(reader, target, relative)]


def lacking(cache: t.Mapping[str, t.Any], _check_mode: bool) -> dict[str, t.Any] | None:
    """The planned stamps the host lacks (the role then copies the controller's archive in); None when it has them all."""
    wanted = sorted(set(cache["stamps"]) - stamps_in(cache["jit_dir"]))
    return {"jit_dir": cache["jit_dir"], "backup": cache["backup"], "restore": cache["jit_dir"] + RESTORE_SUFFIX,
            "stamps": wanted} if wanted else None


def restore_folder(cache: t.Mapping[str, t.Any], check_mode: bool) -> dict[str, t.Any] | None:
    """Bring a host folder backup in when it holds planned stamps the host lacks; None when there is nothing to bring."""
    problem = backup_root_problem(cache)
    if problem:
        raise CacheProblem(problem)
    wanted = set(cache["stamps"]) - stamps_in(cache["jit_dir"])
    brought = wanted & stamps_in(cache["backup"])
    if not brought:
        return None
    copied = [] if check_mode else guarded(lambda: copy_missing(cache["backup"], cache["jit_dir"]), cache["backup"], "restored from")
    return {"jit_dir": cache["jit_dir"], "from": cache["backup"], "stamps": sorted(brought), "files": len(copied)}


def back_up_folder(cache: t.Mapping[str, t.Any], check_mode: bool) -> dict[str, t.Any] | None:
    """Replace the host folder backup with a copy of the image's folder when the host holds stamps it lacks."""
    problem = backup_root_problem(cache)
    if problem:
        raise CacheProblem(problem)
    held = stamps_in(cache["jit_dir"])
    if not held - stamps_in(cache["backup"]):
        return None
    if not check_mode:
        guarded(lambda: replace_copy(cache["jit_dir"], cache["backup"]), cache["backup"], "backed up to")
    return {"jit_dir": cache["jit_dir"], "to": cache["backup"], "stamps": sorted(held)}


def replace_copy(source: str, backup: str) -> None:
    """A whole new copy beside the backup, then swapped in: a reader finds the old copy or the new, and a swap that
    fails puts the old one back."""
    os.makedirs(os.path.dirname(backup), mode=0o755, exist_ok=True)
    fresh, old = temporary_path(backup), temporary_path(backup)
    os.makedirs(fresh, mode=0o755)
    try:
        copy_missing(source, fresh)
        had_one = os.path.lexists(backup)
        if had_one:
            os.rename(backup, old)
        try:
            os.rename(fresh, backup)
        except OSError:
            if had_one:
                os.rename(old, backup)
            raise
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)


def backup_root_problem(cache: t.Mapping[str, t.Any]) -> str | None:
    """A folder backup needs vllm_cache_backup_dir to exist: one missing is most likely a share not mounted, which the
    backup would otherwise fill the root disk in place of and a restore find empty without a word."""
    root = os.path.dirname(os.path.dirname(cache["backup"]))
    if os.path.isdir(root):
        return None
    return (f"vllm_cache_backup_dir: {root} does not exist on the host (a share not mounted, or a disk not attached?); "
            "mount it or create it, or leave vllm_cache_backup_dir empty")


def archive(cache: t.Mapping[str, t.Any], check_mode: bool) -> dict[str, t.Any] | None:
    """A tar of the image's folder for the controller when the host holds stamps its last one lacked (its record)."""
    held = stamps_in(cache["jit_dir"])
    if not held - recorded(cache):
        return None
    path = cache["jit_dir"] + ARCHIVE_SUFFIX
    if not check_mode:
        guarded(lambda: write_tar(cache["jit_dir"], path), path, "archived to")
    return {"jit_dir": cache["jit_dir"], "archive": path, "backup": cache["backup"], "stamps": sorted(held)}


def write_tar(folder: str, path: str) -> None:
    """Readable as the folder's files are (kernels, no secret): the role fetches it without privilege escalation, which
    would make Ansible read the whole archive into memory (slurp) on a host whose memory the model holds."""
    temporary = temporary_path(path)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(descriptor, "wb") as handle, tarfile.open(fileobj=handle, mode="w") as tar:
            os.fchmod(handle.fileno(), 0o644)
            for relative, reader in readable_files(folder):
                info = tar.gettarinfo(arcname=relative, fileobj=reader)
                if info.isfile():
                    tar.addfile(info, reader)
        os.replace(temporary, path)
    except BaseException:
        if os.path.lexists(temporary):
            os.unlink(temporary)
        raise


def archived(cache: t.Mapping[str, t.Any], stamps: t.Any, check_mode: bool) -> dict[str, t.Any] | None:
    """The controller holds the archive: record the stamps it held (the archive action's, given back by the role) and
    remove it from the host. None for a folder whose archive was not fetched."""
    held = [str(s) for s in stamps if STAMP.fullmatch(str(s))] if isinstance(stamps, list) else []
    if not held:
        return None
    path = cache["jit_dir"] + ARCHIVE_SUFFIX
    if not check_mode:
        guarded(lambda: os.path.lexists(path) and os.unlink(path), path, "removed from")
        record(cache, held)
    return {"jit_dir": cache["jit_dir"], "stamps": held}


def recorded(cache: t.Mapping[str, t.Any]) -> set[str]:
    """The stamps the controller's archive holds, as the host recorded them."""
    found = read_file(cache["jit_dir"] + RECORD_SUFFIX)
    return {name for name in (found[0].decode("ascii", "replace").split() if found else ()) if STAMP.fullmatch(name)}


def record(cache: t.Mapping[str, t.Any], stamps: t.Sequence[str]) -> None:
    if stamps:
        path = cache["jit_dir"] + RECORD_SUFFIX
        guarded(lambda: write_atomically(path, "".join(f"{s}\n" for s in stamps), 0o644), path, "recorded in")


def unpack(cache: t.Mapping[str, t.Any], check_mode: bool) -> dict[str, t.Any] | None:
    """Extract the archive the role copied from the controller (jit_dir + RESTORE_SUFFIX): the files the host lacks,
    the stamps last; the archive is removed. None when no archive was copied."""
    path = cache["jit_dir"] + RESTORE_SUFFIX
    if not os.path.lexists(path):
        return None
    if check_mode:
        return {"jit_dir": cache["jit_dir"], "from": path, "files": 0}
    try:
        files = guarded(lambda: extract_missing(path, cache["jit_dir"]), path, "restored from")
    finally:
        guarded(lambda: os.path.lexists(path) and os.unlink(path), path, "removed from")
    # The controller holds what came from it: the next backup is made only for stamps started since.
    brought = sorted(name.rsplit("/", 1)[1] for name in files if name.startswith(f"{WARM}/"))
    held = stamps_in(cache["jit_dir"])
    record(cache, sorted(set(brought) | recorded(cache)) if brought else [])
    return {"jit_dir": cache["jit_dir"], "from": path, "files": len(files), "stamps": sorted(held)}


def extract_missing(path: str, target: str) -> list[str]:
    """Regular files only, under plain relative names; what the host has already stays."""
    written = []
    with tarfile.open(path, mode="r:") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and safe_name(m.name)]
        for member in sorted(members, key=lambda m: m.name.split("/")[0] == WARM):
            source = tar.extractfile(member)
            if source is not None and copy_stream(source, target, member.name):
                written.append(member.name)
    return written


def safe_name(name: str) -> bool:
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and all(part not in ("", ".", "..") for part in parts)


def guarded(action: t.Callable[[], t.Any], path: str, what: str) -> t.Any:
    try:
        return action()
    except (OSError, tarfile.TarError, shutil.Error) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise CacheProblem(f"the compile caches cannot be {what} {path} ({reason}); check the path, its free space, "
                           "and run the task as root") from error


ACTIONS: dict[str, t.Callable[[t.Mapping[str, t.Any], bool], dict[str, t.Any] | None]] = {
    "restore": restore_folder, "back_up": back_up_folder, "archive": archive, "unpack": unpack, "lacking": lacking,
}
# What changes nothing on the host.
READ_ONLY = frozenset(("lacking",))


def apply(action: str, caches: t.Sequence[t.Any], check_mode: bool, archived_stamps: t.Mapping[str, t.Any] | None = None) -> dict[str, t.Any]:
    """One action over the plan's compile caches; ``done`` lists what it did (or would do) per image folder."""
    problems = [problem for problem in (cache_problem(cache) for cache in caches) if problem]
    if problems:
        raise CacheProblem(problems[0])
    if action == "archived":
        done = [entry for entry in (archived(cache, (archived_stamps or {}).get(cache["jit_dir"]), check_mode) for cache in caches) if entry]
    else:
        done = [entry for entry in (ACTIONS[action](cache, check_mode) for cache in caches) if entry]
    return {"changed": bool(done) and action not in READ_ONLY, "done": done}
