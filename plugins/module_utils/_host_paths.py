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
# py-spy, which reads the engines' Python stacks into the diagnostics bundles (serving_host installs it).
PY_SPY = f"{RUNTIME_DIR}/py-spy"
# The engines' stacks the watchdog read before it killed a wedged engine, kept for the bundles.
STACKS_DIR = "/var/lib/sparkfleet/watchdog/stacks"
