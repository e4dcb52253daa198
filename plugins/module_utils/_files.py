# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Writing files: one at a time, all or nothing (write_atomically), and report files only when their
content changed (write_changed). Private to the collection."""

from __future__ import annotations

import os
import secrets
import typing as t


def write_atomically(path: str, text: str | bytes, mode: int) -> None:
    """Replace ``path`` with ``text`` (UTF-8 when given as str) of exactly ``mode``, so a reader sees the old file or the new, never half.

    The temporary file is created in the target's folder, so the rename stays on one filesystem,
    and with ``mode`` from its first byte: a secret written 0600 is never readable by others,
    not even for the moment before a chmod. When anything fails the temporary file is removed
    and the target is left as it was.
    """
    content = text.encode("utf-8") if isinstance(text, str) else text
    folder, name = os.path.split(os.path.abspath(path))
    # A random name, so two runs writing the same target at once never share a temporary file.
    temporary = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.tmp")
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
