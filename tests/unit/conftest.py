"""Make the collection importable as ansible_collections.sparkfleet.vllm for plain pytest."""

import pathlib
import sys

COLLECTIONS_ROOT = pathlib.Path(__file__).resolve().parents[2] / ".cache" / "collections"
if (COLLECTIONS_ROOT / "ansible_collections").is_dir() and str(COLLECTIONS_ROOT) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS_ROOT))
