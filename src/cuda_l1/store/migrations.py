"""Migration steps that SQL alone cannot express, one function per step, in the order of MIGRATIONS.

These are history like the SQL steps in schema.py: never edit one that has shipped. Each spells out
what it computes (a hash, a JSON layout) instead of calling the code that computes it today, so that
a DB migrated next year gets what one migrated now got. Each runs inside the transaction of its
schema version (schema.migrate), so a failure leaves the DB at the previous version.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3


def _v2_code_id(code: str) -> str:
    """The candidate id from schema 2 on: 16 hex digits of the SHA-256 of the exact code (as
    `tasks.code_id` computes it when this migration was written)."""
    return hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()[:16]


# Every (task_id, candidate id) column of schema 1: the candidates' key and the three tables naming it.
_V2_CANDIDATE_KEYS = (("candidates", "id"), ("run_candidates", "candidate_id"), ("verdicts", "candidate_id"),
                      ("completions", "candidate_id"))


def v2_exact_candidate_ids(conn: sqlite3.Connection) -> None:
    """Give every candidate the id of its exact code and rewrite every reference to it.

    Schema 1 ids hashed a normalised form (line ends, trailing whitespace), so a program and a
    whitespace twin that does not even compile could share an id and a verdict. Each (task, old id)
    names one row, so each gets one new id; a new id (16 digits) never equals an old one (12), so
    no row is ever renamed onto another. References are checked at commit, once all agree.
    """
    conn.execute("PRAGMA defer_foreign_keys = ON")  # parent and child keys change in separate statements
    renamed = _v2_id_map(conn)
    if not renamed:
        return
    # A keyed table to join on: one UPDATE per table, not one table scan per candidate.
    conn.execute("CREATE TEMP TABLE v2_ids (task_id TEXT, old_id TEXT, new_id TEXT,"
                 " PRIMARY KEY (task_id, old_id))")
    conn.executemany("INSERT INTO temp.v2_ids VALUES (?, ?, ?)", [(t, o, n) for (t, o), n in renamed.items()])
    _v2_rewrite_verdict_json(conn)  # joins on the old ids: before the verdicts' own column changes
    for table, column in _V2_CANDIDATE_KEYS:
        match = f"m.task_id = {table}.task_id AND m.old_id = {table}.{column}"
        conn.execute(f"""UPDATE {table} SET {column} = (SELECT m.new_id FROM temp.v2_ids m WHERE {match})
                         WHERE EXISTS (SELECT 1 FROM temp.v2_ids m WHERE {match})""")
    _v2_rewrite_id_lists(conn, renamed)
    conn.execute("DROP TABLE temp.v2_ids")


def _v2_id_map(conn: sqlite3.Connection) -> dict[tuple[str, str], str]:
    """(task id, old id) -> new id, for every candidate whose id changes (none on a second run)."""
    renamed = {}
    for task_id, old, code in conn.execute("SELECT task_id, id, code FROM candidates"):
        new = _v2_code_id(code)
        if new != old:
            renamed[(task_id, old)] = new
    return renamed


def _v2_rewrite_verdict_json(conn: sqlite3.Connection) -> None:
    """A stored verdict names its candidate inside its JSON too (verdict_for returns that JSON)."""
    targets = conn.execute(
        """SELECT v.id, m.new_id FROM verdicts v JOIN temp.v2_ids m
           ON m.task_id = v.task_id AND m.old_id = v.candidate_id"""
    ).fetchall()
    for verdict_id, new in targets:  # one row at a time: a verdict's JSON (log, timing) can be large
        text = conn.execute("SELECT verdict FROM verdicts WHERE id = ?", (verdict_id,)).fetchone()[0]
        try:
            data = json.loads(text)
        except (TypeError, ValueError):
            continue  # unreadable before the migration: left as it was, never dropped
        if isinstance(data, dict):
            data["candidate_id"] = new  # json.dumps's defaults: the layout Verdict.to_json writes
            conn.execute("UPDATE verdicts SET verdict = ? WHERE id = ?", (json.dumps(data), verdict_id))


def _v2_rewrite_id_lists(conn: sqlite3.Connection, renamed: dict[tuple[str, str], str]) -> None:
    """Candidate ids inside JSON: a prompt's exemplar_ids and a candidate's origin.parent_ids (the
    exemplars its prompt showed). Both name candidates of the row's own task; an id that names no
    candidate of it is kept as it is."""
    def mapped(task_id: str, ids) -> list | None:
        if not isinstance(ids, list):
            return None
        new = [renamed.get((task_id, i), i) if isinstance(i, str) else i for i in ids]
        return new if new != ids else None

    for prompt_id, task_id, text in conn.execute("SELECT id, task_id, exemplar_ids FROM prompts").fetchall():
        ids = mapped(task_id, _v2_json(text))
        if ids is not None:
            conn.execute("UPDATE prompts SET exemplar_ids = ? WHERE id = ?", (json.dumps(ids), prompt_id))
    rows = conn.execute("SELECT rowid, task_id, origin FROM candidates WHERE origin LIKE '%parent_ids%'").fetchall()
    for rowid, task_id, text in rows:
        origin = _v2_json(text)
        ids = mapped(task_id, origin.get("parent_ids")) if isinstance(origin, dict) else None
        if ids is not None:
            origin["parent_ids"] = ids
            text = json.dumps(origin, sort_keys=True)  # the layout Origin.to_json writes
            conn.execute("UPDATE candidates SET origin = ? WHERE rowid = ?", (text, rowid))


def _v2_json(text):
    """Parsed JSON, or None where a row holds none (nothing unreadable is rewritten)."""
    try:
        return json.loads(text) if text else None
    except (TypeError, ValueError):
        return None
