"""`python -m specdeploy.cli`: the same command as the `specdeploy` script."""

import sys

from specdeploy.cli.commands import main

sys.exit(main())
