# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reaching a vLLM endpoint from a module: HTTP calls and the endpoint of an instance the vllm role deployed.

Private to the collection. The measurement modules take ``instance: NAME`` and read what the
vllm role wrote on the host (the settings JSON and the root-only env file holding the key), so
an operator never copies a key into a benchmark command line.
"""

from __future__ import annotations

import json
import os
import re
import typing as t
from http.client import HTTPException

from ansible.module_utils.six.moves.urllib.error import URLError
from ansible.module_utils.urls import ConnectionError as RequestError
from ansible.module_utils.urls import open_url

from ansible_collections.sparkfleet.vllm.plugins.module_utils._plan_file import read_plan
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_health import Reply, exception_reply, parse_env_file
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_instance import settings_paths

ENDPOINT_ARGUMENT_SPEC: dict[str, dict[str, t.Any]] = {
    "instance": {"type": "str"},
    "config_dir": {"type": "path", "default": "/etc/sparkfleet/vllm"},
    "url": {"type": "str"},
    "api_key": {"type": "str", "no_log": True},
    "model": {"type": "str"},
    "timeout": {"type": "int", "default": 300},
}


PLAIN_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def label_problems(variable: str, label: t.Any) -> list[str]:
    """A result label names files and folders: a plain name, never a path (``..`` included)."""
    if not isinstance(label, str) or not PLAIN_LABEL.fullmatch(label):
        return [f"{variable}: {label!r} must be a plain name of letters, digits and _.- starting with a letter or digit "
                "(it names result files and folders, so no / and no ..)"]
    return []


def http(method: str, url: str, api_key: str | None, payload: t.Any = None, timeout: float = 10) -> Reply:
    """One request; a Reply whose error says what went wrong when no HTTP answer came.

    HTTPException is caught with the socket errors: a port that answers something other than
    HTTP, or a reply cut short, raises it (BadStatusLine, IncompleteRead) and no OSError.
    """
    headers = {"Authorization": "Bearer " + api_key} if api_key else {}
    data = None
    if payload is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(payload)
    try:
        response = open_url(url, method=method, headers=headers, data=data, timeout=timeout)
        return Reply(response.getcode(), response.read().decode("utf-8", "replace"))
    except (URLError, OSError, ValueError, HTTPException, RequestError) as error:
        return exception_reply(error)


def answered(reply: Reply) -> str:
    """How a reply reads in an error message."""
    return f"HTTP {reply.status}" if reply.status is not None else (reply.error or "nothing")


def reply_problem(reply: Reply, what: str) -> str:
    """Why ``what`` gave no 200, and what to check."""
    if reply.status is None:
        return f"{what} did not answer: {reply.error or 'no reply'}; check url and that the instance is serving (vllm_health)"
    if reply.status in (401, 403):
        return (f"{what} answered HTTP {reply.status}: the server refuses the API key sent (or its absence); give the instance's "
                "key in api_key, or give instance so the key is read from the vllm role's env file")
    return f"{what} answered HTTP {reply.status}: {reply.body[:300]}"


def json_object(reply: Reply, what: str) -> dict[str, t.Any]:
    """The JSON object a 200 reply carries; ValueError naming ``what`` otherwise."""
    if reply.status != 200:
        raise ValueError(reply_problem(reply, what))
    try:
        data = json.loads(reply.body)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ValueError(f"{what} answered 200 with something that is not a JSON object: {reply.body[:200]!r}")
    return data


def instance_endpoint(plan: t.Mapping[str, t.Any], env: t.Mapping[str, str]) -> dict[str, t.Any]:
    """URL, key, served name, weights path, container and image of a deployed instance, from its plan file as
    _plan_file.read_plan returned it."""
    return {
        "url": plan["url"],
        "api_key": env.get("VLLM_API_KEY"),
        "model": plan["model"],
        "served_names": list(plan["served_names"]),
        "health_timeout": plan["health_timeout"],
        "cold_start": {key: plan["cold_start"][key] for key in ("timeout", "stamp", "restarts", "restart_window", "kv_cache_warn_share")},
        "weights": plan["weights"],
        "container": plan["container"],
        "container_url": plan["container_url"],
        "image": plan["run_image"],
        "tool_parser": tool_parser(plan.get("serve_args")),
    }


def tool_parser(serve_args: t.Any) -> str | None:
    """The tool-call parser an instance serves with, when it lets the model choose tools (None: it does not)."""
    args = [str(arg) for arg in serve_args] if isinstance(serve_args, list) else []
    if "--enable-auto-tool-choice" not in args or "--tool-call-parser" not in args[:-1]:
        return None
    return args[args.index("--tool-call-parser") + 1]


def read_instance(config_dir: str, name: str) -> dict[str, t.Any]:
    """The endpoint of instance ``name`` from the files the vllm role wrote; ValueError naming what is missing."""
    env_path, settings_path = settings_paths(config_dir.rstrip("/"), name)
    return read_endpoint(env_path, settings_path, name)


def read_endpoint(env_path: str, settings_path: str, name: str) -> dict[str, t.Any]:
    """The endpoint an instance's env and plan files describe; ValueError naming what is missing (PlanFileError: the
    plan file is unusable)."""
    # A plan file that is not there is most often an instance name the task got wrong, not a damaged host.
    if not os.path.lexists(settings_path):
        raise ValueError(f"instance {name}: {settings_path} does not exist; is {name} deployed by the vllm role on this host?")
    plan = read_plan(settings_path)
    try:
        with open(env_path, encoding="utf-8", errors="replace") as handle:
            env = parse_env_file(handle.read())
    except FileNotFoundError as error:
        raise ValueError(f"instance {name}: {error.filename} does not exist; is {name} deployed by the vllm role on this host?") from error
    except OSError as error:
        raise ValueError(f"instance {name}: cannot read {error.filename} ({error.strerror}); the vllm role keeps the env file "
                         "readable by root only, so run the task with become: true") from error
    return instance_endpoint(plan, env)


def resolve(params: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
    """The endpoint a module measures: from ``instance``, overridden by explicit url, api_key and model."""
    endpoint: dict[str, t.Any] = {"url": None, "api_key": None, "model": None, "served_names": [], "health_timeout": None,
                                  "cold_start": None, "weights": None, "container": None, "container_url": "http://127.0.0.1:8000",
                                  "image": None, "tool_parser": None}
    if params.get("instance"):
        endpoint.update(read_instance(params["config_dir"], params["instance"]))
    for key in ("url", "api_key", "model"):
        if params.get(key):
            endpoint[key] = params[key]
    if not endpoint["url"]:
        raise ValueError("give instance (an instance the vllm role deployed here) or url")
    endpoint["url"] = endpoint["url"].rstrip("/")
    return endpoint


def discover_model(endpoint: t.MutableMapping[str, t.Any], timeout: float) -> None:
    """Fill in the served model name from /v1/models when none was given."""
    if endpoint["model"]:
        return
    url = endpoint["url"] + "/v1/models"
    listed = json_object(http("GET", url, endpoint["api_key"], timeout=timeout), url).get("data")
    if not isinstance(listed, list) or not listed or not isinstance(listed[0], dict) or not isinstance(listed[0].get("id"), str):
        raise ValueError(f"{url} lists no model (is this a vLLM server?); check url, or give model")
    endpoint["model"] = listed[0]["id"]
