//! `year`: a year of nightly history, and what it costs to keep and to read.
//!
//! Run 1 goes through the real `canary run` against an instant loopback lane and is accepted as
//! the baselines. The nights after it are written through the store's own API, the same rows
//! `run` writes: most answers repeat the baseline; from mid-year the free lane drifts on a few
//! prompts, with wordings that come back month after month; a few calls time out. The last
//! night is committed one result per transaction, exactly as `run` commits, and timed. Then
//! `diff`, `history`, `history --prompt` and `report` are timed as a user runs them, and
//! `prune` shows what retention takes back.
//!
//! `year --store postgres` does the same on PostgreSQL: a server of this part's own, started by
//! `scripts/postgres` on this machine with its durability settings (fsync on), holds the store
//! in its `canary` database, reached over loopback TCP. Its section has its own title.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use canary::store::{LaneVerdictRow, NewResult, Store, StoreLocation, StoredResult, VerdictRow};
use hdrhistogram::Histogram;

use crate::support::{Reply, TestServer, prompt_of};

const LANES: [&str; 3] = ["free", "paid", "backup"];

struct Size {
    runs: usize,
    prompts: usize,
}

/// Where the year is stored.
enum Engine {
    /// The project's SQLite file.
    Sqlite(PathBuf),
    /// The `canary` database of a server this part started, with its data under `dir`.
    Postgres {
        dir: PathBuf,
        url: String,
        version: String,
    },
}

pub fn main(smoke: bool, args: &[&str]) -> anyhow::Result<()> {
    let store = match args {
        [] => "sqlite",
        ["--store", store] => store,
        [arg] if arg.starts_with("--store=") => &arg["--store=".len()..],
        _ => bail!("year takes no argument but --store sqlite|postgres, found {args:?}"),
    };
    let postgres = match store {
        "sqlite" => false,
        "postgres" => true,
        other => bail!("--store takes sqlite or postgres, found `{other}`"),
    };
    let size = if smoke {
        Size {
            runs: 12,
            prompts: 50,
        }
    } else {
        Size {
            runs: 365,
            prompts: 1000,
        }
    };
    let dir = tempfile::tempdir()?;
    let project = dir.path();
    let engine = if postgres {
        eprintln!("year: starting a PostgreSQL server (scripts/postgres, fsync on)");
        let server_dir = project.join("postgres");
        let url = crate::stores::start_server(&server_dir, false);
        let version = pg(&url, |client| {
            Ok(client
                .query_one("SHOW server_version", &[])?
                .get::<_, String>(0))
        })?;
        Engine::Postgres {
            dir: server_dir,
            url,
            version,
        }
    } else {
        Engine::Sqlite(project.join(".canary/canary.db"))
    };
    let result = year(size, project, &engine);
    if let Engine::Postgres { dir, .. } = &engine {
        // Its watchdog would stop it once this process ends; no need to wait for that.
        let _ = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/postgres"))
            .arg("stop")
            .arg(dir)
            .stdout(std::process::Stdio::null())
            .status();
    }
    result
}

