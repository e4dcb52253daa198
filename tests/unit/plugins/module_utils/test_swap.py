"""The swap step on real files in a temporary folder, with a recording runner standing in for swapon,
swapoff and systemctl that answers in the formats systemd 252 (Debian 12) prints: the fstab entries
commented line by line, a backup beside fstab, its mode and owner kept, the missing masks set in one
call, check mode answered the same and writing nothing, a second run changing nothing, and every
refusal made before anything runs."""

import fnmatch
import os
import re
import time

import pytest

from ansible_collections.sparkfleet.vllm.plugins.module_utils import _memory
from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import FileProblem
from ansible_collections.sparkfleet.vllm.plugins.module_utils._swap import (
    LIST_UNIT_FILES,
    SwapProblem,
    backup_path,
    comment_swap_entries,
    turn_swap_off,
    units_to_mask,
)

# The regex the swap role's ansible.builtin.replace task used (multiline, as replace compiles it).
ROLE_REGEX = re.compile(r"^(\s*[^#\s]\S*\s+\S+\s+swap\s.*)$", re.MULTILINE)
# The lab's fstab after molecule's prepare (blockinfile) on a Debian base image.
FSTAB = """# UNCONFIGURED FSTAB FOR BASE SYSTEM
# BEGIN ANSIBLE MANAGED BLOCK
/swap.img none swap sw 0 0
UUID=4b1c5c6e-0000-4000-8000-000000000001 none swap sw 0 0
# END ANSIBLE MANAGED BLOCK
"""
COMMENTED = FSTAB.replace("/swap.img", "# /swap.img").replace("UUID=4b1c", "# UUID=4b1c")
# Recorded from systemctl list-unit-files --no-legend --plain --type=swap,service,target (systemd 252,
# Debian 12), with the lab's zram stand-in and a swap unit fstab's generator makes.
LISTING = {
    "apparmor.service": ("enabled", "enabled"),
    "apt-daily.service": ("static", "-"),
    "autovt@.service": ("alias", "-"),
    "dev-disk-by\\x2duuid-4b1c5c6e\\x2d0000\\x2d4000\\x2d8000\\x2d000000000001.swap": ("generated", "-"),
    "dev-zram0.swap": ("static", "-"),
    "getty@.service": ("enabled", "enabled"),
    "hwclock.service": ("masked", "enabled"),
    "swap.img.swap": ("generated", "-"),
    "swap.target": ("static", "-"),
    "zramswap.service": ("masked", "enabled"),
}
ZRAM_UNITS = ["zramswap.service", "systemd-zram-setup@zram0.service", "dev-zram0.swap"]
TO_MASK = ["dev-disk-by\\x2duuid-4b1c5c6e\\x2d0000\\x2d4000\\x2d8000\\x2d000000000001.swap", "dev-zram0.swap", "swap.img.swap", "swap.target"]
# What systemctl mask prints when a unit file, not a link, holds the name (systemd 252).
MASK_BLOCKED = "Failed to mask unit: File /etc/systemd/system/swap.target already exists.\n"


def listing_text(states):
    return "".join(f"{unit:<38} {state:<8} {preset}\n" for unit, (state, preset) in sorted(states.items()))


class Host:
    """A recording runner: swapon, swapoff and systemctl answering from, and changing, the host's state."""

    def __init__(self, active=("/swap.img",), states=None, mask_error=None):
        self.active = list(active)
        self.states = dict(LISTING if states is None else states)
        self.mask_error = mask_error
        self.calls = []

    def __call__(self, argv):
        self.calls.append(argv)
        if argv == ["swapon", "--show=NAME", "--noheadings"]:
            return 0, "".join(f"{device}\n" for device in self.active), ""
        if argv == ["swapoff", "-a"]:
            self.active = []
            return 0, "", ""
        if argv == LIST_UNIT_FILES:
            return 0, listing_text(self.states), ""
        if argv[:3] == ["systemctl", "mask", "--"]:
            if self.mask_error:
                return 1, "", self.mask_error
            for unit in argv[3:]:
                self.states[unit] = ("masked", self.states[unit][1])
            return 0, "", "".join(f"Created symlink /etc/systemd/system/{unit} → /dev/null.\n" for unit in argv[3:])
        return 2, "", f"unexpected {argv}"

    def changes(self):
        """The calls that change the host."""
        return [argv for argv in self.calls if argv[:2] in (["swapoff", "-a"], ["systemctl", "mask"])]


