"""Rendering a :class:`Table` as CSV, GitHub Markdown and LaTeX, and writing the three files.

Formatting decisions
--------------------
- Best cells: Markdown ``**…**``, LaTeX ``\\textbf{…}``, CSV: a ``*`` appended to the cell
  (``71.3 ± 1.2*``).
- Stand-in columns get a dagger on the header (``RTE†``; LaTeX ``RTE$^\\dagger$``).
  Footnotes appear in Markdown and LaTeX; the CSV holds the grid only.
- Markdown and LaTeX print a model's name on the first of its rows only; LaTeX separates
  models by ``\\midrule``. The CSV repeats it on every row.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from istar.io.artifacts import write_text

__all__ = ["Table", "spread", "write_table", "render_csv", "render_markdown", "render_latex", "latex_escape"]


@dataclass
class Table:
    """A rendered table: every cell already a string, plus what marks and notes go with it.

    Attributes
    ----------
    name : str
        Short name, e.g. ``"table1"`` (used for the LaTeX label).
    caption : str
        One-sentence description (LaTeX caption, Markdown heading).
    index_names : list of str
        Headers of the leading label columns, e.g. ``["Model", "Method"]``.
    index : list of list of str
        Per row, the labels under ``index_names``.
    columns : list of str
        Task display names of the data columns (without the stand-in dagger).
    cells : list of list of str
        Per row, one string per data column.
    footnotes : list of str
        Lines printed under the table in Markdown and LaTeX.
    standin : list of bool, optional
        Per data column, whether it gets the stand-in dagger (default: none).
    best : list of list of bool, optional
        Per row and data column, whether the cell is marked best (default: none).
    """

    name: str
    caption: str
    index_names: list[str]
    index: list[list[str]]
    columns: list[str]
    cells: list[list[str]]
    footnotes: list[str]
    standin: list[bool] | None = None
    best: list[list[bool]] | None = None

    def __post_init__(self):
        self.standin = self.standin or [False] * len(self.columns)
        self.best = self.best or [[False] * len(self.columns) for _ in self.cells]

    def headers(self) -> list[str]:
        """All column headers, stand-in columns suffixed with a dagger (``†``; LaTeX spells it)."""
        return self.index_names + [c + ("†" if s else "") for c, s in zip(self.columns, self.standin)]


def spread(values, digits: int = 1) -> str:
    """A cell of per-seed values (a pandas Series; missing ones dropped): ``mean ± std`` (ddof = 1), the value
    alone for a single seed, "–" for none."""
    values = values.dropna().astype(float)
    if len(values) < 2:
        return f"{values.iloc[0]:.{digits}f}" if len(values) else "–"
    return f"{values.mean():.{digits}f} ± {values.std(ddof=1):.{digits}f}"


# --------------------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------------------


def render_csv(table: Table) -> str:
    """The grid as CSV (UTF-8 text): headers with ``†``, best cells with a trailing ``*``."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(table.headers())
    for labels, cells, best in zip(table.index, table.cells, table.best):
        writer.writerow(labels + [cell + ("*" if b else "") for cell, b in zip(cells, best)])
    return buffer.getvalue()


_MARKDOWN_SPECIAL = "\\|*_`"


def _markdown_escape(text: str) -> str:
    return "".join("\\" + ch if ch in _MARKDOWN_SPECIAL else ch for ch in text)


def _shown_rows(table: Table, escape, bold: str) -> list[list[str]]:
    """Each row's labels and cells as Markdown and LaTeX print them: escaped by ``escape``, best cells in the
    format ``bold`` (``"**{}**"``), and where there are several label columns a first label that repeats the
    row above's blanked (a model named on its first row only)."""
    rows = []
    for i, (labels, cells, best) in enumerate(zip(table.index, table.cells, table.best)):
        repeated = len(table.index_names) > 1 and i and labels[0] == table.index[i - 1][0]
        rows.append([escape(label) for label in ([""] if repeated else labels[:1]) + labels[1:]]
                    + [bold.format(escape(cell)) if b else escape(cell) for cell, b in zip(cells, best)])
    return rows


def render_markdown(table: Table) -> str:
    """The table as GitHub Markdown: caption in bold, ``**best**`` cells, footnotes below."""
    lines = [f"**{_markdown_escape(table.caption)}**", ""]
    lines.append("| " + " | ".join(_markdown_escape(h) for h in table.headers()) + " |")
    lines.append("|" + "|".join([" --- "] * len(table.index_names) + [" :---: "] * len(table.columns)) + "|")
    lines += ["| " + " | ".join(row) + " |" for row in _shown_rows(table, _markdown_escape, "**{}**")]
    lines += ["", *(_markdown_escape(note) + "  " for note in table.footnotes)] if table.footnotes else []
    return "\n".join(lines) + "\n"


_LATEX_REPLACEMENTS = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "|": r"$|$",
    "±": r"$\pm$",
    "†": r"$^\dagger$",
    "‡": r"$^\ddagger$",
    "−": r"$-$",
    "“": "``",
    "”": "''",
    "×": r"$\times$",
    "λ": r"$\lambda$",
    "ζ": r"$\zeta$",
    "—": "---",
    "–": "--",
    "≥": r"$\geq$",
    "≤": r"$\leq$",
}


def latex_escape(text: str) -> str:
    """Escape LaTeX's special characters and spell the Unicode symbols the tables use.

    A hyphen directly before a digit at the start of a number becomes a math minus ``$-$``.
    """
    return "".join("$-$" if ch == "-" and text[i + 1:i + 2].isdigit() and (i == 0 or not text[i - 1].isalnum())
                   else _LATEX_REPLACEMENTS.get(ch, ch) for i, ch in enumerate(text))


def render_latex(table: Table) -> str:
    """The table as a LaTeX ``table`` float with a booktabs ``tabular``; needs ``\\usepackage{booktabs}``."""
    n_index = len(table.index_names)
    column_format = "l" * n_index + "c" * len(table.columns)
    lines = [
        f"% {table.name}: generated by `istar table {table.name}`; needs \\usepackage{{booktabs}}",
        r"\begin{table}[htbp]",
        r"\centering",
        f"\\caption{{{latex_escape(table.caption)}}}",
        f"\\label{{tab:{table.name}}}",
        f"\\begin{{tabular}}{{{column_format}}}",
        r"\toprule",
        " & ".join(latex_escape(h) for h in table.headers()) + r" \\",  # † is spelled $^\dagger$
        r"\midrule",
    ]
    for i, row in enumerate(_shown_rows(table, latex_escape, r"\textbf{{{}}}")):
        if i and n_index > 1 and row[0]:  # a model's first row
            lines.append(r"\midrule")
        lines.append(" & ".join(row) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if table.footnotes:
        lines += [r"\par\smallskip", *(f"{{\\footnotesize {latex_escape(note)}\\par}}" for note in table.footnotes)]
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


def write_table(table: Table, out_prefix) -> list[Path]:
    """Write ``{out_prefix}.csv``, ``.md`` and ``.tex``, each atomically.

    Parameters
    ----------
    table : Table
    out_prefix : str or Path
        Path without suffix, e.g. ``results/tables/table1``; folders are created.

    Returns
    -------
    list of Path
        The three files written.
    """
    prefix = Path(out_prefix)
    paths = []
    for suffix, render in ((".csv", render_csv), (".md", render_markdown), (".tex", render_latex)):
        paths.append(prefix.with_name(prefix.name + suffix))
        write_text(paths[-1], render(table))
    return paths
