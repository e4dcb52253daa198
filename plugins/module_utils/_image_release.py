# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The engine release a pinned image carries, read at pull time, and the security floors it must meet.

Private to the collection. The release is read from the image's package metadata (the name of its
``<distribution>-<version>.dist-info`` folder) by a shell ``find`` in a throwaway container with no
network, no capabilities and a read-only root: no Python starts, so nothing a package installs to
run at interpreter start (the compromised LiteLLM 1.82.7 and 1.82.8 carried such a ``.pth`` file)
runs. The version is recorded beside the image's ID, so a re-run reads the record instead of
starting a container. Standard library only: the module runs it on the host.
"""

from __future__ import annotations

import json
import re
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_paths import DOCKER_CLIENT
from ansible_collections.sparkfleet.vllm.plugins.module_utils._model_catalog import VERSION, version_tuple

ENGINES = ("vllm", "litellm")
TITLES = {"vllm": "vLLM", "litellm": "LiteLLM"}
# The variable an operator lists an advisory in to run an image below its floor anyway, per engine.
ACKNOWLEDGEMENT_VARIABLES = {"vllm": "vllm_accepted_advisories", "litellm": "gateway_accepted_advisories"}
RECORD_DIR = "/var/lib/sparkfleet/image-releases"
RECORD_SCHEMA_VERSION = 1

# The floor table: each advisory, the first release that fixes it, and where that is written. An image below
# any fixed_in is refused naming the advisory, unless the operator acknowledges it by its id.
ADVISORIES: tuple[dict[str, str], ...] = (
    {"engine": "vllm", "id": "CVE-2026-44223", "fixed_in": "0.20.0",
     "what": "a request with a sampling penalty crashes the engine core for good when extract_hidden_states drafts (denial of service)",
     "source": "https://nvd.nist.gov/vuln/detail/CVE-2026-44223 (vLLM 0.18.0 to 0.19.1)"},
    {"engine": "vllm", "id": "CVE-2026-48746", "fixed_in": "0.22.0",
     "what": "authentication bypass of the API key through the Host header (GHSA-94f4-hr76-p5j6)",
     "source": "https://nvd.nist.gov/vuln/detail/CVE-2026-48746; vLLM pull request 43426"},
    {"engine": "vllm", "id": "CVE-2026-48710", "fixed_in": "0.24.0",
     "what": "Starlette's BadHost path confusion behind path-based authentication (vLLM 0.24.0 requires Starlette 1.0.1)",
     "source": "https://github.com/vllm-project/vllm/releases/tag/v0.24.0"},
    {"engine": "vllm", "id": "vllm-0.24.0-dos", "fixed_in": "0.24.0",
     "what": "denial of service through speculative decoding and the audio endpoints, and a GGUF information disclosure",
     "source": "https://github.com/vllm-project/vllm/releases/tag/v0.24.0 (its security notes; issue 41)"},
    {"engine": "litellm", "id": "CVE-2026-59822", "fixed_in": "1.84.0",
     "what": "authentication bypass of the MCP routes, exploited in the wild (CISA KEV)",
     "source": "https://nvd.nist.gov/vuln/detail/CVE-2026-59822; CISA Known Exploited Vulnerabilities"},
    {"engine": "litellm", "id": "CVE-2026-49468", "fixed_in": "1.84.0",
     "what": "a Host-header bypass reaching /key/generate",
     "source": "https://nvd.nist.gov/vuln/detail/CVE-2026-49468"},
)
# Releases never to run, whatever is acknowledged: what PyPI served under these numbers was not LiteLLM's.
COMPROMISED: dict[str, dict[str, str]] = {
    "litellm": {
        "1.82.7": "a supply-chain compromise of LiteLLM's PyPI release (credential-stealing code run at interpreter start)",
        "1.82.8": "a supply-chain compromise of LiteLLM's PyPI release (credential-stealing code run at interpreter start)",
    },
}
# Where an image keeps its packages: /usr/local/lib/python3.12/dist-packages, /opt/venv/lib/python3.12/site-packages,
# /app/.venv/lib/python3.13/site-packages...
FIND_DEPTH = 7
_DIST_INFO = re.compile(r"(?:^|/)(?P<name>[A-Za-z0-9_.]+)-(?P<version>[^/-]+)\.dist-info$")


_PRE_RELEASE = re.compile(r"(?:a|b|rc)\d+|\.dev\d+")


def release_order(version: str) -> tuple[int, ...]:
    """A release's place in order: its numbers padded to three (0.34 is 0.34.0), a pre-release or development build
    below the release it leads to (0.24.0rc1 and 0.24.0.dev5 may lack 0.24.0's fixes), the local tag ignored."""
    public = public_version(version)
    numbers = version_tuple(public)
    return (*numbers, *(0,) * (3 - len(numbers)), 0 if _PRE_RELEASE.search(public) else 1)


def floor(engine: str) -> str:
    """The lowest release that fixes every advisory of the engine."""
    return max((a["fixed_in"] for a in ADVISORIES if a["engine"] == engine), key=release_order)


def probe_argv(image: str, engine: str) -> list[str]:
    """A throwaway container that lists the engine's dist-info folders without starting Python. Never pulled here: the
    image is the one the caller pulled and verified."""
    search = (f"find / -xdev -maxdepth {FIND_DEPTH} -path /proc -prune -o -type d -name '{engine}-*.dist-info' -print "
              "2>/dev/null; exit 0")
    return [DOCKER_CLIENT, "run", "--rm", "--pull", "never", "--network", "none", "--read-only", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges", "--entrypoint", "/bin/sh", image, "-c", search]


def parse_versions(output: str, engine: str) -> list[str]:
    """The engine's releases among the dist-info folders ``probe_argv`` listed (a local tag such as +cpu kept)."""
    found = set()
    for line in output.splitlines():
        match = _DIST_INFO.search(line.strip())
        if match and match["name"].lower() == engine and VERSION.fullmatch(match["version"]):
            found.add(match["version"])
    return sorted(found, key=release_order)


def public_version(version: str) -> str:
    """The release without its local tag (0.32.0 of 0.32.0+cpu), as the advisories name it."""
    return version.split("+", 1)[0]


def judge(engine: str, versions: t.Sequence[str], image: str, accepted: t.Sequence[str]) -> dict[str, t.Any]:
    """{problems, acknowledged}: a compromised release, each advisory the image's release is below the fix of and the
    operator did not acknowledge, and an acknowledgement that names no advisory of the table. With several releases in
    one image the lowest is judged; with none read, every advisory of the engine counts."""
    variable = ACKNOWLEDGEMENT_VARIABLES[engine]
    title = TITLES[engine]
    known = [a["id"] for a in ADVISORIES if a["engine"] == engine]
    problems = [f"{variable}: {entry!r} is not a {title} advisory of the floor table ({', '.join(known)}); name the one you "
                "accept exactly" for entry in accepted if entry not in known]
    for version in versions:
        reason = COMPROMISED.get(engine, {}).get(public_version(version))
        if reason:
            problems.append(f"{image} carries {title} {version}: {reason}. No acknowledgement runs it; pin an image of another "
                            f"release ({title} {floor(engine)} or newer)")
    lowest = release_order(versions[0]) if versions else None
    below = [a for a in ADVISORIES if a["engine"] == engine and (lowest is None or lowest < release_order(a["fixed_in"]))]
    acknowledged = [a["id"] for a in below if a["id"] in accepted]
    missing = [a for a in below if a["id"] not in accepted]
    if missing:
        listed = "; ".join(f"{a['id']} ({a['what']}; fixed in {a['fixed_in']}; {a['source']})" for a in missing)
        read = (f"carries {title} {versions[0]}" if versions else
                f"has no {engine}-<version>.dist-info the collection could read (or no /bin/sh to read it with), so its release is unknown")
        problems.append(f"{image} {read}, below the floor of {title} {floor(engine)}: {listed}. Pin an image of {title} "
                        f"{floor(engine)} or newer, or accept each advisory by its id in {variable}: "
                        f"[{', '.join(a['id'] for a in missing)}]")
    return {"problems": problems, "acknowledged": acknowledged}


def record_path(image_id: str, record_dir: str = RECORD_DIR) -> str:
    """The record of one image, named by its ID (the digest of its configuration, which names its contents)."""
    return f"{record_dir}/{image_id.replace(':', '-')}.json"


def record_text(engine: str, image_id: str, image: str, versions: t.Sequence[str]) -> str:
    return json.dumps({"schema_version": RECORD_SCHEMA_VERSION, "engine": engine, "image_id": image_id, "image": image,
                       "versions": list(versions)}, indent=2, sort_keys=True) + "\n"


def recorded_versions(text: str | bytes, engine: str, image_id: str) -> list[str] | None:
    """The releases a record holds for this image and engine; None for a record of another shape, image or engine (read
    again, never trusted)."""
    try:
        record = json.loads(text)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("schema_version") != RECORD_SCHEMA_VERSION or record.get("engine") != engine \
            or record.get("image_id") != image_id or not isinstance(record.get("versions"), list):
        return None
    versions = record["versions"]
    if not all(isinstance(v, str) and VERSION.fullmatch(v) for v in versions):
        return None
    return sorted(versions, key=release_order)


# `docker image ls --digests --no-trunc --format '{{.Digest}} {{.ID}}'`: one line per tag of an image, its repository
# digest (<none> for an image built here) and its ID.
LISTING_LINE = re.compile(r"(?P<digest>sha256:[0-9a-f]{64}|<none>) (?P<id>sha256:[0-9a-f]{64})")
# A compile-cache folder of a pinned image is named by its digest's first 16 hex digits (_vllm_plan.image_key).
PINNED_DIGEST = re.compile(r"@sha256:(?P<key>[0-9a-f]{16})[0-9a-f]{48}$")
RECORD_NAME = re.compile(r"sha256-[0-9a-f]{64}[.]json")


def image_leftovers(records: t.Mapping[str, t.Any], listing: str, jit_root: str) -> list[str]:
    """What the collection keeps per image that outlived its image on the host (the rule docs/serving.md gives: they
    live as long as their image): the release record (path -> its text) of each image Docker no longer holds, and the
    compile-cache folder under `jit_root` its record names by the image's digest. A folder no record names (a floating
    image's, an operator's) is never returned, nor is one another image on the host still shares; a listing with no image
    line (Docker did not answer) removes nothing."""
    lines = [found for found in (LISTING_LINE.fullmatch(line.strip()) for line in listing.splitlines()) if found]
    if not lines:
        return []
    keys = {found["digest"][7:23] for found in lines if found["digest"] != "<none>"}
    ids = {found["id"] for found in lines}
    stale = []
    for path, text in records.items():
        folder, name = path.rsplit("/", 1)
        # The path record_path gives a held image's record is kept; only a name record_path writes is ever removed.
        if not RECORD_NAME.fullmatch(name) or path in {record_path(image_id, folder) for image_id in ids}:
            continue
        stale.append(path)
        try:
            image = json.loads(text or "").get("image")
        except (ValueError, AttributeError):
            continue
        pinned = PINNED_DIGEST.search(image) if isinstance(image, str) else None
        if pinned and pinned["key"] not in keys:
            stale.append(f"{jit_root.rstrip('/')}/{pinned['key']}")
    return sorted(set(stale))
