"""Correctness checks and the diff: declarative checks only, changes reported even at the same score."""

import pytest

from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_correctness import (
    BUILTIN_CASES,
    degenerate,
    diff,
    judge,
    load_corruptions,
    load_reason,
    load_schedule,
    normalise,
    passes,
    reference_problems,
    stream_mismatches,
    stream_reason,
    streamed_text,
    tool_call_verdict,
    validate_cases,
)


def test_twenty_builtin_cases_covering_seed_000s_kinds():
    assert len(BUILTIN_CASES) == 20
    assert validate_cases("builtin", list(BUILTIN_CASES)) == []
    kinds = {case["id"].split("-")[0] for case in BUILTIN_CASES}
    assert kinds == {"arith", "word", "unit", "fact", "str", "code", "json"}


@pytest.mark.parametrize(
    ("check", "answer", "expected"),
    [
        ({"has_number": 10063}, "The answer is 10,063.", True),
        ({"has_number": 10063}, "10036", False),
        ({"has_number": 3.5}, "3.5 km", True),
        ({"exact": "krapsebag"}, ' "Krapsebag". ', True),
        ({"exact": "krapsebag"}, "krapsēbag", False),
        ({"regex": r"(?i)\bcanberra\b"}, "It is Canberra.", True),
        ({"regex": r"\bcanberra\b"}, "Sydney", False),
        ({"json_fields": {"name": "Priya Natarajan", "age": 41}}, '```json\n{"name": "Priya Natarajan", "age": 41}\n```', True),
        ({"json_fields": {"name": "Priya Natarajan", "age": 41}}, '{"name": "Priya Natarajan", "age": "41"}', False),
        ({"json_fields": {"name": "x"}}, "no json here {", False),
    ],
)
def test_checks(check, answer, expected):
    assert passes(check, answer) is expected


@pytest.mark.parametrize(
    ("cases", "fragment"),
    [
        ("not a list", "must be a list"),
        ([{"id": "a", "prompt": "q", "check": {"eval": "1 == 1"}}], "cases[0] (a).check: must be exactly one of"),
        ([{"id": "a", "prompt": "q", "check": {"has_number": 1, "exact": "1"}}], "exactly one of"),
        ([{"id": "a", "prompt": "q", "check": {"regex": "("}}], "does not compile"),
        ([{"id": "a", "prompt": "q", "check": {"has_number": "ten"}}], "must be a number"),
        ([{"id": "a", "prompt": "", "check": {"exact": "x"}}], "prompt: give the question"),
        ([{"id": "a b", "prompt": "q", "check": {"exact": "x"}}], ".id: 'a b'"),
        ([{"id": "a", "prompt": "q", "check": {"exact": "x"}}, {"id": "a", "prompt": "q", "check": {"exact": "y"}}], "used by another case"),
        ([{"id": "a", "prompt": "q", "check": {"exact": "x"}, "code": "print(1)"}], "unknown keys code"),
    ],
)
def test_bad_cases_are_named(cases, fragment):
    assert any(fragment in problem for problem in validate_cases("cases", cases))


def test_normalise():
    assert normalise("  The   Answer.\n") == "the answer"
    assert normalise("`a-b-c`") == "a-b-c"


def results(**answers):
    cases = [{"id": "arith-1", "check": {"has_number": 10063}}, {"id": "str-1", "check": {"exact": "krapsebag"}}]
    return judge(cases, answers)


def test_same_answers_no_change():
    reference = {"label": "bf16", "results": results(**{"arith-1": "10063", "str-1": "krapsēbag"})}
    comparison = diff(reference, results(**{"arith-1": "10063.", "str-1": "Krapsēbag"}))
    assert comparison["ok"] and comparison["changed"] == []


def test_changed_answer_at_the_same_score_is_reported():
    reference = {"label": "bf16", "results": results(**{"arith-1": "10063", "str-1": "krapsēbag"})}
    comparison = diff(reference, results(**{"arith-1": "It is 10063", "str-1": "krapsēbag"}))
    assert comparison["ok"] is True
    assert comparison["passed"] == comparison["reference_passed"] == 1
    assert comparison["changed_ids"] == ["arith-1"]


