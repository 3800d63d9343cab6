"""Fit a PLN to your own counts with one command, fast from its second run on.

    python -m fastjax.pln.fit counts.csv [--offsets F] [--covariates F] [--out F.npz]
    python -m fastjax.pln.fit counts.csv --ranks 1-10 [...]            # PLN-PCA of each rank, BIC and ICL
    python -m fastjax.pln.fit counts.csv --bootstrap 200 [--seed S] [...]  # intervals for the coefficients

(``pip install`` also gives it as ``fastjax-fit``.) The command reads and checks the input before JAX is
imported, runs the fit as one program compiled once per data shape and kept in the user's cache folder as
a serialized executable; a later run loads it without importing the fit's modules, tracing, lowering or
compiling (chapters/floor/04-first-result.md measures each step). One module per job:

- ``tables``: reading and checking the counts, offsets and covariates (before JAX);
- ``options``: checking the command's options;
- ``cache``: the cache folder, the keys, signed files and the checks that make loading one safe;
- ``run``: running a program, loaded or compiled, and checking its ELBOs;
- ``fits``: the fit (Part VI's), the PLN-PCA collection and the bootstrap (Part IV's), each one program;
- ``output``: printing the result and writing ``--out``;
- ``cli``: the command line (``main``); ``clock``: when the command started.

Everything a caller uses is importable from here (``from fastjax.pln import fit; fit.main([...])``).
"""

from __future__ import annotations

from fastjax.pln.fit.clock import STARTED  # noqa: F401  (first: the command's stages are timed from here)

import fastjax  # noqa: E402,F401  (the CPU workaround, before jax)

from fastjax.pln.fit import cache, cli, fits, options, output, run, tables  # noqa: E402,F401
from fastjax.pln.fit.cache import (CACHE_FORMAT, FIT_SOURCES, MANY_SOURCES, SECRET_NAME, CacheRejected,  # noqa: E402,F401
                                   cache_folder, cache_key, cache_secret, cache_what, host_cpu, load_executable,
                                   open_cache, save_executable, save_serialized, serialized)
from fastjax.pln.fit.cli import PROG, QUICK_COMPILE, main, parser  # noqa: E402,F401
from fastjax.pln.fit.fits import (Bootstrap, BootstrapResult, Collection, FitResult, RanksResult,  # noqa: E402,F401
                                  bootstrap_program, collection_program, fit, fit_bootstrap, fit_program, fit_ranks,
                                  prepare_bootstrap, prepare_ranks, register_for_export)
from fastjax.pln.fit.options import (BOOTSTRAP_LIMIT, LEVEL, MAXITER_LIMIT, RANK_LIMIT, check_bootstrap,  # noqa: E402,F401
                                     check_maxiter, check_out, check_seed, check_tol, parse_ranks, ranks_text)
from fastjax.pln.fit.output import write_bootstrap, write_npz, write_ranks, write_result  # noqa: E402,F401
from fastjax.pln.fit.run import (Program, check_first_bootstrap_elbos, check_first_elbo,  # noqa: E402,F401
                                 check_first_pca_elbos, checked_elbos, first_elbo_rtol, first_pca_elbo_rtol,
                                 run_program)
from fastjax.pln.fit.tables import (FLOAT32_EXACT, MISSING, OFFSET_LIMIT, Table, read_csv, read_data,  # noqa: E402,F401
                                    read_matrix, read_table)
