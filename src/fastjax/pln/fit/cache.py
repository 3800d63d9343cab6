"""The cache of compiled programs: where it lives, what names a file, how a file is written and checked.


What makes it fast (chapters/floor/04-first-result.md measures each step): the data are read and
checked before JAX is imported; the fit runs as one program, compiled once per data shape and kept in
the user's cache folder as a serialized executable (``jax.experimental.serialize_executable``); a later
run loads it without importing the fit's modules (optax, Part VI's floor), tracing, lowering or compiling.

What the cache guarantees (``open_cache``, ``load_executable``). Loading a serialized executable runs
code from the file (it is a pickle, and the executable is machine code), so the command trusts a file
only as far as the folder that holds it, as Python trusts ``__pycache__``:

- the path above the cache folder is resolved once (``os.path.realpath``), then every folder from ``/``
  down to the cache folder is opened one by one, relative to the one above, with ``O_NOFOLLOW``, and
  checked on its open descriptor (``fstat``: nothing can be swapped between the check and the use): each
  owned by you or root and writable by no one else (root's sticky folders such as ``/tmp`` excepted: there
  others cannot rename or remove what is yours), the cache folder itself yours and not a symbolic link.
  A folder that fails is not used at all: a warning, and the fit compiles in memory;
- the file is opened relative to that descriptor with ``O_NOFOLLOW``, must be a regular file of yours
  with mode 0600, and is read once: what is checked is what is loaded;
- its bytes carry an HMAC-SHA256 keyed by a random secret kept in the cache folder (``secret.key``,
  mode 0600), written with the file and checked before anything is unpickled. It proves that the file
  was written by a process that could read that secret, i.e. by you (this command, or code running as
  you or as root, which could do anything anyway) and that not one byte has changed since: not a file
  planted by hand or restored from elsewhere, not one damaged on disk. It cannot prove more: nothing
  stored beside a file proves who wrote it against someone who can write as you;
- the file also records what it was compiled for (``cache_what``: versions, device, CPU, flags, shapes,
  the fit's source); a file for anything else is not loaded. The loaded program's first ELBO (at the
  start, before any update) must match NumPy's float64 value of the same ELBO (``check_first_elbo``);
- a file that fails any check, fails to load, or was written for something else is removed (the folder
  is yours) and the program compiled again, with one line saying why. A cache that cannot be written is
  a warning: the fit still runs and writes its result.

What this does not cover: a file that passes every check is run as it is, so a bug of XLA's that breaks
a program only when it is reloaded could still crash the process (the one met so far, jaxlib's LAPACK
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import pickle
import re
import secrets
import stat
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

CACHE_FORMAT = 2  # bump when what the cache holds changes, so that old files are not read
FIT_SOURCES = ("__init__.py", "floor.py", "rungs.py", "rprop.py")  # the fit's code in fastjax.pln, hashed into the key
MANY_SOURCES = ("many.py", "collection.py")  # and Part IV's, for --ranks and --bootstrap
FIT_PACKAGES = ("jax", "jaxlib", "optax", "numpy")  # their versions are in the key (optax's code is traced into the fit)
MAGIC = b"fastjax.pln.fit\n"
SECRET_NAME, SECRET_BYTES = "secret.key", 32


def cache_folder() -> Path:
    """Where the command keeps its compiled fits: ``$XDG_CACHE_HOME/fastjax/pln-fit`` (default
    ``~/.cache/fastjax/pln-fit``)."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"  # the XDG spec: a relative one is ignored
    return base / "fastjax" / "pln-fit"


