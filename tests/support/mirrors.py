"""Where the tests' data is: the slice that ships with the repository, and the full releases.

``TEST_DATA`` (tests/data) is a slice of the public releases in their own layout (its README: rows,
sources, licences, sha256); every test reads it, so a clone with nothing beside it runs the suite.
``FULL_MIRROR`` is a full copy of the releases (the layout of istar/data/mirror.py), which only the
``full_release`` group reads (``make test-full``): ``$ISTAR_FULL_MIRROR``, or else the folder
``shared/data`` beside the repository's folder, where CI keeps it.
"""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEST_DATA = REPO / "tests" / "data"
FULL_MIRROR_ENV = "ISTAR_FULL_MIRROR"
FULL_MIRROR = Path(os.environ.get(FULL_MIRROR_ENV) or REPO.parent / "shared" / "data")
FULL_MIRROR_MISSING = (f"the full_release group needs a full copy of the releases at {FULL_MIRROR} (set "
                       f"${FULL_MIRROR_ENV} to one); `make test` leaves the group out")
