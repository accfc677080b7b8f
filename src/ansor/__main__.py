"""`python -m ansor ...`: the `ansor` command, where its script is not on the PATH (a source
checkout on PYTHONPATH, a virtual environment not activated)."""

import sys

from ansor.cli import main

sys.exit(main())