@pytest.fixture
def paths(tmp_path, monkeypatch):
    """fstab, a sysctl.d folder the settings check accepts, and a /proc/sys with the kernel's default swappiness."""
    sysctl_d = tmp_path / "sysctl.d"
    sysctl_d.mkdir()
    monkeypatch.setattr(_memory, "SYSCTL_FOLDERS", (str(sysctl_d),))
    proc = tmp_path / "proc"
    (proc / "vm").mkdir(parents=True)
    (proc / "vm" / "swappiness").write_text("60\n")
    fstab = tmp_path / "fstab"
    fstab.write_text(FSTAB)
    return {"fstab": fstab, "sysctl": sysctl_d / "99-sparkfleet-swap.conf", "proc": proc, "folder": tmp_path}


def swap_off(paths, host, check_mode=False, **options):
    given = {"disable_active": True, "fstab_path": str(paths["fstab"]), "swappiness": 1, "sysctl_file": str(paths["sysctl"]),
             "apply_sysctl": True, "mask_units": True, "zram_units": ZRAM_UNITS, **options}
    return turn_swap_off(host, check_mode=check_mode, proc_sys=str(paths["proc"]), **given)


def backups(paths):
    return sorted(path.name for path in paths["folder"].iterdir() if fnmatch.fnmatch(path.name, "fstab.*~"))


@pytest.mark.parametrize(("line", "commented"), [
    ("/swap.img none swap sw 0 0\n", "# /swap.img none swap sw 0 0\n"),
    ("UUID=4b1c5c6e-0000-4000-8000-000000000001\tnone\tswap\tsw\t0\t0\n", "# UUID=4b1c5c6e-0000-4000-8000-000000000001\tnone\tswap\tsw\t0\t0\n"),
    ("  LABEL=swap   none  swap  defaults  0 0\n", "#   LABEL=swap   none  swap  defaults  0 0\n"),
    ("\t/dev/sda3 swap swap defaults 0 0\n", "# \t/dev/sda3 swap swap defaults 0 0\n"),
    ("/swapfile none swap sw,pri=10 0 0", "# /swapfile none swap sw,pri=10 0 0"),
    ("/dev/zram0 none swap defaults 0 0\r\n", "# /dev/zram0 none swap defaults 0 0\r\n"),
])
def test_a_swap_entry_is_commented_with_its_indentation_and_line_ending(line, commented):
    assert comment_swap_entries(line) == (commented, [line.rstrip("\r\n")])
    assert comment_swap_entries(commented) == (commented, []), "a commented entry stays as it is"


@pytest.mark.parametrize("line", [
    "# /swap.img none swap sw 0 0\n",
    "#/swap.img none swap sw 0 0\n",
    "   # UUID=4b1c5c6e-0000-4000-8000-000000000001 none swap sw 0 0\n",
    "UUID=0a3407de-014b-458b-b5c1-848e92a327a3 / ext4 errors=remount-ro 0 1\n",
    "/dev/sdb1 /mnt/swap ext4 defaults 0 2\n",
    "/dev/sdc1 swap ext4 defaults 0 2\n",
    "swap.img /srv/swap xfs swap 0 0\n",
    "tmpfs /tmp tmpfs defaults,size=2G 0 0\n",
    "\n",
    "proc\n",
])
def test_what_is_not_a_swap_entry_is_left_as_it_is(line):
    assert comment_swap_entries(line) == (line, [])


def test_an_ordinary_fstab_comes_out_as_the_roles_regex_made_it():
    fstab = FSTAB + "UUID=0a3407de / ext4 errors=remount-ro 0 1\n\t/dev/sda3\tnone\tswap\tsw\t0\t0\n/dev/sdb1 /mnt/swap ext4 defaults 0 2\n"
    assert comment_swap_entries(fstab)[0] == ROLE_REGEX.sub(r"# \1", fstab)


def test_a_blank_line_before_an_entry_is_not_what_gets_commented():
    fstab = "proc /proc proc defaults 0 0\n\n/swap.img none swap sw 0 0\n"
    assert comment_swap_entries(fstab) == ("proc /proc proc defaults 0 0\n\n# /swap.img none swap sw 0 0\n", ["/swap.img none swap sw 0 0"])
    # The role's regex let \s* run over the line break and commented the blank line instead.
    assert ROLE_REGEX.sub(r"# \1", fstab) == "proc /proc proc defaults 0 0\n# \n/swap.img none swap sw 0 0\n"


