"""A stand-in for ``docker run ... --entrypoint hf IMAGE download ...`` as vllm_model_stage runs it.

Unit tests have no Docker and no huggingface_hub, so this script takes docker's place on PATH:
it reads the options the module gives docker (the /stage volume, --env with and without a value),
and does what ``hf download`` does against HF_ENDPOINT over real HTTP - the revision's file list
from /api/models/<repo>/revision/<revision> (printed as JSON with --dry-run), each file from
/<repo>/resolve/<commit>/<path> into --local-dir, an unfinished one kept under
.cache/huggingface/download and resumed with a Range request. Each call's argv is appended to
the file named by STAND_IN_LOG, so a test can see what the module passed.
"""

import fnmatch
import json
import os
import sys
import urllib.error
import urllib.request

VALUED = {"--name", "--network", "--env", "--volume", "--entrypoint"}


def docker_run(argv):
    """(environment, volumes, image arguments) of ``docker run`` as vllm_model_stage calls it."""
    environment, volumes, index = {}, {}, 1
    while argv[index].startswith("--"):
        option = argv[index]
        if option in VALUED:
            value = argv[index + 1]
            index += 2
            if option == "--env":
                key, assigned, given = value.partition("=")
                environment[key] = given if assigned else os.environ.get(key, "")
            elif option == "--volume":
                host, container = value.split(":")
                volumes[container] = host
        else:
            index += 1
    return environment, volumes, argv[index + 1:]


def request(url, environment, method="GET", start=0):
    headers = {"Authorization": f"Bearer {environment['HF_TOKEN']}"} if environment.get("HF_TOKEN") else {}
    if start:
        headers["Range"] = f"bytes={start}-"
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers, method=method), timeout=30)


def human_size(size):
    """huggingface_hub's _format_size: one decimal, units of 1000 without a B."""
    number = float(size)
    for unit in ("", "K", "M", "G", "T", "P", "E", "Z"):
        if abs(number) < 1000.0:
            return f"{number:3.1f}{unit}"
        number /= 1000.0
    return f"{number:.1f}Y"


def file_size(endpoint, repo, commit, relative, environment):
    with request(f"{endpoint}/{repo}/resolve/{commit}/{relative}", environment, "HEAD") as head:
        return int(head.headers.get("X-Linked-Size") or head.headers["Content-Length"])


def download(endpoint, repo, commit, relative, local_dir, environment):
    """One file into local_dir, through an .incomplete file that a later run resumes."""
    url = f"{endpoint}/{repo}/resolve/{commit}/{relative}"
    size = file_size(endpoint, repo, commit, relative, environment)
    final = os.path.join(local_dir, relative)
    incomplete = os.path.join(local_dir, ".cache", "huggingface", "download", relative + ".incomplete")
    os.makedirs(os.path.dirname(incomplete), exist_ok=True)
    start = os.path.getsize(incomplete) if os.path.exists(incomplete) else 0
    with request(url, environment, start=start) as reply, open(incomplete, "ab") as handle:
        for block in iter(lambda: reply.read(1 << 16), b""):
            handle.write(block)
    if os.path.getsize(incomplete) != size:
        raise OSError(f"Consistency check failed: file should be of size {size} but has size {os.path.getsize(incomplete)} ({relative})")
    os.makedirs(os.path.dirname(final) or local_dir, exist_ok=True)
    os.replace(incomplete, final)


def hf_download(args, environment, volumes):
    repo, revision = args[1], args[args.index("--revision") + 1]
    include = [args[i + 1] for i, arg in enumerate(args) if arg == "--include"]
    endpoint = environment.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    with request(f"{endpoint}/api/models/{repo}/revision/{revision}", environment) as reply:
        info = json.load(reply)
    files = [s["rfilename"] for s in info["siblings"] if not include or any(fnmatch.fnmatch(s["rfilename"], p) for p in include)]
    if "--dry-run" in args:
        # As huggingface_hub 2.4.0's CLI prints it: a line, then each file with its size in decimal units.
        print(f"[dry-run] Will download {len(files)} files (out of {len(files)}).")
        print(json.dumps([{"file": name, "size": human_size(file_size(endpoint, repo, info["sha"], name, environment))} for name in files]))
        return
    stage = args[args.index("--local-dir") + 1]
    local_dir = volumes["/stage"] + stage[len("/stage"):]
    # hf downloads files side by side: one that fails leaves the others to finish.
    failures = []
    for relative in files:
        if not os.path.exists(os.path.join(local_dir, relative)):
            try:
                download(endpoint, repo, info["sha"], relative, local_dir, environment)
            except OSError as error:
                failures.append(error)
    if failures:
        raise failures[0]


def main():
    with open(os.environ["STAND_IN_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps(sys.argv[1:]) + "\n")
    environment, volumes, args = docker_run(sys.argv[1:])
    try:
        hf_download(args, environment, volumes)
    except (OSError, urllib.error.URLError) as error:
        print(f"Error: {type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
