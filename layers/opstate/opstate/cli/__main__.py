"""``python -m opstate.cli``: the same as the ``opstate`` console script."""

import sys

from opstate.cli.app import main

sys.exit(main())
