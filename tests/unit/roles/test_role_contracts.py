"""Each role's argument spec matches its defaults, and the README documents every variable."""

import pathlib

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[3]
ROLES = sorted(path.name for path in (ROOT / "roles").iterdir() if (path / "meta" / "argument_specs.yml").exists())


def load(path):
    return yaml.safe_load(path.read_text()) or {}


def spec_options(role):
    return load(ROOT / "roles" / role / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]


def test_every_role_has_an_argument_spec():
    assert set(ROLES) == {path.name for path in (ROOT / "roles").iterdir() if path.is_dir()}


@pytest.mark.parametrize("role", ROLES)
def test_argument_spec_defaults_match_role_defaults(role):
    defaults = load(ROOT / "roles" / role / "defaults" / "main.yml")
    options = spec_options(role)
    assert set(options) == set(defaults)
    for name, option in options.items():
        assert name.startswith(role + "_"), f"{name} is not prefixed with the role name"
        assert option.get("default") == defaults[name], name


@pytest.mark.parametrize("role", ROLES)
def test_readme_lists_every_variable(role):
    readme = (ROOT / "README.md").read_text()
    section = readme.split(f"### `sparkfleet.vllm.{role}`")[1].split("\n### ")[0]
    for name in spec_options(role):
        assert f"| `{name}` |" in section, f"README's {role} section does not list {name}"


def test_readme_key_table_is_the_generated_one():
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import key_table_markdown

    readme = (ROOT / "README.md").read_text()
    table = readme.split("<!-- instance keys: begin -->\n")[1].split("\n<!-- instance keys: end -->")[0]
    assert table == key_table_markdown(), "regenerate the README's instance key table from _vllm_plan.key_table_markdown()"
