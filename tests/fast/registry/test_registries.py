"""The registries of methods, tasks and figures against the places that must agree with them."""

import ast
import importlib
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml
from matplotlib.figure import Figure

import istar

from istar.config.schema import SCHEMA_PATH, STUDIES
from istar.core.fig2 import STABILITY_COLUMNS
from istar.registry.methods import (
    BASELINE_METHOD,
    HYPERPARAMETERS,
    METHOD_NAMES,
    METHOD_PATTERN,
    METHODS,
    SEARCHED_METHOD,
    get_method,
)
from istar.registry.tasks import TASKS, get_task, ordered_tasks
from istar.report.figures import (
    FIGURE_NAMES,
    FIGURES,
    PROFILE_FIGURES,
    STUDY_FIGURES,
    draw,
    enabled_figures,
    figure_csvs,
    get_figure,
)
from istar.steps.stability import fig2_data, write_stability


def _schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def _task_enums(node, path=""):
    """(path, enum) of every enum in the schema that lists task keys."""
    if isinstance(node, dict):
        if "enum" in node and "rte" in node["enum"]:
            yield path, node["enum"]
        for key, value in node.items():
            yield from _task_enums(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _task_enums(value, f"{path}/{i}")


def test_schema_task_enums_are_the_task_registry():
    enums = list(_task_enums(_schema()))
    assert len(enums) >= 2  # `tasks` and the studies' task lists
    for path, enum in enums:
        assert enum == list(TASKS), f"the task enum at {path} differs from istar.registry.tasks.TASKS"


def test_ordered_tasks_follows_the_registry_and_rejects_unknown_keys():
    assert ordered_tasks(["squad", "rte", "sst2", "rte"]) == ["sst2", "rte", "squad"]
    with pytest.raises(ValueError, match="unknown task 'glue'; known tasks: sst2"):
        ordered_tasks(["rte", "glue"])
    assert get_task("stsb").display == "STS-B"


def test_method_registry():
    assert METHOD_NAMES == ("base", "cosreg", "istar")
    assert [method.label for method in METHODS.values()] == ["Base", "CosReg", "I-STAR"]
    pattern = re.compile(rf"^(?:{METHOD_PATTERN})$")
    assert all(pattern.match(name) for name in METHOD_NAMES) and not pattern.match("istarx")
    assert not any(get_method("base").takes(name) for name in HYPERPARAMETERS)
    assert get_method("cosreg").takes("lam") and not get_method("cosreg").takes("zeta")
    assert all(get_method("istar").takes(name) for name in HYPERPARAMETERS)
    assert get_method("cosreg").default_lam_key == "final.cosreg_lambda" and get_method("istar").default_lam_key is None
    assert len({method.colour for method in METHODS.values()}) == len(METHODS)
    assert (BASELINE_METHOD, SEARCHED_METHOD) == ("base", "istar")
    with pytest.raises(ValueError, match="unknown method 'l2'; known methods: base, cosreg, istar"):
        get_method("l2")


def test_cosreg_default_lambda_is_the_schema_default():
    """CosReg's λ has two readers (the CLI without --lam, the workflow's final stage) and one home, the schema."""
    import argparse

    from istar.config.specs import TrainSpec, add_spec_arguments, spec_from_cli

    parser = argparse.ArgumentParser()
    add_spec_arguments(parser, TrainSpec)
    spec = spec_from_cli(parser.parse_args(["--model", "m", "--data", "d", "--out", "o", "--method", "cosreg"]))
    assert spec.lam == _schema()["properties"]["final"]["properties"]["cosreg_lambda"]["default"] == 1.0


def test_method_behaviour_comes_from_the_registry(monkeypatch):
    """A new method is an entry: the spec, the penalty call and the planner follow it without naming it."""
    import dataclasses

    import torch

    from istar.config.layout import Setting
    from istar.config.specs import SpecError, TrainSpec
    from istar.core import regularizers
    from istar.pipeline.plan import needs_sigma
    from istar.registry.methods import Method

    seen = {}

    def norm_penalty(hidden_states, attention_mask, *, lam, zeta, sigma_s):  # only the hyperparameters it takes
        seen.update(zeta=zeta, sigma_s=sigma_s)
        return regularizers.Penalty(term=lam * hidden_states[-1].pow(2).mean())

    # a new method's penalty lives in istar.core.regularizers, named by its entry
    monkeypatch.setattr(regularizers, "l2shrink_penalty", norm_penalty, raising=False)
    shrinking = Method("l2shrink", "L2", "#000000", ("lam", "zeta", "sigma_s"), None, penalty="l2shrink_penalty",
                       fixed_layers=-1)
    monkeypatch.setitem(METHODS, "l2shrink", shrinking)
    spec = TrainSpec(model="m", data_dir="d", output_dir="o", method="l2shrink", lam=0.5, zeta=0.3, sigma_s="s.pt")
    spec.validate()
    assert spec.penalty_layers == -1
    with pytest.raises(SpecError, match="l2shrink with zeta > 0 needs --sigma-s"):
        dataclasses.replace(spec, sigma_s=None).validate()
    hidden = (torch.ones(2, 3, 4), torch.full((2, 3, 4), 2.0))
    # the step's call (istar.steps.train_step.forward_and_loss), with every value a spec holds
    values = {"lam": spec.lam, "zeta": spec.zeta, "sigma_s": None, "layers": spec.layers, "tokens": spec.tokens}
    penalty = get_method(spec.method).penalise(hidden, torch.ones(2, 3), global_batch=True, **values)
    assert float(penalty.term) == pytest.approx(0.5 * 4.0) and seen == {"zeta": 0.3, "sigma_s": None}
    assert needs_sigma(Setting("l2shrink", lam=0.5, zeta=0.3)) and not needs_sigma(Setting("l2shrink", lam=0.5, zeta=0.0))
    baseline = dataclasses.replace(spec, method="base", lam=0.0, zeta=0.0, sigma_s=None)
    assert get_method(baseline.method).penalise(hidden, torch.ones(2, 3), global_batch=False, **values) is None
    # the baseline and CosReg have no layer selection of their own: their penalty_layers is the last layer
    assert baseline.penalty_layers == -1 and dataclasses.replace(spec, method="cosreg", zeta=0.0).penalty_layers == -1
    with pytest.raises(ValueError, match="unknown hyperparameter 'beta'"):
        get_method("istar").takes("beta")


def _method_comparisons(source: str) -> list[int]:
    """Lines of ``source`` that compare something with a method's key written out (``m == "istar"``,
    ``"cosreg" in methods``, ``m in ("base", "cosreg")``): a method question the registry should answer."""

    def names_a_method(node) -> bool:
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(map(names_a_method, node.elts))
        return isinstance(node, ast.Constant) and node.value in METHOD_NAMES

    return sorted({node.lineno for node in ast.walk(ast.parse(source))
                   if isinstance(node, ast.Compare) and any(map(names_a_method, [node.left, *node.comparators]))})


# istar/pipeline/plan.py is being rewritten for the whole-job table (issue 57); its two comparisons go with it


def test_no_method_is_named_in_a_comparison_outside_the_registry():
    """Which method is the baseline, which one the search tunes, what a method takes: the registry's
    entries answer (``BASELINE_METHOD``, ``SEARCHED_METHOD``, ``Method``), not a string comparison."""
    assert _method_comparisons('a = m == "istar"\nb = ("base", "x") == t or "cosreg" in ms\nc = m == "ista"') == [1, 2]
    package = Path(istar.__file__).parent
    found = [f"{path.relative_to(package.parent)}:{line}" for path in sorted(package.rglob("*.py"))
             if path.parent.name != "registry"
             for line in _method_comparisons(path.read_text(encoding="utf-8"))]
    assert not found, f"a method's key compared outside istar/registry (ask istar.registry.methods): {', '.join(found)}"


def test_figure_registry_covers_every_study_of_the_schema():
    studies = _schema()["properties"]["studies"]["properties"]
    assert set(STUDY_FIGURES) == set(studies) == {"stability", *STUDIES}
    assert FIGURE_NAMES == (*(f"fig{i}" for i in range(2, 9)), "padding", "sigma_epochs", "forest", *PROFILE_FIGURES)
    for spec in FIGURES.values():
        assert callable(getattr(importlib.import_module(spec.module), spec.name)), spec.name
    assert [path.as_posix() for path in figure_csvs("fig4", "agg")] == ["agg/dims.csv"]
    assert [path.as_posix() for path in figure_csvs("forest", "agg")] == ["agg/paired.csv", "agg/trend.csv"]
    assert figure_csvs("profile_gallery_steps", "agg")[0].as_posix() == "agg/profile_projections.csv"
    config = {"studies": {study: {"enabled": study in ("twonn", "stability")} for study in studies},
              "survey": {"enabled": False}}
    assert enabled_figures(config) == ["fig2", "fig5", "sigma_epochs", "forest"]  # the last two need only the final runs
    config["survey"]["enabled"] = True
    assert enabled_figures(config) == ["fig2", "fig5", "sigma_epochs", "forest", *PROFILE_FIGURES] and len(PROFILE_FIGURES) == 6
    with pytest.raises(ValueError, match="unknown figure 'fig9'"):
        get_figure("fig9")


def test_table_registry_follows_the_study_switches():
    from istar.report.table_specs import TABLES, enabled_tables, get_table

    studies = {study: {"enabled": False} for study in _schema()["properties"]["studies"]["properties"]}
    assert enabled_tables({"studies": studies}) == ["table1", "table2", "claims", "seeds"]
    studies["padding"]["enabled"] = True
    assert enabled_tables({"studies": studies}) == ["table1", "table2", "padding", "claims", "seeds"]
    for spec in TABLES.values():
        module, function = spec.builder.split(":")
        assert callable(getattr(importlib.import_module(module), function)), spec.name
    with pytest.raises(ValueError, match="unknown table 'table3'"):
        get_table("table3")


def test_token_selection_registry():
    from istar.core.tokens import TOKEN_SELECTION_NAMES, TOKEN_SELECTIONS, get_token_selection

    assert TOKEN_SELECTION_NAMES[0] == "real" and TOKEN_SELECTIONS["real"].suffix == ""  # old paths stay
    assert len({s.suffix for s in TOKEN_SELECTIONS.values()}) == len(TOKEN_SELECTIONS)
    assert _schema()["properties"]["penalty"]["properties"]["tokens"]["enum"] == list(TOKEN_SELECTION_NAMES)
    assert get_method("cosreg").takes("tokens") and get_method("istar").takes("tokens")
    assert not get_method("base").takes("tokens")
    with pytest.raises(ValueError, match="unknown token selection 'pad'"):
        get_token_selection("pad")


def test_stability_csv_round_trips_exactly_and_draws(tmp_path):
    frame = fig2_data(batch_sizes=[64, 256], zetas=[0.0, 0.4], n_shrinkage=2_000, repeats=2, dim=16)
    path = write_stability(frame, tmp_path / "fig2_stability.csv")
    read = pd.read_csv(path)
    assert list(read.columns) == list(STABILITY_COLUMNS)
    pd.testing.assert_frame_equal(read, frame, check_exact=True)
    fig = draw("fig2", read)
    assert isinstance(fig, Figure) and len(fig.axes[0].containers) == 2
