# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The correctness set: cases with declarative checks, judging answers, and the diff against a reference.

Private to the collection. Seed 000's lesson: the diff matters more than the score. A
configuration that scores like the reference but changes three answers is suspicious (GB10
kernels can be silently wrong: fluent garbage, no error); one that changes nothing is safe.
Checks are data (has_number, exact, regex, json_fields): user case files are never evaluated
as code.

The vllm_correctness module's work is here too, so its main() only wires its options: the options checked
(request), the cases asked over HTTP through _vllm_client, and the results saved and judged (correctness).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import threading
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import write_changed
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_bench import CONCURRENCY
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_client import discover_model, http, json_object, label_problems, reply_problem

CHECK_KINDS = ("has_number", "exact", "regex", "json_fields")
CASE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def case(case_id: str, prompt: str, **check: t.Any) -> dict[str, t.Any]:
    return {"id": case_id, "prompt": prompt, "check": check}


ONLY = " Reply with only the answer."
BUILTIN_CASES: tuple[dict[str, t.Any], ...] = (
    case("arith-1", "What is 347 * 29?" + ONLY, has_number=10063),
    case("arith-2", "What is 1024 - 389?" + ONLY, has_number=635),
    case("arith-3", "What is 15% of 240?" + ONLY, has_number=36),
    case("word-1", "A train leaves at 14:20 and arrives at 17:05. How many minutes is the trip?" + ONLY, has_number=165),
    case("word-2", "Anna has 3 boxes of 12 eggs and uses 7 eggs. How many eggs are left?" + ONLY, has_number=29),
    case("word-3", "A shop sells pens at 4 for 3 euros. How many euros do 20 pens cost?" + ONLY, has_number=15),
    case("unit-1", "How many metres are in 3.5 kilometres?" + ONLY, has_number=3500),
    case("unit-2", "How many seconds are in 2 hours?" + ONLY, has_number=7200),
    case("unit-3", "How many grams are in 2.25 kilograms?" + ONLY, has_number=2250),
    case("fact-1", "What is the chemical symbol of gold?" + ONLY, exact="Au"),
    case("fact-2", "What is the capital city of Australia?" + ONLY, regex=r"(?i)\bcanberra\b"),
    case("fact-3", "In which year did the first crewed Moon landing take place?" + ONLY, has_number=1969),
    case("str-1", 'Reverse the string "gabespark".' + ONLY, exact="krapsebag"),
    case("str-2", 'Write the word "inference" in upper case.' + ONLY, exact="INFERENCE"),
    case("str-3", 'How many letters "s" are in the word "mississippi"?' + ONLY, has_number=4),
    case("code-1", "What does this Python print?\n\nx = [1, 2, 3]\nprint(sum(x) * len(x))\n" + ONLY, has_number=18),
    case("code-2", "What does this Python print?\n\nprint('-'.join(['a', 'b', 'c']))\n" + ONLY, exact="a-b-c"),
    case(
        "json-1",
        'Extract the person as JSON with keys "name" and "age" from: "Priya Natarajan, 41, leads the platform team." '
        "Reply with only the JSON.",
        json_fields={"name": "Priya Natarajan", "age": 41},
    ),
    case(
        "json-2",
        'Extract the order as JSON with keys "item" and "quantity" from: "Please send 12 spare fans for rack B." '
        "Reply with only the JSON.",
        json_fields={"item": "spare fans", "quantity": 12},
    ),
    case(
        "json-3",
        'Extract the city and the temperature in Celsius as JSON with keys "city" and "celsius" from: '
        '"Oslo reached 31 degrees Celsius on Tuesday." Reply with only the JSON.',
        json_fields={"city": "Oslo", "celsius": 31},
    ),
)


def validate_cases(variable: str, cases: t.Any) -> list[str]:
    """Problems of a list of cases, each naming the case and the field to fix."""
    if not isinstance(cases, list):
        return [f"{variable}: must be a list of cases, each with id, prompt and check"]
    errors: list[str] = []
    seen: set[str] = set()
    for index, item in enumerate(cases):
        where = f"{variable}[{index}]"
        if not isinstance(item, dict):
            errors.append(f"{where}: must be a mapping with id, prompt and check")
            continue
        case_id = item.get("id")
        where = f"{where} ({case_id})" if isinstance(case_id, str) else where
        if not isinstance(case_id, str) or not CASE_ID.fullmatch(case_id):
            errors.append(f"{where}.id: {case_id!r} must be letters, digits, dots, dashes or underscores")
        elif case_id in seen:
            errors.append(f"{where}.id: {case_id} is used by another case")
        else:
            seen.add(case_id)
        if not isinstance(item.get("prompt"), str) or not item["prompt"].strip():
            errors.append(f"{where}.prompt: give the question as text")
        unknown = sorted(set(item) - {"id", "prompt", "check"})
        if unknown:
            errors.append(f"{where}: unknown keys {', '.join(unknown)} (a case has id, prompt and check)")
        errors += check_problems(f"{where}.check", item.get("check"))
    return errors


