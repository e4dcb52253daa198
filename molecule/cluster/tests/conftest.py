import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "shared"))
# The collection's own module_utils, for reading /metrics the way the modules do.
sys.path.insert(0, os.environ["ANSIBLE_COLLECTIONS_PATH"].split(os.pathsep)[0])
