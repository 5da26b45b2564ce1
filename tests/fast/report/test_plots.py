"""Figures on synthetic aggregate data: files written, panels and series counted, clear errors."""

import numpy as np
import pandas as pd
import pytest
import statsmodels.formula.api as smf
import torch
from matplotlib.figure import Figure
from plots_helpers import ANALYSIS_ZETA, LAYERS, MODELS, SEEDS, SWEEP, make_runs
from scipy import stats

from istar.core.fig2 import fig2_true_value, fig2_variances
from istar.core.isotropy import isoscore_star_from_covariance
from istar.registry.methods import METHODS
from istar.report import figure_parts, plots
from istar.report.figures import draw
from istar.steps import stability


def make_layers(rng=None) -> pd.DataFrame:
    """layers.csv rows of the TwoNN study (SST-2) and the layer-wise study (QNLI)."""
    rng = rng or np.random.default_rng(1)
    rows = []
    for model in MODELS:
        for study, task, series in (("twonn", "sst2", [("base", 0.0), *(("istar", lam) for lam in (-5.0, -3.0, 3.0, 5.0))]),
                                    ("layerwise", "qnli", [("base", 0.0), ("istar", -1.0), ("istar", 1.0)])):
            for method, lam in series:
                for seed in SEEDS:
                    for h in range(LAYERS + 1):
                        depth = h / LAYERS
                        rows.append(dict(
                            study=study, model=model, task=task, method=method, setting=f"{method}_lam{lam:g}",
                            lam=lam, zeta=0.2 if method == "istar" else np.nan, layer=np.nan, seed=seed,
                            hidden_state=h,
                            isoscore_star=float(np.clip(0.3 - 0.2 * depth + 0.04 * lam * depth + rng.normal(0, 0.01), 0, 1)),
                            isoscore=np.nan,
                            twonn_cls=18 - 8 * depth + 1.2 * lam * depth + rng.normal(0, 0.5),
                            cosine_similarity=np.nan, standin=False, analysis_zeta=ANALYSIS_ZETA))
    return pd.DataFrame(rows)


def make_dims(rng=None, dim=384) -> pd.DataFrame:
    """dims.csv rows of the CosReg means study (QNLI): one outlier dimension that CosReg moves."""
    rng = rng or np.random.default_rng(2)
    rows = []
    for model in MODELS:
        for method, lam, outlier in (("base", 0.0, -4.0), ("cosreg", -1.0, -9.0), ("cosreg", 1.0, -0.3)):
            for seed in SEEDS:
                means = rng.normal(0, 0.15, dim)
                means[77] = outlier + rng.normal(0, 0.2)
                rows += [dict(study="cosreg_means", model=model, task="qnli", method=method, setting=f"{method}_lam{lam:g}",
                              lam=lam, zeta=np.nan, layer=np.nan, seed=seed, dim=i, mean=means[i], std=1.0)
                         for i in range(dim)]
    return pd.DataFrame(rows)


def _check_saved(fig, tmp_path, name):
    png, pdf = figure_parts.save(fig, tmp_path / f"{name}.png")
    assert png.read_bytes().startswith(b"\x89PNG") and png.stat().st_size > 10_000
    assert pdf.read_bytes().startswith(b"%PDF") and pdf.stat().st_size > 1_000
    assert not list(tmp_path.glob(".*.tmp"))


def _panels(fig: Figure):
    return [ax for ax in fig.axes if ax.get_title()]


def test_fig2_data_reaches_the_true_value_and_draws(tmp_path):
    true_value = fig2_true_value()
    assert true_value == pytest.approx(0.8673, abs=1e-4)
    # the closed form equals IsoScore* of the covariance, computed by the library
    assert true_value == pytest.approx(float(isoscore_star_from_covariance(torch.diag(torch.from_numpy(fig2_variances())))),
                                       abs=1e-12)
    df = stability.fig2_data(batch_sizes=[64, 131_072], zetas=[0.0], repeats=1)
    assert list(df.columns) == ["batch_size", "zeta", "mean", "std"]
    large = df[(df["batch_size"] >= 16_384) & (df["zeta"] == 0.0)]
    assert not large.empty and (large["mean"] - true_value).abs().max() < 0.01
    assert df.loc[df["batch_size"] == 64, "mean"].item() < 0.2  # the small-sample underestimate

    df = stability.fig2_data(batch_sizes=[64, 256, 1024], zetas=[0.0, 0.4, 0.8], n_shrinkage=5_000, repeats=2)
    assert len(df) == 9 and df["std"].notna().all()
    means = df.pivot(index="batch_size", columns="zeta", values="mean")
    assert (means[0.8] > means[0.4]).all() and (means[0.4] > means[0.0]).all()  # shrinkage repairs the estimate
    fig = plots.fig2(df)
    (ax,) = fig.axes
    assert len(ax.containers) == 3  # one error-bar series per ζ
    assert len(ax.lines) >= 3 + 2  # the series' lines plus the true-value and |X| = d lines
    _check_saved(fig, tmp_path, "fig2")