def check_problems(where: str, check: t.Any) -> list[str]:
    if not isinstance(check, dict) or len(check) != 1 or next(iter(check)) not in CHECK_KINDS:
        return [f"{where}: must be exactly one of {', '.join(CHECK_KINDS)} (for example {{has_number: 42}})"]
    kind, expected = next(iter(check.items()))
    if kind == "has_number" and (isinstance(expected, bool) or not isinstance(expected, (int, float))):
        return [f"{where}.has_number: {expected!r} must be a number"]
    if kind == "exact" and not isinstance(expected, str):
        return [f"{where}.exact: {expected!r} must be text"]
    if kind == "regex":
        if not isinstance(expected, str):
            return [f"{where}.regex: {expected!r} must be a regular expression as text"]
        try:
            re.compile(expected)
        except re.error as error:
            return [f"{where}.regex: {expected!r} does not compile ({error})"]
    if kind == "json_fields" and (not isinstance(expected, dict) or not expected):
        return [f"{where}.json_fields: give a mapping of field to expected value"]
    return []


def normalise(answer: str) -> str:
    """The answer as compared between runs: trimmed, case-folded, whitespace collapsed, outer quotes and final period dropped."""
    text = " ".join((answer or "").split()).casefold()
    for _round in range(2):
        text = text.rstrip(". ").strip("`'\" ")
    return text


def numbers(answer: str) -> list[float]:
    found = []
    for match in NUMBER.findall(answer or ""):
        try:
            found.append(float(match.replace(",", "")))
        except ValueError:
            continue
    return found


def first_json_object(answer: str) -> dict[str, t.Any] | None:
    decoder = json.JSONDecoder()
    text = answer or ""
    for start in [index for index, character in enumerate(text) if character == "{"]:
        try:
            value, _end = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


REGEX_SECONDS = 2.0


class RegexTimeout(Exception):
    pass


def search_within(pattern: str, text: str, seconds: float = REGEX_SECONDS) -> bool:
    """re.search with a time limit: a case file's pattern with catastrophic backtracking must not hang the run.

    The limit is a SIGALRM timer, so it holds in the main thread (where modules run); elsewhere
    the search runs unbounded.
    """
    if threading.current_thread() is not threading.main_thread():
        return re.search(pattern, text) is not None

    def expire(_signum: int, _frame: t.Any) -> None:
        raise RegexTimeout(f"the regex {pattern!r} ran longer than {seconds:g} s on the answer")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return re.search(pattern, text) is not None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def passes(check: t.Mapping[str, t.Any], answer: str) -> bool:
    kind, expected = next(iter(check.items()))
    if kind == "has_number":
        return any(abs(found - float(expected)) < 1e-9 for found in numbers(answer))
    if kind == "exact":
        return normalise(answer) == normalise(expected)
    if kind == "regex":
        return search_within(expected, answer or "")
    document = first_json_object(answer)
    return document is not None and all(document.get(field) == value for field, value in expected.items())


def judge(cases: t.Sequence[t.Mapping[str, t.Any]], answers: t.Mapping[str, str]) -> list[dict[str, t.Any]]:
    results = []
    for c in cases:
        try:
            results.append({"id": c["id"], "pass": passes(c["check"], answers[c["id"]]), "answer": answers[c["id"]]})
        except RegexTimeout as error:
            results.append({"id": c["id"], "pass": False, "answer": answers[c["id"]], "reason": str(error)})
    return results


def reference_problems(path: str, reference: t.Any) -> list[str]:
    """Why a reference file cannot be compared with: not a results file of vllm_correctness, or a damaged one."""
    results = reference.get("results") if isinstance(reference, dict) else None
    if not isinstance(results, list):
        return [f"reference: {path} is not a results file of vllm_correctness (no results list)"]
    damaged = [index for index, r in enumerate(results) if not (isinstance(r, dict) and isinstance(r.get("id"), str)
                                                                and isinstance(r.get("pass"), bool) and isinstance(r.get("answer"), str))]
    if damaged:
        return [f"reference: {path} has results without id, pass and answer (entries {', '.join(map(str, damaged[:5]))}); "
                "it is damaged, run the reference label again"]
    return []


