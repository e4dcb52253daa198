"""What the layers' hooks share: tests/integration/conftest.py keeps here how to stop the lanes it started, and
tests/conftest.py, whose hooks see the unit tests (a subfolder's conftest never does), stops them at a unit failure."""

import typing as t

import pytest

STOP_LANES = pytest.StashKey[t.Callable[[pytest.Config], None]]()
