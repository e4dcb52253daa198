# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  instance:
    description:
      - Name of an instance the P(sparkfleet.vllm.vllm#role) role deployed on this host. Its URL, API key, served
        model name, weights path, container and image are read from O(config_dir), so no key is copied into a play.
      - Give O(instance), or O(url) (with O(api_key) and O(model) as needed) for any other endpoint.
    type: str
  config_dir:
    description: Where the vllm role keeps each instance's settings and root-only env file.
    type: path
    default: /etc/sparkfleet/vllm
  url:
    description: Base URL of the endpoint as this host reaches it, without C(/v1). Overrides the instance's.
    type: str
  api_key:
    description: Bearer key of the endpoint. Overrides the instance's. Never logged.
    type: str
  model:
    description: Served model name requests use. Defaults to the instance's first name, else the first model C(/v1/models) lists.
    type: str
  timeout:
    description: Seconds one HTTP request may take.
    type: int
    default: 300
"""