def host_cpu() -> str:
    """The host CPU's model and instruction-set flags, hashed (XLA compiles CPU code for the host's own
    instructions: an executable from another CPU may not run here): from ``/proc/cpuinfo`` where there is
    one, else the ``platform`` module's words."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            words = sorted({line.strip() for line in f if line.startswith(("model name", "flags", "Features", "CPU part"))})
    except OSError:
        words = []
    text = "\n".join(words) or f"{platform.machine()} {platform.processor()}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_what(shape: tuple[int, int, int], maxiter: int, compile_options: dict[str, Any] | None = None,
               program: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the compiled fit of ``shape`` (n, p, d) depends on: the versions of jax, jaxlib, optax (traced
    into the fit) and numpy, Python's, the device and the host CPU, every ``JAX_*`` and ``XLA_*``
    environment variable (``XLA_FLAGS`` among them) and the compile options, the shapes, float32,
    ``maxiter`` and the fit's source files. ``program``: None for the fit; for Part IV's programs what
    they are and how many members (``{"kind": "ranks", "members": 10, "q_max": 10}``, ``{"kind":
    "bootstrap", "members": 201}``), and their source files (``MANY_SOURCES``) join the fit's."""
    import importlib.metadata

    import jax

    device = jax.devices()[0]
    here = Path(__file__).resolve().parent
    files = [here.parent / f for f in FIT_SOURCES + (MANY_SOURCES if program is not None else ())]
    files += sorted(here.glob("*.py"))  # this command's own modules
    source = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()
    what = dict(format=CACHE_FORMAT, versions={k: importlib.metadata.version(k) for k in FIT_PACKAGES},
                python=sys.version, platform=device.platform, device=device.device_kind, devices=jax.device_count(),
                cpu=host_cpu(), env={k: v for k, v in sorted(os.environ.items()) if k.startswith(("JAX_", "XLA_"))},
                shape=[int(v) for v in shape], dtype="float32", maxiter=int(maxiter), source=source,
                options=compile_options or {})
    if program is not None:
        what["program"] = program
    return what


def cache_key(shape: tuple[int, int, int], maxiter: int, compile_options: dict[str, Any] | None = None,
              program: dict[str, Any] | None = None) -> str:
    """The file name of the compiled fit of ``shape`` (n, p, d) (or of Part IV's ``program``): a hash of
    ``cache_what``."""
    what = cache_what(shape, maxiter, compile_options, program)
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


class CacheRejected(Exception):
    """A cache file (or folder) that is not used, and why."""


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
_FILE_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def _check_folder(fd: int, where: Path, last: bool) -> None:
    st, me = os.fstat(fd), os.geteuid()
    if st.st_uid not in ((me,) if last else (me, 0)):
        raise CacheRejected(f"{where} belongs to user id {st.st_uid}, not to you{'' if last else ' or root'}")
    sticky = st.st_uid == 0 and st.st_mode & stat.S_ISVTX and not last
    if st.st_mode & 0o022 and not sticky:
        raise CacheRejected(f"{where} can be written by others (mode {stat.S_IMODE(st.st_mode):o})")


def open_cache(folder: str | os.PathLike) -> int:
    """An open descriptor of the cache ``folder`` (created, mode 0700, where missing), after checking each
    folder from ``/`` down on its own descriptor (module docstring). Raises CacheRejected or OSError."""
    if not hasattr(os, "O_NOFOLLOW") or os.open not in os.supports_dir_fd:
        raise CacheRejected("this system cannot open files relative to a checked folder")
    full = Path(os.path.abspath(folder))
    parts = Path(os.path.realpath(full.parent)).parts[1:] + ((full.name,) if full.name else ())
    fd, where = os.open("/", _DIR_FLAGS), Path("/")
    try:
        _check_folder(fd, where, last=not parts)
        for k, part in enumerate(parts):
            where = where / part
            try:
                new = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                os.mkdir(part, 0o700, dir_fd=fd)
                new = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as err:  # ENOTDIR, ELOOP: a file or a symbolic link; ENAMETOOLONG
                link = stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode)
                if isinstance(err, NotADirectoryError) and not link:
                    raise CacheRejected(f"{where} is not a folder") from None
                raise CacheRejected(f"{short(where)}: {err.strerror} (the cache folder must be a folder, not a symbolic "
                                    "link)") from None
            os.close(fd)
            fd = new
            _check_folder(fd, where, last=k == len(parts) - 1)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _read_own(folder_fd: int, name: str, size: int | None = None) -> bytes | None:
    """The bytes of ``name`` in the checked folder, read once from the descriptor that was checked (a regular
    file of yours, mode 0600); None when there is none. Raises CacheRejected."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=folder_fd)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise CacheRejected(f"cannot be opened safely ({err.strerror}: a symbolic link?)") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen, which refuses a folder with its own error
        os.close(fd)
        raise CacheRejected("is not a regular file")
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise CacheRejected(f"belongs to user id {st.st_uid}, not to you")
        if stat.S_IMODE(st.st_mode) != 0o600:
            raise CacheRejected(f"has mode {stat.S_IMODE(st.st_mode):o}, not 600")
        return f.read() if size is None else f.read(size + 1)


def short(text: Any, limit: int = 80) -> str:
    """``text`` as a message shows it: at most ``limit`` characters, then how many more."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


