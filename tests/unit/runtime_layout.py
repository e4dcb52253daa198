"""The host runtime laid out under a test's folder as serving_host and the watchdog role install it, with the collection's
programs that run beside it: what those programs can import there, and nothing else of the collection."""

import pathlib
import shutil

from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_runtime import RUNTIME_DIR, runtime_files

ROOT = pathlib.Path(__file__).resolve().parents[2]


def install_runtime(root: pathlib.Path, programs=()) -> pathlib.Path:
    """The runtime's folder under ``root``, holding its files and ``programs`` ({path, source} as the roles' plans give them)."""
    folders, files = runtime_files()
    for folder in folders:
        (root / folder["path"].lstrip("/")).mkdir(parents=True, exist_ok=True)
    for entry in [*files, *programs]:
        shutil.copy(ROOT / entry["source"], root / entry["path"].lstrip("/"))
    return root / RUNTIME_DIR.lstrip("/")
