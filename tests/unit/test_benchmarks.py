"""Every script in benchmarks/ parses its options and builds its commands against the current playbooks, inventories
and modules, without running any: each is imported and its --print-commands run in this process with subprocess
refused, ansible-playbook only lists hosts and tags; no Docker, no lab, no network."""

import ast
import configparser
import importlib
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
COLLECTIONS = ROOT / ".cache" / "collections"
# The scripts import lab_vllm from beside them, as they do when run.
sys.path.insert(0, str(BENCHMARKS))
SCRIPTS = ("bench_overhead", "fleet_scale", "frozen_engine", "gate_latency", "noop_reapply")
LAB_ENV = {"SPARKFLEET_VLLM_IMAGE_LOCAL": "sparkfleet/vllm-cpu:test", "SPARKFLEET_TINY_MODEL": "/cache/models/tiny-llama",
           "SPARKFLEET_LAB_IMAGE": "sparkfleet/lab:test"}


def script(name):
    return importlib.import_module(name)


def yaml_file(path):
    return yaml.safe_load((ROOT / path).read_text())


@pytest.fixture
def lab_env(monkeypatch):
    for name, value in LAB_ENV.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def nothing_runs(monkeypatch):
    """subprocess refuses every command: what a test calls must only build them."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"a command ran: {args[0] if args else kwargs}")

    for name in ("run", "Popen", "call", "check_call", "check_output"):
        monkeypatch.setattr(subprocess, name, refuse)


def printed_lines(module, argv, capsys):
    module.main(argv)
    return capsys.readouterr().out.splitlines()


def ansible_playbook(argv, *listing):
    """ansible-playbook's answer to one of the scripts' commands with a listing option added (nothing runs on a host)."""
    done = subprocess.run([*argv, *listing], cwd=ROOT, capture_output=True, text=True, check=False, timeout=120,
                          env={**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS)})
    assert done.returncode == 0, f"{shlex.join(argv)} {' '.join(listing)}: {(done.stdout + done.stderr)[-3000:]}"
    return done.stdout


def listed_hosts(argv):
    """{play name: [hosts]} of ansible-playbook --list-hosts on the command."""
    plays, current = {}, None
    for line in ansible_playbook(argv, "--list-hosts").splitlines():
        play = re.match(r"\s+play #\d+ \(.*?\): (.*?)\t", line)
        if play:
            current = plays.setdefault(play.group(1), [])
        elif current is not None and line.startswith("      ") and line.strip():
            current.append(line.strip())
    return plays


def playbook_tags(argv):
    """Every tag of the command's playbook, its plays' and their tasks' (ansible-playbook --list-tags)."""
    tags = set()
    for found in re.findall(r"TAGS: \[([^\]]*)\]", ansible_playbook(argv, "--list-tags")):
        tags.update(tag.strip() for tag in found.split(",") if tag.strip())
    return tags


def option(argv, *names):
    values = [argv[index + 1] for index, word in enumerate(argv[:-1]) if word in names]
    return values[-1] if values else None


def roles_reached(playbook):
    """The collection's roles a playbook runs (its plays' roles, include_role and import_role), following import_playbook."""
    text = (ROOT / playbook).read_text()
    found = set(re.findall(r"(?:role|name):\s*sparkfleet\.vllm\.(\w+)", text))
    for imported in re.findall(r"import_playbook:\s*(\S+)", text):
        found |= roles_reached(str(((ROOT / playbook).parent / imported).relative_to(ROOT)))
    return found


def declared_variables(roles):
    """Variables the roles declare in their argument specs (every entry point)."""
    declared = set()
    for role in roles:
        specs = ROOT / "roles" / role / "meta" / "argument_specs.yml"
        if specs.is_file():
            for entry in (yaml.safe_load(specs.read_text()).get("argument_specs") or {}).values():
                declared |= set((entry or {}).get("options") or {})
    return declared


