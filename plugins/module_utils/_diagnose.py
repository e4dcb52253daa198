# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A host's diagnostics bundle: plan files, units, containers, metrics, kernel messages, versions,
images, fabric and NVIDIA reports in one tarball, with every key redacted.

Private to the collection. Standard library only and Python 3.10: part of the host runtime
(_host_runtime.RUNTIME_MODULES), whose watchdog daemon imports it on a host without Ansible, as the
diagnose_bundle module does through Ansible. Commands and HTTP reads go through the callables the caller hands in (a recording
in the tests), each bounded by a time limit and all of them by the bundle's own.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
import typing as t
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import newest_files, prune_oldest, write_atomically
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_paths import PY_SPY, STACKS_DIR

# argv and a timeout in seconds -> (exit status, stdout, stderr); the status is None when the command
# did not finish in time and MISSING when its tool is not installed. (Aliases are evaluated at import,
# where ansible-test's pylint holds module_utils to Pythons older than 3.10: hence Optional.)
Runner = Callable[[list[str], float], tuple[t.Optional[int], str, str]]  # noqa: UP045
# URL and a timeout in seconds -> (HTTP status, body), or (None, why) when nothing answered.
Fetcher = Callable[[str, float], tuple[t.Optional[int], str]]  # noqa: UP045

MISSING = 127
REDACTED = "<redacted>"
CONFIG_DIRS = ("/etc/sparkfleet/vllm", "/etc/sparkfleet/cluster", "/etc/sparkfleet/gateway")
# The client the units run: another docker earlier on PATH may talk to another engine.
DOCKER = "/usr/bin/docker"
# A setting whose name holds one of these words is a secret, whatever else the name says.
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
# A JSON or YAML field that holds a secret ends with one of them (api_key, master_key, hf_token); key_env names one.
SECRET_FIELD = re.compile(r"(?:KEY|TOKEN|SECRET|PASSWORD)S?$", re.IGNORECASE)
# An environment variable's name as Docker's env files and --env spell it.
ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
# The one kind of environment setting whose value is not taken for a secret: the tuning and runtime knobs of the
# engine, its libraries and its image (addresses, interfaces, paths, versions), which the bundle must keep readable
# (NCCL_SOCKET_IFNAME's interface in fabric.txt, VLLM_HOST_IP in the plans). Any other name (an operator's
# GITHUB_PAT) is a secret; so is a knob whose name holds a secret word (VLLM_API_KEY, HF_TOKEN).
PUBLIC_ENV = re.compile(r"(?:VLLM|NCCL|GLOO|UCX|TP|CUDA|NV|NVIDIA|TORCH|PYTORCH|TRITON|FLASHINFER|OMP|MKL|HF|TRANSFORMERS|RAY|MASTER"
                        r"|LC|LD|PIP|UV)_[A-Z0-9_]*|PYTHON[A-Z0-9_]*|PATH|HOME|HOSTNAME|LANG|TERM|TZ|MAX_JOBS|DEBIAN_FRONTEND")
# LiteLLM's reference to an environment variable (the gateway's config and plan): a name, not a key.
ENV_REFERENCE = "os.environ/"
# A unit or container name as the collection writes it (the watchdog's _watchdog.PLAN_NAME; this file stands alone on a
# host): a plan naming anything else never reaches a command line or a member's name.
PLAN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@:-]{0,250}")
# vLLM's flags that take a secret, with their nargs: --api-key takes one key or more, --hf-token one at most.
SECRET_FLAGS = {"api-key": "+", "hf-token": "?"}
# argparse takes any unambiguous prefix of a long flag, and vLLM's parser reads _ as - in a flag's name (up to a
# dot): --hf-tok, --api_ke=, --ap. One letter never is: --host and --allowed-origins make --h and --a ambiguous.
MIN_FLAG_PREFIX = 2
# Scrubbing a shorter value from free text would mangle the bundle (a *_KEY setting of "true");
# no key the collection writes is that short.
MIN_SECRET = 8


def flag_spellings() -> bytes:
    """Every spelling argparse takes of a secret flag, as a regular expression: its prefixes, _ for -."""
    prefixes = {flag[:length] for flag in SECRET_FLAGS for length in range(MIN_FLAG_PREFIX, len(flag) + 1)}
    return b"|".join("".join("[-_]" if char == "-" else re.escape(char) for char in prefix).encode()
                     for prefix in sorted(prefixes, key=len, reverse=True))


