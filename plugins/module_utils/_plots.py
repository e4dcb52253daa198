# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""matplotlib for the report modules' plots. Private to the collection."""

from __future__ import annotations

import typing as t


def load_pyplot() -> t.Any:
    """matplotlib's pyplot, or None without matplotlib; imported only for a plot, since the import alone takes seconds."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        return None
    return pyplot
