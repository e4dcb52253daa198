# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Writing files: one at a time, all or nothing (write_atomically); report files only when their
content changed (write_changed); bring files and folders to their planned content, mode and root
ownership, with a diff and the same answer in check mode (sync_files, sync_folders); read what a
role deployed in a few folders at once (read_folders). Private to the collection."""

from __future__ import annotations

import fnmatch
import os
import re
import secrets
import stat
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._settings import path_problem

MODE = re.compile(r"0?[0-7]{3}")
# What a diff shows in place of a secret file's content.
SECRET_NOT_SHOWN = "(a secret: its content is not shown)\n"
# The most read_folders reads of one file: the plan files it reads are a few KiB.
READ_LIMIT = 1 << 20


class FileProblem(Exception):
    """A file or folder that cannot be read or written, with the fix."""


def temporary_path(path: str) -> str:
    """A temporary name beside ``path`` (one filesystem, so a rename replaces it in one step), random so
    two runs writing the same target at once never share it."""
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(folder, f".{name}.{secrets.token_hex(4)}.tmp")


def write_atomically(path: str, text: str | bytes, mode: int) -> None:
    """Replace ``path`` with ``text`` (UTF-8 when given as str) of exactly ``mode``, so a reader sees the old file or the new, never half.

    The temporary file is created in the target's folder, so the rename stays on one filesystem,
    and with ``mode`` from its first byte: a secret written 0600 is never readable by others,
    not even for the moment before a chmod. When anything fails the temporary file is removed
    and the target is left as it was.
    """
    content = text.encode("utf-8") if isinstance(text, str) else text
    folder = os.path.dirname(os.path.abspath(path))
    temporary = temporary_path(path)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            # os.open applies the umask, which would leave a 0644 results file 0600 under umask 077.
            os.fchmod(handle.fileno(), mode)
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise
    # Without this a crash right after the rename can bring the old file back.
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def newest_files(folder: str, prefix: str, suffix: str) -> list[str]:
    """The names of the regular files of ``folder`` that start with ``prefix`` and end with ``suffix``, newest first (by
    modification time, then name), never through a link; one that vanishes meanwhile is left out, a folder that cannot be
    read gives none."""
    found = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                try:
                    if entry.name.startswith(prefix) and entry.name.endswith(suffix) and entry.is_file(follow_symlinks=False):
                        found.append((entry.stat(follow_symlinks=False).st_mtime, entry.name))
                except OSError:
                    continue
    except OSError:
        return []
    return [name for _mtime, name in sorted(found, reverse=True)]


def prune_oldest(folder: str, prefix: str, suffix: str, keep: int, dry_run: bool = False) -> list[str]:
    """Remove the files newest_files lists beyond the newest ``keep``; returns the paths removed (with ``dry_run``, those
    it would remove). What the collection writes on its own (bundles, stack files) is bounded by this rule, so it never
    fills a disk that holds the weights. A file that cannot be removed meanwhile is left out, never raised."""
    removed = []
    for name in newest_files(folder, prefix, suffix)[max(keep, 0):]:
        path = os.path.join(folder, name)
        try:
            if not dry_run:
                os.unlink(path)
        except OSError:
            continue
        removed.append(path)
    return removed


def write_changed(dest: str, contents: t.Mapping[str, bytes], check_mode: bool) -> tuple[bool, list[str]]:
    """Write each name -> bytes under ``dest`` whose content differs, readable by all (reports); (changed, paths)."""
    changed, paths = False, []
    for name, content in contents.items():
        path = os.path.join(dest, name)
        paths.append(path)
        if os.path.exists(path):
            with open(path, "rb") as handle:
                if handle.read() == content:
                    continue
        changed = True
        if not check_mode:
            os.makedirs(dest, exist_ok=True)
            write_atomically(path, content, 0o644)
    return changed, paths


def read_file(path: str) -> tuple[bytes, int, tuple[int, int]] | None:
    """(content, mode, (uid, gid)) of a file, None when there is none; the content byte for byte,
    so a last good copy is kept and restored exactly."""
    try:
        with open(path, "rb") as handle:
            status = os.fstat(handle.fileno())
            return handle.read(), status.st_mode & 0o7777, (status.st_uid, status.st_gid)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise FileProblem(f"{path}: cannot be read ({error.strerror}); run the task as root (become: true)") from error


def root_owner() -> tuple[int, int] | None:
    """Root's ids when the module runs as root, else None: a file is then left with its owner."""
    return (0, 0) if os.geteuid() == 0 else None