def test_the_units_to_mask_are_the_swap_units_present_and_not_masked():
    assert units_to_mask(listing_text(LISTING), ZRAM_UNITS) == TO_MASK
    runtime = {**LISTING, "zramswap.service": ("masked-runtime", "enabled")}
    assert "zramswap.service" in units_to_mask(listing_text(runtime), ZRAM_UNITS), "a runtime mask is gone at the next boot"
    assert units_to_mask(listing_text(LISTING), []) == TO_MASK, "swap.target and the swap units need no listing"
    assert units_to_mask("", ZRAM_UNITS) == []


def test_the_backup_is_named_as_ansibles_backup_local_names_it():
    name = backup_path("/etc/fstab", 4711, time.strptime("2025-01-31 12:05:09", "%Y-%m-%d %H:%M:%S"))
    assert name == "/etc/fstab.4711.2025-01-31@12:05:09~"
    assert fnmatch.fnmatch(name, "/etc/fstab.*~"), "the molecule test finds it with this glob"


def test_check_mode_reports_everything_and_changes_nothing_then_the_run_does_it_once(paths):
    host = Host()
    check = swap_off(paths, host, check_mode=True)
    assert check["changed"] and check["swapped_off"] and check["masked"] == TO_MASK
    assert check["fstab_commented"] == ["/swap.img none swap sw 0 0", "UUID=4b1c5c6e-0000-4000-8000-000000000001 none swap sw 0 0"]
    assert check["sysctl_changed"] and check["sysctl_file_written"] and check["sysctl_set_running"] == ["vm.swappiness"]
    assert check["fstab_backup"] == "" and [entry["after"] for entry in check["diff"]][0] == COMMENTED
    assert host.changes() == [] and host.active == ["/swap.img"]
    assert paths["fstab"].read_text() == FSTAB and not paths["sysctl"].exists() and backups(paths) == []
    assert (paths["proc"] / "vm" / "swappiness").read_text() == "60\n"

    done = swap_off(paths, host)
    assert {key: value for key, value in done.items() if key != "fstab_backup"} == \
        {key: value for key, value in check.items() if key != "fstab_backup"}, "check mode answered the same"
    assert host.changes() == [["swapoff", "-a"], ["systemctl", "mask", "--", *TO_MASK]], "the missing masks in one call"
    assert paths["fstab"].read_text() == COMMENTED
    assert backups(paths) == [os.path.basename(done["fstab_backup"])] and open(done["fstab_backup"]).read() == FSTAB
    assert paths["sysctl"].read_text().endswith("\nvm.swappiness=1\n") and (paths["proc"] / "vm" / "swappiness").read_text() == "1"

    host.calls = []
    again = swap_off(paths, host)
    assert again == {"changed": False, "swapped_off": False, "fstab_commented": [], "fstab_backup": "", "sysctl_changed": False,
                     "sysctl_file_written": False, "sysctl_set_running": [], "masked": [], "diff": []}
    assert host.calls == [["swapon", "--show=NAME", "--noheadings"], LIST_UNIT_FILES], "a no-op only reads"
    assert len(backups(paths)) == 1 and paths["fstab"].read_text() == COMMENTED


def test_only_the_units_not_yet_masked_are_masked(paths):
    states = {**LISTING, **{unit: ("masked", "-") for unit in TO_MASK if unit != "dev-zram0.swap"}}
    host = Host(active=(), states=states)
    assert swap_off(paths, host)["masked"] == ["dev-zram0.swap"]
    assert host.changes() == [["systemctl", "mask", "--", "dev-zram0.swap"]]


@pytest.mark.skipif(os.geteuid() != 0, reason="setting another owner needs root")
def test_fstab_keeps_its_mode_and_owner_and_a_link_stays_a_link(paths):
    shared = paths["folder"] / "shared-fstab"
    paths["fstab"].rename(shared)
    paths["fstab"].symlink_to(shared)
    os.chmod(shared, 0o640)
    os.chown(shared, 4321, 4322)
    done = swap_off(paths, Host())
    assert paths["fstab"].is_symlink() and shared.read_text() == COMMENTED
    for path in (shared, done["fstab_backup"]):
        status = os.stat(path)
        assert (status.st_mode & 0o7777, status.st_uid, status.st_gid) == (0o640, 4321, 4322), path


