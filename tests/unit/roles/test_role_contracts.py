"""Each role's argument spec matches its defaults, and the README documents every variable."""

import pathlib
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
from role_readme import role_readme  # noqa: E402

ROLES = sorted(path.name for path in (ROOT / "roles").iterdir() if (path / "meta" / "argument_specs.yml").exists())
# A role's variables carry its name, except the measuring playbooks' settings, which carry each playbook's.
PREFIXES = {"measure_defaults": ("bench_", "soak_", "sweep_", "rollout_")}


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
        assert name.startswith(PREFIXES.get(role, (role + "_",))), f"{name} is not prefixed with the role name"
        assert option.get("default") == defaults[name], name


@pytest.mark.parametrize("role", ROLES)
def test_readme_lists_every_variable(role):
    readme = (ROOT / "README.md").read_text()
    section = readme.split(f"### `sparkfleet.vllm.{role}`")[1].split("\n### ")[0]
    for name in spec_options(role):
        assert f"| `{name}` |" in section, f"README's {role} section does not list {name}"


def generated_between(path, marker):
    return path.read_text().split(f"<!-- {marker}: begin -->\n")[1].split(f"\n<!-- {marker}: end -->")[0]


def test_generated_documentation_is_current():
    """The README's key table, docs/catalog.md's table and the page of every class and catalog entry
    are generated from the data (scripts/render_docs.py); a stale page would mislead an operator."""
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._hardware_classes import CLASSES, class_page
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._model_catalog import CATALOG, catalog_page, catalog_table_markdown
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import key_table_markdown

    stale = "is stale: run python scripts/render_docs.py"
    assert generated_between(ROOT / "README.md", "instance keys") == key_table_markdown(), f"README's key table {stale}"
    assert generated_between(ROOT / "docs" / "catalog.md", "catalog table") == catalog_table_markdown(), f"docs/catalog.md {stale}"
    for folder, names, render in (("hardware", CLASSES, class_page), ("catalog", CATALOG, catalog_page)):
        pages = {path.stem for path in (ROOT / "docs" / folder).glob("*.md")}
        assert pages == set(names), f"docs/{folder} {stale}"
        for name in names:
            assert (ROOT / "docs" / folder / f"{name}.md").read_text() == render(name), f"docs/{folder}/{name}.md {stale}"


@pytest.mark.parametrize("role", ROLES)
def test_each_role_has_a_galaxy_readme_generated_from_its_argument_spec(role):
    """Every variable with its default, the requirements and an example play, as Galaxy shows a role."""
    page = (ROOT / "roles" / role / "README.md").read_text()
    assert page == role_readme(ROOT / "roles" / role), f"roles/{role}/README.md is stale: run python scripts/render_docs.py"
    for name in spec_options(role):
        assert f"| `{name}` |" in page


def test_every_staging_call_takes_the_roles_verify_setting():
    """The lab runs the staging module's quick and full checks directly (molecule/models); the role's part is to pass
    vllm_models_verify to every staging call, from the Hub and from a source node alike."""
    calls = [task["sparkfleet.vllm.vllm_model_stage"] for task in load(ROOT / "roles" / "vllm" / "tasks" / "stage.yml")
             if "sparkfleet.vllm.vllm_model_stage" in task]
    assert len(calls) == 2 and all(call.get("verify") == "{{ vllm_models_verify }}" for call in calls), calls