fn year(size: Size, project: &Path, engine: &Engine) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    let server = runtime.block_on(TestServer::start(|_, seen| {
        Reply::completion(&answer(&prompt_of(seen)), "bench-model")
    }));
    let store_line = match engine {
        Engine::Sqlite(_) => ".canary/canary.db",
        Engine::Postgres { url, .. } => url.as_str(),
    };
    write_project(project, &server.base_url(), size.prompts, store_line)?;
    let canary = |args: &[&str]| -> anyhow::Result<(Duration, std::process::Output)> {
        let started = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_canary"))
            .arg("-c")
            .arg(project.join("canary.yaml"))
            .args(args)
            .env("CANARY_LOG", "warn")
            .output()?;
        let took = started.elapsed();
        if out.status.code().is_none_or(|c| c >= 2) {
            bail!(
                "canary {args:?} exited {:?}: {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok((took, out))
    };

    eprintln!(
        "year: run 1 through `canary run`: {} prompts × {} lanes",
        size.prompts,
        LANES.len()
    );
    let (first_run, _) = canary(&["run", "--samples", "1", "--no-alert"])?;
    canary(&["accept"])?;

    let location = match engine {
        Engine::Sqlite(path) => StoreLocation::Sqlite(path.clone()),
        Engine::Postgres { url, .. } => {
            StoreLocation::parse(url, project).map_err(|e| anyhow!(e))?
        }
    };
    let mut store = Store::open(location)?;
    let baseline = store.results(1)?;
    let set_hash = store.run(Some(1))?.prompt_set_hash;
    let lanes: Vec<String> = LANES.iter().map(|l| l.to_string()).collect();
    let generated = Instant::now();
    for night in 2..size.runs {
        let run = store.begin_run(&set_hash, 1, &lanes)?;
        let (results, verdicts, lane_verdicts) = night_of(&baseline, night, size.runs, run);
        let rows: Vec<NewResult<'_>> = results.iter().map(Night::as_new).collect();
        store.insert_results(run, &rows)?;
        store.finish_run(run, &verdicts, &lane_verdicts, exit_of(&lane_verdicts))?;
        if night % 25 == 0 {
            eprintln!("year: night {night} of {}", size.runs);
        }
    }
    let generation = generated.elapsed();

    // The last night, committed as `run` commits: one transaction per result as it arrives.
    let run = store.begin_run(&set_hash, 1, &lanes)?;
    let (results, verdicts, lane_verdicts) = night_of(&baseline, size.runs, size.runs, run);
    let mut commit = Histogram::<u64>::new(3)?;
    for result in &results {
        let started = Instant::now();
        store.insert_result(run, &result.as_new())?;
        commit.record(started.elapsed().as_micros() as u64)?;
    }
    store.finish_run(run, &verdicts, &lane_verdicts, exit_of(&lane_verdicts))?;
    match engine {
        Engine::Sqlite(path) => date_runs(path, size.runs)?,
        Engine::Postgres { url, .. } => date_runs_pg(url, size.runs)?,
    }
    let (results_count, texts_count) = store.counts()?;
    drop(store);

    let (tables, file, database) = match engine {
        Engine::Sqlite(path) => {
            let tables = table_bytes(path)?
                .into_iter()
                .map(|(name, bytes)| {
                    let of_answers = name == "texts" || name == "sqlite_autoindex_texts_1";
                    (name, bytes, of_answers)
                })
                .collect::<Vec<_>>();
            (tables, file_bytes(path), 0)
        }
        Engine::Postgres { url, .. } => {
            let tables = table_bytes_pg(url)?;
            let total = tables.iter().map(|(_, bytes, _)| bytes).sum();
            (tables, total, database_bytes_pg(url)?)
        }
    };
    let answers: u64 = tables
        .iter()
        .filter(|(_, _, of_answers)| *of_answers)
        .map(|(_, bytes, _)| bytes)
        .sum();
    let per_result = (file - answers) as f64 / results_count as f64;

    eprintln!("year: timing diff, history, report");
    let report_file = project.join("report.html");
    let report_arg = report_file.to_string_lossy().into_owned();
    let timed = [
        ("`canary diff` (latest run)", vec!["diff"]),
        ("`canary history`", vec!["history"]),
        (
            "`canary history --prompt p-0001`",
            vec!["history", "--prompt", "p-0001"],
        ),
        ("`canary report -o FILE`", vec!["report", "-o", &report_arg]),
    ];
    let mut command_rows = Vec::new();
    for (name, args) in &timed {
        let mut times = Vec::new();
        for _ in 0..5 {
            times.push(canary(args)?.0);
        }
        times.sort();
        command_rows.push((*name, times[2], times[4]));
    }

    eprintln!("year: prune");
    let before_prune = match engine {
        Engine::Sqlite(path) => file_bytes(path),
        Engine::Postgres { url, .. } => table_bytes_pg(url)?.iter().map(|(_, b, _)| b).sum(),
    };
    let (prune_time, prune_out) = canary(&["prune", "--keep", "180d", "--format", "json"])?;
    let pruned: serde_json::Value = serde_json::from_slice(&prune_out.stdout)?;
    let (vacuum_time, vacuum_out) =
        canary(&["prune", "--keep", "180d", "--vacuum", "--format", "json"])?;
    let vacuumed: serde_json::Value = serde_json::from_slice(&vacuum_out.stdout)?;
    let after_vacuum = vacuumed["bytes_after"].as_u64().unwrap_or_default();

    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let on_pg = matches!(engine, Engine::Postgres { .. });
    // What the size is of: SQLite's file, or PostgreSQL's tables with their indexes and TOAST.
    let of = if on_pg { "tables" } else { "file" };
    let nights = format!(
        "{} nightly runs × {} prompts × {} lanes, one sample each: run 1 through `canary run` \
         against an instant loopback lane ({:.1} s) and accepted; nights 2–{} written through \
         the store's API in one transaction per night ({:.1} s); the last night committed one \
         result per transaction as `run` does",
        size.runs,
        size.prompts,
        LANES.len(),
        first_run.as_secs_f64(),
        size.runs - 1,
        generation.as_secs_f64(),
    );
    let drift = "From mid-year the free lane drifts on 3% of its prompts with wordings that \
                 recur; 0.3% of calls time out.";
    match engine {
        Engine::Sqlite(_) => {
            println!("### A year of history\n");
            println!("{nights}. {drift}\n");
        }
        Engine::Postgres { version, .. } => {
            println!("### A year of history on PostgreSQL\n");
            println!(
                "The same year in a PostgreSQL {version} store: a server of the benchmark's own on \
                 this machine (started by `scripts/postgres`; fsync, synchronous commit and full \
                 page writes on, PostgreSQL's default settings otherwise), reached over loopback \
                 TCP and sharing the machine's {} cores with canary and the benchmark. {nights}; \
                 then `VACUUM ANALYZE`, as autovacuum would have run over a year. {drift}\n",
                std::thread::available_parallelism().map_or(1, |n| n.get()),
            );
        }
    }
    println!("| figure | value | target |");
    println!("|---|---:|---|");
    println!("| results | {results_count} | |");
    println!("| distinct answers | {texts_count} | |");
    if on_pg {
        println!(
            "| canary's tables with their indexes and TOAST (what `canary prune` reports) | {:.1} MiB | |",
            mib(file)
        );
        println!(
            "| of which distinct answers (table `texts` with its indexes and TOAST) | {:.1} MiB | |",
            mib(answers)
        );
        println!(
            "| the whole database, with PostgreSQL's own catalogs (`pg_database_size`; the WAL apart) | {:.1} MiB | |",
            mib(database)
        );
    } else {
        println!("| database file | {:.1} MiB | |", mib(file));
        println!(
            "| of which distinct answers (text + hash) | {:.1} MiB | |",
            mib(answers)
        );
    }
    println!(
        "| bytes per result beyond the distinct answers (results, verdicts, everything else) | {per_result:.1} | < 100 {} |",
        verdict(per_result < 100.0)
    );
    let commit_path = if on_pg {
        "own transaction over loopback TCP, WAL fsync at commit"
    } else {
        "own transaction, fsync"
    };
    println!(
        "| commit path per result ({commit_path}), p50 / p99 | {} / {} µs | |",
        commit.value_at_quantile(0.5),
        commit.value_at_quantile(0.99)
    );
    for (name, median, max) in &command_rows {
        let target = if name.contains("report") { 1000 } else { 300 };
        println!(
            "| {name}, median / max of 5 | {} / {} ms | < {target} ms {} |",
            median.as_millis(),
            max.as_millis(),
            verdict(median.as_millis() < target)
        );
    }
    println!(
        "| `canary prune --keep 180d` | {} runs, {} results, {} answers in {:.2} s; {of} {:.1} → {:.1} MiB | |",
        pruned["runs"],
        pruned["results"],
        pruned["answers"],
        prune_time.as_secs_f64(),
        mib(before_prune),
        mib(pruned["bytes_after"].as_u64().unwrap_or_default()),
    );
    println!(
        "| then `canary prune --vacuum`{} | {of} {:.1} MiB in {:.2} s | |",
        if on_pg { " (a plain `VACUUM`)" } else { "" },
        mib(after_vacuum),
        vacuum_time.as_secs_f64()
    );
    if on_pg {
        println!(
            "\nWhere the bytes are (before the prune; each table with its TOAST, `pg_table_size`, \
             and each index, `pg_total_relation_size`):\n"
        );
    } else {
        println!("\nWhere the bytes are (SQLite's dbstat, before the prune):\n");
    }
    println!("| table or index | MiB | bytes per result |");
    println!("|---|---:|---:|");
    for (name, bytes, _) in tables.iter().filter(|(_, b, _)| *b >= 64 * 1024) {
        println!(
            "| {name} | {:.2} | {:.1} |",
            mib(*bytes),
            *bytes as f64 / results_count as f64
        );
    }
    if on_pg {
        println!(
            "\nWhat differs from SQLite. Each PostgreSQL row carries a tuple header of 24 bytes \
             (32 once it needs a null bitmap, as most result and verdict rows do) and a 4-byte \
             line pointer; the integer columns are 4-byte `INTEGER`s (schema 5) where SQLite \
             stores a small integer in 1 to 3 bytes; and a table is a heap beside its primary-key \
             index, which repeats the key (for a result: run, lane, prompt, sample) behind an \
             index tuple header of its own, where SQLite's `WITHOUT ROWID` tables are their own \
             index. So a result and its verdict take two heap rows and two index entries: about \
             100 bytes of headers and pointers before the first byte of their data. The answers (80 to 620 bytes) stay in their \
             rows, uncompressed: TOAST compresses and moves only rows of about 2 KB and more. \
             Committing a result is five statements, each a round trip over loopback TCP (begin, \
             the writers' shared lock, the answer's id, the row, commit), then one WAL fsync: the \
             ids of lanes, prompts and outcomes are looked up once per run. The same round trips \
             (two statements a result and one a verdict) make writing a night through the store's \
             API take more than a second here where SQLite takes tens of milliseconds. The sizes leave \
             out the write-ahead log. `canary prune --vacuum` runs a plain `VACUUM`: the pruned \
             rows' space becomes reusable inside the tables (the next nights fill it) but is not \
             handed back to the file system, as SQLite's `VACUUM` does by rewriting the file; `VACUUM \
             FULL` would, holding an exclusive lock on each table while it rewrites it."
        );
    }
    println!();
    drop(server);
    Ok(())
}

fn verdict(pass: bool) -> &'static str {
    if pass { "PASS" } else { "MISS" }
}