def test_fewer_passes_fail():
    reference = {"label": "bf16", "results": results(**{"arith-1": "10063", "str-1": "krapsebag"})}
    comparison = diff(reference, results(**{"arith-1": "10036", "str-1": "krapsebag"}))
    assert comparison["ok"] is False
    assert comparison["reasons"] == ["1 cases pass against 2 in the reference bf16"]
    assert comparison["changed"][0] == {"id": "arith-1", "reference_pass": True, "pass": False,
                                        "reference_answer": "10063", "answer": "10036"}


def test_more_passes_are_fine_and_unmatched_cases_listed():
    reference = {"label": "bf16", "results": [{"id": "old", "pass": False, "answer": "x"}]}
    comparison = diff(reference, results(**{"arith-1": "10063", "str-1": "no"}))
    assert comparison["ok"] and comparison["missing_from_run"] == ["old"]
    assert comparison["not_in_reference"] == ["arith-1", "str-1"]


def test_a_catastrophic_regex_fails_its_case_within_the_time_limit():
    import time

    cases = [{"id": "slow", "prompt": "p", "check": {"regex": r"^(a+)+$"}}]
    started = time.monotonic()
    result = judge(cases, {"slow": "a" * 40 + "b"})[0]
    assert time.monotonic() - started < 10
    assert result["pass"] is False and "ran longer than" in result["reason"]


@pytest.mark.parametrize(
    ("reference", "fragment"),
    [({"results": "x"}, "is not a results file of vllm_correctness"), ([], "is not a results file of vllm_correctness"),
     ({"results": [{"id": "a", "pass": True, "answer": "1"}, {"id": "b", "pass": "yes", "answer": "2"}]},
      "has results without id, pass and answer (entries 1); it is damaged, run the reference label again")],
)
def test_a_damaged_reference_is_named(reference, fragment):
    problems = reference_problems("/r.json", reference)
    assert len(problems) == 1 and fragment in problems[0] and problems[0].startswith("reference: /r.json ")


def test_a_reference_of_the_right_shape_is_fine():
    assert reference_problems("/r.json", {"label": "a", "results": [{"id": "a", "pass": False, "answer": ""}]}) == []


def test_a_streamed_answer_is_its_content_deltas_joined_and_a_cut_or_failed_stream_is_named():
    events = ['data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}',
              'data: {"choices": [{"index": 0, "delta": {"content": "4"}}]}', ": keep-alive",
              'data: {"choices": [{"index": 0, "delta": {"content": "2"}, "finish_reason": "stop"}]}',
              'data: {"choices": [], "usage": {"completion_tokens": 2}}', "data: [DONE]"]
    assert streamed_text("\n\n".join(events)) == "42"
    with pytest.raises(ValueError, match="ended without \\[DONE\\]: it was cut short"):
        streamed_text("\n\n".join(events[:3]))
    with pytest.raises(ValueError, match="the stream carried an error"):
        streamed_text('data: {"error": {"message": "engine dead"}}\n\ndata: [DONE]')
    with pytest.raises(ValueError, match="is not JSON"):
        streamed_text("data: {half")


def test_only_a_streamed_answer_unlike_the_non_streamed_one_is_a_mismatch():
    results = [{"id": "a", "pass": True, "answer": "42"}, {"id": "b", "pass": True, "answer": "x y"}, {"id": "c", "pass": False, "answer": "z"}]
    assert stream_mismatches(results, {"a": "42", "b": "y x"}) == [{"id": "b", "answer": "x y", "streamed_answer": "y x"}]
    assert stream_reason(stream_mismatches(results, {"b": "y x"}), 1).startswith("1 of 1 greedy answers differ when streamed (b: 'x y' streamed as 'y x')")


def reply(*calls, content=None):
    return {"choices": [{"message": {"content": content, "tool_calls": list(calls)}}]}


