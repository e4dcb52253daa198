"""Molecule scenarios on the lab hosts: converge, idempotence and testinfra verify."""

import pytest
from tool_runner import run_logged

SCENARIOS = ["default", "models", "vllm"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_molecule_scenario(scenario):
    output = run_logged(f"molecule-{scenario}", ["molecule", "test", "--scenario-name", scenario])
    assert "idempotence" in output