def test_fig3_draws_the_paired_differences_from_base_per_lambda_and_the_fitted_dose_response(tmp_path):
    runs = make_runs()
    fig = plots.fig3(runs)
    panels = _panels(fig)
    assert len(panels) == 4 and {ax.get_title() for ax in panels} >= {"bert — RTE", "albert — STS-B"}
    assert {ax.get_ylabel() for ax in panels} == {"Accuracy (%) − Base (points)", "Pearson correlation (×100) − Base (points)"}
    differences, fits = plots.dose_response(runs)
    sweep = runs[(runs.study == "lambda_sweep") & (runs.model == "bert") & (runs.task == "rte")]
    by_seed = sweep.pivot(index="seed", columns="lam", values="score") * 100
    gaps = by_seed[list(SWEEP)].sub(by_seed[0.0], axis=0)  # each seed's difference from its own Base run
    cell = differences[(differences.model == "bert") & (differences.task == "rte")].set_index("lam").loc[list(SWEEP)]
    assert cell["mean_difference"].to_numpy() == pytest.approx(gaps.mean().to_numpy())
    assert cell["sd_difference"].to_numpy() == pytest.approx(gaps.std(ddof=1).to_numpy())
    interval = stats.ttest_1samp(gaps[-5.0], 0.0).confidence_interval(0.95)
    assert (cell.loc[-5.0, "ci_low"], cell.loc[-5.0, "ci_high"]) == pytest.approx((interval.low, interval.high))
    # the line is statsmodels' random-intercept fit of the score on λ, through Base
    mixed = smf.mixedlm("points ~ lam", sweep.assign(points=sweep.score * 100), groups=sweep["seed"]).fit(reml=True)
    fit = fits[(fits.model == "bert") & (fits.task == "rte")].iloc[0]
    assert fit["slope"] == pytest.approx(mixed.params["lam"], rel=1e-4)
    ax = next(ax for ax in panels if ax.get_title() == "bert — RTE")
    (line,) = [line for line in ax.lines if line.get_label().startswith("fit on λ")]
    x, y = line.get_data()
    assert y == pytest.approx(fit["slope"] * x) and min(x) == -5 and max(x) == 5
    points = next(c for c in ax.containers if c.get_label().startswith("mean difference"))
    assert points.lines[0].get_data()[1] == pytest.approx(cell["mean_difference"].to_numpy())
    assert len(fig.legends) == 1 and len(fig.legends[0].get_texts()) == 3
    _check_saved(fig, tmp_path, "fig3")
    no_base = plots.fig3(runs[runs.method != "base"])  # a sweep whose λ list lacks 0 has nothing to subtract
    assert "add 0 (Base) to studies.lambda_sweep.lambdas" in no_base.axes[0].get_title()


def test_an_isoscore_axis_names_the_zeta_its_measurements_used():
    """The label comes from the rows plotted (runs.csv / layers.csv ``analysis_zeta``), never from a config:
    records without the column name no ζ, rows measured with two ζ are refused."""
    runs = make_runs()
    assert figure_parts.isoscore_label(runs) == "IsoScore* (ζ = 0.6)"
    assert figure_parts.isoscore_label(runs.drop(columns="analysis_zeta")) == "IsoScore*"
    layers = make_layers()
    assert draw("fig6", layers).axes[0].get_ylabel() == "IsoScore* (ζ = 0.6)"
    mixed = layers.assign(analysis_zeta=np.where(layers.seed == 0, 0.2, 0.6))
    with pytest.raises(ValueError, match=r"measured with several ζ \(0.2, 0.6\): measure every run"):
        plots.fig6(mixed)


def test_single_seed_has_no_error_bars():
    fig = plots.fig6(make_layers()[lambda frame: frame.seed == 0])
    for ax in _panels(fig):
        for container in ax.containers:
            assert container.has_xerr is False and container.has_yerr is False


