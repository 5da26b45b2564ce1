"""What the parts of one test module split by lane share (helpers and fixtures):
tests/fast/pipeline/test_bundle.py, tests/integration/test_bundle.py."""

from mirrors import REPO

GPU_STUDY = REPO / "config" / "gpu-study.yaml"