/// A plausible answer to `prompt`, 80 to 600 characters, the same every time it is asked.
fn answer(prompt: &str) -> String {
    let n: usize = prompt
        .rsplit(' ')
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let words = [
        "the",
        "answer",
        "depends",
        "on",
        "context",
        "and",
        "in",
        "most",
        "cases",
        "it",
        "is",
        "reasonable",
        "to",
        "say",
        "that",
        "value",
        "holds",
    ];
    let mut text = format!("For question {n}: ");
    let mut i = n;
    while text.len() < 80 + (n * 37) % 520 {
        text.push_str(words[i % words.len()]);
        text.push(' ');
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    text.push('.');
    text
}

fn write_project(dir: &Path, base_url: &str, prompts: usize, store: &str) -> anyhow::Result<()> {
    let mut config = format!("store: {store}\naudit: null\nlanes:\n");
    for lane in LANES {
        config.push_str(&format!(
            "  - name: {lane}\n    kind: openai\n    base_url: {base_url}\n    model: bench-model\n    max_inflight: 16\n"
        ));
    }
    std::fs::write(dir.join("canary.yaml"), config)?;
    std::fs::create_dir_all(dir.join("prompts"))?;
    let mut set = String::new();
    for n in 1..=prompts {
        set.push_str(&format!(
            "- id: p-{n:04}\n  prompt: \"Benchmark question number {n}\"\n"
        ));
    }
    std::fs::write(dir.join("prompts/set.yaml"), set).context("write the prompt set")
}

/// One result of a generated night.
struct Night {
    lane: String,
    prompt_id: String,
    prompt_hash: String,
    outcome: &'static str,
    output: Option<String>,
    error: Option<&'static str>,
    call_ms: u64,
}

impl Night {
    fn as_new(&self) -> NewResult<'_> {
        let served = self.output.is_some();
        NewResult {
            lane: &self.lane,
            prompt_id: &self.prompt_id,
            prompt_hash: &self.prompt_hash,
            sample: 0,
            outcome: self.outcome,
            output: self.output.as_deref(),
            model: served.then_some("bench-model"),
            fingerprint: served.then_some("fp-test"),
            finish_reason: served.then_some("stop"),
            prompt_tokens: served.then_some(12),
            completion_tokens: served.then_some(40 + self.call_ms % 90),
            queue_ms: self.call_ms % 3,
            call_ms: self.call_ms,
            error: self.error,
        }
    }
}