def diff(reference: t.Mapping[str, t.Any], current: t.Sequence[t.Mapping[str, t.Any]]) -> dict[str, t.Any]:
    """Each case whose pass/fail or normalised answer changed; ok unless fewer cases pass than in the reference."""
    before = {r["id"]: r for r in reference.get("results", [])}
    after = {r["id"]: r for r in current}
    changed = []
    for case_id, result in after.items():
        old = before.get(case_id)
        if old is None:
            continue
        if old["pass"] != result["pass"] or normalise(old["answer"]) != normalise(result["answer"]):
            changed.append(
                {
                    "id": case_id,
                    "reference_pass": old["pass"],
                    "pass": result["pass"],
                    "reference_answer": old["answer"],
                    "answer": result["answer"],
                }
            )
    reference_passed = sum(1 for r in before.values() if r["pass"])
    passed = sum(1 for r in after.values() if r["pass"])
    reasons = []
    if passed < reference_passed:
        reasons.append(f"{passed} cases pass against {reference_passed} in the reference {reference.get('label', '')!s}".rstrip())
    missing = sorted(set(before) - set(after))
    return {
        "ok": not reasons,
        "reference_label": reference.get("label"),
        "reference_passed": reference_passed,
        "passed": passed,
        "changed": changed,
        "changed_ids": [c["id"] for c in changed],
        "not_in_reference": sorted(set(after) - set(before)),
        "missing_from_run": missing,
        "reasons": reasons,
    }


def streamed_text(body: str) -> str:
    """The answer a streamed chat completion sent: its server-sent events' content deltas, joined. ValueError when an
    event is no JSON chunk, the stream carries an error, or it ends without [DONE] (a stream cut short)."""
    parts: list[str] = []
    for line in body.splitlines():
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            return "".join(parts)
        try:
            chunk = json.loads(data)
        except ValueError as error:
            raise ValueError(f"a streamed event is not JSON ({data[:80]!r})") from error
        if not isinstance(chunk, dict) or "error" in chunk or chunk.get("object") == "error":
            raise ValueError(f"the stream carried an error: {str(chunk)[:200]}")
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise ValueError(f"a streamed chunk's choices are not a list: {str(chunk)[:200]}")
        for choice in choices:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            content = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(content, str):
                parts.append(content)
    raise ValueError("the stream ended without [DONE]: it was cut short")


def stream_mismatches(results: t.Sequence[t.Mapping[str, t.Any]], streamed: t.Mapping[str, str]) -> list[dict[str, t.Any]]:
    """The cases whose streamed answer is not the non-streamed one, character for character (seed 003: some MoE models
    scramble or drop streamed tokens while the same greedy prompt answers right without streaming)."""
    return [{"id": r["id"], "answer": r["answer"], "streamed_answer": streamed[r["id"]]}
            for r in results if r["id"] in streamed and streamed[r["id"]] != r["answer"]]


def stream_reason(mismatches: t.Sequence[t.Mapping[str, t.Any]], compared: int) -> str:
    shown = "; ".join(f"{m['id']}: {m['answer'][:60]!r} streamed as {m['streamed_answer'][:60]!r}" for m in mismatches[:3])
    return (f"{len(mismatches)} of {compared} greedy answers differ when streamed ({shown}). Some models scramble streamed "
            "tokens (seed 003): try --enforce-eager or another image; an instance under load can also change a greedy "
            "answer between two requests, so rerun on an idle instance before blaming streaming")


# The end-to-end tool call (seed 003: tool calling through a model's parser has been unreliable with coding agents): one
# tool, a prompt that needs it, the model free to choose ("auto"), so the parser, not guided decoding, makes the call.
TOOL_CALL_PROMPT = "What is the weather in Paris right now? Use the get_weather tool."
# Room for a model that writes a sentence before its call: a call cut off would read as no call.
TOOL_CALL_MIN_TOKENS = 256
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city's name"}}, "required": ["city"]},
    },
}


