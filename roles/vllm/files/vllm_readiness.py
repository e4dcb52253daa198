"""Wait until a vLLM instance serves; run by the instance's systemd unit (ExecStartPost), so the
next instance starts only after this one is ready, and at every boot.

The verdict is sparkfleet.vllm's plugins/module_utils/_vllm_health.py, which the vllm role
installs beside this file: the boot path and the health gate judge alike. This file only
supplies the HTTP call and docker inspect. Exits 0 once ready, 1 with the reason otherwise.

A start whose settings never served on this image's caches (no stamp) compiles: it is waited on
for the cold timeout, and once ready the stamp is written, so later starts get the warm one. When
a cold start's engine exits after compiling (seed 001), systemd restarts the unit and this wait
runs again.
"""

import argparse
import http.client
import os
import subprocess
import sys
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _vllm_health import (  # noqa: E402
    POLL_INTERVAL,
    DockerUnanswered,
    Reply,
    capacity_check,
    container_snapshot,
    exception_reply,
    mark_warm,
    missing_container,
    parse_env_file,
    start_timeout,
    wait_until_ready,
)


def get(url, api_key, timeout=5):
    request = urllib.request.Request(url, headers={"Authorization": "Bearer " + api_key} if api_key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return Reply(response.status, response.read().decode("utf-8", "replace"))
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as error:
        return exception_reply(error)


def inspect(container):
    completed = subprocess.run(["docker", "inspect", container], capture_output=True, text=True, check=False)
    if completed.returncode != 0 and not missing_container(completed.stderr):
        raise DockerUnanswered(completed.stderr.strip())
    return container_snapshot(completed.stdout) if completed.returncode == 0 else None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--container", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--env-file", required=True)
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--cold-timeout", type=float, required=True)
    parser.add_argument("--stamp", required=True)
    parser.add_argument("--served-name", action="append", required=True)
    # Absent from the units of releases before it: their starts are not compared.
    parser.add_argument("--kv-cache-warn-share", type=float)
    args = parser.parse_args(argv)
    timeout, cold = start_timeout(args.timeout, {"timeout": args.cold_timeout, "stamp": args.stamp})
    with open(args.env_file, encoding="utf-8") as handle:
        api_key = parse_env_file(handle.read()).get("VLLM_API_KEY")
    url = args.url.rstrip("/") + "/v1/models"
    result = wait_until_ready(lambda: get(url, api_key), lambda: inspect(args.container), args.served_name, timeout, POLL_INTERVAL)
    print(f"{args.container}: {'cold' if cold else 'warm'} start, {result['reason']} after {result['elapsed']} s", file=sys.stderr)
    if not result["ok"]:
        return 1
    tokens, warning = capacity_check(get(args.url.rstrip("/") + "/metrics", api_key), args.stamp, args.kv_cache_warn_share)
    print(f"{args.container}: " + (f"WARNING: {warning}" if warning else f"the KV cache holds {tokens:,} tokens" if tokens else
                                   "the KV cache size is not on its /metrics page"), file=sys.stderr)
    try:
        # A unit without the share compares nothing, so its starts are no reference either.
        mark_warm(args.stamp, tokens if args.kv_cache_warn_share else None, degraded=bool(warning))
    except OSError as error:
        print(f"{args.stamp}: the warm stamp cannot be written ({error.strerror}); the next start waits the cold timeout", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
