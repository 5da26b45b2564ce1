"""A step's model context (istar.steps.common.open_model_context): the precision it resolves is the one its
Accelerator runs, whatever an earlier step in the same process left in accelerate's process-wide state."""

import pytest

from istar.config.specs import ModelData


@pytest.mark.parametrize("order", [(True, False), (False, True)], ids=["bf16-then-fp32", "fp32-then-bf16"])
def test_each_step_runs_its_own_precision_after_another_in_the_same_process(tiny_model_dir, prepared, monkeypatch,
                                                                           order):
    """Both CPU paths forced, one after the other in one process: a processor with native bf16 resolves a
    reduced precision to bf16, one without to fp32 (istar.registry.precisions.run_precision); accelerate
    refuses a second precision in its shared state unless the step drops what the first one left."""
    from istar.steps.common import open_model_context

    data = prepared("rte", 16, 8)
    for native_bf16 in order:
        monkeypatch.setattr("istar.registry.precisions.cpu_has_native_bf16", lambda native=native_bf16: native)
        context = open_model_context(ModelData(model=str(tiny_model_dir), data_dir=str(data), mixed_precision="bf16"))
        expected = "bf16" if native_bf16 else "no"
        assert context.precision.key == expected
        assert context.accelerator.mixed_precision == expected
