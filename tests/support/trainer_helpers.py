"""What the parts of one test module split by lane share (helpers and fixtures):
tests/fast/integrations/test_trainer.py, tests/integration/test_trainer.py."""

from __future__ import annotations


def training_logs(trainer) -> list[dict]:
    return [entry for entry in trainer.state.log_history if "isoscore_star" in entry]