def read_by_roles(variable, roles):
    """Whether a variable no argument spec declares (a fleet-wide one, sparkfleet_*) is read by the roles' tasks."""
    pattern = re.compile(rf"\b{re.escape(variable)}\b")
    return any(pattern.search(path.read_text()) for role in roles for path in (ROOT / "roles" / role / "tasks").glob("*.yml"))


def extra_variables(argv):
    """The variables a command's -e options set, given as JSON or as key=value pairs."""
    names = []
    for index, word in enumerate(argv[:-1]):
        if word in ("-e", "--extra-vars"):
            value = argv[index + 1]
            names += list(json.loads(value)) if value.startswith("{") else [pair.split("=", 1)[0] for pair in value.split()]
    return names


def read_by_playbook(variable, playbook):
    """Whether the playbook itself, or a task file of playbooks/tasks it may include, reads the variable (bench_instance)."""
    pattern = re.compile(rf"\b{re.escape(variable)}\b")
    return any(pattern.search(path.read_text()) for path in [ROOT / playbook, *(ROOT / "playbooks" / "tasks").glob("*.yml")])


def check_playbook_command(argv, inventory_hosts, runs_roles=True):
    """A command's playbook, inventory, -e variables and --limit hosts exist, and its --tags are tags of the playbook;
    ``runs_roles``: the playbook runs roles of the collection (a benchmark's does; the reboot test's runs modules only)."""
    assert argv[0] == "ansible-playbook"
    inventory = option(argv, "-i", "--inventory")
    playbook = next(word for index, word in enumerate(argv[1:], 1) if word.endswith(".yml") and argv[index - 1] not in ("-i", "--inventory"))
    assert (ROOT / playbook).is_file(), playbook
    assert (ROOT / inventory).exists(), inventory
    roles = roles_reached(playbook)
    assert roles or not runs_roles, f"{playbook} runs none of the collection's roles"
    for variable in extra_variables(argv):
        assert (variable in declared_variables(roles) or read_by_roles(variable, roles) or read_by_playbook(variable, playbook)), (
            f"-e {variable}: neither {playbook} nor its roles take it")
    limit = option(argv, "-l", "--limit")
    if limit:
        assert set(limit.split(",")) <= set(inventory_hosts), f"--limit {limit}: not hosts of {inventory}"
    for tags in (option(argv, "--tags", "-t"), option(argv, "--skip-tags")):
        if tags:
            assert set(tags.split(",")) <= playbook_tags(argv), f"{tags}: not tags of {playbook}"
    return playbook, roles


def module_options(name):
    """The options a module documents (its DOCUMENTATION and the collection's doc fragments it extends)."""
    def documentation(path):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "DOCUMENTATION":
                return yaml.safe_load(node.value.value)
        raise AssertionError(f"{path} has no DOCUMENTATION")

    doc = documentation(ROOT / "plugins" / "modules" / f"{name}.py")
    options = dict(doc["options"])
    for fragment in doc.get("extends_documentation_fragment") or []:
        options.update(documentation(ROOT / "plugins" / "doc_fragments" / f"{fragment.removeprefix('sparkfleet.vllm.')}.py")["options"])
    return options


PYTHON_TYPES = {"str": str, "path": str, "int": int, "float": (int, float), "bool": bool, "list": list, "dict": dict}


def check_module_run(command, expected_module):
    """A module run as the script runs it: the module's file, and arguments on stdin that the module documents."""
    argv, stdin = command
    assert argv == [sys.executable, str(ROOT / "plugins" / "modules" / f"{expected_module}.py")]
    assert pathlib.Path(argv[1]).is_file()
    arguments = json.loads(stdin)["ANSIBLE_MODULE_ARGS"]
    options = module_options(expected_module)
    assert set(arguments) <= set(options), f"{expected_module} has no option {sorted(set(arguments) - set(options))}"
    for name, spec in options.items():
        if spec.get("required"):
            assert name in arguments, f"{expected_module} needs {name}"
    for name, value in arguments.items():
        assert isinstance(value, PYTHON_TYPES[options[name].get("type", "str")]), f"{expected_module} {name}={value!r}"
        if "choices" in options[name]:
            assert value in options[name]["choices"], f"{expected_module} {name}={value!r}"
    return arguments


