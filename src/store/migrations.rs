//! Schema migrations, applied in order. A SQLite store records how far it has come in
//! `PRAGMA user_version`, a PostgreSQL store in `canary_schema`.
//!
//! Never edit a migration that has shipped: add the next one, to both lists.

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
    // 3: a compact history. What repeats from result to result (lane names, prompt ids and
    // hashes, the outcome with the model, fingerprint and finish reason it reported, verdict
    // names) is stored once and referenced by a small integer; output hashes are 32-byte blobs
    // referenced by row id; a result's time is milliseconds since its run started. A result
    // row and its verdict drop from about 320 bytes to about 65.
    r#"
    CREATE TABLE words (
        id    INTEGER PRIMARY KEY,
        word  TEXT    NOT NULL UNIQUE
    );
    CREATE TABLE prompt_versions (
        id      INTEGER PRIMARY KEY,
        prompt  INTEGER NOT NULL REFERENCES words(id),
        hash    TEXT    NOT NULL,
        UNIQUE (prompt, hash)
    );
    CREATE TABLE served_as (
        id             INTEGER PRIMARY KEY,
        outcome        TEXT    NOT NULL,
        model          TEXT,
        fingerprint    TEXT,
        finish_reason  TEXT
    );
    CREATE INDEX served_as_by_outcome ON served_as (outcome, model);
    CREATE TABLE texts (
        id    INTEGER PRIMARY KEY,
        hash  BLOB    NOT NULL UNIQUE,  -- SHA-256 of the text
        text  TEXT    NOT NULL
    );
    CREATE TABLE results_v3 (
        run_id             INTEGER NOT NULL REFERENCES runs(id),
        lane               INTEGER NOT NULL REFERENCES words(id),
        prompt             INTEGER NOT NULL REFERENCES prompt_versions(id),
        sample             INTEGER NOT NULL,
        served             INTEGER NOT NULL REFERENCES served_as(id),
        -- No foreign key: texts are removed only by a prune, and only those no result refers
        -- to; a key would make that delete scan every result once per text.
        output             INTEGER,
        prompt_tokens      INTEGER,
        completion_tokens  INTEGER,
        queue_ms           INTEGER NOT NULL,
        call_ms            INTEGER NOT NULL,
        error              TEXT,
        at_ms              INTEGER NOT NULL,  -- when it was committed, after the run's start
        PRIMARY KEY (run_id, lane, prompt, sample)
    ) WITHOUT ROWID;
    CREATE TABLE verdicts_v3 (
        run_id      INTEGER NOT NULL REFERENCES runs(id),
        lane        INTEGER NOT NULL REFERENCES words(id),
        prompt      INTEGER NOT NULL REFERENCES words(id),
        verdict     INTEGER NOT NULL REFERENCES words(id),
        similarity  REAL,
        review      INTEGER NOT NULL DEFAULT 0,
        reasons     TEXT,  -- JSON list of strings; NULL when there are none
        mode        INTEGER REFERENCES words(id),
        p_value     REAL,
        PRIMARY KEY (run_id, lane, prompt)
    ) WITHOUT ROWID;

    INSERT OR IGNORE INTO words (word)
        SELECT lane FROM results UNION SELECT prompt_id FROM results
        UNION SELECT lane FROM verdicts UNION SELECT prompt_id FROM verdicts
        UNION SELECT verdict FROM verdicts UNION SELECT mode FROM verdicts WHERE mode IS NOT NULL;
    INSERT INTO prompt_versions (prompt, hash)
        SELECT DISTINCT w.id, r.prompt_hash FROM results r JOIN words w ON w.word = r.prompt_id;
    INSERT INTO served_as (outcome, model, fingerprint, finish_reason)
        SELECT DISTINCT outcome, model, fingerprint, finish_reason FROM results;
    INSERT INTO texts (hash, text) SELECT unhex(hash), text FROM outputs;
    INSERT INTO results_v3
        SELECT r.run_id, l.id, pv.id, r.sample, s.id, t.id, r.prompt_tokens, r.completion_tokens,
               r.queue_ms, r.call_ms, r.error,
               COALESCE(MAX(0, CAST(ROUND((julianday(r.created_at) - julianday(runs.started_at)) * 86400000) AS INTEGER)), 0)
        FROM results r
        JOIN runs ON runs.id = r.run_id
        JOIN words l ON l.word = r.lane
        JOIN words p ON p.word = r.prompt_id
        JOIN prompt_versions pv ON pv.prompt = p.id AND pv.hash = r.prompt_hash
        JOIN served_as s ON s.outcome = r.outcome AND s.model IS r.model
            AND s.fingerprint IS r.fingerprint AND s.finish_reason IS r.finish_reason
        LEFT JOIN texts t ON t.hash = unhex(r.output_hash);
    INSERT INTO verdicts_v3
        SELECT v.run_id, l.id, p.id, w.id, v.similarity, v.review,
               CASE WHEN v.reasons = '[]' THEN NULL ELSE v.reasons END, m.id, v.p_value
        FROM verdicts v
        JOIN words l ON l.word = v.lane
        JOIN words p ON p.word = v.prompt_id
        JOIN words w ON w.word = v.verdict
        LEFT JOIN words m ON m.word = v.mode;
    DROP TABLE results;
    DROP TABLE outputs;
    DROP TABLE verdicts;
    ALTER TABLE results_v3 RENAME TO results;
    ALTER TABLE verdicts_v3 RENAME TO verdicts;
    "#,
    // 4: several runners. A run names its runner (host and pid) and, in a shared store, holds
    // a lease on each lane it measures; a run still `running` whose lease has lapsed is dead.
    // An alert being sent is claimed by one runner, so two never send it both.
    r#"
    ALTER TABLE runs ADD COLUMN runner TEXT;
    ALTER TABLE runs ADD COLUMN lease_until TEXT;
    ALTER TABLE runs ADD COLUMN shard TEXT;
    CREATE TABLE leases (
        lane    TEXT    PRIMARY KEY,
        run_id  INTEGER NOT NULL REFERENCES runs(id),
        runner  TEXT    NOT NULL,
        until   TEXT    NOT NULL
    );
    ALTER TABLE alerts ADD COLUMN claimed_by TEXT;
    ALTER TABLE alerts ADD COLUMN claimed_until TEXT;
    "#,
    // 5: counts and times in ms are at most 2^31 - 1, what PostgreSQL's four-byte `INTEGER`
    // holds, so a history copies into PostgreSQL as it is. Earlier versions stored a server's
    // token counts as it reported them, however large.
    r#"
    UPDATE results SET prompt_tokens = 2147483647 WHERE prompt_tokens > 2147483647;
    UPDATE results SET completion_tokens = 2147483647 WHERE completion_tokens > 2147483647;
    UPDATE results SET queue_ms = 2147483647 WHERE queue_ms > 2147483647;
    UPDATE results SET call_ms = 2147483647 WHERE call_ms > 2147483647;
    UPDATE results SET at_ms = 2147483647 WHERE at_ms > 2147483647;
    "#,
];

