"""The suite's three layers as pytest markers (pytest.ini), taken from where a test lives, and the
lab layer skipped once a faster layer failed: an hour of lab hosts proves nothing then."""

import pytest

LAYERS = (("tests/unit/", "unit"), ("tests/integration/test_static.py", "static"), ("tests/integration/test_molecule.py", "lab"))


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = item.path.relative_to(config.rootpath).as_posix()
        for prefix, layer in LAYERS:
            if path.startswith(prefix):
                item.add_marker(layer)


def pytest_runtest_setup(item):
    if item.get_closest_marker("lab") and item.session.testsfailed:
        pytest.skip(f"{item.session.testsfailed} unit or static test(s) failed; the lab layer would prove nothing")
