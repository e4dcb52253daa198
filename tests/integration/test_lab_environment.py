"""A lab shell as a newcomer gets one (issue 39): `scripts/lab env` prints the lab's environment as exports a shell can
eval, its keys as reads of their 0600 files and never their values; in that shell the lab inventory resolves, and in a
shell without it the inventory's refusal names the variable and what to run. Needs the lab's images and keys, which
the suite's set-up builds; runs no lab host (the debug module runs on the controller)."""

import os
import subprocess

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