def call(name="get_weather", arguments='{"city": "Paris"}'):
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize(("answer", "reason"), [
    (reply(call()), "get_weather called with arguments that parse, city 'Paris'"),
    (reply(content="It is sunny."), "the model called no tool; it answered 'It is sunny.'"),
    (reply(call(name="get_time")), "the model called 'get_time', not get_weather"),
    (reply(call(arguments='{"city": "Paris"')), "the call's arguments are not a JSON object"),
    (reply(call(arguments='{"town": "Paris"}')), "the call's arguments name no city Paris"),
    ({"choices": []}, "the reply has no choices[0].message"),
])
def test_a_tool_call_passes_only_with_get_weather_and_arguments_that_parse(answer, reason):
    verdict = tool_call_verdict(answer)
    assert verdict["reason"].startswith(reason) and verdict["pass"] is reason.startswith("get_weather called")


@pytest.mark.parametrize("event", ['data: {"choices": 3}', 'data: {"choices": [{"delta": "text"}]}\n\ndata: {"object": "error", "message": "x"}'])
def test_a_stream_of_another_shape_is_named_not_a_traceback(event):
    with pytest.raises(ValueError, match="choices are not a list|carried an error|ended without"):
        streamed_text(event + "\n\ndata: [DONE]")


@pytest.mark.parametrize(("answer", "why"), [
    ("Paris", None),
    ("", None),
    ("The the the the the the the the the the the", "a repetition loop"),
    ("Paris is the capital of France; Lyon, Marseille and Lille are cities.", None),
    ("ab" * 40, "a repetition loop (80 of 80 characters"),
    ("Paris " + "\n" * 30, "a repetition loop"),
    ("\ufffd\ufffd x \x07\x01", "token soup (4 of 7 characters"),
    ("The answer is 42, " + "42, " * 12, "a repetition loop"),
    ("Liste: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10.", None),
])
def test_degenerate_output_is_a_loop_or_token_soup(answer, why):
    found = degenerate(answer)
    assert (found is None) if why is None else found.startswith(why), found


def test_only_cases_right_alone_count_under_load_and_each_is_named_once():
    cases = [{"id": "a", "check": {"exact": "4"}}, {"id": "b", "check": {"exact": "9"}}, {"id": "c", "check": {"has_number": 7}}]
    alone = [{"id": "a", "pass": True, "answer": "4"}, {"id": "b", "pass": False, "answer": "8"},
             {"id": "c", "pass": True, "answer": "It is 7."}]
    under_load = [("a", "4", None), ("b", "zzzz", None), ("c", "Seven, so 7.", None), ("a", "5", None), ("a", "5", None),
                  ("c", None, "HTTP 500"), ("b", None, "timeout")]
    corrupted = load_corruptions(cases, alone, under_load)
    assert [(c["id"], c["wrong"], c["asked"]) for c in corrupted] == [("a", 2, 3), ("c", 1, 2)]
    assert corrupted[0]["reason"] == "its known answer was right alone and wrong under load" and corrupted[0]["answer"] == "5"
    assert corrupted[1]["reason"] == "no answer under load (HTTP 500)", "every request is accounted for"
    assert load_corruptions(cases, alone, [("a", "4", None), ("c", "7 it is", None)]) == [], "reworded but right: batch numerics"


def test_the_load_keeps_the_batch_full_and_asks_every_case():
    cases = [{"id": str(n)} for n in range(3)]
    assert [c["id"] for c in load_schedule(cases, 4)] == ["0", "1", "2", "0", "1", "2", "0", "1"]
    assert len(load_schedule([{"id": str(n)} for n in range(20)], 4)) == 20


def test_the_load_reason_gives_the_advice_that_fits_what_went_wrong():
    wrong = {"id": "a", "wrong": 1, "asked": 4, "reason": "its known answer was right alone and wrong under load", "alone": "4", "answer": "5"}
    silent = {"id": "b", "wrong": 2, "asked": 4, "reason": "no answer under load (timed out)", "alone": "9", "answer": None}
    assert "--no-async-scheduling" in load_reason([wrong], 8) and "capacity" not in load_reason([wrong], 8)
    assert "capacity problem: check max_num_seqs" in load_reason([silent], 8) and "async" not in load_reason([silent], 8)
    both = load_reason([wrong, silent], 8)
    assert both.startswith("2 cases answered right alone went wrong with 8 requests in flight: a (1 of 4") and "async" in both and "capacity" in both