def lab_inventory_hosts():
    return yaml_file("inventories/lab/hosts.yml")["all"]["children"]


def lab_instance(name):
    return next(instance for instance in yaml_file("inventories/lab/group_vars/lab.yml")["vllm_instances"] if instance["name"] == name)


# --- every script


def test_every_script_in_benchmarks_is_checked_here():
    entry_points = {path.stem for path in BENCHMARKS.glob("*.py") if 'if __name__ == "__main__":' in path.read_text()}
    assert entry_points == set(SCRIPTS)
    assert {path.stem for path in BENCHMARKS.glob("*.py")} - entry_points == {"lab_vllm"}, "the one helper the scripts share"


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_runs_and_names_its_options(name):
    """As the lead runs it: python3 benchmarks/NAME.py --help, without the lab's environment."""
    env = {key: value for key, value in os.environ.items() if key not in LAB_ENV}
    done = subprocess.run([sys.executable, str(BENCHMARKS / f"{name}.py"), "--help"], capture_output=True, text=True, check=False, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--runs" in done.stdout
    assert "--print-commands" in done.stdout


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("runs", ["0", "-1", "two", "1.5"])
def test_a_run_count_that_is_no_positive_whole_number_is_refused(name, runs, lab_env, nothing_runs, capsys):
    with pytest.raises(SystemExit) as stopped:
        script(name).main(["--runs", runs, "--print-commands"])
    assert stopped.value.code == 2
    assert "--runs" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["bench_overhead", "gate_latency", "fleet_scale"])
@pytest.mark.parametrize("missing", ["SPARKFLEET_VLLM_IMAGE_LOCAL", "SPARKFLEET_TINY_MODEL", "SPARKFLEET_LAB_IMAGE"])
def test_a_script_without_the_lab_environment_says_what_to_source(name, missing, lab_env, nothing_runs, monkeypatch):
    needs = {"fleet_scale": {"SPARKFLEET_LAB_IMAGE"}}.get(name, {"SPARKFLEET_VLLM_IMAGE_LOCAL", "SPARKFLEET_TINY_MODEL"})
    monkeypatch.delenv(missing)
    if missing not in needs:
        script(name).main(["--print-commands", "--runs", "1"])
        return
    with pytest.raises(SystemExit) as stopped:
        script(name).main(["--print-commands"])
    assert missing in str(stopped.value.code)
    assert "scripts/lib/common.sh" in str(stopped.value.code)


# --- noop_reapply


def test_noop_reapply_runs_the_whole_site_playbook_on_both_lab_hosts():
    noop = script("noop_reapply")
    command = noop.reapply_command()
    assert command == ["ansible-playbook", "-i", "inventories/lab", "site.yml"]
    for partial in ("-l", "--limit", "--tags", "-t", "--skip-tags", "-e", "--extra-vars"):
        assert partial not in command, "a cluster is applied whole: no limit, no tags"
    groups = lab_inventory_hosts()
    check_playbook_command(command, groups["lab"]["hosts"])
    assert set(noop.LAB_HOSTS) == set(groups["lab"]["hosts"]) == {"lab-spark-1", "lab-gx10-1"}
    # Why no one-host run (the docstring's reason): every lab host is a node of the lab cluster.
    assert set(groups["lab_cluster"]["hosts"]) == set(noop.LAB_HOSTS)
    assert yaml_file("lab/hosts.yml")[0]["hosts"] == "lab"
    plays = listed_hosts(command)
    assert len(plays) >= 5
    assert all(sorted(hosts) == sorted(noop.LAB_HOSTS) for hosts in plays.values()), plays


