# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where the host runtime lives on a host: its programs (the units' start door, the watchdog's daemon, the ranks' fabric
wait) beside the package of the collection's module_utils files they import, and the Docker client they run. Its own file
because both the runtime and the watchdog's plan, which the runtime imports, name these paths."""

from __future__ import annotations

RUNTIME_DIR = "/usr/local/libexec/sparkfleet"
PACKAGE = "ansible_collections/sparkfleet/vllm/plugins/module_utils"
# The Docker client every unit runs (spark_facts reports whether a host has it).
DOCKER_CLIENT = "/usr/bin/docker"