/// Night `night` of `nights`: results, item verdicts and lane verdicts.
fn night_of(
    baseline: &[StoredResult],
    night: usize,
    nights: usize,
    run: i64,
) -> (Vec<Night>, Vec<VerdictRow>, Vec<LaneVerdictRow>) {
    let mut results = Vec::with_capacity(baseline.len());
    let mut verdicts = Vec::with_capacity(baseline.len());
    let mut drifted = 0;
    for (i, base) in baseline.iter().enumerate() {
        // A cheap, fixed hash of (night, item) for reproducible variety.
        let h = (night as u64 * 1_000_003 + i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
        let timed_out = h % 1000 < 3;
        let drifts = base.lane == "free" && night > nights / 2 && h % 100 < 3;
        let (outcome, output, error, verdict, similarity, reasons) = if timed_out {
            (
                "timeout",
                None,
                Some("deadline passed while waiting for the answer"),
                "failed",
                None,
                vec!["timeout: deadline passed while waiting for the answer".to_string()],
            )
        } else if drifts {
            drifted += 1;
            let text = format!(
                "{} (reworded, variant {})",
                base.output.as_deref().unwrap_or_default(),
                (night / 30) % 4
            );
            (
                "served",
                Some(text),
                None,
                "drifted",
                Some(0.81),
                vec!["similarity 0.81 below the threshold 0.85".to_string()],
            )
        } else {
            (
                "served",
                base.output.clone(),
                None,
                "unchanged",
                Some(1.0),
                vec![],
            )
        };
        verdicts.push(VerdictRow {
            lane: base.lane.clone(),
            prompt_id: base.prompt_id.clone(),
            verdict: verdict.to_string(),
            similarity,
            review: false,
            reasons,
            mode: Some("exact".to_string()),
            p_value: None,
        });
        results.push(Night {
            lane: base.lane.clone(),
            prompt_id: base.prompt_id.clone(),
            prompt_hash: base.prompt_hash.clone(),
            outcome,
            output,
            error,
            call_ms: 40 + h % 400,
        });
    }
    let lane_verdicts = LANES
        .iter()
        .map(|lane| {
            let moved = *lane == "free" && drifted > 0;
            LaneVerdictRow {
                run_id: run,
                lane: lane.to_string(),
                verdict: if moved { "drifted" } else { "unchanged" }.to_string(),
                reasons: if moved {
                    vec![format!("{drifted} prompts drifted")]
                } else {
                    vec![]
                },
                p_value: None,
            }
        })
        .collect();
    (results, verdicts, lane_verdicts)
}

fn exit_of(lanes: &[LaneVerdictRow]) -> i32 {
    i32::from(lanes.iter().any(|l| l.verdict == "drifted"))
}

/// Spreads the runs over the past year, one a night, the last one today.
fn date_runs(store: &Path, nights: usize) -> anyhow::Result<()> {
    let conn = rusqlite::Connection::open(store)?;
    let now = chrono::Utc::now();
    for night in 1..=nights {
        let at = now - chrono::Duration::days((nights - night) as i64);
        conn.execute(
            "UPDATE runs SET started_at = ?1, finished_at = ?1 WHERE id = ?2",
            rusqlite::params![
                at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                night as i64
            ],
        )?;
    }
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")?;
    Ok(())
}

/// Bytes of each table and index, largest first (SQLite's dbstat).
fn table_bytes(store: &Path) -> anyhow::Result<Vec<(String, u64)>> {
    let conn = rusqlite::Connection::open(store)?;
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")?;
    let mut stmt = conn
        .prepare("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name ORDER BY SUM(pgsize) DESC")?;
    let rows = stmt
        .query_map([], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)? as u64))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

