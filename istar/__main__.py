import sys

from istar.cli import main

sys.exit(main())
