"""The repository stands on its own: its documentation is complete, generated parts are current,
every istar name and subcommand it writes exists, and nothing points outside it."""

import argparse
import ast
import functools
import importlib
import importlib.util
import inspect
import io
import math
import pkgutil
import re
import subprocess
from pathlib import Path

import pytest
from docs_helpers import PAGES, pages_with_istar_code
from mirrors import REPO

# Tests and test configs (.test/) may name the larger data mirror that sits beside a checkout.
ALLOWED = ("tests/", ".test/")


def tracked_files() -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()


def test_nothing_refers_to_a_path_outside_the_repository():
    outside = re.compile(r"\.\./shared|/work/|/root/|/home/[a-z]|METHOD\.md|DESIGN\.md")
    hits = []
    for name in tracked_files():
        path = REPO / name
        if name.startswith(ALLOWED) or not path.is_file() or path.suffix in (".tsv", ".png", ".pdf"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        hits += [f"{name}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1) if outside.search(line)]
    assert not hits, "\n".join(hits)


def test_every_cited_section_of_the_method_exists():
    sections = set(re.findall(r"^## (\d+)\.", (REPO / "docs" / "method.md").read_text(encoding="utf-8"), re.M))
    cited = set()
    for path in list((REPO / "istar").rglob("*.py")) + [REPO / "workflow" / "schemas" / "config.schema.yaml"]:
        cited |= set(re.findall(r"docs/method\.md`?\s*§(\d+)", path.read_text(encoding="utf-8")))
    assert cited and cited <= sections, f"cited {sorted(cited)}, documented {sorted(sections)}"


def test_the_docs_the_readme_links_exist():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for link in re.findall(r"\]\(((?:docs|config|bench)/[^)#]+)\)", readme):
        assert (REPO / link).is_file(), link


def test_the_pages_with_library_code_are_found():
    names = {page.relative_to(REPO).as_posix() for page in pages_with_istar_code()}
    assert {"README.md", "docs/library.md"} <= names, names


def test_the_api_index_lists_exactly_the_names_istar_exports():
    import istar

    table = (REPO / "docs" / "api" / "index.md").read_text(encoding="utf-8").split("| --- | --- |")[1].split("```")[0]
    listed = re.findall(r"`(\w+)`", table)
    assert len(listed) == len(set(listed)) and set(listed) == set(istar.__all__), set(listed) ^ set(istar.__all__)


def _sections(doc: str) -> dict[str, str]:
    """A numpydoc docstring's sections by heading (``Parameters``, ``Returns``, ``Examples``, …)."""
    parts = re.split(r"^(\w[\w ]*)\n-{3,}\n", doc, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_every_public_name_has_numpydoc_sections_that_render_and_examples_that_run():
    """Each name ``istar`` exports: an Examples section (run here unless marked ``+SKIP``); a function's
    Parameters and Returns, a class's Parameters or Attributes; every entry ``name : type`` with the
    type alone after the colon (a description there renders in the type slot)."""
    import doctest
    import inspect

    import torch

    import istar

    problems = []
    for name in istar.__all__:
        obj = getattr(istar, name)
        sections = _sections(inspect.getdoc(obj) or "")
        needed = [("Parameters", "Returns")] if inspect.isfunction(obj) else [("Parameters", "Attributes")]
        if "Examples" not in sections:
            problems.append(f"{name}: no Examples section")
        if inspect.isfunction(obj) and not {"Parameters", "Returns"} <= set(sections):
            problems.append(f"{name}: no Parameters or no Returns section")
        if inspect.isclass(obj) and not set(needed[0]) & set(sections):
            problems.append(f"{name}: no Parameters or Attributes section")
        for heading in ("Parameters", "Attributes"):
            for entry in re.findall(r"^(\S[^\n]*?) : ([^\n]*)$", sections.get(heading, ""), re.M):
                if len(entry[1]) > 60 or entry[1].endswith(".") or re.search(r"\b(the|to|from|is)\b", entry[1]):
                    problems.append(f"{name}: {heading} entry {entry[0]!r} has a description in its type slot")
        test = doctest.DocTestParser().get_doctest(sections.get("Examples", ""), {"istar": istar, "torch": torch},
                                                   name, None, 0)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        torch.manual_seed(0)
        output = io.StringIO()
        if runner.run(test, out=output.write).failed:
            problems.append(f"{name}: its Examples fail:\n{output.getvalue()}")
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------- every istar name the text gives exists

DOTTED = re.compile(r"(?<![\w./-])istar(?:\.[A-Za-z_]\w*)+")
FROM_IMPORT = re.compile(r"\bfrom[ \t]+(istar(?:\.\w+)*)[ \t]+import[ \t]+\(?([\w \t,]+)")
FILE_SUFFIXES = frozenset({"py", "md", "yaml", "yml", "json", "toml", "cfg", "txt", "csv", "smk", "sh", "log", "lock"})
CODE_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[^\n]*\n(.*?)^[ \t]*\1[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)((?:(?!\n[ \t]*\n).)+?)(?<!`)\1(?!`)", re.S)
# `istar` where a shell command starts: a line or code span, after ; & | ( or a $ prompt, after -m
# (python -m, accelerate launch -m), each optionally after VAR=value assignments
COMMAND = re.compile(r"(?:^|[;&|(]|\$|-m)[ \t]*(?:[A-Za-z_]\w*=\S*[ \t]+)*istar[ \t]+([^\s`]+)", re.M)


def docstrings() -> list[tuple[str, int, str]]:
    """(file, first line, text) of every docstring in the package: modules, classes, functions and
    methods, read from the source (ast) of each module pkgutil finds (``__main__`` is not imported)."""
    import istar

    root = Path(istar.__file__).resolve().parents[1]
    found = [("istar/__init__.py", 1, istar.__doc__)]
    for module in pkgutil.walk_packages(istar.__path__, "istar."):
        path = Path(importlib.util.find_spec(module.name).origin)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
                first = node.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                        first.value.value, str):
                    found.append((path.relative_to(root).as_posix(), first.value.lineno, first.value.value))
    return found


def pages() -> list[tuple[str, int, str]]:
    return [(page.relative_to(REPO).as_posix(), 1, page.read_text(encoding="utf-8")) for page in PAGES]


def code_pieces(text: str, markdown: bool) -> list[tuple[int, str]]:
    """(offset, code) of the code in a text: Markdown's fenced blocks and inline spans; a docstring's
    inline literals and the lines indented deeper than its body (literal blocks, usage lines)."""
    pieces, outside, position = [], [], 0
    if markdown:
        for block in CODE_FENCE.finditer(text):
            pieces.append((block.start(2), block.group(2)))
            outside.append((position, text[position:block.start()]))
            position = block.end()
    else:
        lines = text.split("\n")
        body = min((len(line) - len(line.lstrip()) for line in lines[1:] if line.strip()), default=0)
        offset = len(lines[0]) + 1
        for line in lines[1:]:
            if line.strip() and len(line) - len(line.lstrip()) > body:
                pieces.append((offset, line))
            offset += len(line) + 1
    outside.append((position, text[position:]))
    for start, chunk in outside:
        pieces += [(start + span.start(2), span.group(2)) for span in CODE_SPAN.finditer(chunk)]
    return pieces


def written_names(texts) -> list[tuple[str, str]]:
    """(file:line, dotted name) of every istar name the texts write, ``from istar.m import a, b as c``
    as istar.m.a and istar.m.b."""
    found = []
    for name, first, text in texts:
        for match in DOTTED.finditer(text):
            where = f"{name}:{first + text.count(chr(10), 0, match.start())}"
            if match.group().rsplit(".", 1)[1] not in FILE_SUFFIXES:
                found.append((where, match.group()))
        for match in FROM_IMPORT.finditer(text):
            where = f"{name}:{first + text.count(chr(10), 0, match.start())}"
            found += [(where, f"{match.group(1)}.{part.split()[0]}") for part in match.group(2).split(",") if part.strip()]
    return found


def written_subcommands(texts, markdown: bool) -> list[tuple[str, str]]:
    """(file:line, word) for every ``istar WORD`` at a command's start in the texts' code; options
    (``istar --version``) and placeholders (``istar SUBCOMMAND``, ``istar <step>``) are not words."""
    found = []
    for name, first, text in texts:
        for offset, code in code_pieces(text, markdown):
            for match in COMMAND.finditer(code):
                word = match.group(1).rstrip(":,.;)…'\"")
                if word.startswith("-") or not re.search("[a-z]", word) or word[0] in "<{[$":
                    continue
                found.append((f"{name}:{first + text.count(chr(10), 0, offset + match.start(1))}", word))
    return found


@functools.cache
def resolves(name: str) -> bool:
    """The name imports as a module, or is an attribute reachable from its longest importable module
    prefix; an attribute a class declares with an annotation (a dataclass field) counts."""
    parts = name.split(".")
    target = importlib.import_module(parts[0])
    for depth, part in enumerate(parts[1:], 2):
        module = ".".join(parts[:depth])
        if inspect.ismodule(target) and hasattr(target, "__path__") and importlib.util.find_spec(module):
            target = importlib.import_module(module)
        elif hasattr(target, part):
            target = getattr(target, part)
        elif inspect.isclass(target) and any(part in inspect.get_annotations(cls) for cls in target.__mro__):
            return True  # an instance's attribute: what lies past it cannot be looked up on the class
        else:
            return False
    return True


def cli_subcommands() -> set[str]:
    """The subcommands ``istar``'s parser accepts, read in-process (argparse keeps them only in _actions)."""
    from istar.cli import build_parser

    (subparsers,) = [action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction)]
    return set(subparsers.choices)


def test_the_name_rules_on_examples():
    """What the two tests below count as a name, on examples of each rule, so that a rule that stops
    matching fails here rather than letting every name pass."""
    text = ("See :func:`istar.core.isotropy.isoscore` and `istar.core.isotropy.nope`;\n"
            "from istar.core import twonn, gone as here\n"
            "envs/istar.yaml, istar.yaml, https://istar.example.org, config key final.istar.minilm, istar_lam-1.\n")
    assert [name for _, name in written_names([("x.md", 1, text)])] == [
        "istar.core.isotropy.isoscore", "istar.core.isotropy.nope", "istar.core", "istar.core.twonn", "istar.core.gone"]
    examples = {"istar.core.isotropy.isoscore": True, "istar.core.isotropy.nope": False, "istar.core.twonn": True,
                "istar.core.gone": False, "istar.isoscore": True, "istar.__version__": True,
                "istar.models.pretrained.LoadedModel.static_matrices": True,  # a property
                "istar.models.pretrained.LoadedModel.input_embeddings": True,  # a dataclass field without default
                "istar.models.pretrained.LoadedModel.nope": False}
    assert {name: resolves(name) for name in examples} == examples
    page = ("Run `istar train --spec S`, `istar --version`, `istar SUBCOMMAND --help`,\n"
            "`python -m istar run-bundle B`. The istar command, `istar` itself.\n\n"
            "```bash\nOMP_NUM_THREADS=1 istar trian --spec S\n$ istar <step>\n```\n"
            "```text\n  data/  prepare (istar prepare-data); the istar package\n```\n")
    assert written_subcommands([("x.md", 1, page)], markdown=True) == [
        ("x.md:5", "trian"), ("x.md:9", "prepare-data"), ("x.md:1", "train"), ("x.md:2", "run-bundle")]
    docstring = "One line about istar train as prose.\n\n    istar evaluate --spec S\n\nThen ``istar measur``.\n"
    assert written_subcommands([("m.py", 10, docstring)], markdown=False) == [
        ("m.py:12", "evaluate"), ("m.py:14", "measur")]


# It imports every module the texts name (torch, transformers, matplotlib): 12 s quiet, up to about
# 50 s on a loaded 2-core machine when it is the worker's first test to import them.
@pytest.mark.timeout(180)
def test_every_istar_name_the_docs_and_docstrings_write_exists():
    """Every dotted ``istar.…`` name in README.md, docs/**/*.md and the package's docstrings resolves
    (:func:`resolves`): a renamed or moved function, a stale module name fails here, named with its
    file and line.

    What counts as a name: ``istar`` followed by ``.identifier`` parts, not preceded by a letter,
    digit, ``_``, ``.``, ``/`` or ``-`` (so a path ``envs/istar.yaml``, a URL, a config key
    ``final.istar.…`` or a setting ``istar_lam-1`` is none), whose last part is no file suffix
    (``istar.yaml`` is a file); ``from istar.m import a, b`` writes istar.m.a and istar.m.b. Prose
    and code alike: a name in running text is as wrong as one in a code block.
    """
    names = written_names(pages() + docstrings())
    assert len({name for _, name in names}) > 100, "the collector finds (almost) no names: the rules broke"
    unresolved = [f"{where}: {name}" for where, name in names if not resolves(name)]
    assert not unresolved, "no such istar name (correct the text to the true one):\n" + "\n".join(unresolved)


def test_every_istar_subcommand_the_docs_and_docstrings_write_exists():
    """Every ``istar WORD`` at the start of a command in README.md's and docs/**/*.md's code, and in
    the package's docstrings' code, names a subcommand the ``istar`` parser defines.

    Code: Markdown's fenced blocks and inline spans; a docstring's inline literals and the lines
    indented deeper than its body. Prose is not read: it calls the package istar too ("the istar
    command"). A command starts at the beginning of a line or span, after ``;``, ``&``, ``|``, ``(``
    or a ``$`` prompt, or after ``-m`` (``python -m istar``, ``accelerate launch -m istar``), each
    optionally after ``VAR=value`` assignments. A word starting with ``-`` is an option
    (``istar --version``), one without a lower-case letter or in ``<>``/``{}`` a placeholder
    (``istar SUBCOMMAND``, ``istar <step>``); trailing punctuation is dropped (``istar train:`` of an
    error line).
    """
    written = written_subcommands(pages(), markdown=True) + written_subcommands(docstrings(), markdown=False)
    assert len(written) > 50, "the collector finds (almost) no commands: the rules broke"
    known = cli_subcommands()
    unknown = [f"{where}: istar {word}" for where, word in written if word not in known]
    assert not unknown, f"no such subcommand (the parser has {', '.join(sorted(known))}):\n" + "\n".join(unknown)


def _study_records(records, prefix: str = ""):
    """A study's committed runs.csv read by the current code, and its committed paired.csv and pooled.csv,
    which must be what that code makes of the runs (the records are derived from runs.csv, not typed)."""
    import pandas as pd

    from istar.report.comparisons import study_tests
    from istar.report.paired import pooled_gains

    runs = pd.read_csv(records / f"{prefix}runs.csv")
    tests = study_tests(runs)
    final = tests.paired[tests.paired["study"] == "final"]
    pooled = pooled_gains(final)
    committed = pd.read_csv(records / f"{prefix}paired.csv")
    pd.testing.assert_frame_equal(committed, pd.read_csv(io.StringIO(tests.paired.to_csv(index=False))))
    pd.testing.assert_frame_equal(pd.read_csv(records / f"{prefix}pooled.csv"),
                                  pd.read_csv(io.StringIO(pooled.to_csv(index=False))))
    return runs, tests, pooled


def workflow_rules() -> set[str]:
    """The rule names the workflow defines (``rule X:``, ``checkpoint X:``, ``use rule Y as X``)."""
    text = "\n".join(path.read_text(encoding="utf-8") for path in
                     [REPO / "workflow" / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk"))])
    return set(re.findall(r"^\s*(?:rule|checkpoint) (\w+):", text, re.M)) | set(re.findall(r" as (\w+) with:", text))


def test_the_architecture_names_the_rules_the_workflow_has():
    """docs/architecture.md's data flow names each path's rule: every name there is a rule, and every rule
    that writes a result is there."""
    page = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    flow = page.split("## Data flow, as paths", 1)[1].split("```", 2)[1]
    named = {match.group(1) for line in flow.splitlines()[1:]
             if (match := re.match(r"^\S.*?\s{2,}(\w+)(?:\s|$)", line))}
    rules = workflow_rules()
    assert named - rules == set(), f"docs/architecture.md names rules the workflow does not have: {named - rules}"
    assert rules - named <= {"all", "surveys"}, f"rules missing from docs/architecture.md: {rules - named}"


def test_the_gpu_study_in_the_results_says_what_its_records_carry():
    """docs/results.md's GPU Table 1 and pooled verdict are the cells the workflow's own formatting
    makes from the study's committed records (docs/data/gpu-study), not numbers typed apart from them."""
    from istar.report.paired import difference_cell, power_cell

    records = REPO / "docs" / "data" / "gpu-study"
    text = (REPO / "docs" / "results.md").read_text(encoding="utf-8")
    section = text[text.index("## The GPU study"):text.index("## The dose-response study")].replace("−", "-")
    runs, tests, pooled = _study_records(records)
    scores = tests.rows("final", "score")
    assert len(scores) == 2 and set(scores.n) == {10} and tests.family_size == 6
    for row in scores.itertuples():
        assert difference_cell(row) in section, (row.task, difference_cell(row))
        assert power_cell(row).replace("−", "-") in section, (row.task, power_cell(row))
        assert f"{row.mde * 100:.2f}" in section, (row.task, "the claims' detectable effect")
    score = pooled[pooled["measure"] == "score"].iloc[0]
    assert score["interval"] == "HKSJ"
    assert f"interval {score.ci_low:+.2f}".replace("+", "") in section.replace("+", "")
    assert f"MDE {score.mde:.2f} points" in section
    iso = pooled[pooled["measure"] == "isoscore_star"].iloc[0]
    assert f"{iso['mean']:+.3f} [{iso.ci_low:+.3f}, {iso.ci_high:+.3f}], p = {iso.p_value:.3f}" in section
    paper = tests.rows("final", "score").set_index("task")
    assert f"ours − the paper's {paper.at['sst2', 'gap']:+.2f}".replace("−", "-") in section
    assert len(runs) == 40 and runs.groupby(["task", "method"]).seed.nunique().eq(10).all()


def test_the_gpu_study_repeat_says_what_its_records_carry():
    """docs/results.md's "Run again" (the GPU study on an H100, MRPC Base again on an H200) states
    the agreement counts, divergence steps and verdicts that its records (docs/data/gpu-study-repeats)
    hold, in the workflow's own formatting of the tests."""
    import pandas as pd

    from istar.report.paired import difference_cell, power_cell

    records = REPO / "docs" / "data" / "gpu-study-repeats"
    text = (REPO / "docs" / "results.md").read_text(encoding="utf-8")
    section = text[text.index("### Run again"):text.index("## The dose-response study")]
    section = " ".join(section.replace("−", "-").replace("–", "-").split())  # minus, ranges; a number may wrap
    _, tests, _ = _study_records(records, "h100-")
    for row in tests.rows("final", "score").itertuples():
        assert difference_cell(row).split(" (n=")[0] + "," in section.replace(" points [", " ["), row.task
        assert f"p = {row.p_value:.3f}, MDE {row.mde * 100:.1f}" in section, row.task
        assert power_cell(row).startswith(f"p = {row.p_value:.3f}")
    pooled = pd.read_csv(records / "h100-pooled.csv").query("measure == 'score'").iloc[0]
    assert (f"pooled {pooled['mean']:+.2f} points [{pooled.ci_low:+.2f}, {pooled.ci_high:+.2f}], "
            f"p = {pooled.p_value:.3f}, τ² = {pooled.tau2:.2f}, MDE {pooled.mde:.2f}") in section

    agreement = pd.read_csv(records / "agreement.csv")
    sst2, mrpc = agreement[agreement.task == "sst2"], agreement[agreement.task == "mrpc"]
    assert len(sst2) == 20 and sst2.first_differing_step_h100.isna().all()
    assert (sst2.accuracy_h100 == sst2.accuracy_h200).all() and (sst2.eval_loss_h100 == sst2.eval_loss_h200).all()
    assert f"All 20 SST-2 runs on the H100 logged the same loss at every one of their {sst2.steps.iloc[0]}" in section
    assert len(mrpc) == 20 and mrpc.first_differing_step_h100.notna().all()
    h100_steps = mrpc.first_differing_step_h100
    assert f"within its first {int(h100_steps.max())} of {mrpc.steps.iloc[0]} steps" in section
    assert f"step {int(h100_steps.min())}-{int(h100_steps.max())} on the H100" in section
    again = mrpc.dropna(subset=["first_differing_step_h200_rerun"])
    assert len(again) == 10 and set(again.method) == {"base"}
    assert (f"step {int(again.first_differing_step_h200_rerun.min())}-"
            f"{int(again.first_differing_step_h200_rerun.max())} on the H200 again") in section
    same_step = (again.first_differing_step_h200_rerun == again.first_differing_step_h100).sum()
    assert f"for {same_step} of the 10 seeds at the very step" in section
    moved_h100 = (mrpc.accuracy_h100 != mrpc.accuracy_h200).sum()
    moved_again = (again.accuracy_h200_rerun != again.accuracy_h200).sum()
    assert f"{moved_h100} of 20 runs on the H100 ended with another dev accuracy" in section
    assert f"as did {moved_again} of 10 on the H200 rerun" in section

    training = pd.read_csv(records / "h100-training.csv")
    assert len(training) == 40 and training.losses_finite.all() and (training.device == "cuda").all()
    assert (training.precision_effective == "fp16").all() and (training.num_processes == 1).all()


def test_the_dose_response_study_in_the_results_says_what_its_records_carry():
    """docs/results.md's dose-response section states the trend, the cells and the verdicts that the current
    code makes of the study's committed records (docs/data/dose-response), which are what that code makes of
    its runs.csv."""
    import pandas as pd

    from istar.report.paired import difference_cell
    from istar.report.paper import Estimate

    records = REPO / "docs" / "data" / "dose-response"
    text = (REPO / "docs" / "results.md").read_text(encoding="utf-8")
    section = text[text.index("## The dose-response study"):text.index("## The paper's setup")]
    section = " ".join(section.replace("−", "-").replace("\\*", "*").split())
    runs, tests, _ = _study_records(records)
    sweep = runs[runs["study"] == "lambda_sweep"]
    assert len(sweep) == 56 and sweep.groupby("lam").seed.nunique().eq(8).all() and sweep.isoscore_star.notna().all()
    trend = pd.read_csv(records / "trend.csv")
    pd.testing.assert_frame_equal(trend, pd.read_csv(io.StringIO(tests.trends.to_csv(index=False))))
    iso = trend.set_index("covariate").loc["isoscore_star"]
    assert f"{iso.slope / 10:+.2f} points per +0.1 IsoScore* [{iso.ci_low / 10:+.2f}, {iso.ci_high / 10:+.2f}]" in section
    assert f"Holm p = {iso.p_holm:.3f}" in section and f"MDE {iso.mde / 10:.2f}" in section
    lam = trend.set_index("covariate").loc["lam"]
    assert f"{lam.slope:+.3f} points per unit of λ [{lam.ci_low:+.3f}, {lam.ci_high:+.3f}]" in section
    for row, per, digits in ((iso, 10, 2), (lam, 1, 3)):  # each beside its interval at the verdict's level
        strict = Estimate.of(row.slope / per, row.se / per, math.inf, row.mde_alpha)
        assert f"[{strict.ci_low:+.{digits}f}, {strict.ci_high:+.{digits}f}] at {100 * (1 - row.mde_alpha):.1f} %" in section
    for row in tests.rows("final", "score").itertuples():
        assert difference_cell(row).replace("−", "-") in section, (row.method, difference_cell(row))
