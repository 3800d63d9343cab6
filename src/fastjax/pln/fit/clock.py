"""When the command started: its stages (``--json``) are timed from here. Imported first by the package,
before numpy and the command's other imports (``python -m`` imports fastjax and fastjax.pln before it)."""

import time

STARTED = time.perf_counter()