def sync_files(files: t.Sequence[t.Mapping[str, t.Any]], check_mode: bool) -> dict[str, list[t.Any]]:
    """Write each file whose content differs, and set the mode and root ownership of each whose
    content is right but whose metadata is not. Each file: ``label``, ``path``, ``mode`` (int),
    ``content`` (bytes) and ``hidden`` (the text a diff shows instead of a secret's content, or
    None). Returns the labels rewritten (``content``), those whose mode or owner were set
    (``metadata``) and the diffs."""
    found: dict[str, list[t.Any]] = {"content": [], "metadata": [], "diff": []}
    owner = root_owner()
    for file in files:
        before = read_file(file["path"])
        if before is None or before[0] != file["content"]:
            found["content"].append(file["label"])
            found["diff"].append(file_diff(file, before))
            if not check_mode:
                write_owned(file["path"], file["content"], file["mode"], owner)
        elif metadata_differs(before[1], before[2], file["mode"], owner):
            found["metadata"].append(file["label"])
            if not check_mode:
                set_metadata(file["path"], file["mode"], owner)
    return found


def file_diff(file: t.Mapping[str, t.Any], before: tuple[bytes, int, tuple[int, int]] | None) -> dict[str, str]:
    """The diff of a file rewritten; a secret's (its ``hidden`` text) says only that it was rewritten,
    so the diff is not empty and shows no content."""
    hidden = file.get("hidden")
    if hidden:
        old, new = "" if before is None else f"{hidden.rstrip()} (before)\n", f"{hidden.rstrip()} (after)\n"
    else:
        old, new = "" if before is None else before[0].decode("utf-8", "replace"), file["content"].decode("utf-8", "replace")
    return {"before_header": file["path"], "after_header": file["path"], "before": old, "after": new}


def metadata_differs(mode_now: int, ids_now: tuple[int, int], mode: int, owner: tuple[int, int] | None) -> bool:
    """Whether a file's or folder's mode, or its owner when the module sets owners, is not the planned one."""
    return mode_now != mode or (owner is not None and ids_now != owner)


def write_owned(path: str, content: bytes, mode: int, owner: tuple[int, int] | None) -> None:
    try:
        write_atomically(path, content, mode)
        if owner is not None:
            os.chown(path, *owner)
    except FileNotFoundError as error:
        raise FileProblem(f"{path}: its folder {os.path.dirname(path)} does not exist; the role creates it before "
                          "writing the file (its planned folders)") from error
    except OSError as error:
        raise FileProblem(f"{path}: cannot be written ({error.strerror}); run the task as root (become: true)") from error


def set_metadata(path: str, mode: int, owner: tuple[int, int] | None) -> None:
    try:
        os.chmod(path, mode)
        if owner is not None:
            os.chown(path, *owner)
    except OSError as error:
        raise FileProblem(f"{path}: its mode cannot be set ({error.strerror}); run the task as root (become: true)") from error


def sync_folders(folders: t.Sequence[t.Mapping[str, t.Any]], check_mode: bool) -> dict[str, list[str]]:
    """Create each folder (``path``, ``mode`` as int) that is missing, each missing parent 0755,
    and set the mode and root ownership of each that differs. A folder that is a symlink to a
    folder is followed, as the file module does. Returns the paths ``created`` and ``metadata``
    (mode or owner set)."""
    found: dict[str, list[str]] = {"created": [], "metadata": []}
    owner = root_owner()
    for folder in folders:
        path, mode = folder["path"], folder["mode"]
        try:
            status = os.stat(path)
        except FileNotFoundError:
            found["created"].append(path)
            if not check_mode:
                create_folder(path, mode, owner)
            continue
        except OSError as error:
            raise FileProblem(f"{path}: cannot be read ({error.strerror}); run the task as root (become: true)") from error
        if not stat.S_ISDIR(status.st_mode):
            raise FileProblem(f"{path}: exists and is not a folder; move it away, the role needs a folder there")
        if metadata_differs(status.st_mode & 0o7777, (status.st_uid, status.st_gid), mode, owner):
            found["metadata"].append(path)
            if not check_mode:
                set_metadata(path, mode, owner)
    return found


def create_folder(path: str, mode: int, owner: tuple[int, int] | None) -> None:
    missing = [path]
    while not os.path.isdir(os.path.dirname(missing[-1])):
        missing.append(os.path.dirname(missing[-1]))
    for parent in reversed(missing[1:]):
        make_folder(parent, 0o755, owner)
    make_folder(path, mode, owner)


def make_folder(path: str, mode: int, owner: tuple[int, int] | None) -> None:
    try:
        os.mkdir(path, mode)
    except FileExistsError as error:
        raise FileProblem(f"{path}: exists and is not a folder; move it away, the role needs a folder there") from error
    except OSError as error:
        raise FileProblem(f"{path}: cannot be created ({error.strerror}); run the task as root (become: true)") from error
    # mkdir applies the umask; the folder's mode is the planned one from here on.
    set_metadata(path, mode, owner)


