"""The Σ_S file a run is given (istar.steps.sigma_tracking.read_given_sigma and the provenance check behind it):
a file made with other settings than the run's is refused before the model is loaded."""

import dataclasses
import re

import pytest


def test_a_sigma_file_of_other_settings_is_refused_before_training(tiny_model_dir, prepared, tiny_sigma, tmp_path):
    """A Σ_S file made with another row budget, token selection or model than the run reads it with (a stale file
    after an edit of shrinkage.rows) stops the run before the model is loaded, naming the file, both values and
    the fix; the file the run's own settings make is read."""
    from istar.config.specs import TrainSpec
    from istar.steps.sigma_tracking import read_given_sigma

    spec = TrainSpec(model=str(tiny_model_dir), data_dir=str(prepared("rte")), output_dir=str(tmp_path / "run"),
                     method="istar", lam=-1.0, zeta=0.2, sigma_s=str(tiny_sigma("rte")))
    assert read_given_sigma(spec) is not None
    for change, named in (({"shrinkage_rows": 1500}, "rows 250000 where 1500 is expected"),
                          ({"tokens": "all_positions"}, "tokens 'real' where 'all_positions' is expected"),
                          ({"model": str(tmp_path)}, f"model '{tiny_model_dir}' where '{tmp_path}' is expected")):
        with pytest.raises(ValueError, match=r"sigma0.pt was computed with other settings than its reader's: "
                                             + re.escape(named) + r"; compute it again"):
            read_given_sigma(dataclasses.replace(spec, **change))


def test_a_sigma_file_written_before_specs_were_recorded_is_judged_on_its_provenance_keys():
    """Files of earlier versions record the settings under their own keys (requested_rows, layer_spec, tokens)."""
    from istar.core.shrinkage import check_sigma_settings

    legacy = {"requested_rows": 1000, "layer_spec": "all", "tokens": "real", "model": "./tiny-bert"}
    check_sigma_settings("old.pt", legacy, {"rows": 1000, "layers": "all", "tokens": "real", "model": "pin.json"}, "fix")
    with pytest.raises(ValueError, match=r"old.pt .*: layers 'all' where \[2\] is expected; fix"):
        check_sigma_settings("old.pt", legacy, {"rows": 1000, "layers": [2]}, "fix")
