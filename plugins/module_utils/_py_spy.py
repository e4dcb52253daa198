# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""py-spy's wheels as the inventory pins them (vllm_py_spy_wheels): checked before any host changes, and the one a host
of a given architecture installs, with the member of the wheel that is py-spy's binary. Private to the collection."""

from __future__ import annotations

import re
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_paths import PY_SPY

VARIABLE = "vllm_py_spy_wheels"
# An architecture as Ansible's facts spell it (aarch64, x86_64).
ARCHITECTURE = re.compile(r"[a-z0-9_]{1,32}")
# A wheel of py-spy by its file name (PEP 427): the distribution, its version, the tags.
WHEEL_FILE = re.compile(r"(?P<distribution>py_spy)-(?P<version>[0-9][0-9A-Za-z.+]{0,40})-[A-Za-z0-9_.-]{1,200}[.]whl")
# Fetched by the controller's get_url: a mirror inside the site (http) or a file the controller already holds (file).
WHEEL_URL = re.compile(r"(?:https?://[A-Za-z0-9.-]{1,253}(?::[0-9]{1,5})?|file://)/[A-Za-z0-9._~%+/-]{0,1900}")
SHA256 = re.compile(r"[0-9a-f]{64}")
FIX = f"set {VARIABLE} to a map of architectures (aarch64, x86_64) to {{url, sha256}} of py-spy wheels, or {{}} for none"


def wheel_problems(wheels: t.Any) -> list[str]:
    """What is wrong with the wheels given, each naming the variable and the fix."""
    if not isinstance(wheels, dict):
        return [f"{VARIABLE} is a {type(wheels).__name__}, not a map; {FIX}"]
    problems = []
    for architecture, wheel in wheels.items():
        where = f"{VARIABLE}[{architecture!r}]"
        if not isinstance(architecture, str) or not ARCHITECTURE.fullmatch(architecture):
            problems.append(f"{where}: {architecture!r} is no architecture as Ansible's facts name one (aarch64, x86_64); {FIX}")
            continue
        if not isinstance(wheel, dict) or set(wheel) != {"url", "sha256"}:
            problems.append(f"{where} must hold exactly url and sha256; {FIX}")
            continue
        url, digest = wheel["url"], wheel["sha256"]
        if not isinstance(url, str) or not WHEEL_URL.fullmatch(url) or not WHEEL_FILE.fullmatch(url.rsplit("/", 1)[-1]):
            problems.append(f"{where}.url {str(url)[:120]!r} is no https://, http:// or file:// address of a py_spy-<version>-<tags>.whl "
                            f"file (letters, digits and ._~%+/- only); {FIX}")
        if not isinstance(digest, str) or not SHA256.fullmatch(digest):
            problems.append(f"{where}.sha256 must be the wheel's SHA-256, 64 lowercase hexadecimal digits (PyPI's file page shows it); {FIX}")
    return problems


def wheel_for(wheels: t.Any, architecture: str | None = None) -> dict[str, t.Any]:
    """{problems, wheel}: the wheels' problems, and for `architecture` the wheel to install (url, sha256, its file name,
    the member that is py-spy's binary, where the host keeps it), or None when none is pinned for it."""
    problems = wheel_problems(wheels)
    if problems or architecture not in (wheels or {}):
        return {"problems": problems, "wheel": None}
    url = wheels[architecture]["url"]
    found = WHEEL_FILE.fullmatch(url.rsplit("/", 1)[-1])
    return {"problems": [], "wheel": {
        "url": url, "sha256": wheels[architecture]["sha256"], "file": found.group(0),
        "binary": f"{found['distribution']}-{found['version']}.data/scripts/py-spy", "dest": PY_SPY}}