# Second line of defence for values shorter than MIN_SECRET or no file named: a secret flag's value in a command line
# or in a JSON or Python list, a secret NAME=value setting, a bearer token.
TEXT_PATTERNS = (
    (re.compile(rb"(--(?:%s)(?:=|\s+))[^\s\"',\\]+" % flag_spellings()), rb"\1" + REDACTED.encode()),
    (re.compile(rb"([\"']--(?:%s)[\"']\s*,\s*[\"'])[^\"'\\]+" % flag_spellings()), rb"\1" + REDACTED.encode()),
    (re.compile(rb"\b([A-Z0-9_]*(?:KEY|TOKEN|SECRET|PASSWORD)[A-Z0-9_]*=)[^\s\"',\\]+"), rb"\1" + REDACTED.encode()),
    (re.compile(rb"(Bearer\s+)[^\s\"',\\]+", re.IGNORECASE), rb"\1" + REDACTED.encode()),
)
KERNEL_LINES = re.compile(r"out of memory|oom[-_ ]?kill|oom_reaper|\boom\b|killed process|NVRM|\bXid\b", re.IGNORECASE)
# Plan files sit in a role's folder, the last good copies in last-good/, the gateway's LiteLLM config in litellm/.
PLAN_FOLDERS = ("", "last-good", "litellm")
PLAN_SUFFIXES = (".json", ".yaml")
OTHER_UNITS = ("earlyoom.service", "docker.service")
# The name of every bundle diagnose_bundle writes starts so, then the host's name (bundle_prefix).
BUNDLE_PREFIX = "sparkfleet-diagnose-"
# An engine's processes whose stacks a bundle reads: vLLM's API server, engine core and workers, with room for Ray's.
STACK_PROCESSES = 16
# The watchdog's stack files kept on a host, the newest (each a few kilobytes per process).
STACK_FILES_KEPT = 20
# Read while the watchdog holds a wedged engine's restart: short, so the restart is not held long.
STACKS_TIME_LIMIT = 10.0
STACKS_TOTAL_LIMIT = 60.0
# Tools such as ibdev2netdev live in sbin, which a non-login PATH can lack.
SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")


AS_ROOT = "; run it as root, the owner of the env files"


class DiagnoseError(Exception):
    """The bundle cannot be made safely (an env file whose keys cannot be read) or written."""


def run_command(argv: list[str], timeout: float) -> tuple[int | None, str, str]:
    """The Runner for a real host. The command runs in its own process group, killed whole on timeout,
    so a script's children (nvidia-bug-report.sh) cannot hold the bundle past its limit."""
    tool = shutil.which(argv[0], path=os.pathsep.join([os.environ.get("PATH", ""), *SBIN]))
    if tool is None:
        return MISSING, "", f"{argv[0]} is not installed"
    try:
        process = subprocess.Popen([tool, *argv[1:]], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   start_new_session=True, text=True, errors="replace")
    except OSError as error:
        return 126, "", f"{tool} cannot run ({error.strerror})"
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        try:
            out, err = process.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            out, err = "", ""
        return None, out, f"{err}timed out after {timeout:.0f} s"
    return process.returncode, out, err


def http_get(url: str, timeout: float) -> tuple[int | None, str]:
    """The Fetcher for a real host: a plain GET, past any proxy (the URLs are the host's own servers)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as reply:
            return reply.status, reply.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as error:
        return None, f"{url}: {getattr(error, 'reason', error)}"


def bundle_prefix(host: str) -> str:
    """The start of the name of every bundle of this host: what its folder's pruning removes, and nothing else."""
    return f"{BUNDLE_PREFIX}{re.sub(r'[^A-Za-z0-9._-]', '_', host)}-"


def bundle_path(folder: str, host: str, when: float) -> str:
    """Where a host's bundle made at `when` (seconds since the epoch) goes."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when))
    return os.path.join(folder, f"{bundle_prefix(host)}{stamp}.tar.gz")


def secret_env(name: str) -> bool:
    """Whether an environment setting's value is a secret: every one but the public knobs (PUBLIC_ENV)."""
    return bool(SECRET_NAME.search(name)) or not PUBLIC_ENV.fullmatch(name)


