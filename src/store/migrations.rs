//! Schema migrations, applied in order; `PRAGMA user_version` records how far a store has come.
//!
//! Never edit a migration that has shipped: add the next one.

/// Every migration, the n-th bringing the schema to version n+1.
pub const MIGRATIONS: &[&str] = &[
    // 1: runs, content-addressed outputs, results, verdicts, alerts.
    r#"
    CREATE TABLE runs (
        id              INTEGER PRIMARY KEY,
        started_at      TEXT    NOT NULL,
        finished_at     TEXT,
        status          TEXT    NOT NULL CHECK (status IN ('running', 'finished', 'interrupted')),
        prompt_set_hash TEXT    NOT NULL,
        samples         INTEGER NOT NULL,
        lanes           TEXT    NOT NULL,  -- JSON list of the lanes measured
        exit_code       INTEGER,
        pid             INTEGER
    );

    -- Each distinct output text once, keyed by its SHA-256: a year of nightly runs whose answers
    -- mostly repeat stays small.
    CREATE TABLE outputs (
        hash  TEXT PRIMARY KEY,
        text  TEXT NOT NULL
    ) WITHOUT ROWID;

    CREATE TABLE results (
        id                INTEGER PRIMARY KEY,
        run_id            INTEGER NOT NULL REFERENCES runs(id),
        lane              TEXT    NOT NULL,
        prompt_id         TEXT    NOT NULL,
        prompt_hash       TEXT    NOT NULL,
        sample            INTEGER NOT NULL,
        outcome           TEXT    NOT NULL,
        output_hash       TEXT    REFERENCES outputs(hash),
        model             TEXT,
        fingerprint       TEXT,
        finish_reason     TEXT,
        prompt_tokens     INTEGER,
        completion_tokens INTEGER,
        queue_ms          INTEGER NOT NULL,
        call_ms           INTEGER NOT NULL,
        error             TEXT,
        created_at        TEXT    NOT NULL,
        UNIQUE (run_id, lane, prompt_id, sample)
    );
    CREATE INDEX results_by_lane_prompt ON results (lane, prompt_id, run_id);

    CREATE TABLE verdicts (
        run_id      INTEGER NOT NULL REFERENCES runs(id),
        lane        TEXT    NOT NULL,
        prompt_id   TEXT    NOT NULL,
        verdict     TEXT    NOT NULL,
        similarity  REAL,
        review      INTEGER NOT NULL DEFAULT 0,
        reasons     TEXT    NOT NULL,  -- JSON list of strings
        PRIMARY KEY (run_id, lane, prompt_id)
    ) WITHOUT ROWID;

    CREATE TABLE lane_verdicts (
        run_id   INTEGER NOT NULL REFERENCES runs(id),
        lane     TEXT    NOT NULL,
        verdict  TEXT    NOT NULL,
        reasons  TEXT    NOT NULL,
        PRIMARY KEY (run_id, lane)
    ) WITHOUT ROWID;

    -- One row per alert and channel. An alert is stored before it is sent, and stays `pending`
    -- with its last error until a delivery succeeds: a failed send never loses it.
    CREATE TABLE alerts (
        id          INTEGER PRIMARY KEY,
        run_id      INTEGER NOT NULL REFERENCES runs(id),
        lane        TEXT    NOT NULL,
        kind        TEXT    NOT NULL CHECK (kind IN ('drift', 'recovered')),
        signature   TEXT    NOT NULL,  -- what drifted; the same drift is not re-sent early
        channel     TEXT    NOT NULL,
        status      TEXT    NOT NULL CHECK (status IN ('pending', 'sent')),
        subject     TEXT    NOT NULL,
        body_text   TEXT    NOT NULL,
        body_html   TEXT    NOT NULL,
        error       TEXT,
        attempts    INTEGER NOT NULL DEFAULT 0,
        created_at  TEXT    NOT NULL,
        sent_at     TEXT
    );
    CREATE INDEX alerts_by_lane ON alerts (lane, id);
    "#,
    // 2: how each item was judged and the two-sample test's p-values, so history can show a
    // lane's p-value run by run.
    r#"
    ALTER TABLE verdicts ADD COLUMN mode TEXT;
    ALTER TABLE verdicts ADD COLUMN p_value REAL;
    ALTER TABLE lane_verdicts ADD COLUMN p_value REAL;
    CREATE INDEX lane_verdicts_by_lane ON lane_verdicts (lane, run_id);
    "#,
];