def tool_call_verdict(reply: t.Any) -> dict[str, t.Any]:
    """Whether a chat reply called get_weather with arguments that parse into a city naming Paris: {pass, reason, call}."""
    try:
        message = reply["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        return {"pass": False, "reason": "the reply has no choices[0].message", "call": None}
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    if not isinstance(calls, list) or not calls:
        content = str(message.get("content") or "")[:200] if isinstance(message, dict) else ""
        return {"pass": False, "reason": f"the model called no tool; it answered {content!r} (the parser found no call in it)", "call": None}
    function = calls[0].get("function") if isinstance(calls[0], dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    call = {"name": name, "arguments": arguments}
    if name != WEATHER_TOOL["function"]["name"]:
        return {"pass": False, "reason": f"the model called {name!r}, not get_weather", "call": call}
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        return {"pass": False, "reason": f"the call's arguments are not a JSON object: {str(arguments)[:200]!r}", "call": call}
    if not isinstance(parsed.get("city"), str) or "paris" not in parsed["city"].casefold():
        return {"pass": False, "reason": f"the call's arguments name no city Paris: {parsed!r}", "call": call}
    return {"pass": True, "reason": "get_weather called with arguments that parse, city " + repr(parsed["city"]), "call": call}


class ResultsNotSaved(Exception):
    """The results could not be written; ``results`` holds the judged cases all the same."""

    def __init__(self, reason: str, results: list[dict[str, t.Any]]) -> None:
        super().__init__(reason)
        self.results = results


def reference_path(results_dir: str, reference: str) -> str:
    """A label saved in ``results_dir``, or a results file's own path."""
    if os.sep in reference or reference.endswith(".json"):
        return reference
    return os.path.join(results_dir, f"results-{reference}.json")


def request(params: t.Mapping[str, t.Any]) -> tuple[list[dict[str, t.Any]], dict[str, t.Any] | None, list[str]]:
    """(the cases to run, the reference to diff with or None, every problem of the options, each naming its option)."""
    errors = validate_cases("cases", params["cases"])
    cases = (list(BUILTIN_CASES) if params["builtin_cases"] else []) + params["cases"]
    if not errors:
        errors += validate_cases("cases (with the built-in ones)", cases)
    if not cases:
        errors.append("cases: nothing to run; give cases or set builtin_cases: true")
    errors += label_problems("label", params["label"])
    if params["stream_cases"] < 0:
        errors.append(f"stream_cases is {params['stream_cases']}: give how many cases to also ask streamed (0 for none)")
    if not 0 <= params["load_concurrency"] <= MAX_LOAD_CONCURRENCY:
        errors.append(f"load_concurrency is {params['load_concurrency']}: give the requests to keep in flight, 0 or 1 for none, at most "
                      f"{MAX_LOAD_CONCURRENCY}")
    reference = None
    if params["reference"] and not errors:
        path = reference_path(params["results_dir"], params["reference"])
        if path != params["reference"]:
            errors += label_problems("reference", params["reference"])
        try:
            with open(path, encoding="utf-8") as handle:
                reference = json.load(handle)
        except (OSError, ValueError) as error:
            errors.append(f"reference: cannot read {path} ({error}); run the reference label first or give a results file")
        if reference is not None:
            errors += reference_problems(path, reference)
    return cases, reference, errors


def chat_request(endpoint: t.Mapping[str, t.Any], prompt: str, params: t.Mapping[str, t.Any], stream: bool = False) -> dict[str, t.Any]:
    """A greedy chat completion of ``prompt`` with the module's max_tokens and chat_template_kwargs."""
    return {
        "model": endpoint["model"],
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": params["max_tokens"],
        "chat_template_kwargs": params["chat_template_kwargs"],
        **({"stream": True} if stream else {}),
    }


def ask(endpoint: t.Mapping[str, t.Any], case: t.Mapping[str, t.Any], params: t.Mapping[str, t.Any]) -> str:
    """The case's answer; ValueError naming the case when the endpoint answers anything but a chat completion's text."""
    url = endpoint["url"] + "/v1/chat/completions"
    reply = json_object(http("POST", url, endpoint["api_key"], chat_request(endpoint, case["prompt"], params), timeout=params["timeout"]),
                        f"case {case['id']}: {url}")
    try:
        content = reply["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError) as error:
        raise ValueError(f"case {case['id']}: {url} answered a reply without choices[0].message.content") from error
    if not isinstance(content, str):
        raise ValueError(f"case {case['id']}: {url} answered a choices[0].message.content that is not text")
    return content


def ask_streamed(endpoint: t.Mapping[str, t.Any], case: t.Mapping[str, t.Any], params: t.Mapping[str, t.Any]) -> str:
    """The case's answer asked with stream=true; ValueError naming the case when the stream is not a whole answer."""
    url = endpoint["url"] + "/v1/chat/completions"
    reply = http("POST", url, endpoint["api_key"], chat_request(endpoint, case["prompt"], params, stream=True), timeout=params["timeout"])
    if reply.status != 200:
        raise ValueError(f"case {case['id']} streamed: {reply_problem(reply, url)}")
    try:
        return streamed_text(reply.body)
    except ValueError as error:
        raise ValueError(f"case {case['id']} streamed: {url}: {error}") from error


def ask_tool_call(endpoint: t.Mapping[str, t.Any], params: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
    """The tool-call case's verdict (tool_call_verdict)."""
    url = endpoint["url"] + "/v1/chat/completions"
    body = {**chat_request(endpoint, TOOL_CALL_PROMPT, params), "tools": [WEATHER_TOOL], "tool_choice": "auto",
            "max_tokens": max(params["max_tokens"], TOOL_CALL_MIN_TOKENS)}
    return tool_call_verdict(json_object(http("POST", url, endpoint["api_key"], body, timeout=params["timeout"]), f"the tool-call case: {url}"))


# The most requests the load check keeps in flight: as many as a benchmark may run, whose highest it is given.
MAX_LOAD_CONCURRENCY = int(CONCURRENCY.high)
# A run of one short unit repeated this often, over at least half an answer, is a model stuck in a loop.
REPEATS = 8
_REPEATED_RUN = re.compile(r"(.{1,16}?)\1{" + str(REPEATS - 1) + ",}", re.DOTALL)
# Characters no healthy text answer is made of: the replacement character (broken UTF-8 from mixed-up token ids) and
# control characters but tab and newline.
_SOUP = re.compile(r"[\ufffd\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def degenerate(answer: str) -> str | None:
    """Why an answer is degenerate output (a short unit repeated over most of it, or token soup), None when it is not."""
    if not answer:
        return None
    soup = len(_SOUP.findall(answer))
    if soup * 5 >= len(answer):
        return f"token soup ({soup} of {len(answer)} characters are replacement or control characters)"
    longest = max((match.end() - match.start() for match in _REPEATED_RUN.finditer(answer)), default=0)
    if longest * 2 >= len(answer) and longest >= 2 * REPEATS:
        return f"a repetition loop ({longest} of {len(answer)} characters repeat one short run)"
    return None


def load_schedule(cases: t.Sequence[t.Mapping[str, t.Any]], concurrency: int) -> list[t.Mapping[str, t.Any]]:
    """The requests of the load check: the cases round-robin, twice as many as can be in flight (the batch stays full
    while the first ones finish), each case at least once."""
    total = max(len(cases), 2 * concurrency)
    return [cases[index % len(cases)] for index in range(total)]


def ask_under_load(endpoint: t.Mapping[str, t.Any], cases: t.Sequence[t.Mapping[str, t.Any]], params: t.Mapping[str, t.Any],
                   concurrency: int) -> list[tuple[str, str | None, str | None]]:
    """Each scheduled case asked with ``concurrency`` requests in flight: (case id, answer or None, why it has none)."""
    schedule = load_schedule(cases, concurrency)

    def one(case: t.Mapping[str, t.Any]) -> tuple[str, str | None, str | None]:
        try:
            return case["id"], ask(endpoint, case, params), None
        except (ValueError, OSError) as error:
            return case["id"], None, str(error)[:200]

    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, schedule))


def load_corruptions(cases: t.Sequence[t.Mapping[str, t.Any]], alone: t.Sequence[t.Mapping[str, t.Any]],
                     under_load: t.Sequence[tuple[str, str | None, str | None]]) -> list[dict[str, t.Any]]:
    """The cases a model answered right alone and not under load: a known answer wrong, degenerate output, or no answer.
    Batch-size numerics may change a greedy answer's wording without counting; a case wrong alone says nothing here
    (the sequential diff judges it). One entry per case, with how many of its requests went wrong."""
    checks = {case["id"]: case["check"] for case in cases}
    right_alone = {result["id"]: result["answer"] for result in alone if result["pass"]}
    found: dict[str, dict[str, t.Any]] = {}
    for case_id, answer, error in under_load:
        if case_id not in right_alone:
            continue
        if answer is None:
            reason = f"no answer under load ({error})"
        else:
            try:
                still_right = passes(checks[case_id], answer)
            except RegexTimeout:
                still_right = True
            why = degenerate(answer)
            if why and not degenerate(right_alone[case_id]):
                reason = f"{why} under load, none alone"
            elif not still_right:
                reason = "its known answer was right alone and wrong under load"
            else:
                continue
        entry = found.setdefault(case_id, {"id": case_id, "answer": answer, "alone": right_alone[case_id], "reason": reason, "wrong": 0})
        entry["wrong"] += 1
    asked = {case_id: sum(1 for asked_id, _a, _e in under_load if asked_id == case_id) for case_id in found}
    return [{**entry, "asked": asked[case_id]} for case_id, entry in found.items()]


def load_reason(corrupted: t.Sequence[t.Mapping[str, t.Any]], concurrency: int) -> str:
    shown = "; ".join(f"{c['id']} ({c['wrong']} of {c['asked']}: {c['reason']}; alone {c['alone'][:40]!r}, under load "
                      f"{(c['answer'] or '')[:40]!r})" for c in corrupted[:4])
    advice = []
    if any(c["answer"] is not None for c in corrupted):
        advice.append("Speculative decoding with async scheduling corrupts answers only at concurrency above 1 (vllm 46669): try "
                      "--no-async-scheduling or fewer draft tokens")
    if any(c["answer"] is None for c in corrupted):
        advice.append(f"A request that gets no answer at {concurrency} in flight is a capacity problem: check max_num_seqs, the "
                      "engine's log and the correctness timeout")
    return f"{len(corrupted)} cases answered right alone went wrong with {concurrency} requests in flight: {shown}. {' '.join(advice)}"


def correctness(endpoint: dict[str, t.Any], cases: t.Sequence[t.Mapping[str, t.Any]], reference: t.Mapping[str, t.Any] | None,
                params: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
    """Ask every case (the first stream_cases also streamed, and the tool-call case when wanted), save the judged results
    and compare them: the module's result, ``ok`` false with its reasons when the run does not hold up. ValueError when
    the endpoint answers something else than asked; ResultsNotSaved when the results cannot be written."""
    discover_model(endpoint, params["timeout"])
    answers = {case["id"]: ask(endpoint, case, params) for case in cases}
    streamed = {case["id"]: ask_streamed(endpoint, case, params) for case in cases[:params["stream_cases"]]}
    wanted = params["tool_call"] == "always" or (params["tool_call"] == "auto" and endpoint["tool_parser"])
    tool_call = ask_tool_call(endpoint, params) if wanted else None
    results = judge(cases, answers)
    concurrency = params["load_concurrency"]
    corrupted = load_corruptions(cases, results, ask_under_load(endpoint, cases, params, concurrency)) if concurrency > 1 else []
    load = {"concurrency": concurrency, "requests": len(load_schedule(cases, concurrency)), "corrupted": corrupted} if concurrency > 1 else None
    mismatches = stream_mismatches(results, streamed)
    document = {"label": params["label"], "model": endpoint["model"], "url": endpoint["url"], "max_tokens": params["max_tokens"],
                "results": results, "streamed": len(streamed), "stream_mismatches": mismatches, "tool_call": tool_call, "load": load}
    results_file = os.path.join(params["results_dir"], f"results-{params['label']}.json")
    try:
        # One that already holds these results is left alone.
        text = json.dumps(document, indent=1, sort_keys=True) + "\n"
        changed, _paths = write_changed(params["results_dir"], {os.path.basename(results_file): text.encode()}, False)
    except OSError as error:
        raise ResultsNotSaved(f"results_dir: cannot write {results_file} ({error.strerror or error}); give a results_dir the task's user "
                              "can write, or become: true", results) from error
    output = {"changed": changed, "ok": True, "passed": sum(1 for r in results if r["pass"]), "total": len(results), "results": results,
              "results_file": results_file, "streamed": len(streamed), "stream_mismatches": mismatches, "tool_call": tool_call, "load": load,
              "reasons": []}
    if reference is not None:
        comparison = diff(reference, results)
        output["changed_cases"] = comparison.pop("changed")
        output["ok"] = comparison.pop("ok")
        output["reasons"] = comparison.pop("reasons")
        output["comparison"] = comparison
    if mismatches:
        output["ok"] = False
        output["reasons"].append(stream_reason(mismatches, len(streamed)))
    if corrupted:
        output["ok"] = False
        output["reasons"].append(load_reason(corrupted, concurrency))
    if tool_call and not tool_call["pass"]:
        output["ok"] = False
        output["reasons"].append(f"the tool-call case failed ({endpoint['tool_parser'] or 'the endpoint'}'s parser): {tool_call['reason']}")
    return output
