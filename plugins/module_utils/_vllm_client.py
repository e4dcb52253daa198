# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reaching a vLLM endpoint from a module: HTTP calls and the endpoint of an instance the vllm role deployed.

Private to the collection. The measurement modules take ``instance: NAME`` and read what the
vllm role wrote on the host (the settings JSON and the root-only env file holding the key), so
an operator never copies a key into a benchmark command line.
"""

from __future__ import annotations

import json
import re
import typing as t
from http.client import HTTPException

from ansible.module_utils.six.moves.urllib.error import URLError
from ansible.module_utils.urls import ConnectionError as RequestError
from ansible.module_utils.urls import open_url

from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_health import Reply, exception_reply, parse_env_file
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_instance import PLAN_SCHEMA_VERSION, settings_paths

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


PLAN_TEXT_KEYS = ("url", "model", "weights", "container", "container_url", "run_image")


def plan_problems(plan: t.Mapping[str, t.Any]) -> list[str]:
    """The keys of a plan file the measurement modules read that are missing or of another type."""
    wrong = [key for key in PLAN_TEXT_KEYS if not isinstance(plan.get(key), str) or not plan[key]]
    names = plan.get("served_names")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        wrong.append("served_names")
    timeout = plan.get("health_timeout")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        wrong.append("health_timeout")
    return wrong


def instance_endpoint(plan: t.Mapping[str, t.Any], env: t.Mapping[str, str]) -> dict[str, t.Any]:
    """URL, key, served name, weights path, container and image of a deployed instance, from its plan file."""
    if plan.get("schema_version") != PLAN_SCHEMA_VERSION:
        raise ValueError(f"the plan file of instance {plan.get('name', '?')} has schema_version {plan.get('schema_version')!r}, "
                         f"this collection reads {PLAN_SCHEMA_VERSION}: another release wrote it; re-apply the vllm role")
    wrong = plan_problems(plan)
    if wrong:
        raise ValueError(f"the plan file of instance {plan.get('name', '?')} has no usable {', '.join(wrong)}; "
                         "re-apply the vllm role (a damaged file, or one of an older release)")
    return {
        "url": plan["url"],
        "api_key": env.get("VLLM_API_KEY"),
        "model": plan["model"],
        "served_names": list(plan["served_names"]),
        "health_timeout": plan["health_timeout"],
        "cold_start": cold_start(plan.get("cold_start")),
        "weights": plan["weights"],
        "container": plan["container"],
        "container_url": plan["container_url"],
        "image": plan["run_image"],
        "tool_parser": tool_parser(plan.get("serve_args")),
    }


def cold_start(found: t.Any) -> dict[str, t.Any] | None:
    """The plan file's cold_start when it is whole (None: a damaged or older file, whose starts are judged warm)."""
    if not isinstance(found, dict) or not isinstance(found.get("stamp"), str) or not found["stamp"].startswith("/"):
        return None
    numbers = [found.get(key) for key in ("timeout", "restarts", "restart_window")]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers):
        return None
    share = found.get("kv_cache_warn_share")
    # A plan of an older release has no share: its starts are not compared.
    valid_share = isinstance(share, (int, float)) and not isinstance(share, bool) and 0 < share <= 1
    return {**{key: found[key] for key in ("timeout", "stamp", "restarts", "restart_window")}, "kv_cache_warn_share": share if valid_share else None}


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
    """The endpoint an instance's env and plan files describe; ValueError naming what is missing."""
    try:
        with open(settings_path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        with open(env_path, encoding="utf-8", errors="replace") as handle:
            env = parse_env_file(handle.read())
    except FileNotFoundError as error:
        raise ValueError(f"instance {name}: {error.filename} does not exist; is {name} deployed by the vllm role on this host?") from error
    except OSError as error:
        raise ValueError(f"instance {name}: cannot read {error.filename} ({error.strerror}); the vllm role keeps the env file "
                         "readable by root only, so run the task with become: true") from error
    try:
        settings = json.loads(text)
    except ValueError as error:
        raise ValueError(f"instance {name}: {settings_path} is not valid JSON ({error}); re-apply the vllm role") from error
    if not isinstance(settings, dict):
        raise ValueError(f"instance {name}: {settings_path} does not hold a plan object; re-apply the vllm role")
    return instance_endpoint(settings, env)


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
