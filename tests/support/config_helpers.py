"""What the parts of one test module split by lane share (helpers and fixtures):
tests/e2e/test_config.py, tests/fast/config/test_config.py, tests/integration/test_config.py."""

import yaml
from mirrors import REPO


def demo():
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def with_change(path, value):
    config = demo()
    target = config
    keys = path.split(".")
    for key in keys[:-1]:
        target = target.setdefault(key, {})
    target[keys[-1]] = value
    return config