def secret_field(name: str) -> bool:
    """Whether a plan's field (a JSON key, a YAML key) holds a secret: an environment name as secret_env judges it,
    any other name when it ends with a secret word."""
    return secret_env(name) if ENV_NAME.fullmatch(name) else bool(SECRET_FIELD.search(name))


def learnt(values: Iterable[str]) -> set[str]:
    """The values long enough to be scrubbed from free text, each as given, trimmed and unquoted (for a reader that
    strips quotes); LiteLLM's os.environ/ references are names, not values."""
    found = {spelling for value in values for spelling in (value, value.strip(), value.strip().strip("\"'"))}
    return {value for value in found if len(value) >= MIN_SECRET and not value.startswith(ENV_REFERENCE)}


def config_dir_problems(configured: Sequence[t.Any]) -> list[str]:
    """What is wrong with the configuration folders given: each must be an absolute path."""
    fix = "set vllm_config_dir, cluster_config_dir, gateway_config_dir and watchdog_plan_dirs to absolute folders"
    if not configured:
        return [f"config_dirs is empty, so no plan and no key would be read; {fix}"]
    return [f"config_dirs[{index}]: {folder!r} is not an absolute folder; {fix}"
            for index, folder in enumerate(configured) if not isinstance(folder, str) or not folder.startswith("/")]


def config_folders(configured: Sequence[str]) -> list[str]:
    """The folders to read: those the inventory configured, then the collection's default folders not among them (an
    inventory that moved a role's folder may have left keys in the old one, which old journal lines printed), each once
    in one spelling (/etc/sparkfleet/vllm/ and //etc/sparkfleet/vllm are the same folder)."""
    return list(dict.fromkeys("/" + "/".join(part for part in folder.split("/") if part) for folder in [*configured, *CONFIG_DIRS]))


def env_secrets(text: str) -> set[str]:
    """The secret values of an env file (NAME=value, the value taken to the end of the line as Docker does): every
    setting's but the public knobs'. Env files are where the collection keeps secrets, so a name it does not know is
    taken for one."""
    values = []
    for line in text.splitlines():
        name, separator, value = line.partition("=")
        if separator and not name.lstrip().startswith("#") and secret_env(name.strip()):
            values.append(value)
    return learnt(values)


def secret_flag(arg: str) -> tuple[str, str | None] | None:
    """The secret flag an argument sets in any spelling argparse takes (an unambiguous prefix, _ for -) and its value
    when given with =; None for any other argument."""
    if not arg.startswith("--"):
        return None
    name, separator, value = arg[2:].partition("=")
    name = name.split(".", 1)[0].replace("_", "-")
    for flag in SECRET_FLAGS:
        if len(name) >= MIN_FLAG_PREFIX and flag.startswith(name):
            return flag, value if separator else None
    return None


def redact_args(args: Sequence[t.Any]) -> tuple[list[t.Any], set[str]]:
    """The arguments with the values of secret flags replaced, and those values: NAME=value settings of a secret
    name too (docker run --env). A flag's separate values follow it up to the next option, as many as its nargs
    takes; the first is taken even when it starts with one dash (a key may), the next ones only when they do not."""
    redacted: list[t.Any] = []
    found: set[str] = set()
    taking, taken = "", 0
    for arg in args:
        text = str(arg)
        if taking and not text.startswith("--") and (taken == 0 or not text.startswith("-")):
            found.add(text)
            redacted.append(REDACTED)
            taken += 1
            taking = taking if taking == "+" else ""
            continue
        taking, taken = "", 0
        flag = secret_flag(text)
        setting, separator, value = text.partition("=")
        if flag is not None and flag[1] is not None:
            found.add(flag[1])
            redacted.append(f"{setting}={REDACTED}")
        elif flag is not None:
            redacted.append(arg)
            taking = SECRET_FLAGS[flag[0]]
        elif separator and ENV_NAME.fullmatch(setting) and secret_env(setting):
            found.add(value)
            redacted.append(f"{setting}={REDACTED}")
        else:
            redacted.append(arg)
    return redacted, learnt(found)


def text_args(text: str) -> list[str]:
    """A text's words as a command line, line after line: each line split as a shell (and systemd's Exec lines, near
    enough) would, or at its blanks when its quotes do not pair up; a YAML list's dash left out."""
    words: list[str] = []
    for line in text.splitlines():
        try:
            line_words = shlex.split(line, comments=False)
        except ValueError:
            line_words = line.split()
        words += line_words[1:] if line_words[:1] == ["-"] else line_words
    return words


