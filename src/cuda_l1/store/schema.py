"""The history DB schema as an ordered list of migrations, and how a connection is opened.

`PRAGMA user_version` holds how many migrations a DB has had. Migrations are history: never edit
one that has shipped; append a new one. Each is applied in its own transaction together with the
version bump, so a crash mid-migration leaves the DB at the previous version, not half-migrated.
A migration step is an SQL statement, or a function of the connection (migrations.py) for what SQL
alone cannot compute, such as a hash.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Callable

from cuda_l1.errors import UserError
from cuda_l1.store.migrations import v2_exact_candidate_ids

BUSY_TIMEOUT_MS = 30_000  # another process (a report, a backup) may hold the lock briefly

# Status values as of the first schema; spelled out because a migration must not change with the code.
_V1_STATUSES = "'ok','incorrect','rejected','compile_error','runtime_error','timeout','parse_error'"

_STALE_WRITER = ("a candidate id of the old form: this store was migrated to exact candidate ids "
                 "(schema 2) by a newer cuda-l1; upgrade this process")

# A migration step: an SQL statement, or a function of the connection (in migrations.py).
Step = str | Callable[[sqlite3.Connection], None]

MIGRATIONS: list[list[Step]] = [
    # 1: runs, tasks, candidates, verdicts, prompts, completions, reference timings.
    [
        """CREATE TABLE runs (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            created_at REAL NOT NULL,
            config TEXT NOT NULL DEFAULT '{}',   -- JSON
            notes TEXT NOT NULL DEFAULT ''
        )""",
        """CREATE TABLE tasks (
            id TEXT PRIMARY KEY,                 -- Task.id: hash of the normalised reference source
            name TEXT NOT NULL,
            level INTEGER NOT NULL,
            number INTEGER,                      -- KernelBench problem number when known
            source TEXT NOT NULL,
            origin TEXT NOT NULL DEFAULT '',
            description TEXT NOT NULL DEFAULT '',
            created_at REAL NOT NULL
        )""",
        # The same code can be a candidate for two tasks (tasks that share a Model but not their
        # inputs), so a candidate is identified by (task_id, id).
        """CREATE TABLE candidates (
            task_id TEXT NOT NULL REFERENCES tasks(id),
            id TEXT NOT NULL,                    -- content hash of the exact code
            code TEXT NOT NULL,
            norm_hash TEXT NOT NULL,             -- hash of the normalised code
            origin TEXT NOT NULL DEFAULT '{}',   -- JSON: kind, strategy, model, prompt_id, parent_ids
            run_id INTEGER REFERENCES runs(id),  -- the run that first produced it
            created_at REAL NOT NULL,
            PRIMARY KEY (task_id, id)
        )""",
        "CREATE INDEX candidates_by_norm ON candidates(task_id, norm_hash)",
        "CREATE INDEX candidates_by_id ON candidates(id)",
        # Every run that produced a candidate, including runs that met it again (for resume).
        """CREATE TABLE run_candidates (
            run_id INTEGER NOT NULL REFERENCES runs(id),
            task_id TEXT NOT NULL,
            candidate_id TEXT NOT NULL,
            seq INTEGER NOT NULL,                -- order in which the run met its candidates
            PRIMARY KEY (run_id, task_id, candidate_id),
            FOREIGN KEY (task_id, candidate_id) REFERENCES candidates(task_id, id)
        )""",
        f"""CREATE TABLE verdicts (
            id INTEGER PRIMARY KEY,
            task_id TEXT NOT NULL,
            candidate_id TEXT NOT NULL,
            run_id INTEGER REFERENCES runs(id),
            device TEXT NOT NULL,
            config_key TEXT NOT NULL DEFAULT '', -- identifies the evaluation settings
            status TEXT NOT NULL CHECK (status IN ({_V1_STATUSES})),
            speedup REAL,
            raw_speedup REAL,
            reference_ms REAL,
            candidate_ms REAL,
            ci_low REAL,
            ci_high REAL,
            verdict TEXT NOT NULL,               -- Verdict.to_json()
            created_at REAL NOT NULL,
            FOREIGN KEY (task_id, candidate_id) REFERENCES candidates(task_id, id),
            UNIQUE (task_id, candidate_id, device, config_key)
        )""",
        "CREATE INDEX verdicts_by_task ON verdicts(task_id, device, status)",
        "CREATE INDEX verdicts_by_run ON verdicts(run_id)",
        """CREATE TABLE prompts (
            id INTEGER PRIMARY KEY,
            run_id INTEGER REFERENCES runs(id),
            task_id TEXT NOT NULL REFERENCES tasks(id),
            messages TEXT NOT NULL,              -- JSON list of chat messages
            exemplar_ids TEXT NOT NULL DEFAULT '[]',
            created_at REAL NOT NULL
        )""",
        "CREATE INDEX prompts_by_task ON prompts(task_id)",
        """CREATE TABLE completions (
            id INTEGER PRIMARY KEY,
            prompt_id INTEGER NOT NULL REFERENCES prompts(id),
            task_id TEXT NOT NULL,               -- the prompt's task; lets candidate_id be a real key
            endpoint TEXT NOT NULL DEFAULT '',
            model TEXT NOT NULL DEFAULT '',
            text TEXT NOT NULL,
            prompt_tokens INTEGER,
            completion_tokens INTEGER,
            latency_s REAL,
            cost REAL,
            finish_reason TEXT,
            parse_status TEXT NOT NULL CHECK (parse_status IN ('ok','parse_error')),
            parse_message TEXT NOT NULL DEFAULT '',
            candidate_id TEXT,
            created_at REAL NOT NULL,
            FOREIGN KEY (task_id, candidate_id) REFERENCES candidates(task_id, id)
        )""",
        "CREATE INDEX completions_by_prompt ON completions(prompt_id)",
        "CREATE INDEX completions_by_task ON completions(task_id, parse_status)",
        """CREATE TABLE reference_timings (
            task_id TEXT NOT NULL REFERENCES tasks(id),
            device TEXT NOT NULL,
            versions_key TEXT NOT NULL,          -- changes when torch/CUDA/driver versions change
            stats TEXT NOT NULL,                 -- JSON
            created_at REAL NOT NULL,
            PRIMARY KEY (task_id, device, versions_key)
        )""",
    ],
    # 2: candidate ids hash the exact code, not a normalised form. The two indexes come first: with
    # foreign keys on, every renamed candidate looks up the rows that refer to it, and without them
    # the rename scanned whole tables per candidate (65 s for 20k candidates; 4 s with them). The
    # triggers make a process still running older code fail loudly instead of writing old ids into
    # a migrated store (rows no later migration would fix).
    [
        "CREATE INDEX run_candidates_by_candidate ON run_candidates(task_id, candidate_id)",
        "CREATE INDEX completions_by_candidate ON completions(task_id, candidate_id)",
        v2_exact_candidate_ids,
        f"""CREATE TRIGGER candidates_have_exact_ids BEFORE INSERT ON candidates
            WHEN length(NEW.id) != 16 BEGIN SELECT RAISE(ABORT, '{_STALE_WRITER}'); END""",
        f"""CREATE TRIGGER verdicts_have_exact_ids BEFORE INSERT ON verdicts
            WHEN length(NEW.candidate_id) != 16 BEGIN SELECT RAISE(ABORT, '{_STALE_WRITER}'); END""",
    ],
    # 3: references that ran once as the evaluator runs them (reference_runs.check_references), per device and
    # software versions. A resumed KernelBench run ran again, at each start, every reference it had not
    # judged yet (228 on an H200 call that spent 73 s of its 358 before its first verdict). No longer
    # written: the workers run each reference once before judging its task (TaskEnv), and the caller
    # none. Kept, so that a store stays readable by the releases that wrote it.
    [
        """CREATE TABLE reference_checks (
            task_id TEXT NOT NULL REFERENCES tasks(id),
            device TEXT NOT NULL,
            versions_key TEXT NOT NULL,          -- as reference_timings: new versions check again
            checked_at REAL NOT NULL,
            PRIMARY KEY (task_id, device, versions_key)
        )""",
    ],
    # 4: the tasks a run could not judge, their reference failing there (bench and audit go on past one),
    # so that a report rebuilt from the store still names them and keeps their old verdicts out of its
    # figures, as the run's own report did.
    [
        """CREATE TABLE tasks_not_run (
            run_id INTEGER NOT NULL REFERENCES runs(id),
            task_id TEXT NOT NULL REFERENCES tasks(id),
            why TEXT NOT NULL,
            noted_at REAL NOT NULL,
            PRIMARY KEY (run_id, task_id)
        )""",
    ],
]
SCHEMA_VERSION = len(MIGRATIONS)


def connect(path: str | Path, readonly: bool = False) -> sqlite3.Connection:
    """Open a connection with the store's settings; migrate it to SCHEMA_VERSION unless read-only."""
    path = Path(path)
    try:
        if readonly:
            if not path.is_file():
                raise UserError("no such history DB.", path=str(path))
            conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False,
                                   isolation_level=None)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: the store issues BEGIN/COMMIT itself, so a commit is never implicit.
            conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA foreign_keys = ON")
        if not readonly:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise UserError(f"cannot switch the history DB to WAL mode (got {mode!r}).", path=str(path))
            # WAL with synchronous=NORMAL already keeps every committed transaction through kill -9
            # (the WAL write reaches the OS before COMMIT returns); FULL also fsyncs the WAL on each
            # commit, so a verdict reported as recorded survives power loss and VM preemption too.
            # One fsync costs milliseconds; a verdict costs seconds of GPU time. FULL it is.
            conn.execute("PRAGMA synchronous = FULL")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        raise UserError(f"not a usable SQLite history DB ({exc}).", path=str(path)) from None
    try:
        _check_version(version, path)
        if readonly:
            if version < SCHEMA_VERSION:
                raise UserError(
                    f"the history DB has schema version {version}, older than this code's {SCHEMA_VERSION}; "
                    "open it once for writing to migrate it.",
                    path=str(path),
                )
        else:
            migrate(conn, path)
    except BaseException:
        conn.close()
        raise
    return conn


def _check_version(version: int, path: Path) -> None:
    if version > SCHEMA_VERSION:
        raise UserError(
            f"the history DB has schema version {version}, newer than this code knows ({SCHEMA_VERSION}). "
            "It was written by a newer cuda-l1; upgrade cuda-l1 to open it.",
            path=str(path),
        )


def migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Apply the missing migrations, each with its version bump in one transaction."""
    while True:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:  # busy past BUSY_TIMEOUT_MS
            raise UserError(f"the history DB is locked by another process ({exc}); it may be migrating "
                            "the store: try again when it is done.", path=str(path)) from None
        try:
            # Re-read under the write lock: another process may have migrated meanwhile.
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            _check_version(version, path)
            if version == SCHEMA_VERSION:
                conn.execute("COMMIT")
                return
            for step in MIGRATIONS[version]:
                if callable(step):
                    step(conn)
                else:
                    conn.execute(step)
            conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
