"""The measuring tools every part uses: the timing harness (``timing``), charts (``plots``), traces and
compiled programs (``profiling``), device memory (``memory``). They know no example: they import only
the base modules, the setup and JAX.
"""
