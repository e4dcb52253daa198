"""A catalog entry or an instance naming one, with fields of every wrong type: a clear refusal naming
the entry, never a traceback (on a real host no_log would hide it behind "censored")."""

import pytest
from test_catalog_and_guards import EMBEDDINGS, instance, plan

from ansible_collections.sparkfleet.vllm.plugins.module_utils._model_catalog import (
    CATALOG,
    catalog_id,
    catalog_problems,
    catalog_reference_problems,
)

CATALOG_WITH_EXTRA = {**CATALOG, **EMBEDDINGS}
WRONG_TYPES = ["", None, "   ", [], ["x"], {}, {"a": 1}, 0, -1, 1.5, True, "two words", "nan"]


@pytest.mark.parametrize(
    "model",
    [pytest.param(None, id="left-empty"), pytest.param("", id="empty-text"), pytest.param("   ", id="whitespace"),
     pytest.param([], id="empty-list"), pytest.param(["/models/x"], id="a-list"), pytest.param({}, id="a-mapping"),
     pytest.param(7, id="a-number"), pytest.param(True, id="a-bool"), pytest.param("/models/two words", id="inner-space")],
)
def test_an_instance_naming_an_entry_with_its_model_left_empty_names_the_entry(model):
    found = catalog_reference_problems("vllm_instances[0] (llm)", {"catalog": "embeddings", "model": model}, CATALOG_WITH_EXTRA)
    assert len(found) == 1
    assert found[0].startswith(f"vllm_instances[0] (llm).model: {model!r} is no checkpoint")
    assert "catalog entry embeddings's (/models/embeddings)" in found[0] and "remove the model key" in found[0]


@pytest.mark.parametrize("model", ["/models/gemma", "google/gemma-4-31B-it"])
def test_a_model_beside_the_entry_or_none_at_all_is_fine(model):
    assert catalog_reference_problems("i", {"catalog": "embeddings", "model": model}, CATALOG_WITH_EXTRA) == []
    assert catalog_reference_problems("i", {"catalog": "embeddings"}, CATALOG_WITH_EXTRA) == []
    assert catalog_reference_problems("i", {"model": None}, CATALOG_WITH_EXTRA) == []


@pytest.mark.parametrize("name", [[], ["embeddings"], {}, {"embeddings": 1}, 3, True, "", "no-such-entry"])
def test_a_catalog_name_of_another_type_is_refused_not_looked_up(name):
    assert catalog_id(name) is None or name in ("", "no-such-entry")
    found = catalog_reference_problems("i", {"catalog": name, "model": None}, CATALOG_WITH_EXTRA)
    assert len(found) == 1 and found[0].startswith(f"i.catalog: {name!r} is not a catalog entry's id")


ENTRY_FIELDS = sorted(set(EMBEDDINGS["embeddings"]) | {"repo", "path", "sources", "text_only_weights_gib"})


@pytest.mark.parametrize("field", ENTRY_FIELDS)
def test_every_entry_field_of_every_wrong_type_is_refused_without_a_traceback(field):
    refused = 0
    for value in WRONG_TYPES:
        extra = {"embeddings": {**EMBEDDINGS["embeddings"], field: value}}
        problems = catalog_problems(extra)
        assert all(isinstance(problem, str) for problem in problems)
        found = plan(instance(catalog="embeddings"), catalog_extra=extra)
        assert isinstance(found["errors"], list)
        refused += bool(problems)
        assert all(problem in found["errors"] for problem in problems)
    assert refused


@pytest.mark.parametrize("method", ["mtp", "eagle3"])
@pytest.mark.parametrize("key", ["model", "num_speculative_tokens", "weights_gib", "options"])
def test_every_drafter_field_of_every_wrong_type_is_refused_without_a_traceback(method, key):
    for value in WRONG_TYPES:
        drafter = {"model": "a/b", "num_speculative_tokens": 2, key: value}
        extra = {"embeddings": {**EMBEDDINGS["embeddings"], "drafters": {method: drafter}}}
        for spec in (instance(catalog="embeddings"), instance(catalog="embeddings", speculative={"method": method})):
            found = plan(spec, catalog_extra=extra)
            assert isinstance(found["errors"], list)
        assert all(problem.startswith("vllm_catalog_extra.embeddings.") for problem in catalog_problems(extra))


@pytest.mark.parametrize("nested", [{"drafters": {"mtp": None}}, {"drafters": {"mtp": []}}, {"broken": [None]}, {"broken": ["x"]},
                                    {"broken": [{"setting": "quantization", "values": "fp8", "reason": 1}]},
                                    {"modalities": [1, None]}, {"instance_defaults": {"max_model_len": "long"}}])
def test_nested_fields_of_another_shape_are_refused_without_a_traceback(nested):
    extra = {"embeddings": {**EMBEDDINGS["embeddings"], **nested}}
    catalog_problems(extra)
    assert isinstance(plan(instance(catalog="embeddings"), catalog_extra=extra)["errors"], list)