def test_fig4_lines(tmp_path):
    dims = make_dims()
    fig = plots.fig4(dims)
    panels = _panels(fig)
    assert len(panels) == 2
    for ax in panels:
        assert len(ax.lines) == 3
        labels = {line.get_label() for line in ax.lines}
        assert labels == {"Base", "CosReg λ = −1", "CosReg λ = +1"}
    base = next(line for line in panels[0].lines if line.get_label() == "Base")
    expected = dims[(dims.model == "bert") & (dims.method == "base")].groupby("dim")["mean"].mean()
    np.testing.assert_allclose(base.get_ydata(), expected.to_numpy())
    _check_saved(fig, tmp_path, "fig4")


@pytest.mark.parametrize("name, series", [("fig5", 5), ("fig6", 3)])
def test_layer_figures(tmp_path, name, series):
    fig = draw(name, make_layers())  # as `istar figure` draws it (ζ of the analysis where the figure shows it)
    panels = _panels(fig)
    assert len(panels) == 2
    for ax in panels:
        assert len(ax.containers) == series
        assert ax.get_xlabel() == "Layer (0 = embeddings)"
        assert len(ax.containers[0].lines[0].get_xdata()) == LAYERS + 1
    _check_saved(fig, tmp_path, name)


def test_lambda_colours_diverge():
    styles = figure_parts.series_styles([("base", 0.0), ("istar", -5.0), ("istar", -1.0), ("istar", 5.0), ("cosreg", 1.0)])
    assert styles[("base", 0.0)][1] == METHODS["base"].colour
    assert styles[("cosreg", 1.0)][1] == METHODS["cosreg"].colour  # one λ: the method's colour
    red, green, blue = (int(styles[("istar", -5.0)][1][i:i + 2], 16) for i in (1, 3, 5))
    assert blue > red  # negative λ blue
    red, green, blue = (int(styles[("istar", 5.0)][1][i:i + 2], 16) for i in (1, 3, 5))
    assert red > blue  # positive λ red
    assert len({colour for _, colour in styles.values()}) == len(styles)


def test_fig7_best_zeta_line(tmp_path):
    runs = make_runs()
    fig = plots.fig7(runs)
    panels = _panels(fig)
    assert len(panels) == 2
    for ax in panels:
        assert len(ax.containers) == 1
        (vline,) = [line for line in ax.lines if line.get_linestyle() == "--"]
        model = ax.get_title().split(" — ")[0]
        rows = runs[(runs.study == "zeta_sweep") & (runs.model == model)]
        assert vline.get_xdata()[0] == pytest.approx(rows.groupby("zeta")["score"].mean().idxmax())
        assert vline.get_color() == figure_parts.HIGHLIGHT
    _check_saved(fig, tmp_path, "fig7")


def test_fig8_layers_and_global_line(tmp_path):
    runs = make_runs()
    fig = plots.fig8(runs)
    panels = _panels(fig)
    assert len(panels) == 2
    for ax in panels:
        (container,) = ax.containers
        assert list(container.lines[0].get_xdata()) == list(range(1, LAYERS + 1))
        (hline,) = [line for line in ax.lines if line.get_linestyle() == "--"]
        model = ax.get_title().split(" — ")[0]
        overall = runs[(runs.study == "single_layer") & (runs.model == model) & runs.layer.isna()]
        assert hline.get_ydata()[0] == pytest.approx(100 * overall["score"].mean())
        assert len(ax.patches) == 1  # the ± std band of the global penalty
    _check_saved(fig, tmp_path, "fig8")


@pytest.mark.parametrize("name, frame, study", [
    ("fig3", make_runs, "lambda_sweep"), ("fig4", make_dims, "cosreg_means"), ("fig5", make_layers, "twonn"),
    ("fig6", make_layers, "layerwise"), ("fig7", make_runs, "zeta_sweep"), ("fig8", make_runs, "single_layer"),
])
def test_missing_study_is_a_clear_error(name, frame, study):
    df = frame()
    with pytest.raises(ValueError, match=rf"no rows with study == '{study}' in \w+\.csv: enable studies\.{study} in the config"):
        draw(name, df[df.study != study])


def test_missing_isoscore_and_columns_are_clear_errors():
    with pytest.raises(ValueError, match="no 'isoscore_star' values.*istar measure"):
        plots.fig6(make_layers().assign(isoscore_star=np.nan))
    with pytest.raises(ValueError, match="lacks the column.*twonn_cls"):
        plots.fig5(make_layers().drop(columns="twonn_cls"))


