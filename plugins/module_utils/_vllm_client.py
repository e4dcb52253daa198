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
import typing as t

from ansible.module_utils.six.moves.urllib.error import HTTPError, URLError
from ansible.module_utils.urls import open_url

LOOPBACK = ("127.0.0.1", "::1", "0.0.0.0", "::")

ENDPOINT_ARGUMENT_SPEC: dict[str, dict[str, t.Any]] = {
    "instance": {"type": "str"},
    "config_dir": {"type": "path", "default": "/etc/sparkfleet/vllm"},
    "url": {"type": "str"},
    "api_key": {"type": "str", "no_log": True},
    "model": {"type": "str"},
    "timeout": {"type": "int", "default": 300},
}


def http(method: str, url: str, api_key: str | None, payload: t.Any = None, timeout: float = 10) -> tuple[int | None, str]:
    """(status, body); status None when nothing answers."""
    headers = {"Authorization": "Bearer " + api_key} if api_key else {}
    data = None
    if payload is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(payload)
    try:
        response = open_url(url, method=method, headers=headers, data=data, timeout=timeout)
        return response.getcode(), response.read().decode("utf-8", "replace")
    except HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace") if exc.fp else ""
    except (URLError, OSError, ValueError):
        return None, ""


def parse_env_file(text: str) -> dict[str, str]:
    """KEY=value lines of a Docker env file."""
    values = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#") and "=" in line:
            key, _separator, value = line.partition("=")
            values[key.strip()] = value
    return values


def served_names(serve_args: t.Sequence[str]) -> list[str]:
    names: list[str] = []
    if "--served-model-name" in serve_args:
        for arg in serve_args[serve_args.index("--served-model-name") + 1:]:
            if arg.startswith("--"):
                break
            names.append(arg)
    return names


def host_url(published_ports: t.Sequence[str]) -> str:
    """The URL on the host of the first publication (``address:host_port:container_port``)."""
    publication = published_ports[0]
    address, host_port, _container_port = publication.rsplit(":", 2)
    address = address.strip("[]")
    if address in ("0.0.0.0", "::"):
        address = "127.0.0.1"
    return f"http://[{address}]:{host_port}" if ":" in address else f"http://{address}:{host_port}"


def instance_endpoint(settings: t.Mapping[str, t.Any], env: t.Mapping[str, str]) -> dict[str, t.Any]:
    """URL, key, served name, weights path, container and image of a deployed instance."""
    serve_args = list(settings["serve_args"])
    container_port = serve_args[serve_args.index("--port") + 1] if "--port" in serve_args else "8000"
    names = served_names(serve_args)
    return {
        "url": host_url(settings["published_ports"]),
        "api_key": env.get("VLLM_API_KEY"),
        "model": names[0] if names else serve_args[0],
        "weights": serve_args[0],
        "container": f"vllm-{settings['name']}",
        "container_url": f"http://127.0.0.1:{container_port}",
        "image": settings.get("image"),
    }


def read_instance(config_dir: str, name: str) -> dict[str, t.Any]:
    """The endpoint of instance ``name`` from the files the vllm role wrote; ValueError naming what is missing."""
    settings_path = os.path.join(config_dir, f"{name}.json")
    env_path = os.path.join(config_dir, f"{name}.env")
    try:
        with open(settings_path, encoding="utf-8") as handle:
            settings = json.load(handle)
        with open(env_path, encoding="utf-8") as handle:
            env = parse_env_file(handle.read())
    except FileNotFoundError as error:
        raise ValueError(f"instance {name}: {error.filename} does not exist; is {name} deployed by the vllm role on this host?") from error
    return instance_endpoint(settings, env)


def resolve(params: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
    """The endpoint a module measures: from ``instance``, overridden by explicit url, api_key and model."""
    endpoint: dict[str, t.Any] = {"url": None, "api_key": None, "model": None, "weights": None,
                                  "container": None, "container_url": "http://127.0.0.1:8000", "image": None}
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
    status, body = http("GET", endpoint["url"] + "/v1/models", endpoint["api_key"], timeout=timeout)
    if status != 200:
        raise ValueError(f"{endpoint['url']}/v1/models answered {status or 'nothing'}; give model, or check url and api_key")
    endpoint["model"] = json.loads(body)["data"][0]["id"]