def test_noop_reapply_prints_its_command_and_runs_nothing(nothing_runs, capsys):
    lines = printed_lines(script("noop_reapply"), ["--print-commands", "--runs", "2"], capsys)
    assert lines == [f"cd {shlex.quote(str(ROOT))} && ansible-playbook -i inventories/lab site.yml"] * 2


RECAP_OUTPUT = """PLAY [Watch what serves] ***
TASK [x] ***
ok: [lab-spark-1]

PLAY RECAP *********************************************************************
lab-gx10-1                 : ok=84   changed=0    unreachable=0    failed=0    skipped=78   rescued=0    ignored=0
lab-spark-1                : ok=68   changed=2    unreachable=0    failed=0    skipped=78   rescued=0    ignored=0
"""


def test_noop_reapply_counts_ok_and_skipped_tasks_per_host_from_the_recap():
    assert script("noop_reapply").recap_counts(RECAP_OUTPUT) == {"lab-gx10-1": (162, 78, 0), "lab-spark-1": (146, 78, 2)}


@pytest.mark.parametrize("output", ["", "fatal: [lab-gx10-1]: FAILED!", "PLAY [Check the whole fleet] ***\n"])
def test_noop_reapply_refuses_an_output_without_a_recap(output):
    with pytest.raises(SystemExit, match="no PLAY RECAP"):
        script("noop_reapply").recap_counts(output)


def test_noop_reapply_prints_tasks_wall_and_controller_cpu_per_host(monkeypatch, capsys):
    noop = script("noop_reapply")
    measured = iter([(20.0, {"lab-gx10-1": (162, 78, 0), "lab-spark-1": (146, 78, 1)}, 30.0, 10.0),
                     (40.0, {"lab-gx10-1": (60, 20, 0), "lab-spark-1": (50, 20, 0)}, 50.0, 12.0)])
    monkeypatch.setattr(noop, "reapply", lambda: next(measured))
    lines = printed_lines(noop, ["--runs", "2"], capsys)
    assert "| lab-gx10-1 | 60 | 20 | 0 | 30.0 | 40.0 |" in lines
    assert "| lab-spark-1 | 50 | 20 | 1 | 30.0 | 40.0 |" in lines
    assert any(line.startswith("goals: at most 60 tasks per host (met, at most 60); under 15 s (missed, 30.0 s)") for line in lines)


def test_noop_reapply_refuses_a_recap_without_a_lab_host(monkeypatch):
    noop = script("noop_reapply")
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: subprocess.CompletedProcess(args, 0, RECAP_OUTPUT.replace("lab-gx10-1", "other"), ""))
    with pytest.raises(SystemExit, match="names no lab-gx10-1"):
        noop.reapply()


# --- fleet_scale


def test_fleet_scale_builds_its_site_runs_against_the_playbook_and_its_own_inventory(lab_env, tmp_path):
    fleet = script("fleet_scale")
    inventory = fleet.write_inventory(tmp_path)
    hosts = yaml.safe_load(inventory.read_text())["all"]["children"]["bench"]["hosts"]
    assert list(hosts) == fleet.HOSTS
    commands = fleet.planned_commands(LAB_ENV["SPARKFLEET_LAB_IMAGE"], inventory, 2)
    site_runs = [argv for _set, _unset, argv in commands if argv[0] == "ansible-playbook"]
    assert len(site_runs) == 2 + len(fleet.SCALES) * 2 + len(fleet.REVERTED) * 2
    limits = [option(argv, "--limit").split(",") for argv in site_runs]
    assert limits[:2] == [fleet.HOSTS[:1], fleet.HOSTS[1:]]
    assert limits[2:2 + len(fleet.SCALES) * 2] == [fleet.HOSTS[:count] for count in fleet.SCALES for _run in range(2)]
    for argv in site_runs:
        assert option(argv, "--tags") == ",".join(fleet.ROLES)
    playbook, roles = check_playbook_command(site_runs[0], hosts)
    assert set(fleet.ROLES) <= roles
    assert sorted(listed_hosts(site_runs[1])["Prepare the hosts for serving"]) == sorted(fleet.HOSTS[1:])
    check_playbook_command(site_runs[-1], hosts)
    assert playbook == "site.yml"


