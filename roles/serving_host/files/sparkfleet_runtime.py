"""The host runtime's entry: a sparkfleet.vllm unit's start, readiness wait and stop run it (see _host_runtime).

serving_host installs it with the collection's module_utils files it imports, under this file's folder, so the host
runs the very code the collection's modules use.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_runtime import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
