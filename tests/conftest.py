"""Test layers: unit, static and lab, run in that order; the lab layer is skipped once the unit layer
failed. The lab's lanes start once the tests are collected (tests/integration/conftest.py), so the
unit and static layers run beside them; a unit failure stops them, a static one does not (the lab
layer still reports).

Select one layer with a marker, for example `scripts/test -m unit` or `scripts/test -m "not lab"`.
"""

import pathlib

import pytest
from suite_layers import STOP_LANES

LAYERS = ("unit", "static", "lab")
HERE = pathlib.Path(__file__).resolve().parent
FAILED_EARLY = pytest.StashKey[bool]()


def layer_of(item):
    path = pathlib.Path(str(item.fspath)).resolve()
    if HERE / "unit" in path.parents:
        return "unit"
    return "lab" if path.name == "test_molecule.py" else "static"


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(getattr(pytest.mark, layer_of(item)))
    items.sort(key=lambda item: LAYERS.index(layer_of(item)))


def pytest_runtest_makereport(item, call):
    if call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception) and layer_of(item) == "unit":
        item.session.config.stash[FAILED_EARLY] = True
        stop = item.session.config.stash.get(STOP_LANES, None)
        if stop:
            stop(item.session.config)


def pytest_runtest_setup(item):
    if layer_of(item) == "lab" and item.session.config.stash.get(FAILED_EARLY, False):
        pytest.skip("the unit layer failed: the lab layer does not run")