def test_fleet_scale_gives_its_hosts_the_lab_settings_the_roles_take(tmp_path):
    fleet = script("fleet_scale")
    lab = yaml_file("inventories/lab/group_vars/lab.yml")
    settings = yaml.safe_load(fleet.write_inventory(tmp_path).read_text())["all"]["children"]["bench"]["vars"]
    roles = roles_reached("site.yml")
    for name in fleet.HOST_SETTINGS:
        assert settings[name] == lab[name]
        assert name in declared_variables(roles) or (name.startswith("sparkfleet_") and read_by_roles(name, roles)), name


def test_fleet_scale_starts_its_hosts_as_the_lab_starts_its_own(lab_env):
    fleet = script("fleet_scale")
    lab = yaml_file("lab/hosts.yml")[0]["tasks"][1]["community.docker.docker_container"]
    argv = fleet.host_command("sparkfleet/lab:test", "bench-3")
    assert argv[:6] == [fleet.DOCKER, "run", "-d", "--name", "sparkfleet-bench-3", "--hostname"]
    for capability in lab["capabilities"]:
        assert ["--cap-add", capability] == argv[argv.index(capability) - 1:argv.index(capability) + 1]
    for security in lab["security_opts"]:
        assert argv[argv.index(security) - 1] == "--security-opt"
    for folder in lab["tmpfs"]:
        assert argv[argv.index(folder) - 1] == "--tmpfs"
    assert option(argv, "--cgroupns") == lab["cgroupns_mode"]
    assert option(argv, "--stop-signal") == lab["stop_signal"]
    assert argv[-2:] == ["sparkfleet/lab:test", lab["command"]]
    assert lab["volumes"][0] in argv


def test_fleet_scale_measures_settings_of_docs_ansible_cfg_by_their_environment_names():
    fleet = script("fleet_scale")
    from ansible.config.manager import ConfigManager

    parser = configparser.ConfigParser()
    parser.read(fleet.CONFIG)
    by_env = {}
    for definition in ConfigManager().get_configuration_definitions().values():
        for env in definition.get("env") or []:
            by_env[env["name"]] = {(ini["section"], ini["key"]) for ini in definition.get("ini") or []}
    for env in fleet.REVERTED.values():
        for name, value in env.items():
            set_in_file = [(section, key) for section, key in by_env[name] if parser.has_option(section, key)]
            assert set_in_file, f"{name} reverts no setting of docs/ansible.cfg"
            assert parser.get(*set_in_file[0]) != value
    changes, unset = fleet.environment_changes(fleet.CONFIG, {"ANSIBLE_FORKS": "5"})
    assert changes == {"ANSIBLE_FORKS": "5", "ANSIBLE_CONFIG": str(fleet.CONFIG)}
    assert unset == ("ANSIBLE_PIPELINING",)
    assert fleet.environment_changes(None, fleet.PROFILE_ENV) == (fleet.PROFILE_ENV, ())


def test_fleet_scale_profiles_roles_with_a_callback_that_is_installed():
    namespace, collection, plugin = script("fleet_scale").PROFILE_ENV["ANSIBLE_CALLBACKS_ENABLED"].split(".")
    found = [path for path in map(pathlib.Path, sys.path)
             if (path / "ansible_collections" / namespace / collection / "plugins" / "callback" / f"{plugin}.py").is_file()]
    assert found, f"{namespace}.{collection}.{plugin} is not installed"


