"""Start and stop a real, throwaway PostgreSQL server (Debian's ``postgresql`` package) for
tests and benchmarks: ``initdb`` into a scratch directory, listen on 127.0.0.1 at a free port,
trust authentication, one database. ``stop()`` shuts it down and removes the directory.

PostgreSQL refuses to run as root; as root the server runs as the ``postgres`` user the
package creates. ``scripts/postgres-host.sh`` installs the package where it is missing.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from servewitness.testing.vllm_server import free_port


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries on this machine (run scripts/postgres-host.sh)."""


def pg_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise PostgresUnavailable(
            "no PostgreSQL server here (/usr/lib/postgresql/*/bin/initdb): "
            "run scripts/postgres-host.sh"
        )
    return Path(found[-1]).parent


@dataclass
class PostgresServer:
    scratch_parent: Path | None = None
    dbname: str = "verifier"
    port: int = 0
    dir: Path | None = None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{self.dbname}"

    def _as_owner(self) -> tuple[list[str], int | None, int | None]:
        if os.geteuid() != 0:
            return [], None, None
        pw = pwd.getpwnam("postgres")
        return ["runuser", "-u", "postgres", "--"], pw.pw_uid, pw.pw_gid

    def start(self) -> PostgresServer:
        bindir = pg_bin()
        parent = self.scratch_parent
        if parent is not None:
            parent.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix="pg-", dir=parent))
        prefix, uid, gid = self._as_owner()
        if uid is not None and gid is not None:
            os.chown(self.dir, uid, gid)  # SCRATCH_PARENT must be traversable by postgres
        data = self.dir / "data"
        run = [*prefix]
        subprocess.run(
            [*run, str(bindir / "initdb"), "-D", str(data), "-U", "postgres",
             "--auth=trust", "--no-sync", "-E", "UTF8"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        self.port = free_port()
        opts = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} -c fsync=on"
        subprocess.run(
            [*run, str(bindir / "pg_ctl"), "-D", str(data), "-o", opts,
             "-l", str(self.dir / "log"), "-w", "-t", "60", "start"],
            check=True, capture_output=True, timeout=90,
        )  # fmt: skip
        subprocess.run(
            [*run, str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
             "-U", "postgres", self.dbname],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        return self

    def createdb(self, name: str) -> str:
        """A fresh database on this server; its URL."""
        prefix, _, _ = self._as_owner()
        subprocess.run(
            [*prefix, str(pg_bin() / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
             "-U", "postgres", name],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def psql(self, sql: str, dbname: str | None = None) -> str:
        """Run SQL with psql as the superuser (tests use it to tamper behind the verifier)."""
        prefix, _, _ = self._as_owner()
        out = subprocess.run(
            [*prefix, str(pg_bin() / "psql"), "-h", "127.0.0.1", "-p", str(self.port),
             "-U", "postgres", "-d", dbname or self.dbname, "-v", "ON_ERROR_STOP=1",
             "-At", "-c", sql],
            check=True, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        return out.stdout

    def restart(self) -> None:
        """Restart the server in place (fast shutdown: every client connection is dropped)."""
        if self.dir is None:
            raise RuntimeError("the server is not running")
        prefix, _, _ = self._as_owner()
        opts = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} -c fsync=on"
        subprocess.run(
            [*prefix, str(pg_bin() / "pg_ctl"), "-D", str(self.dir / "data"), "-o", opts,
             "-l", str(self.dir / "log"), "-m", "fast", "-w", "-t", "60", "restart"],
            check=True, capture_output=True, timeout=90,
        )  # fmt: skip

    def stop(self) -> None:
        if self.dir is None:
            return
        prefix, _, _ = self._as_owner()
        with contextlib.suppress(subprocess.SubprocessError, PostgresUnavailable):
            subprocess.run(
                [*prefix, str(pg_bin() / "pg_ctl"), "-D", str(self.dir / "data"),
                 "-m", "immediate", "-w", "-t", "30", "stop"],
                check=False, capture_output=True, timeout=60,
            )  # fmt: skip
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (self.dir / "data" / "postmaster.pid").exists():
            time.sleep(0.1)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