def test_a_failed_mask_names_the_units_systemctls_words_and_the_fix(paths):
    host = Host(active=(), mask_error=MASK_BLOCKED)
    with pytest.raises(SwapProblem) as raised:
        swap_off(paths, host)
    message = str(raised.value)
    assert ", ".join(TO_MASK) in message and MASK_BLOCKED.strip() in message and "move it away" in message


@pytest.mark.parametrize(("options", "fragment"), [
    ({"swappiness": 11}, "swappiness: 11 is out of range; give a whole number from 0 to 10"),
    ({"swappiness": -1}, "swappiness: -1 is out of range"),
    ({"sysctl_file": "/etc/sysctl.conf"}, "sysctl_file: /etc/sysctl.conf is not a file its reader reads"),
    ({"sysctl_file": "sysctl.d/99-swap.conf"}, "sysctl_file: 'sysctl.d/99-swap.conf' must be an absolute path"),
    ({"zram_units": ["zramswap.service", "x;reboot"]}, "zram_units[1]: 'x;reboot' is not a systemd unit name"),
    ({"zram_units": ["--root=/tmp"]}, "zram_units[0]: '--root=/tmp' is not a systemd unit name"),
])
def test_a_bad_option_is_refused_before_anything_runs(paths, options, fragment):
    host = Host()
    with pytest.raises(SwapProblem) as raised:
        swap_off(paths, host, **options)
    assert fragment in str(raised.value)
    assert host.calls == [] and paths["fstab"].read_text() == FSTAB and not paths["sysctl"].exists()


def test_a_swap_file_unit_named_with_an_escape_is_masked_as_systemd_lists_it(paths):
    host = Host(states={**LISTING, "\\x2eswapfile.swap": ("generated", "-")})
    done = swap_off(paths, host)
    assert "\\x2eswapfile.swap" in done["masked"]
    assert ["systemctl", "mask", "--", *sorted([*TO_MASK, "\\x2eswapfile.swap"])] in host.changes()


def test_without_masking_or_swapoff_neither_systemctl_nor_swapon_runs(paths):
    host = Host()
    done = swap_off(paths, host, disable_active=False, mask_units=False, zram_units=["not checked when not masking;"])
    assert host.calls == [] and done["masked"] == [] and not done["swapped_off"] and host.active == ["/swap.img"]
    assert done["changed"] and paths["fstab"].read_text() == COMMENTED


@pytest.mark.parametrize(("answers", "fragments"), [
    ({"swapon": (127, "", "swapon is not installed on the host (not on its PATH)")}, ["swapon is not installed", "Debian package mount"]),
    ({"swapoff": (255, "", "swapoff: /swap.img: swapoff failed: Cannot allocate memory")},
     ["swapoff -a exited 255: swapoff: /swap.img: swapoff failed: Cannot allocate memory", "must fit without swap"]),
    ({"systemctl": (1, "", "System has not been booted with systemd as init system (PID 1). Can't operate.")},
     ["list-unit-files", "exited 1: System has not been booted", "is systemd running"]),
])
def test_a_tool_that_fails_is_named_with_its_words(paths, answers, fragments):
    host = Host()

    def run(argv):
        return answers[argv[0]] if argv[0] in answers else host(argv)

    with pytest.raises(SwapProblem) as raised:
        turn_swap_off(run, disable_active=True, fstab_path=str(paths["fstab"]), swappiness=1, sysctl_file=str(paths["sysctl"]),
                      apply_sysctl=True, mask_units=True, zram_units=ZRAM_UNITS, check_mode=False, proc_sys=str(paths["proc"]))
    for fragment in fragments:
        assert fragment in str(raised.value)


def test_a_missing_fstab_is_named_and_nothing_changes(paths):
    paths["fstab"].unlink()
    host = Host()
    with pytest.raises(SwapProblem, match="fstab_path: .* does not exist"):
        swap_off(paths, host)
    assert host.changes() == [] and not paths["sysctl"].exists()


def test_a_sysctl_the_kernel_cannot_take_is_a_file_problem(paths):
    (paths["proc"] / "vm" / "swappiness").unlink()
    with pytest.raises(FileProblem, match="vm.swappiness: the running kernel has no such setting"):
        swap_off(paths, Host(), check_mode=True)
