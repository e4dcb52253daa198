# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The runner the collection's step modules hand their module_utils: argv in, (rc, stdout, stderr)
out. Private to the collection."""

from __future__ import annotations

import typing as t

Runner = t.Callable[[list[str]], tuple[int, str, str]]


def tool_runner(module: t.Any) -> Runner:
    """Run argv[0] found on the host's PATH. A tool that is missing or cannot run is a result naming
    it (rc 127 or 126), never an exception: a step half done (a relaunch that must still roll back)
    goes on to its own failure handling."""

    def run(argv: list[str]) -> tuple[int, str, str]:
        tool = module.get_bin_path(argv[0])
        if tool is None:
            return 127, "", f"{argv[0]} is not installed on the host (not on its PATH)"
        try:
            return module.run_command([tool, *argv[1:]], handle_exceptions=False)
        except OSError as error:
            return 126, "", f"{tool} cannot run ({error.strerror})"

    return run
