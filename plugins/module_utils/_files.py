# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Writing report files only when their content changed. Private to the collection."""

from __future__ import annotations

import os
import typing as t


def write_changed(dest: str, contents: t.Mapping[str, bytes], check_mode: bool) -> tuple[bool, list[str]]:
    """Write each name -> bytes under ``dest`` whose content differs; (changed, paths)."""
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
            with open(path, "wb") as handle:
                handle.write(content)
    return changed, paths
