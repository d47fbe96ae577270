"""Markdown pipe tables of DataFrames, for the reports the pipeline writes (no extra dependency)."""

from __future__ import annotations

import numpy as np
import pandas as pd


def markdown_table(frame: pd.DataFrame, digits: int = 1, *, index: bool = False, nonfinite: str | None = None
                   ) -> str:
    """A pipe table of ``frame`` (floats rounded to ``digits`` decimals). ``index`` and ``nonfinite`` (the text of
    NaN/inf floats, else ``nan``/``inf``) serve matrices: their index is a column, their missing pairs stay blank."""
    cols = ([frame.index.name or ""] if index else []) + [str(c) for c in frame.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for idx, row in zip(frame.index, frame.itertuples(index=False)):
        cells = ([str(idx)] if index else []) + [_cell(v, digits, nonfinite) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(value, digits: int, nonfinite: str | None) -> str:
    if not isinstance(value, (float, np.floating)):
        return str(value)
    return nonfinite if nonfinite is not None and not np.isfinite(value) else f"{value:.{digits}f}"
