# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which of site.yml's roles a run applies, judged from its --tags and --skip-tags. Private to the collection.

Apart from the fleet check because plays template it for almost every task: what a task's filter imports, each of
Ansible's per-task workers compiles again."""

from __future__ import annotations

import typing as t


def tag_in_run(tag: str, run_tags: t.Iterable[str], skip_tags: t.Iterable[str], known: t.Iterable[str] | None = None) -> bool:
    """Whether a run given these --tags and --skip-tags runs the tasks tagged with this one tag alone
    (a role's tag in site.yml), as Ansible judges a task's tags. The plan counts on a role applied
    earlier in the same run only then. With ``known`` (every tag site.yml gives), a run tag outside it
    may carry the role too (a play importing site.yml under a tag of its own), so the role counts as
    in the run unless its tag is skipped: the fleet check skips a role's checks only when the run
    surely leaves the role out."""
    tags = {"all", "tagged", tag}
    if tags.intersection(skip_tags):
        return False
    run_tags = set(run_tags)
    return bool(tags.intersection(run_tags)) or (known is not None and bool(run_tags - set(known) - {"untagged"}))