def temp_name(name: str) -> str:
    """The name of a temporary file that will become ``name``: hidden, and naming this process, so that a
    later run can tell one left by a process that died (SIGKILL, a power cut) from one still being written
    (``remove_stale_temps``)."""
    return f".{name}.{os.getpid()}-{secrets.token_hex(6)}.tmp"


def remove_stale_temps(folder: str | os.PathLike | int, name: str | None = None) -> list[str]:
    """Remove the temporary files (``temp_name``) in ``folder`` (a path or an open descriptor) whose process
    is gone, for the target ``name`` (None: any target); only regular files of yours. Returns their
    names. A process that was killed while writing left them; a living one is still writing its own."""
    fd = folder if isinstance(folder, int) else None
    try:
        entries = os.listdir(folder)
    except OSError:
        return []
    gone = []
    for entry in entries:
        m = _TEMP.fullmatch(entry)
        if m is None or (name is not None and m["name"] != name) or _alive(int(m["pid"])):
            continue
        try:
            st = os.stat(entry, dir_fd=fd, follow_symlinks=False) if fd is not None else os.lstat(Path(folder) / entry)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                os.unlink(entry, dir_fd=fd) if fd is not None else os.unlink(Path(folder) / entry)
                gone.append(entry)
        except OSError:
            pass
    return gone