/// Runs `work` with a connection to the PostgreSQL database at `url`, off any async runtime.
fn pg<R: Send>(
    url: &str,
    work: impl FnOnce(&mut postgres::Client) -> anyhow::Result<R> + Send,
) -> anyhow::Result<R> {
    canary::store::postgres::off_runtime(|| {
        let mut client = postgres::Client::connect(url, postgres::NoTls)
            .with_context(|| format!("connect to {url}"))?;
        work(&mut client)
    })
}

/// [`date_runs`] on PostgreSQL, then `VACUUM ANALYZE`: the statistics and visibility map
/// autovacuum would have kept over a year, whatever it managed during the few minutes of
/// writing.
fn date_runs_pg(url: &str, nights: usize) -> anyhow::Result<()> {
    pg(url, |client| {
        let now = chrono::Utc::now();
        let mut tx = client.transaction()?;
        let update =
            tx.prepare("UPDATE runs SET started_at = $1, finished_at = $1 WHERE id = $2")?;
        for night in 1..=nights {
            let at = now - chrono::Duration::days((nights - night) as i64);
            let at = at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            tx.execute(&update, &[&at, &(night as i64)])?;
        }
        tx.commit()?;
        client.batch_execute("VACUUM ANALYZE")?;
        Ok(())
    })
}