@pytest.mark.parametrize("istar_tokens", ["real", "all_positions"])
def test_sigma_epochs_says_which_rows_each_sigma_read_when_they_differ(istar_tokens):
    rows = [{"study": "final", "model": "m", "task": "rte", "method": method, "setting": method, "lam": lam,
             "seed": seed, "tokens": tokens, "epoch": epoch, "sigma_s_isoscore": 0.2 + 0.01 * epoch + 0.001 * seed}
            for method, lam, tokens in (("base", 0.0, "real"), ("istar", -1.0, istar_tokens))
            for seed in (0, 1) for epoch in (0, 1)]
    fig = draw("sigma_epochs", pd.DataFrame(rows))
    labels = fig.axes[0].get_legend_handles_labels()[1]
    if istar_tokens == "real":  # the same rows everywhere: nothing to say
        assert labels == ["Base", "I-STAR λ = −1"]
        # runs recorded before the token selection existed read the default rows
        old = draw("sigma_epochs", pd.DataFrame(rows).assign(tokens=None))
        assert old.axes[0].get_legend_handles_labels()[1] == labels
    else:  # padding alone moves the IsoScore, so the legend names the rows
        assert labels == ["Base (Σ_S over real tokens)", "I-STAR λ = −1 (Σ_S over all positions)"]


def test_the_forest_plot_draws_each_cell_the_pool_and_the_papers_cell_and_names_what_it_leaves_out(tmp_path):
    from istar.report.comparisons import study_tests

    rng = np.random.default_rng(5)
    rows = []
    for task in ("sst2", "mrpc", "rte"):
        for seed in range(6):
            base = 0.8 + rng.normal(0, 0.01)
            for method, score in (("base", base), ("istar", base + rng.normal(0.003, 0.01))):
                if task == "rte":
                    score = 0.527  # every run of both arms predicted the majority class: no information
                rows.append({"study": "final", "model": "minilm", "task": task, "method": method, "seed": seed,
                             "metric": "accuracy", "score": score, "tokens": "real"})
    paired = study_tests(pd.DataFrame(rows)).paired
    fig = plots.forest(paired)
    ax = fig.axes[0]
    labels = [tick.get_text() for tick in ax.get_yticklabels()]
    assert labels == ["minilm SST-2, I-STAR\nvs the paper's distilbert", "minilm MRPC, I-STAR\nvs the paper's distilbert",
                      "I-STAR, pooled over 2 cells (HKSJ)"]
    assert "left out, no information: minilm RTE I-STAR" in ax.get_title()
    assert len(ax.containers) == 4  # ours and the paper's cell, for each of the two informative cells
    figure_parts.save(fig, tmp_path / "forest.png")
    empty = plots.forest(paired[paired["measure"] != "score"])  # every pair excluded: a figure that says so
    assert "no pair left" in empty.axes[0].get_title()


def test_the_forest_plot_adds_the_isotropy_contrasts_and_the_sweeps_trends():
    """The dose-response records (docs/data): below the score panel, each isotropy contrast of paired.csv in its
    own units and each trend of trend.csv (λ per unit, IsoScore* per +0.1), at the values the records hold."""
    from pathlib import Path

    from istar.report.figures import figure_csvs

    records = Path(__file__).parents[3] / "docs" / "data" / "dose-response"
    paired, trends = (pd.read_csv(path) for path in figure_csvs("forest", records))
    scores, contrasts, slopes = draw("forest", paired, trends).axes
    measures = paired[(paired.study == "final") & paired.measure.isin(list(plots.CONTRAST_LABELS))]
    drawn = {tick.get_text(): container.lines[0].get_data()[0][0]
             for tick, container in zip(contrasts.get_yticklabels(), contrasts.containers)}
    assert drawn == pytest.approx({f"minilm SST-2, {METHODS[row.method].label}: {plots.CONTRAST_LABELS[row.measure]}":
                                   row.mean_difference for row in measures.itertuples()})
    lam, iso = (trends.set_index("covariate").loc[name] for name in ("lam", "isoscore_star"))
    drawn = {tick.get_text(): container.lines[0].get_data()[0][0]
             for tick, container in zip(slopes.get_yticklabels(), slopes.containers)}
    assert drawn == pytest.approx({"minilm SST-2: slope on λ (points per unit)": lam.slope,
                                   "minilm SST-2: slope on IsoScore* (points per +0.1)": iso.slope / 10})
    assert len(scores.containers) == 4  # the score panel as before: ours and the paper's cell, per method