_TEMP = re.compile(r"\.(?P<name>.+)\.(?P<pid>[0-9]+)-[0-9a-f]{12}\.tmp")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _write_own(folder_fd: int, name: str, data: bytes, replace: bool = True) -> None:
    """Write ``data`` to ``name`` in the checked folder through a new temporary file (mode 0600, synced),
    renamed over ``name`` (``replace``) or linked to it unless it exists; no temporary is left behind (one
    left by a process killed meanwhile goes on the next run: ``remove_stale_temps``)."""
    tmp = temp_name(name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(fd, 0o600)
            f.write(data)
            f.flush()
            os.fsync(fd)
        if replace:
            os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        else:
            try:
                os.link(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd, follow_symlinks=False)
            except FileExistsError:
                pass
    finally:
        try:
            os.unlink(tmp, dir_fd=folder_fd)
        except FileNotFoundError:
            pass


def cache_secret(folder_fd: int) -> bytes:
    """The cache folder's secret (``SECRET_NAME``, 32 random bytes, mode 0600), made where missing; one that
    fails the file checks is replaced, which makes every file signed with it unprovable."""
    for _ in range(2):
        try:
            key = _read_own(folder_fd, SECRET_NAME, SECRET_BYTES)
        except CacheRejected as why:
            try:
                os.unlink(SECRET_NAME, dir_fd=folder_fd)
            except OSError:  # a folder, say: nothing this command should remove
                raise CacheRejected(f"its {SECRET_NAME} {why} and cannot be replaced: remove it") from None
            warnings.warn(f"the cache's {SECRET_NAME} {why}: replaced by a new one", stacklevel=2)
            key = None
        if key is not None and len(key) == SECRET_BYTES:
            return key
        if key is not None:
            os.unlink(SECRET_NAME, dir_fd=folder_fd)
        _write_own(folder_fd, SECRET_NAME, secrets.token_bytes(SECRET_BYTES), replace=False)
    raise CacheRejected(f"its {SECRET_NAME} cannot be made")


def _signed(secret: bytes, what: dict[str, Any], payload: bytes) -> bytes:
    meta = json.dumps(what, sort_keys=True).encode()
    body = MAGIC + len(meta).to_bytes(8, "little") + meta + payload
    return body + hmac.new(secret, body, hashlib.sha256).digest()


def _unsigned(secret: bytes, what: dict[str, Any], raw: bytes) -> bytes:
    """The payload of a file ``_signed`` wrote for ``what``; else CacheRejected."""
    body, mac = raw[:-32], raw[-32:]
    if len(raw) < len(MAGIC) + 40 or not hmac.compare_digest(hmac.new(secret, body, hashlib.sha256).digest(), mac):
        raise CacheRejected("does not carry this cache's signature (not written by this command, or changed since)")
    size = int.from_bytes(body[len(MAGIC):len(MAGIC) + 8], "little")
    meta = json.loads(body[len(MAGIC) + 8:len(MAGIC) + 8 + size])
    if meta != json.loads(json.dumps(what)):
        changed = sorted(k for k in set(meta) | set(what) if meta.get(k) != what.get(k))
        raise CacheRejected("was compiled for another " + ", ".join(f"{k} ({k}={meta.get(k)})" if k in ("shape", "maxiter")
                                                                    else k for k in changed))
    return body[len(MAGIC) + 8 + size:]


def load_executable(folder_fd: int, name: str, what: dict[str, Any]) -> Any | None:
    """The compiled fit saved as ``name`` in the checked cache folder by ``save_executable`` for ``what``, or
    None when there is none. Raises CacheRejected (the caller removes the file) when it fails a check or
    does not load."""
    raw = _read_own(folder_fd, name)
    if raw is None:
        return None
    payload = _unsigned(cache_secret(folder_fd), what, raw)
    import jax
    from jax.experimental import serialize_executable

    # jaxlib fills in its LAPACK kernels (Cholesky, triangular solves, LU: the fit calls them on CPU) when
    # it first lowers a program that uses one, and deserialize_and_load does not: an executable loaded
    # first calls a null kernel and the process dies (jax-ml/jax#28908, open). Lowering a 1×1 Cholesky,
    # never compiled, fills them in through public API.
    jax.jit(jax.numpy.linalg.cholesky).trace(jax.ShapeDtypeStruct((1, 1), np.float32)).lower()
    try:
        blob, in_tree, out_tree = pickle.loads(payload)  # signed by this cache's secret: written by this command
        return serialize_executable.deserialize_and_load(blob, in_tree, out_tree)
    except Exception as err:
        raise CacheRejected(f"does not load ({type(err).__name__}: {str(err)[:100]})") from None


def serialized(compiled: Any) -> bytes | None:
    """``compiled`` (a ``jax.stages.Compiled``) as the bytes ``load_executable`` reads back, or None when this
    backend cannot serialize it. Call it before the program first runs: XLA:CPU cannot serialize some
    programs once they have run (the bootstrap's: "`LessThan` is not serializable", jaxlib 0.10.2 and
    0.12.0.1), and serializes them before."""
    import jax
    from jax.experimental import serialize_executable

    try:
        return pickle.dumps(serialize_executable.serialize(compiled))
    except (ValueError, NotImplementedError, jax.errors.JaxRuntimeError):
        return None


def save_serialized(payload: bytes, folder_fd: int, name: str, what: dict[str, Any]) -> None:
    """Write ``payload`` (``serialized``) as ``name`` in the checked cache folder, signed (``_signed``), through
    a temporary file renamed over it. Raises OSError or CacheRejected when it cannot be written."""
    _write_own(folder_fd, name, _signed(cache_secret(folder_fd), what, payload))


def save_executable(compiled: Any, folder_fd: int, name: str, what: dict[str, Any]) -> bool:
    """``save_serialized(serialized(compiled), ...)``; False when this backend cannot serialize it."""
    payload = serialized(compiled)
    if payload is None:
        return False
    save_serialized(payload, folder_fd, name, what)
    return True

