"""``python -m fastjax.pln.fit``: the command (``cli.main``)."""

import sys

from fastjax.pln.fit.cli import main

if __name__ == "__main__":
    sys.exit(main())
