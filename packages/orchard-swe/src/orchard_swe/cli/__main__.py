"""``python -m orchard_swe.cli``: the ``orchard-swe`` command."""

import sys

from . import main

sys.exit(main())
