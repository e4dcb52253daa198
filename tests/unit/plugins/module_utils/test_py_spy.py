"""py-spy's pinned wheels (vllm_py_spy_wheels): every bad spelling refused naming the variable and the fix, the role's
default pins valid for both of the architectures the collection serves on, and the binary's member derived from the
wheel's own name."""

import pathlib

import pytest
import yaml

from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_paths import PY_SPY
from ansible_collections.sparkfleet.vllm.plugins.module_utils._py_spy import wheel_for, wheel_problems

ROOT = pathlib.Path(__file__).resolve().parents[4]
DEFAULTS = yaml.safe_load((ROOT / "roles" / "vllm" / "defaults" / "main.yml").read_text())["vllm_py_spy_wheels"]
GOOD_URL = "https://mirror.example/pypi/py_spy-0.4.3-py2.py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl"
GOOD_SHA = "bb" * 32


def test_the_default_pins_are_valid_for_a_spark_and_the_lab():
    assert not wheel_problems(DEFAULTS)
    for architecture in ("aarch64", "x86_64"):
        wheel = wheel_for(DEFAULTS, architecture)["wheel"]
        assert wheel["binary"] == "py_spy-0.4.3.data/scripts/py-spy" and wheel["dest"] == PY_SPY
        assert wheel["url"].startswith("https://files.pythonhosted.org/") and wheel["file"] in wheel["url"]


def test_an_architecture_without_a_pin_installs_nothing_and_none_is_no_error():
    assert wheel_for(DEFAULTS, "riscv64") == {"problems": [], "wheel": None}
    assert wheel_for({}, "aarch64") == {"problems": [], "wheel": None}


BAD = {
    "not a map": (["https://x/py_spy-0.4.3-a.whl"], "vllm_py_spy_wheels is a list, not a map"),
    "architecture with a slash": ({"arm/64": {"url": GOOD_URL, "sha256": GOOD_SHA}}, "is no architecture as Ansible's facts name one"),
    "sha256 missing": ({"aarch64": {"url": GOOD_URL}}, "must hold exactly url and sha256"),
    "a key more": ({"aarch64": {"url": GOOD_URL, "sha256": GOOD_SHA, "mode": "0777"}}, "must hold exactly url and sha256"),
    "uppercase sha256": ({"aarch64": {"url": GOOD_URL, "sha256": GOOD_SHA.upper()}}, ".sha256 must be the wheel's SHA-256"),
    "short sha256": ({"aarch64": {"url": GOOD_URL, "sha256": "bb" * 20}}, ".sha256 must be the wheel's SHA-256"),
    "another package": ({"aarch64": {"url": "https://x/evil-1.0-py3-none-any.whl", "sha256": GOOD_SHA}}, ".url 'https://x/evil-1.0"),
    "not a wheel": ({"aarch64": {"url": "https://x/py_spy-0.4.3.tar.gz", "sha256": GOOD_SHA}}, ".url 'https://x/py_spy-0.4.3.tar.gz'"),
    "a quote and a space": ({"aarch64": {"url": "https://x/a b'/py_spy-0.4.3-a.whl", "sha256": GOOD_SHA}}, "letters, digits and ._~%+/- only"),
    "another scheme": ({"aarch64": {"url": "ftp://x/py_spy-0.4.3-a.whl", "sha256": GOOD_SHA}}, "no https://, http:// or file:// address"),
    "a user in the address": ({"aarch64": {"url": "https://user:pw@x/py_spy-0.4.3-a.whl", "sha256": GOOD_SHA}}, "no https://, http://"),
}


@pytest.mark.parametrize("wheels, problem", BAD.values(), ids=BAD.keys())
def test_bad_pins_are_refused_naming_the_variable_and_the_fix(wheels, problem):
    found = wheel_for(wheels, "aarch64")
    assert found["wheel"] is None and len(found["problems"]) == 1, found
    assert problem in found["problems"][0]
    assert "set vllm_py_spy_wheels to a map of architectures (aarch64, x86_64) to {url, sha256}" in found["problems"][0]


def test_a_mirror_and_a_file_on_the_controller_are_pins_too():
    for url in ("http://mirror.lan:8080/py_spy-0.4.3-py2.py3-none-any.whl", "file:///srv/wheels/py_spy-0.4.3-py2.py3-none-any.whl"):
        assert wheel_for({"x86_64": {"url": url, "sha256": GOOD_SHA}}, "x86_64")["wheel"]["file"] == "py_spy-0.4.3-py2.py3-none-any.whl"