def test_fleet_scale_prints_its_commands_and_starts_nothing(lab_env, nothing_runs, capsys):
    fleet = script("fleet_scale")
    lines = printed_lines(fleet, ["--print-commands", "--runs", "1"], capsys)
    assert lines[0] == f"cd {shlex.quote(str(ROOT))}"
    assert lines[1] == lines[-1] == shlex.join(fleet.remove_command())
    assert sum(" run -d " in line for line in lines) == len(fleet.HOSTS)
    assert sum("ansible-playbook" in line for line in lines) == 2 + len(fleet.SCALES) + len(fleet.REVERTED)
    assert "env -u ANSIBLE_PIPELINING ANSIBLE_FORKS=5 ANSIBLE_CONFIG=" in next(line for line in lines if "ANSIBLE_FORKS=5" in line)


# --- frozen_engine


def test_frozen_engine_acts_on_the_lab_hosts_tiny_instance_by_the_collections_names():
    frozen = script("frozen_engine")
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_instance import settings_paths, unit_names

    lab = lab_inventory_hosts()
    assert frozen.HOST == lab["lab"]["hosts"]["lab-gx10-1"]["ansible_host"]
    assert yaml_file("lab/hosts.yml")[0]["tasks"][1]["community.docker.docker_container"]["name"] == "{{ ansible_host }}"
    name = frozen.CONTAINER.removeprefix("vllm-")
    assert (frozen.UNIT, frozen.CONTAINER) == unit_names(name, False)
    assert frozen.ENV_FILE == settings_paths(yaml_file("roles/vllm/defaults/main.yml")["vllm_config_dir"], name)[0]
    instance = lab_instance(name)
    assert frozen.PORT == instance["port"]
    assert "tiny" in instance["served_model_names"]
    assert '"model": "tiny"' in frozen.completion("KEY", 2, 10)


def test_frozen_engine_runs_at_the_watchdog_roles_defaults():
    frozen = script("frozen_engine")
    lab_settings = "".join(path.read_text() for path in (ROOT / "inventories" / "lab").rglob("*.yml"))
    assert not re.search(r"^\s*watchdog_\w+:", lab_settings, re.MULTILINE), "the lab inventory changes a watchdog setting"
    defaults = yaml_file("roles/watchdog/defaults/main.yml")
    assert frozen.SERVE_TIMEOUT > defaults["watchdog_interval"] * (defaults["watchdog_failures"] + 1)
    assert "sparkfleet-watchdog.service" in (ROOT / "roles" / "watchdog" / "meta" / "argument_specs.yml").read_text()


def test_frozen_engine_parses_its_options():
    frozen = script("frozen_engine")
    defaults = frozen.parse_arguments([])
    assert (defaults.runs, defaults.load_seconds, defaults.print_commands) == (1, 150, False)
    given = frozen.parse_arguments(["--runs", "2", "--load-seconds", "30", "--print-commands"])
    assert (given.runs, given.load_seconds, given.print_commands) == (2, 30, True)
    for wrong in (["--runs", "3"], ["--load-seconds", "0"], ["--load-seconds", "-5"], ["--load-seconds", "soon"]):
        with pytest.raises(SystemExit) as stopped:
            frozen.parse_arguments(wrong)
        assert stopped.value.code == 2


def test_frozen_engine_prints_what_it_runs_on_the_lab_host_and_runs_nothing(nothing_runs, capsys):
    frozen = script("frozen_engine")
    lines = printed_lines(frozen, ["--print-commands", "--runs", "2", "--load-seconds", "30"], capsys)
    commands = [shlex.split(line) for line in lines]
    assert all(command[:5] == ["docker", "exec", frozen.HOST, "sh", "-c"] for command in commands)
    shells = [command[5] for command in commands]
    assert shells[0] == f"cat {frozen.ENV_FILE}"
    assert shells.count("kill -STOP PID") == shells.count("kill -CONT PID 2>/dev/null") == 2
    assert shells.count(f"docker top {frozen.CONTAINER} -eo pid,args") == 2
    assert sum("+30)); while" in shell for shell in shells) == frozen.LOAD_CLIENTS
    assert shells[-1].startswith("journalctl -u sparkfleet-watchdog.service -o cat --no-pager --since @")