def mode_problem(value: t.Any) -> str | None:
    """What is wrong with a mode given as an octal string (None: nothing); no setuid, setgid or sticky bit."""
    if not isinstance(value, str) or not MODE.fullmatch(value):
        return "must be an octal string of three or four digits with no setuid, setgid or sticky bit, such as \"0644\""
    return None


def listed_path_problem(value: t.Any) -> str | None:
    problem = path_problem(value)
    if problem is None and os.path.normpath(value) != value:
        return "must be written as it is meant, with no doubled or trailing '/'"
    return problem


def secret_mode_problem(value: t.Any) -> str | None:
    """What is wrong with a secret file's mode (None: nothing): mode_problem's, or any access for group or others."""
    problem = mode_problem(value)
    if problem is None and int(value, 8) & 0o077:
        return "gives group or others access to a secret; use \"0600\""
    return problem


def sync_listed(folders: t.Sequence[t.Mapping[str, t.Any]], files: t.Sequence[t.Mapping[str, t.Any]], check_mode: bool,
                secret_files: t.Sequence[t.Mapping[str, t.Any]] = ()) -> dict[str, t.Any]:
    """Folders then files as the host_files module takes them (path, mode as an octal string, a
    file's content as text), every path and mode checked before anything changes. A secret file's
    content never reaches the diff, and its mode gives group and others nothing."""
    problems = [f"{option}[{index}].{key}: {entry.get(key)!r} {problem}"
                for option, entries, mode_check in (("folders", folders, mode_problem), ("files", files, mode_problem),
                                                    ("secret_files", secret_files, secret_mode_problem))
                for index, entry in enumerate(entries)
                for key, problem in (("path", listed_path_problem(entry.get("path"))), ("mode", mode_check(entry.get("mode"))))
                if problem]
    if problems:
        raise FileProblem("; ".join(problems))
    created = sync_folders([{"path": folder["path"], "mode": int(folder["mode"], 8)} for folder in folders], check_mode)
    written = sync_files([{"label": file["path"], "path": file["path"], "mode": int(file["mode"], 8),
                           "content": file["content"].encode("utf-8"), "hidden": hidden}
                          for entries, hidden in ((files, None), (secret_files, SECRET_NOT_SHOWN)) for file in entries], check_mode)
    return {"changed": any((created["created"], created["metadata"], written["content"], written["metadata"])),
            "folders_created": created["created"], "folders_fixed": created["metadata"],
            "files_written": written["content"], "files_fixed": written["metadata"], "diff": written["diff"]}


def pattern_problem(value: t.Any) -> str | None:
    if not isinstance(value, str) or not value or "/" in value:
        return "must be a file name pattern (such as \"*.json\"), with no '/'"
    return None


def read_folders(folders: t.Sequence[t.Mapping[str, t.Any]]) -> dict[str, t.Any]:
    """The regular files (not links) of each folder whose names match one of its patterns, as the
    folder_files_info module takes them: ``{"files": {path: text, or None unless the folder's read
    is set}, "missing": [folders that do not exist]}``, each path joined to its folder as given (as
    ansible.builtin.find does). Every path and pattern checked first."""
    problems = [f"folders[{index}].path: {folder.get('path')!r} {problem}"
                for index, folder in enumerate(folders) if (problem := path_problem(folder.get("path")))]
    problems += [f"folders[{index}].patterns: {pattern!r} {problem}"
                 for index, folder in enumerate(folders) for pattern in folder.get("patterns") or []
                 if (problem := pattern_problem(pattern))]
    problems += [f"folders[{index}].patterns: must list at least one file name pattern (such as \"*.json\")"
                 for index, folder in enumerate(folders) if not folder.get("patterns")]
    if problems:
        raise FileProblem("; ".join(problems))
    files: dict[str, str | None] = {}
    missing = []
    for folder in folders:
        try:
            names = sorted(os.listdir(folder["path"]))
        except FileNotFoundError:
            missing.append(folder["path"])
            continue
        except OSError as error:
            raise FileProblem(f"{folder['path']}: cannot be listed ({error.strerror}); it must be a folder root can read") from error
        for name in names:
            path = os.path.join(folder["path"], name)
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in folder["patterns"]) and is_regular_file(path):
                files[path] = read_text(path) if folder.get("read") else None
    return {"files": files, "missing": missing}


def is_regular_file(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def read_text(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            content = handle.read(READ_LIMIT + 1)
    except OSError as error:
        raise FileProblem(f"{path}: cannot be read ({error.strerror})") from error
    if len(content) > READ_LIMIT:
        raise FileProblem(f"{path}: larger than {READ_LIMIT} bytes, which no file of the collection is; move it out of the folder")
    return content.decode("utf-8", "replace")
