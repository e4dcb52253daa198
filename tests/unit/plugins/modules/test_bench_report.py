"""The bench report as an operator reads it (issue 39 item 6): the plot has a legend, both axes start at zero and
each throughput point names the requests it stands on; a correctness set with no case passing says what that means."""

import math

import pytest

from ansible_collections.sparkfleet.vllm.plugins.modules import vllm_bench_report

RUNS = [{"concurrency": 1, "completed": 2, "output_throughput": 701.0, "mean_tpot_ms": 1.28},
        {"concurrency": 2, "completed": 4, "output_throughput": None, "mean_tpot_ms": 1.52},
        {"concurrency": 4, "completed": 8, "output_throughput": 2050.0, "mean_tpot_ms": 1.69}]


class KeptFigures:
    """matplotlib's pyplot, keeping each figure instead of closing it, so the test reads what was drawn."""

    def __init__(self, pyplot):
        self.pyplot, self.figures = pyplot, []

    def subplots(self, *args, **kwargs):
        return self.pyplot.subplots(*args, **kwargs)

    def close(self, figure):
        self.figures.append(figure)


def test_the_plot_has_a_legend_axes_from_zero_and_the_requests_of_each_point():
    pytest.importorskip("matplotlib")
    pyplot = KeptFigures(vllm_bench_report.load_pyplot())
    png = vllm_bench_report.plot_png(pyplot, "spark-1 llm", RUNS)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    throughput_axis, tpot_axis = pyplot.figures[0].axes
    assert throughput_axis.get_ylim()[0] == 0 and tpot_axis.get_ylim()[0] == 0
    assert [text.get_text() for text in throughput_axis.get_legend().get_texts()] == ["output tokens/s", "mean TPOT ms"]
    assert [text.get_text() for text in throughput_axis.texts] == ["2 req", "8 req"], "no label on the run without a figure"
    throughput = throughput_axis.get_lines()[0].get_ydata()
    assert throughput[0] == 701.0 and math.isnan(throughput[1]), "a missing figure is a gap, never a zero"
    pyplot.pyplot.close(pyplot.figures[0])


@pytest.mark.parametrize("correctness, note", [
    ({"passed": 0, "total": 20}, True),
    ({"passed": 3, "total": 20}, False),
    ({"passed": 0, "total": 20, "comparison": {"reference_label": "bf16", "reference_passed": 0, "changed_ids": []}}, False),
])
def test_no_case_passing_says_what_it_can_mean(correctness, note):
    line = vllm_bench_report.correctness_line(correctness)
    assert line.startswith(f"Correctness: {correctness['passed']}/20 cases pass")
    assert ("a reference run of the unquantized model (bench_correctness_reference) tells the two apart" in line) is note