# --- gate_latency and bench_overhead (lab_vllm)


def test_gate_latency_runs_the_health_gate_with_options_it_documents(lab_env, nothing_runs):
    gate = script("gate_latency")
    commands = gate.planned_commands(LAB_ENV["SPARKFLEET_VLLM_IMAGE_LOCAL"], LAB_ENV["SPARKFLEET_TINY_MODEL"], "k" * 32, 2)
    module_runs = [command for command in commands if command[1] is not None]
    assert len(module_runs) == len(gate.INTERVALS) * 2 * 2
    intervals = [check_module_run(command, "vllm_health")["interval"] for command in module_runs]
    assert intervals == [interval for interval in gate.INTERVALS for _run in range(4)]
    starts = [index for index, (argv, _stdin) in enumerate(commands) if argv[:3] == [gate.DOCKER, "run", "-d"]]
    assert len(starts) == len(gate.INTERVALS) * 2 * 2
    assert all(commands[index - 1][0] == gate.REMOVE_COMMAND for index in starts), "each start removes the last container first"
    assert commands[-1] == (gate.REMOVE_COMMAND, None)
    assert sum(gate.EXITING[0] in argv for argv, _stdin in commands) == len(gate.INTERVALS) * 2


@pytest.mark.parametrize("name", ["gate_latency", "bench_overhead"])
def test_the_served_tiny_model_listens_on_loopback_only(name, lab_env, nothing_runs):
    module = script(name)
    argv = module.serve_command("image", "/models", "key")
    assert option(argv, "-p") == f"127.0.0.1:{module.PORT}:8000"
    assert option(argv, "--served-model-name") == "tiny"
    assert "VLLM_NO_USAGE_STATS=1" in argv


def test_bench_overhead_runs_the_module_and_vllm_bench_on_the_same_shape(lab_env, nothing_runs, tmp_path):
    bench = script("bench_overhead")
    commands = bench.planned_commands(LAB_ENV["SPARKFLEET_VLLM_IMAGE_LOCAL"], LAB_ENV["SPARKFLEET_TINY_MODEL"], "k" * 32, 3, str(tmp_path))
    module_runs = [command for command in commands if command[1] is not None]
    assert len(module_runs) == 3
    arguments = check_module_run(module_runs[0], "vllm_bench")
    direct = bench.direct_command()
    assert commands.count((direct, None)) == 4, "one warm-up and one per run"
    assert direct[:6] == [bench.DOCKER, "exec", "--env", "OPENAI_API_KEY", bench.NAME, "vllm"]
    assert "k" * 32 not in direct, "the key travels in the environment"
    assert option(direct, "--max-concurrency") == str(arguments["concurrencies"][0])
    assert option(direct, "--num-prompts") == str(arguments["concurrencies"][0] * arguments["prompts_per_concurrency"])
    assert option(direct, "--seed") == "1000"
    assert [option(direct, "--random-input-len"), option(direct, "--random-output-len")] == [str(arguments["input_tokens"]), str(arguments["output_tokens"])]
    assert (commands[0], commands[-1]) == ((bench.REMOVE_COMMAND, None), (bench.REMOVE_COMMAND, None))


@pytest.mark.parametrize("name", ["gate_latency", "bench_overhead"])
def test_module_scripts_print_their_commands_and_start_nothing(name, lab_env, nothing_runs, capsys):
    module = script(name)
    lines = printed_lines(module, ["--print-commands", "--runs", "1"], capsys)
    assert lines[0] == shlex.join(module.REMOVE_COMMAND)
    assert any(f"plugins/modules/{'vllm_health' if name == 'gate_latency' else 'vllm_bench'}.py <<< " in line for line in lines)
    assert all(LAB_ENV["SPARKFLEET_VLLM_IMAGE_LOCAL"] in line for line in lines if " run -d " in line)
