"""Database engine and schema migrations (Alembic, configured in code: no alembic.ini needed).

Every engine made here turns a lost or refused connection (the driver's OperationalError or
InterfaceError, on connect or mid-query; SQLite's "database is locked" past its busy timeout) into
`DatabaseUnavailable` (the API answers 503 with Retry-After), and a full disk on the database's side
into `StorageFull`, in one `handle_error` hook, so no caller catches SQLAlchemy's own errors.

A SQLite file is checked before it is used (`check_sqlite_file`, under the migration lock, so a file
another process is creating right now is never judged half-made): SQLite itself takes a zero-length
file, or any missing one, for a new empty database, so a truncated or misnamed catalog would silently
start over empty. Only a missing file becomes a new catalog; a zero-length file, a file that is not
SQLite, one holding another application's tables, or a schema revision this version does not know is
refused with one line (`DatabaseRefused`).
"""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import InterfaceError, OperationalError

from indexer.config import StorageSettings
from indexer.errors import DatabaseRefused, DatabaseUnavailable, StorageFull
from indexer.storage.sql.lock_order import pool_options
from retrieval.regular_file import UnusableFile, open_regular

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parents[3] / "migrations"  # the repository root's migrations/
MIGRATION_LOCK_KEY = 0x636E636C6970  # "cnclip": the PostgreSQL advisory lock migrations take


_DISK_FULL_SQLSTATE = "53100"  # PostgreSQL's disk_full
# SQLite reports SQL it cannot run ("no such column": a bug, a 500) as an OperationalError too.
_SQLITE_BUGS = {"SQLITE_ERROR"}


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())  # psycopg's messages span lines; a CLI error is one


def _domain_error(context: ExceptionContext) -> None:
    """`handle_error` hook: raise the project's error in place of the driver's (chained to it)."""
    original = context.original_exception
    if getattr(original, "sqlite_errorname", None) == "SQLITE_FULL" or (
        getattr(original, "sqlstate", None) == _DISK_FULL_SQLSTATE
    ):
        raise StorageFull(f"the database's disk is full: {_one_line(original)}") from context.sqlalchemy_exception
    if getattr(original, "sqlite_errorname", None) in _SQLITE_BUGS:
        return
    if context.is_disconnect or isinstance(context.sqlalchemy_exception, (OperationalError, InterfaceError)):
        engine = context.engine or (context.connection.engine if context.connection is not None else None)
        where = f" at {engine.url!r}" if engine is not None else ""  # repr hides the password
        raise DatabaseUnavailable(
            f"cannot reach the database{where}: {_one_line(original)}"
        ) from context.sqlalchemy_exception


SQLITE_HEADER = b"SQLite format 3\x00"
_FIX = "point CNCLIP_DATABASE_URL at the catalog, or at a path that does not exist yet to start a new one"


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL: readers never block the writer and a killed writer loses only its open transaction.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


def create_db_engine(url: str, pool_size: int | None = None) -> Engine:
    """An engine for `url`; SQLite files get WAL and foreign keys, their folder is created. Its pool
    holds `pool_size` connections (indexer/storage/sql/lock_order.py: the order locks are taken in, and why a
    pool that runs dry is a 503)."""
    pool = pool_options(url, pool_size)
    if url.startswith("sqlite"):
        path = url.split(":///", 1)[-1]
        if path and path != ":memory:":
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise DatabaseRefused(
                    f"the database file {path} cannot be used ({exc.strerror or exc}): {_FIX}"
                ) from None
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 10}, **pool)
        event.listen(engine, "connect", _sqlite_pragmas)
    else:
        engine = create_engine(url, pool_pre_ping=True, **pool)
    event.listen(engine, "handle_error", _domain_error)
    return engine


def alembic_config(url: str) -> Config:
    """Alembic configured for our migrations folder and `url` (env.py reads it from here)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(engine: Engine, revision: str = "head") -> str | None:
    """Bring the schema to `revision` on `engine`'s database; returns the revision now current."""
    return _migrate(engine, command.upgrade, revision)


def downgrade(engine: Engine, revision: str) -> str | None:
    """Take the schema back to `revision` (tests; a release never needs it)."""
    return _migrate(engine, command.downgrade, revision)


def sqlite_file(engine: Engine) -> Path | None:
    """The file of a SQLite engine; None for other databases and in-memory SQLite."""
    database = engine.url.database
    if engine.dialect.name != "sqlite" or not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


def _known_revisions() -> set[str]:
    return {script.revision for script in ScriptDirectory.from_config(alembic_config("sqlite://")).walk_revisions()}