def plan_secrets(data: bytes) -> set[str]:
    """The secret values a plan file holds (JSON, or YAML read as text): the values of secret flags in any spelling,
    in every list (docker_run, serve_args) and every text (the unit file's Exec lines); NAME=value settings of a
    secret name; the values of secret fields (api_key, HF_TOKEN in an env map). A plan is no place for them, but a
    key given as an extra argument once landed there, and the plan outlives the container that showed it."""
    text = data.decode("utf-8", "replace")
    try:
        # The gateway's LiteLLM config is JSON below a comment line.
        document = json.loads("\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    except ValueError:
        fields = [line.partition(":") for line in text.splitlines()]
        values = [value.strip().rstrip(",") for name, separator, value in fields
                  if separator and secret_field(name.strip().lstrip("- ").strip("\"'"))]
        return redact_args(text_args(text))[1] | learnt(values)
    found: set[str] = set()
    pending: list[t.Any] = [document]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            found |= learnt(value for name, value in item.items() if isinstance(value, str) and secret_field(str(name)))
            pending += item.values()
        elif isinstance(item, list):
            found |= redact_args([arg for arg in item if isinstance(arg, (str, int, float))])[1]
            pending += item
        elif isinstance(item, str):
            found |= redact_args(text_args(item))[1]
    return found


def redact_inspect(text: str) -> tuple[str, set[str]]:
    """docker inspect's JSON with every environment value and every secret argument replaced, and the
    secret values it held (to be scrubbed from the other members). Raises ValueError when it is not JSON."""
    containers = json.loads(text)
    found: set[str] = set()
    if not isinstance(containers, list) or not all(isinstance(c, dict) and isinstance(c.get("Config") or {}, dict) for c in containers):
        # Not docker inspect's shape, so not known to be redacted: left out like text that is no JSON.
        raise ValueError("docker inspect answered JSON of another shape")
    for container in containers:
        config = container.get("Config") or {}
        if isinstance(config.get("Env"), list):
            settings = [str(entry).partition("=") for entry in config["Env"]]
            found |= learnt(value for name, _sep, value in settings if secret_env(name))
            config["Env"] = [f"{name}={REDACTED}" for name, _sep, _value in settings]
        for holder, key in ((config, "Cmd"), (config, "Entrypoint"), (container, "Args")):
            if isinstance(holder.get(key), list):
                holder[key], values = redact_args(holder[key])
                found |= values
    return json.dumps(containers, indent=2) + "\n", found


def spellings(value: str) -> set[str]:
    """A secret as the bundle's members may hold it: as is, in a systemd Exec line (the plans' unit files: % and $
    doubled, quoted with backslashes) and as a shell quotes it (a logged command line), each also inside a JSON string
    (plans, docker inspect) and a Python string (vLLM's log of its arguments)."""
    systemd = value.replace("%", "%%").replace("$", "$$")
    forms = {value, systemd, systemd.replace("\\", "\\\\").replace('"', '\\"'), shlex.quote(value)}
    return {spelling for form in forms for spelling in (form, json.dumps(form)[1:-1], repr(form)[1:-1])}


def scrub(data: bytes, secrets: Iterable[str]) -> bytes:
    """Every spelling of every known secret value, then every secret-looking setting left, replaced; the longest
    first (a key that contains another is removed whole)."""
    for secret in sorted({spelling for value in secrets for spelling in spellings(value)}, key=len, reverse=True):
        data = data.replace(secret.encode(), REDACTED.encode())
    for pattern, replacement in TEXT_PATTERNS:
        data = pattern.sub(replacement, data)
    return data


def survey(config_dirs: Sequence[str]) -> dict[str, t.Any]:
    """What the config folders hold: the plan files as members, the plans of what is deployed now (last
    good copies describe the past), the secret values of every env file, and what the plans name:
    units, containers, /metrics URLs and whether the host serves a cluster's rank. A folder or env file
    that cannot be read raises: its keys could not be scrubbed."""
    files: dict[str, bytes] = {}
    plans: dict[str, dict[str, t.Any]] = {}
    secrets: set[str] = set()
    problems: list[str] = []
    for index, folder in enumerate(config_dirs):
        label = os.path.basename(folder.rstrip("/")) or "root"
        label = label if not any(member.startswith(f"plans/{label}/") for member in files) else f"{label}-{index}"
        for sub in PLAN_FOLDERS:
            path = os.path.join(folder, sub) if sub else folder
            try:
                names = sorted(os.listdir(path))
            except FileNotFoundError:
                continue
            except OSError as error:
                raise DiagnoseError(f"{path}: cannot be listed ({error.strerror}), so the keys of its env files could not be "
                                    f"kept out of the bundle{AS_ROOT if isinstance(error, PermissionError) else ''}") from error
            for name in names:
                full, is_env = os.path.join(path, name), name.endswith(".env")
                # A plan file is never followed through a link: it could lead the bundle to any file on the host.
                if not os.path.isfile(full) or not (is_env or (name.endswith(PLAN_SUFFIXES) and not os.path.islink(full))):
                    continue
                try:
                    with open(full, "rb") as handle:
                        data = handle.read()
                except OSError as error:
                    if is_env:
                        raise DiagnoseError(f"{full}: cannot be read ({error.strerror}), so its keys could not be kept out of "
                                            f"the bundle{AS_ROOT if isinstance(error, PermissionError) else ''}") from error
                    problems.append(f"{full}: cannot be read ({error.strerror})")
                    continue
                if is_env:
                    secrets |= env_secrets(data.decode("utf-8", "replace"))
                    continue
                files["/".join(["plans", label, *([sub] if sub else []), name])] = data
                secrets |= plan_secrets(data)
                if not sub and name.endswith(".json"):
                    try:
                        plans[f"{label}-{name.removesuffix('.json')}"] = json.loads(data)
                    except ValueError as error:
                        problems.append(f"{full}: not JSON ({error})")
    plans = {stem: plan for stem, plan in plans.items() if isinstance(plan, dict)}
    named: dict[str, set[str]] = {"unit": set(), "container": set()}
    for stem, plan in plans.items():
        for key, names in named.items():
            if isinstance(plan.get(key), str) and PLAN_NAME.fullmatch(plan[key]):
                names.add(plan[key])
            elif key in plan:
                problems.append(f"plan {stem}: its {key} {str(plan[key])[:80]!r} is no name the collection writes; left out")
    return {
        "files": files, "secrets": secrets, "problems": problems,
        "units": sorted(named["unit"]),
        "containers": sorted(named["container"]),
        # Only engines answer /metrics: the gateway's plans and a cluster's workers (no API) are left out.
        "metrics": {stem: plan["url"] for stem, plan in plans.items()
                    if isinstance(plan.get("url"), str) and plan.get("container") and plan.get("kind") != "gateway"
                    and (not isinstance(plan.get("cluster"), dict) or plan["cluster"].get("head"))},
        "cluster": any(plan.get("cluster") for plan in plans.values()),
    }


class Collector:
    """Runs commands and reads under the per-command limit and the bundle's deadline, keeping the
    members, what the manifest says about each command, and what went wrong."""

    def __init__(self, run: Runner, fetch: Fetcher, time_limit: float, total_limit: float, clock: Callable[[], float]) -> None:
        self.run, self.fetch, self.time_limit, self.clock = run, fetch, time_limit, clock
        self.deadline = clock() + total_limit
        self.members: dict[str, bytes] = {}
        self.commands: list[dict[str, t.Any]] = []
        self.problems: list[str] = []

    def _limit(self, member: str, what: dict[str, t.Any]) -> float | None:
        left = self.deadline - self.clock()
        if left <= 0:
            self.commands.append({"member": member, **what, "skipped": True})
            return None
        return min(self.time_limit, left)

    def command(self, member: str, argv: list[str]) -> tuple[int | None, str, str] | None:
        """(rc, stdout, stderr), or None when the bundle's time was up and the command was skipped."""
        limit = self._limit(member, {"command": argv})
        if limit is None:
            return None
        start = self.clock()
        rc, out, err = self.run(argv, limit)
        self.commands.append({"member": member, "command": argv, "rc": rc, "seconds": round(self.clock() - start, 2),
                              "timed_out": rc is None, "missing": rc == MISSING, "skipped": False})
        if rc is None:
            self.problems.append(f"{shlex.join(argv)}: timed out after {limit:.0f} s")
        return rc, out, err

    def output(self, member: str, argv: list[str]) -> None:
        """One command's output as one member; a tool not installed or a command skipped adds nothing."""
        result = self.command(member, argv)
        if result is not None and result[0] != MISSING:
            self.members[member] = output_text(*result).encode()

    def sections(self, member: str, commands: Iterable[list[str]]) -> None:
        """Several commands' outputs as one member, each under its command line."""
        self.members[member] = "".join(section(argv, self.command(member, argv)) for argv in commands).encode()

    def get(self, member: str, url: str) -> None:
        limit = self._limit(member, {"url": url})
        if limit is None:
            return
        start = self.clock()
        status, body = self.fetch(url, limit)
        self.commands.append({"member": member, "url": url, "status": status, "seconds": round(self.clock() - start, 2),
                              "skipped": False})
        if status is None:
            self.problems.append(f"{url}: no answer ({body})")
            body = f"(no answer: {body})\n"
        elif status != 200:
            # An error page is no metrics (seen: a 401's text, which the scrub then redacted into nonsense).
            self.problems.append(f"{url}: HTTP {status}, no metrics")
            body = f"(HTTP {status}, no metrics: {body[:200]!r})\n"
        self.members[member] = body.encode()


def output_text(rc: int | None, out: str, err: str) -> str:
    """A command's stdout, its stderr below a marker, and how it ended unless it exited 0."""
    if rc == MISSING:
        return "(not installed)\n"
    status = {None: "timed out", 0: ""}.get(rc, f"exit status {rc}")
    out = out if not out or out.endswith("\n") else out + "\n"
    return out + (f"--- stderr ---\n{err.rstrip()}\n" if err.strip() else "") + (f"({status})\n" if status else "")


def section(argv: list[str], result: tuple[int | None, str, str] | None, keep: Callable[[str], t.Any] | None = None) -> str:
    """A command's output under its command line; `keep` picks the lines of its stdout worth keeping."""
    if result is None:
        return f"$ {shlex.join(argv)}\n(skipped: the bundle's time limit was reached)\n\n"
    rc, out, err = result
    if keep is not None:
        out = "".join(line for line in out.splitlines(keepends=True) if keep(line)) or ("(no matching line)\n" if rc == 0 else "")
    return f"$ {shlex.join(argv)}\n{output_text(rc, out, err)}\n"


def container_pids(listing: str) -> list[str]:
    """The host PIDs in `docker top CONTAINER -eo pid,comm`'s answer, in its order: its header and any line that starts
    with no PID left out."""
    return [words[0] for words in (line.split() for line in listing.splitlines()) if words and words[0].isdigit()]


def engine_stacks(bundle: Collector, container: str) -> str:
    """The Python stack of each of the container's processes, under its command line, as the member it returns. py-spy
    reads them from the processes' memory without pausing them (--nonblocking): a bundle never stalls a serving engine,
    and a frozen one (SIGSTOP, a hang in a collective) is read all the same. A wedge reported upstream needs them."""
    member = f"stacks/{container}.txt"
    listing = [DOCKER, "top", container, "-eo", "pid,comm"]
    listed = bundle.command(member, listing)
    text = section(listing, listed)
    pids = container_pids(listed[1]) if listed is not None and listed[0] == 0 else []
    for pid in pids[:STACK_PROCESSES]:
        argv = [PY_SPY, "dump", "--nonblocking", "--pid", pid]
        result = bundle.command(member, argv)
        if result is not None and result[0] == MISSING:
            text += f"(py-spy is not installed at {PY_SPY}, so no stack was read: docs/diagnose.md says how it is installed)\n"
            break
        text += section(argv, result)
    if len(pids) > STACK_PROCESSES:
        text += f"({len(pids) - STACK_PROCESSES} more processes not read: the first {STACK_PROCESSES} are the engine's own)\n"
    bundle.members[member] = text.encode()
    return member


def save_engine_stacks(container: str, unit: str, config_dirs: Sequence[str], when: float, folder: str = STACKS_DIR,
                       run: Runner = run_command) -> str:
    """The container's engine stacks, scrubbed of every key the config folders hold, written 0600 to a file of `folder`
    named after the unit and `when` (seconds since the epoch): the watchdog's record of a wedged engine, read before it
    kills the engine and taken into every later bundle. The oldest files beyond STACK_FILES_KEPT go. Returns its path;
    raises DiagnoseError or OSError as collect_bundle does."""
    if not PLAN_NAME.fullmatch(container) or not PLAN_NAME.fullmatch(unit):
        raise DiagnoseError(f"{container!r} or {unit!r} is no name the collection writes")
    secrets = survey(config_dirs)["secrets"]
    bundle = Collector(run, http_get, STACKS_TIME_LIMIT, STACKS_TOTAL_LIMIT, time.monotonic)
    member = engine_stacks(bundle, container)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    path = os.path.join(folder, f"{unit}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(when))}.txt")
    write_atomically(path, scrub(bundle.members[member], secrets), 0o600)
    prune_oldest(folder, "", ".txt", STACK_FILES_KEPT)
    return path


def saved_stacks(folder: str) -> dict[str, bytes]:
    """The watchdog's stack files (save_engine_stacks), the newest STACK_FILES_KEPT by modification time; a link is never
    followed and a file the watchdog removes meanwhile is left out."""
    files = {}
    for name in newest_files(folder, "", ".txt")[:STACK_FILES_KEPT]:
        try:
            descriptor = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        with os.fdopen(descriptor, "rb") as handle:
            files[name] = handle.read()
    return files


def collect_bundle(destination: str, config_dirs: Sequence[str], time_limit: float, run: Runner, fetch: Fetcher,
                   total_limit: float = 300.0, clock: Callable[[], float] = time.monotonic, stacks_dir: str = STACKS_DIR) -> dict[str, t.Any]:
    """Collect the host's bundle and write it to `destination` (.tar.gz, mode 0600; its folder created
    0700 when missing). Returns {path, members, problems, size}; raises DiagnoseError or OSError when
    the bundle cannot be made safely or written."""
    started, when = clock(), time.time()
    found = survey(config_dirs)
    folder = os.path.dirname(os.path.abspath(destination))
    if not os.path.isdir(folder):
        os.makedirs(folder, mode=0o700)
        os.chmod(folder, 0o700)
    bundle = Collector(run, fetch, time_limit, total_limit, clock)
    bundle.members.update(found["files"])
    bundle.problems.extend(found["problems"])
    secrets = set(found["secrets"])
    listed = bundle.command("units/list-units.txt", ["systemctl", "list-units", "sparkfleet-*", "--all", "--plain", "--no-pager"])
    if listed is not None and listed[0] != MISSING:
        bundle.members["units/list-units.txt"] = output_text(*listed).encode()
    listed_units = {line.split()[0] for line in (listed[1] if listed else "").splitlines() if line.startswith("sparkfleet-")}
    # The most telling first, so a bundle cut short by its time limit still holds them.
    boot = ["journalctl", "-k", "-b", "0", "--no-pager", "-o", "short-iso"]
    current = bundle.command("kernel.txt", boot)
    # Without a journal of the kernel (journalctl then prints only "-- No entries --"), the ring buffer.
    if current is not None and (current[0] != 0 or all(line.startswith("-- ") for line in current[1].splitlines())):
        boot = ["dmesg", "-T"]
        current = bundle.command("kernel.txt", boot)
    # The boot before this one too: a GB10 frozen by a memory leak comes back only through a reset.
    previous = ["journalctl", "-k", "-b", "-1", "--no-pager", "-o", "short-iso"]
    bundle.members["kernel.txt"] = (section(boot, current, KERNEL_LINES.search)
                                    + section(previous, bundle.command("kernel.txt", previous), KERNEL_LINES.search)).encode()
    for container in found["containers"]:
        member = f"containers/{container}.inspect.json"
        inspected = bundle.command(member, [DOCKER, "inspect", container])
        if inspected is not None and inspected[0] != MISSING:
            try:
                text, values = redact_inspect(inspected[1])
                secrets |= values
                text += output_text(inspected[0], "", inspected[2])
            except ValueError:
                text = "(docker inspect gave no JSON: left out, so that no value escapes unredacted)\n" + output_text(inspected[0], "", inspected[2])
            bundle.members[member] = text.encode()
        bundle.output(f"containers/{container}.log", [DOCKER, "logs", "--tail", "500", "--timestamps", container])
        engine_stacks(bundle, container)
    for name, data in saved_stacks(stacks_dir).items():
        bundle.members[f"watchdog-stacks/{name}"] = data
    for stem, url in found["metrics"].items():
        bundle.get(f"metrics/{stem}.txt", url.rstrip("/") + "/metrics")
    for unit in [*sorted(set(found["units"]) | listed_units), *OTHER_UNITS]:
        bundle.output(f"units/{unit}.show.txt", ["systemctl", "show", unit])
        bundle.output(f"units/{unit}.journal.txt", ["journalctl", "-u", unit, "--no-pager", "-n", "1000", "-o", "short-iso"])
    bundle.sections("versions.txt", [["uname", "-a"], ["cat", "/proc/cmdline"], ["cat", "/proc/driver/nvidia/version"],
                                     ["dpkg-query", "-W", "-f", "${db:Status-Abbrev} ${Package} ${Version}\\n",
                                      "nvidia-*", "libnvidia-*", "cuda-*", "linux-image-*"],
                                     ["apt-mark", "showhold"]])
    bundle.output("images.txt", [DOCKER, "image", "ls", "--digests", "--no-trunc"])
    if found["cluster"]:
        # ip -o link shows each interface's MTU: a fast link below 9000 halves NCCL's bandwidth.
        bundle.sections("fabric.txt", [["ip", "-br", "addr"], ["ip", "-o", "link"], ["ibdev2netdev"], ["show_gids"]])
    bundle.output("nvidia/nvidia-smi-q.txt", ["nvidia-smi", "-q"])
    bug_report(bundle, folder)
    skipped = sum(entry["skipped"] for entry in bundle.commands)
    if skipped:
        bundle.problems.append(f"the bundle's total time limit ({total_limit:.0f} s) was reached: {skipped} commands skipped")
    members = [*bundle.members, "MANIFEST.json"]
    bundle.members["MANIFEST.json"] = json.dumps({
        "host": socket.gethostname(), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when)),
        "config_dirs": list(config_dirs), "time_limit": time_limit, "total_limit": total_limit, "seconds": round(clock() - started, 2),
        "complete": not skipped, "members": members, "commands": bundle.commands, "problems": bundle.problems,
    }, indent=2).encode()
    size = write_tarball(destination, {name: scrub(data, secrets) for name, data in bundle.members.items()}, when)
    return {"path": destination, "members": members, "problems": bundle.problems, "size": size}


