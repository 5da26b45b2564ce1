"""What the parts of one test module split by lane share (helpers and fixtures):
tests/fast/integrations/test_integrations.py, tests/integration/test_integrations.py."""

from __future__ import annotations

SENTENCES = ["a gripping, beautifully acted film", "dull and far too long", "one of the year's best",
             "the plot makes no sense", "warm, funny and wise", "a tedious mess", "i loved every minute",
             "flat characters and a lazy script"]
