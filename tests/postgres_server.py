"""A real PostgreSQL server for tests: Debian's ``postgresql`` binaries, a throwaway cluster.

``initdb`` into a temporary folder and ``postgres`` on a free loopback port; as root
(which PostgreSQL refuses to run as) both run as the ``postgres`` system user. When
the binaries are not installed, ``PostgresUnavailable`` says why and tests skip.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


class PostgresUnavailable(Exception):
    pass


def _bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for candidate in sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True):
        return candidate
    raise PostgresUnavailable(f"{name} not found (apt-get install postgresql)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _accepts(dsn: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.OperationalError:
        return False


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """A running server; yields its DSN (database ``postgres``, user ``postgres``, trust auth)."""
    initdb, postgres = _bin("initdb"), _bin("postgres")
    prefix: list[str] = []
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError as exc:
            raise PostgresUnavailable("running as root and there is no 'postgres' user to run the server as") from exc
        prefix = ["runuser", "-u", "postgres", "--"]
    root = Path(tempfile.mkdtemp(prefix="gw-pg-"))
    data = root / "data"
    if prefix:
        os.chown(root, user.pw_uid, user.pw_gid)
    port = _free_port()
    proc: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run(
            [*prefix, initdb, "-D", str(data), "-U", "postgres", "-A", "trust", "--no-sync"],
            check=True, capture_output=True, timeout=120,
        )
        proc = subprocess.Popen(
            [*prefix, postgres, "-D", str(data), "-h", "127.0.0.1", "-p", str(port), "-k", str(root), "-F"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        deadline = time.monotonic() + 60
        while not _accepts(dsn):  # a listening port is not yet a server that takes queries
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise PostgresUnavailable(f"postgres did not start: {err[-500:]}")
            time.sleep(0.1)
        yield dsn
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(root, ignore_errors=True)