def collect_host_bundle(destination: str, config_dirs: Sequence[str], time_limit: float, total_limit: float = 300.0,
                        stacks_dir: str = STACKS_DIR) -> dict[str, t.Any]:
    """collect_bundle on the host this runs on: the diagnose_bundle module's, and the watchdog's when it gives up."""
    return collect_bundle(destination, config_dirs, time_limit, run_command, http_get, total_limit, stacks_dir=stacks_dir)


def bug_report(bundle: Collector, folder: str) -> None:
    """nvidia-bug-report.sh's log (gzip, named by the script) added as text, so the final scrub reaches it.
    It writes into a private temporary folder beside the bundle, removed afterwards."""
    report_folder = tempfile.mkdtemp(prefix=".bug-report-", dir=folder)
    try:
        argv = ["nvidia-bug-report.sh", "--output-file", os.path.join(report_folder, "nvidia-bug-report.log")]
        result = bundle.command("nvidia/nvidia-bug-report.log", argv)
        # A report cut short by the time limit is still worth its lines.
        for name in sorted(os.listdir(report_folder)) if result is not None and result[0] != MISSING else []:
            with open(os.path.join(report_folder, name), "rb") as handle:
                data = handle.read()
            try:
                bundle.members[f"nvidia/{name.removesuffix('.gz')}"] = gzip.decompress(data) if name.endswith(".gz") else data
            except (OSError, EOFError) as error:
                bundle.problems.append(f"nvidia-bug-report.sh left a damaged {name} ({error})")
    finally:
        shutil.rmtree(report_folder, ignore_errors=True)


def write_tarball(destination: str, members: dict[str, bytes], when: float) -> int:
    """Write the members as a .tar.gz under one folder named after the bundle, atomically (a temporary
    file in the same folder, created 0600, renamed over the destination); returns its size."""
    prefix = os.path.basename(destination).removesuffix(".tar.gz")
    handle, temporary = tempfile.mkstemp(prefix=".diagnose-", suffix=".tmp", dir=os.path.dirname(os.path.abspath(destination)))
    try:
        with os.fdopen(handle, "wb") as raw:
            with tarfile.open(fileobj=raw, mode="w:gz") as archive:
                for name, data in members.items():
                    info = tarfile.TarInfo(f"{prefix}/{name}")
                    info.size, info.mode, info.mtime = len(data), 0o600, int(when)
                    archive.addfile(info, io.BytesIO(data))
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(temporary, destination)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    return os.path.getsize(destination)
