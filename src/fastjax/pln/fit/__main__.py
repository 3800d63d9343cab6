"""``python -m fastjax.pln.fit``: the command (``cli.main``)."""

from fastjax.pln.fit.cli import run

if __name__ == "__main__":
    run()
