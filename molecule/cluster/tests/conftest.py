import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "shared"))


def pytest_collection_modifyitems(items):
    """The rollout's tests run last: the good rollout leaves every unit on settings the scenario's
    inventory does not hold, which any later site.yml run would relaunch back."""
    items.sort(key=lambda item: item.path.name == "test_rollout.py")