def check_sqlite_file(path: Path) -> None:
    """`DatabaseRefused` unless `path` is missing (a new catalog) or a cnclip catalog (see the
    module docstring). Reads the file only; call with the migration lock held."""
    try:  # a regular file only: a FIFO or a device named as the catalog must not hang the check
        with os.fdopen(open_regular(path), "rb") as f:
            head = f.read(len(SQLITE_HEADER)) or b""  # None: nothing to read without waiting
    except UnusableFile as exc:
        if exc.missing:
            return
        raise DatabaseRefused(f"the database file {exc.message}: {_FIX}") from None
    except OSError as exc:  # a regular file that fails to read: a link to /proc/self/mem (EIO), a bad disk
        raise DatabaseRefused(f"the database file {path} cannot be read ({exc.strerror or exc}): {_FIX}") from None
    if not head:
        raise DatabaseRefused(f"the database file {path} is empty (0 bytes), not a cnclip catalog: {_FIX}")
    if head != SQLITE_HEADER:
        raise DatabaseRefused(f"the database file {path} is not a SQLite database: {_FIX}")
    try:
        connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            versions = (
                {row[0] for row in connection.execute("SELECT version_num FROM alembic_version")}
                if "alembic_version" in tables
                else set()
            )
        finally:
            connection.close()
    except sqlite3.Error as exc:
        raise DatabaseRefused(f"the database file {path} cannot be read as SQLite ({exc}): {_FIX}") from exc
    foreign = sorted(tables - {"alembic_version"} - {name for name in tables if name.startswith("sqlite_")})
    if foreign and "alembic_version" not in tables:
        shown = ", ".join(foreign[:5])
        raise DatabaseRefused(f"the database file {path} holds another application's tables ({shown}): {_FIX}")
    unknown = versions - _known_revisions()
    if unknown:
        raise DatabaseRefused(
            f"the database file {path} has schema revision {sorted(unknown)[0]!r}, which this version of cnclip "
            f"does not know (a newer cnclip, or another application's Alembic): {_FIX}"
        )


@contextmanager
def _sqlite_checked(engine: Engine) -> Iterator[None]:
    """For a SQLite file: hold the lock beside it (one process at a time migrates: two `cnclip index`
    started together on a new database would both create the tables) and check the file first."""
    path = sqlite_file(engine)
    if path is None:
        yield
        return
    try:  # the folder and the lock beside the file: a name too long, a folder in /proc, a link to nothing
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(f"{path}.migrate.lock", "a+b")  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        raise DatabaseRefused(f"the database file {path} cannot be used ({exc.strerror or exc}): {_FIX}") from None
    with lock as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            check_sqlite_file(path)
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


@contextmanager
def _one_migrator(engine: Engine, connection: Connection) -> Iterator[None]:
    """One process at a time migrates a PostgreSQL database: an advisory lock (SQLite files take
    `_sqlite_checked`'s file lock before connecting)."""
    if engine.dialect.name != "postgresql":
        yield
        return
    connection.exec_driver_sql(f"SELECT pg_advisory_lock({MIGRATION_LOCK_KEY})")
    connection.commit()
    try:
        yield
    finally:
        connection.exec_driver_sql(f"SELECT pg_advisory_unlock({MIGRATION_LOCK_KEY})")
        connection.commit()


def check_database(url: str) -> None:
    """`DatabaseRefused` when `url` names a SQLite file that is not a cnclip catalog (for commands
    that want one clear line before they start, like `cnclip serve`)."""
    engine = create_db_engine(url)
    try:
        with _sqlite_checked(engine):
            pass
    finally:
        engine.dispose()


def _migrate(engine: Engine, step: Any, revision: str) -> str | None:
    config = alembic_config(engine.url.render_as_string(hide_password=False))
    sqlite = engine.dialect.name == "sqlite"
    try:
        with _sqlite_checked(engine), engine.connect() as connection, _one_migrator(engine, connection):
            if sqlite:
                # SQLite changes a table by copying it; with foreign keys on, dropping the old copy would
                # cascade to every row that points at it. Off outside the transaction, checked after.
                connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
                connection.commit()  # ends SQLAlchemy's autobegun transaction (sqlite3 began none)
            try:
                with connection.begin():
                    config.attributes["connection"] = connection
                    step(config, revision)
                broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall() if sqlite else []
            finally:
                if sqlite:
                    connection.exec_driver_sql("PRAGMA foreign_keys=ON")
                    connection.commit()
            if broken:
                raise DatabaseUnavailable(f"the migration left {len(broken)} broken references: {broken[:3]}")
        return current_revision(engine)
    except OperationalError as exc:
        raise DatabaseUnavailable(f"cannot reach the database at {engine.url!r}: {exc.orig}") from exc


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def upgrade_settings_db(settings: StorageSettings) -> str | None:
    """`cnclip db upgrade`: migrate the configured database to the newest schema."""
    engine = create_db_engine(settings.sqlalchemy_url)
    try:
        return upgrade(engine)
    finally:
        engine.dispose()
