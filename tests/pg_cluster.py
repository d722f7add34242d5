"""A throwaway PostgreSQL cluster for the tests: ``initdb`` into a temporary folder, listening on a unix socket in it
(no TCP port), started and stopped with ``pg_ctl``; never the system's service.

The binaries are Debian's ``postgresql`` package (``/usr/lib/postgresql/<major>/bin``) or whatever ``initdb`` is on
PATH. PostgreSQL refuses to run as root: as root the cluster runs as the ``postgres`` user the package creates.
Durability is off (``fsync``, ``synchronous_commit``, ``full_page_writes``): a test cluster trades it for speed.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

SUPERUSER = "postgres"


def find_bindir() -> Path | None:
    """The folder holding initdb and pg_ctl (the newest Debian major first), or None."""
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]),
                            reverse=True):
        if Path(candidate, "initdb").is_file() and Path(candidate, "pg_ctl").is_file():
            return Path(candidate)
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(os.path.realpath(initdb)).parent
    return None


def unavailable_reason() -> str | None:
    """Why a cluster cannot be started here, or None when it can."""
    if find_bindir() is None:
        return "PostgreSQL is not installed (no initdb/pg_ctl; Debian: apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SUPERUSER)
        except KeyError:
            return "running as root and there is no 'postgres' user to run PostgreSQL as"
        if shutil.which("runuser") is None:
            return "running as root without runuser to start PostgreSQL as 'postgres'"
    return None


class PostgresCluster:
    """``start()`` -> a running cluster; ``url(db)`` connects to database ``db``; ``new_database()`` makes a fresh
    one; ``stop()`` / ``start()`` again (same data, same socket); ``destroy()`` stops it and removes its folder."""

    def __init__(self, root: Path | None = None):
        bindir = find_bindir()
        if bindir is None:
            raise RuntimeError(unavailable_reason() or "PostgreSQL is not installed")
        self.bindir = bindir
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="structspec-pg-"))
        self.data = self.root / "data"
        self.socket_dir = self.root  # short path: a unix socket path is limited to ~107 bytes
        self.log = self.root / "postgres.log"
        self._as_postgres = os.geteuid() == 0

    def _run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / argv[0]), *argv[1:]]
        if self._as_postgres:
            cmd = ["runuser", "-u", SUPERUSER, "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)

    def _check(self, out: subprocess.CompletedProcess[str], what: str) -> None:
        if out.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{what} failed ({out.returncode}): {out.stdout}{out.stderr}{log}")

    def start(self) -> "PostgresCluster":
        if not self.data.exists():
            if self._as_postgres:
                shutil.chown(self.root, SUPERUSER)
            self._check(self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "-A", "trust", "--no-sync",
                                  "-E", "UTF8", "--locale", "C"), "initdb")
        options = (f"-k {self.socket_dir} -c listen_addresses= -c fsync=off -c synchronous_commit=off "
                   "-c full_page_writes=off -c max_connections=200")
        self._check(self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o", options,
                              "start"), "pg_ctl start")
        return self

    def stop(self) -> None:
        """Stop the server (fast: open sessions are disconnected); the data stays for ``start``."""
        if self.running():
            self._check(self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop"),
                        "pg_ctl stop")

    def running(self) -> bool:
        return self.data.exists() and self._run("pg_ctl", "-D", str(self.data), "status").returncode == 0

    def destroy(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@/{database}?host={self.socket_dir}"

    def new_database(self, prefix: str = "t") -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)
