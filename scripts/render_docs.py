"""Regenerate the documentation that is generated from data: the README's instance key table,
a page per hardware class (docs/hardware/) and per catalog entry (docs/catalog/), the
catalog table of docs/catalog.md and each role's README for Galaxy (roles/<role>/README.md, from
its argument spec). tests/unit/roles/test_role_contracts.py checks they are current."""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".cache" / "collections"))

from role_readme import role_readme  # noqa: E402  (beside this script)

from ansible_collections.sparkfleet.vllm.plugins.module_utils._hardware_classes import CLASSES, class_page  # noqa: E402
from ansible_collections.sparkfleet.vllm.plugins.module_utils._model_catalog import (  # noqa: E402
    CATALOG,
    catalog_page,
    catalog_table_markdown,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import key_table_markdown  # noqa: E402


def between(text, marker, content):
    head, rest = text.split(f"<!-- {marker}: begin -->\n")
    _old, tail = rest.split(f"\n<!-- {marker}: end -->")
    return f"{head}<!-- {marker}: begin -->\n{content}\n<!-- {marker}: end -->{tail}"


readme = ROOT / "README.md"
readme.write_text(between(readme.read_text(), "instance keys", key_table_markdown()))
for folder, names, render in (("hardware", CLASSES, class_page), ("catalog", CATALOG, catalog_page)):
    target = ROOT / "docs" / folder
    target.mkdir(exist_ok=True)
    for name in names:
        (target / f"{name}.md").write_text(render(name))
catalog_doc = ROOT / "docs" / "catalog.md"
catalog_doc.write_text(between(catalog_doc.read_text(), "catalog table", catalog_table_markdown()))
for role_dir in sorted(path for path in (ROOT / "roles").iterdir() if (path / "meta" / "argument_specs.yml").exists()):
    (role_dir / "README.md").write_text(role_readme(role_dir))
