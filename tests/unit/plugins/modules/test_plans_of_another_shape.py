"""Plans are free-form by design (type dict, checked by their module_utils): a plan whose parts are of another shape,
given to serving_unit or gateway_route or found in the gateway's plan file, is refused naming the part and the fix,
never a traceback."""

import json

import pytest
import test_gateway_route as gateway
import test_serving_unit as serving


@pytest.mark.parametrize("unit_file", [["[Unit]"], {"Unit": {"Description": "x"}}, 5, ""], ids=["list", "mapping", "number", "empty"])
def test_serving_unit_names_a_unit_file_that_is_not_text(host, unit_file):
    serving.set_state(host)
    plan, env_file = serving.planned(host)
    result = serving.run(host, {**plan, "unit_file": unit_file}, env_file)
    assert result["failed"] and result["msg"].startswith("plan: lacks unit_file; give the plan its role built"), result["msg"]
    assert serving.files(host) == {}


host = serving.host


@pytest.mark.parametrize("settings", ["oops", {}, {"retries": 2}, ["request_timeout"]], ids=["text", "empty", "partial", "list"])
def test_gateway_route_names_settings_of_another_shape_given_or_in_its_plan_file(tmp_path, settings):
    plan = gateway.planned()
    refused = gateway.run(tmp_path / "given", plan={**plan, "settings": settings})
    assert refused["failed"] and "plan (the gateway role's gateway_plan): its settings lack " in refused["msg"], refused["msg"]
    assert not (tmp_path / "given" / "plan.json").exists()
    assert gateway.run(tmp_path / "file", plan=plan)["ok"]
    path = tmp_path / "file" / "plan.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "settings": settings}))
    refused = gateway.run(tmp_path / "file", drain=["gx10-1"])
    assert refused["failed"] and refused["msg"].startswith(f"{path}: its settings lack "), refused["msg"]
    assert "re-run site.yml --tags gateway" in refused["msg"]