/// The schema version this canary writes, on both engines.
pub const KNOWN_VERSION: i64 = MIGRATIONS.len() as i64;

/// PostgreSQL's migrations, each with the version it brings a store to. The first creates the
/// schema SQLite reaches through migrations 1 to 4, column for column, so `canary store copy`
/// moves rows between the two as they are. Text that is sorted is compared byte by byte
/// (`COLLATE "C"`), as SQLite does, so both list runs, lanes and prompts in the same order.
pub const POSTGRES: &[(i64, &str)] = &[
    (
        4,
        r#"
    CREATE TABLE runs (
        id              BIGINT  GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        started_at      TEXT    COLLATE "C" NOT NULL,
        finished_at     TEXT,
        status          TEXT    NOT NULL CHECK (status IN ('running', 'finished', 'interrupted')),
        prompt_set_hash TEXT    NOT NULL,
        samples         BIGINT  NOT NULL,
        lanes           TEXT    NOT NULL,
        exit_code       BIGINT,
        pid             BIGINT,
        runner          TEXT,
        lease_until     TEXT    COLLATE "C",
        shard           TEXT
    );
    CREATE TABLE words (
        id    BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        word  TEXT   COLLATE "C" NOT NULL UNIQUE
    );
    CREATE TABLE prompt_versions (
        id      BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        prompt  BIGINT NOT NULL REFERENCES words(id),
        hash    TEXT   NOT NULL,
        UNIQUE (prompt, hash)
    );
    CREATE TABLE served_as (
        id             BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        outcome        TEXT   NOT NULL,
        model          TEXT,
        fingerprint    TEXT,
        finish_reason  TEXT
    );
    CREATE INDEX served_as_by_outcome ON served_as (outcome, model);
    CREATE TABLE texts (
        id    BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        hash  BYTEA  NOT NULL UNIQUE,
        text  TEXT   NOT NULL
    );
    CREATE TABLE results (
        run_id             BIGINT NOT NULL REFERENCES runs(id),
        lane               BIGINT NOT NULL REFERENCES words(id),
        prompt             BIGINT NOT NULL REFERENCES prompt_versions(id),
        sample             BIGINT NOT NULL,
        served             BIGINT NOT NULL REFERENCES served_as(id),
        output             BIGINT,
        prompt_tokens      BIGINT,
        completion_tokens  BIGINT,
        queue_ms           BIGINT NOT NULL,
        call_ms            BIGINT NOT NULL,
        error              TEXT,
        at_ms              BIGINT NOT NULL,
        PRIMARY KEY (run_id, lane, prompt, sample)
    );
    CREATE TABLE verdicts (
        run_id      BIGINT NOT NULL REFERENCES runs(id),
        lane        BIGINT NOT NULL REFERENCES words(id),
        prompt      BIGINT NOT NULL REFERENCES words(id),
        verdict     BIGINT NOT NULL REFERENCES words(id),
        similarity  DOUBLE PRECISION,
        review      BIGINT NOT NULL DEFAULT 0,
        reasons     TEXT,
        mode        BIGINT REFERENCES words(id),
        p_value     DOUBLE PRECISION,
        PRIMARY KEY (run_id, lane, prompt)
    );
    CREATE TABLE lane_verdicts (
        run_id   BIGINT NOT NULL REFERENCES runs(id),
        lane     TEXT   COLLATE "C" NOT NULL,
        verdict  TEXT   NOT NULL,
        reasons  TEXT   NOT NULL,
        p_value  DOUBLE PRECISION,
        PRIMARY KEY (run_id, lane)
    );
    CREATE INDEX lane_verdicts_by_lane ON lane_verdicts (lane, run_id);
    CREATE TABLE alerts (
        id             BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        run_id         BIGINT NOT NULL REFERENCES runs(id),
        lane           TEXT   COLLATE "C" NOT NULL,
        kind           TEXT   NOT NULL CHECK (kind IN ('drift', 'recovered')),
        signature      TEXT   NOT NULL,
        channel        TEXT   NOT NULL,
        status         TEXT   NOT NULL CHECK (status IN ('pending', 'sent')),
        subject        TEXT   NOT NULL,
        body_text      TEXT   NOT NULL,
        body_html      TEXT   NOT NULL,
        error          TEXT,
        attempts       BIGINT NOT NULL DEFAULT 0,
        created_at     TEXT   NOT NULL,
        sent_at        TEXT,
        claimed_by     TEXT,
        claimed_until  TEXT   COLLATE "C"
    );
    CREATE INDEX alerts_by_lane ON alerts (lane, id);
    CREATE TABLE leases (
        lane    TEXT   COLLATE "C" PRIMARY KEY,
        run_id  BIGINT NOT NULL REFERENCES runs(id),
        runner  TEXT   NOT NULL,
        until   TEXT   COLLATE "C" NOT NULL
    );
    "#,
    ),
    (
        5,
        // Four-byte integers where eight were never needed: each result and verdict row, and
        // each entry of their primary keys, is that much smaller (SQLite sizes its integers
        // itself). Ids stay below 2^31 (the tables they name hold lanes, prompts, outcomes and
        // distinct answers); counts and times in ms are held to 2^31 - 1 as SQLite's migration
        // 5 holds them. PostgreSQL rewrites both tables once.
        r#"
    ALTER TABLE results
        ALTER COLUMN run_id TYPE INTEGER, ALTER COLUMN lane TYPE INTEGER,
        ALTER COLUMN prompt TYPE INTEGER, ALTER COLUMN sample TYPE INTEGER,
        ALTER COLUMN served TYPE INTEGER, ALTER COLUMN output TYPE INTEGER,
        ALTER COLUMN prompt_tokens TYPE INTEGER USING LEAST(prompt_tokens, 2147483647),
        ALTER COLUMN completion_tokens TYPE INTEGER USING LEAST(completion_tokens, 2147483647),
        ALTER COLUMN queue_ms TYPE INTEGER USING LEAST(queue_ms, 2147483647),
        ALTER COLUMN call_ms TYPE INTEGER USING LEAST(call_ms, 2147483647),
        ALTER COLUMN at_ms TYPE INTEGER USING LEAST(at_ms, 2147483647);
    ALTER TABLE verdicts
        ALTER COLUMN run_id TYPE INTEGER, ALTER COLUMN lane TYPE INTEGER,
        ALTER COLUMN prompt TYPE INTEGER, ALTER COLUMN verdict TYPE INTEGER,
        ALTER COLUMN review TYPE SMALLINT, ALTER COLUMN mode TYPE INTEGER;
    "#,
    ),
];
