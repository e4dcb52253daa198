"""A lab shell as a newcomer gets one (issue 39): `scripts/lab env` prints the lab's environment as exports a shell can
eval, its keys as reads of their 0600 files and never their values; in that shell the lab inventory resolves, and in a
shell without it the inventory's refusal names the variable and what to run. Needs the lab's images and keys, which
the suite's set-up builds; runs no lab host (the debug module runs on the controller)."""

import json
import os
import re
import subprocess

import yaml
from tool_runner import ROOT

LAB_VARIABLES = ("SPARKFLEET_VLLM_IMAGE", "SPARKFLEET_LITELLM_IMAGE", "SPARKFLEET_LAB_SUBNET", "SPARKFLEET_LAB_API_KEY",
                 "SPARKFLEET_LAB_GATEWAY_KEY", "ANSIBLE_COLLECTIONS_PATH", "PATH")


def shown(variable, exports, environment):
    """What the lab inventory's ``variable`` resolves to on lab-spark-1, in a shell that evaluated ``exports`` first."""
    command = f'eval "$1"; ansible -i inventories/lab lab-spark-1 -m ansible.builtin.debug -a var={variable}'
    return subprocess.run(["bash", "-c", command, "lab", exports], cwd=ROOT, capture_output=True, text=True, env=environment,
                          check=False, timeout=300)


def test_lab_env_prints_exports_a_shell_evals_and_a_shell_without_them_is_told_what_to_run():
    printed = subprocess.run(["bash", "scripts/lab", "env"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=900).stdout
    exported = [line.split("=", 1)[0].removeprefix("export ") for line in printed.splitlines() if line.startswith("export ")]
    assert set(LAB_VARIABLES) <= set(exported), exported
    assert all(line.startswith(("export ", "#")) for line in printed.splitlines()), "stdout holds only the exports"
    for key_file in ("api-key", "gateway-key"):
        key = (ROOT / ".cache" / "lab" / key_file).read_text().strip()
        assert key not in printed and f'="$(cat {ROOT / ".cache" / "lab" / key_file})"' in printed
    bare = {name: value for name, value in os.environ.items() if not name.startswith("SPARKFLEET_")}
    resolved = shown("vllm_image", printed, bare)
    assert resolved.returncode == 0 and "@sha256:" in resolved.stdout, resolved.stdout[-2000:] + resolved.stderr[-2000:]
    for variable, missing in (("vllm_image", "SPARKFLEET_VLLM_IMAGE"), ("gateway_master_key", "SPARKFLEET_LAB_GATEWAY_KEY")):
        refused = shown(variable, "true", bare)
        output = refused.stdout + refused.stderr
        assert refused.returncode != 0 and f'{missing} is not set in this shell' in output, output[-2000:]
        assert 'run eval "$(scripts/lab env)" in this shell first' in output


MEASURING_PLAYBOOKS = ("bench.yml", "soak.yml", "mtp_sweep.yml", "rollout.yml")


def test_every_measuring_play_loads_the_defaults_first_and_sets_none_of_them():
    """A setting in a play's vars would outrank the inventory again (issue 39 item 4); a play that reads a setting without
    the role would not see it, and one on the controller would not see the inventory's groups' values either."""
    settings = set(yaml.safe_load((ROOT / "roles" / "measure_defaults" / "defaults" / "main.yml").read_text()))
    loading = 0
    for name in MEASURING_PLAYBOOKS:
        for play in yaml.safe_load((ROOT / "playbooks" / name).read_text()):
            # A setting read, not an attribute or a private variable of the same name.
            read = {setting for setting in settings if re.search(rf"(?<![\w.]){setting}\b", yaml.safe_dump(play))}
            assert not settings & set(play.get("vars") or {}), (name, play["name"], settings & set(play["vars"]))
            if play["hosts"] == "localhost":
                assert not read, (name, play["name"], read)
            elif read:
                assert play["roles"][0] == {"role": "sparkfleet.vllm.measure_defaults"}, (name, play["name"])
                loading += 1
    assert loading == 5, "bench, soak and sweep each have one measuring play, the rollout two"


def resolved_settings(inventory, *extra):
    done = subprocess.run(["ansible-playbook", "-i", inventory, "tests/integration/fixtures/measure_settings.yml", *extra],
                          cwd=ROOT, capture_output=True, text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return {host: json.loads(message) for host, message in re.findall(r'ok: \[(\S+)\] => \{\s+"msg": "(.*)"\s+\}', done.stdout.replace('\\"', '"'))}


def test_the_lab_inventory_sizes_the_measurements_and_minus_e_still_wins():
    """Every documented measuring command runs on the lab as written: its inventory's settings beat the playbooks'
    defaults, which hold elsewhere; -e beats both. (The variables the lab reads from its environment are not read.)"""
    lab = resolved_settings("inventories/lab")
    assert set(lab) == {"lab-spark-1", "lab-gx10-1"}
    for settings in lab.values():
        assert settings == {"soak_input_tokens": 128, "soak_duration": 120, "bench_input_tokens": 256, "rollout_judge_speed": False,
                            "sweep_concurrencies": [2]}
    elsewhere = resolved_settings("localhost,", "-c", "local")
    assert elsewhere["localhost"] == {"soak_input_tokens": 4096, "soak_duration": 3600, "bench_input_tokens": 1000,
                                      "rollout_judge_speed": True, "sweep_concurrencies": [1, 8]}
    given = resolved_settings("inventories/lab", "-e", "soak_input_tokens=512")
    assert {settings["soak_input_tokens"] for settings in given.values()} == {"512"}, "-e outranks the lab inventory"