/// Bytes of each table (with its TOAST) and index of the store's schema, largest first, and
/// whether it holds the distinct answers (table `texts` and its indexes). Together they are
/// what `Store::disk_bytes` counts.
fn table_bytes_pg(url: &str) -> anyhow::Result<Vec<(String, u64, bool)>> {
    pg(url, |client| {
        let rows = client.query(
            "SELECT t.relname::TEXT, t.relname::TEXT, pg_table_size(t.oid)
             FROM pg_class t JOIN pg_namespace n ON n.oid = t.relnamespace
             WHERE n.nspname = current_schema() AND t.relkind = 'r'
             UNION ALL
             SELECT i.relname::TEXT, t.relname::TEXT, pg_total_relation_size(i.oid)
             FROM pg_index x
             JOIN pg_class i ON i.oid = x.indexrelid
             JOIN pg_class t ON t.oid = x.indrelid
             JOIN pg_namespace n ON n.oid = t.relnamespace
             WHERE n.nspname = current_schema() AND t.relkind = 'r'
             ORDER BY 3 DESC, 1",
            &[],
        )?;
        Ok(rows
            .iter()
            .map(|row| {
                let table: String = row.get(1);
                (
                    row.get(0),
                    row.get::<_, i64>(2).max(0) as u64,
                    table == "texts",
                )
            })
            .collect())
    })
}

/// Bytes of the whole database, PostgreSQL's catalogs included.
fn database_bytes_pg(url: &str) -> anyhow::Result<u64> {
    pg(url, |client| {
        let bytes: i64 = client
            .query_one("SELECT pg_database_size(current_database())", &[])?
            .get(0);
        Ok(bytes.max(0) as u64)
    })
}

fn file_bytes(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}
