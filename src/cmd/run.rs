//! `canary run`: the nightly job.

use anyhow::Context;

use super::{color_enabled, emit, load_config, process_env};
use crate::alert;
use crate::alert::heartbeat::{Beat, Heartbeat};
use crate::cli::{Cli, Format, RunArgs};
use crate::judge::{Against, Judge};
use crate::prompts::PromptSet;
use crate::report;
use crate::router::Router;
use crate::run::{Plan, execute, more_samples, plan};
use crate::store::lock::RunGuard;
use crate::store::{Store, StoreLocation, lease};

/// Exit code after Ctrl-C / SIGTERM, as shells expect.
const EXIT_INTERRUPTED: i32 = 130;

/// Runs `canary run`.
pub async fn run(cli: &Cli, args: &RunArgs) -> anyhow::Result<i32> {
    let config = load_config(&cli.config)?;
    let mut set = PromptSet::load(&config.prompts).context("invalid prompt set")?;
    if let Some(shard) = args.shard {
        shard.select(&mut set.prompts);
    }
    let mut guard = RunGuard::take(&config.store)?;
    let mut store = Store::open(&config.store)?;
    // With the file lock held no other run is alive. (A shared store marked the runs whose
    // leases lapsed as it opened.)
    if !config.store.is_shared() {
        for id in store.mark_interrupted()? {
            tracing::warn!(
                "run {id} was interrupted before it finished; its stored results are kept"
            );
        }
    }
    let router = Router::new(&config, &process_env)?;
    let plan = plan(
        &config,
        &router,
        &set,
        &args.lanes,
        &args.prompts,
        args.samples,
    )?;
    if !plan.unreadable.is_empty() {
        // Judging needs them: refuse before a single request is spent.
        let list: Vec<String> = plan.unreadable.iter().map(|e| format!("  {e}")).collect();
        anyhow::bail!(
            "cannot read {} baseline{}:\n{}\nfix {} (git checkout, or resolve the merge), or write new ones with `canary accept --samples 10 --prompt ID`",
            list.len(),
            if list.len() == 1 { "" } else { "s" },
            list.join("\n"),
            if list.len() == 1 { "it" } else { "them" }
        );
    }
    for (lane, why) in &plan.skipped {
        tracing::info!("lane {lane}: switched off ({why}); not measured in this run");
    }
    let lane_names: Vec<String> = plan.lanes.iter().map(|(l, _)| l.clone()).collect();
    let shard = args.shard.map(|s| s.to_string());
    let run_id =
        store.begin_run_with(&set.hash, plan.max_samples(), &lane_names, shard.as_deref())?;
    lease_lanes(
        &config,
        &store,
        &mut guard,
        run_id,
        &lane_names,
        shard.as_deref(),
    )?;
    guard.describe(&format!(
        "run {run_id} (pid {}, started {})",
        std::process::id(),
        chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    ))?;
    tracing::info!(
        "run {run_id}: {} prompts × {} lanes, {} answers ({})",
        plan.prompts.len(),
        plan.lanes.len(),
        plan.jobs(),
        sampling_summary(&plan)
    );

    let heartbeat = if args.no_alert {
        None
    } else {
        heartbeat(&config)
    };
    if let Some(heartbeat) = &heartbeat {
        beat(heartbeat, Beat::Start).await;
    }
    let measuring = async {
        let mut stored = execute(&plan, run_id, &config, &router, &mut store).await?;
        let preview = Judge::new(&config, &store, &set).run(run_id, Against::Baselines)?;
        let more = more_samples(&plan, &preview);
        if !more.is_empty() {
            // One line per lane and reason, not one per prompt.
            let mut grouped: std::collections::BTreeMap<(&str, &str), (Vec<&str>, u32)> =
                std::collections::BTreeMap::new();
            for extra in &more {
                let entry = grouped
                    .entry((extra.item.lane.as_str(), extra.why))
                    .or_default();
                entry.0.push(extra.item.prompt.id.as_str());
                entry.1 = entry.1.max(extra.item.first + extra.item.samples);
            }
            for ((lane, why), (ids, total)) in &grouped {
                let shown = ids.iter().take(5).copied().collect::<Vec<_>>().join(", ");
                let rest = ids.len().saturating_sub(5);
                tracing::info!(
                    "lane {lane}, {} prompt{} ({shown}{}): {why}; sampling each up to {total} times",
                    ids.len(),
                    if ids.len() == 1 { "" } else { "s" },
                    if rest > 0 {
                        format!(" and {rest} more")
                    } else {
                        String::new()
                    }
                );
            }
            let more = Plan {
                items: more.into_iter().map(|m| m.item).collect(),
                ..plan.clone()
            };
            stored += execute(&more, run_id, &config, &router, &mut store).await?;
        }
        Ok::<usize, anyhow::Error>(stored)
    };
    let stored = tokio::select! {
        stored = measuring => stored,
        // Results are committed one by one, so stopping here loses nothing that finished.
        () = super::shutdown_signal() => {
            let kept = store.results_of(run_id, None, false).map(|r| r.len()).unwrap_or(0);
            store.mark_run_interrupted(run_id)?;
            eprintln!("interrupted: run {run_id} stopped; {kept} finished results are kept in {}", config.store.display());
            if let Some(heartbeat) = &heartbeat {
                beat(heartbeat, Beat::Failure).await;
            }
            return Ok(EXIT_INTERRUPTED);
        }
    };
    if stored.is_ok() {
        wait_for_control(&config, &store, &lane_names).await?;
    }
    let finished = match stored {
        Ok(stored) => {
            conclude(
                cli,
                args,
                &config,
                &set,
                &router,
                &mut store,
                run_id,
                stored,
                &plan.skipped,
            )
            .await
        }
        Err(err) => Err(err),
    };
    match finished {
        Ok(exit_code) => {
            if let Some(heartbeat) = &heartbeat {
                beat(heartbeat, Heartbeat::for_exit_code(exit_code)).await;
            }
            Ok(exit_code)
        }
        Err(err) => {
            // The results stay; the run is closed so it does not look in progress, and the
            // heartbeat hears that this night failed.
            if let Err(close) = store.finish_run(run_id, &[], &[], super::EXIT_ERROR) {
                tracing::warn!("run {run_id} could not be closed: {close}");
            }
            if let Some(heartbeat) = &heartbeat {
                beat(heartbeat, Beat::Failure).await;
            }
            Err(err)
        }
    }
}

/// In a shared store, takes run `run_id`'s leases on its lanes (or its shard of them) and keeps
/// them renewed while `guard` lives; a lane another live run holds removes the new run and says
/// who holds it.
pub(crate) fn lease_lanes(
    config: &crate::config::Config,
    store: &Store,
    guard: &mut RunGuard,
    run_id: i64,
    lanes: &[String],
    shard: Option<&str>,
) -> anyhow::Result<()> {
    let StoreLocation::Postgres(target) = &config.store else {
        return Ok(());
    };
    let keys = lease::keys(lanes, shard);
    if let Err(err) = store.acquire_leases(run_id, &keys, target.lease) {
        store.discard_run(run_id)?;
        return Err(err.into());
    }
    guard.keep(lease::LeaseKeeper::start(
        &config.store,
        run_id,
        keys.len(),
        target.lease,
    )?);
    Ok(())
}

/// Longest a run waits for another runner still measuring the control lane.
const CONTROL_WAIT: std::time::Duration = std::time::Duration::from_secs(10 * 60);

/// In a shared store, when another runner is measuring the control lane right now, waits (up
/// to [`CONTROL_WAIT`]) for it to finish, so this run is judged against the same night's
/// control answers.
async fn wait_for_control(
    config: &crate::config::Config,
    store: &Store,
    measured: &[String],
) -> anyhow::Result<()> {
    let Some(control) = config.drift.control.as_deref() else {
        return Ok(());
    };
    if !config.store.is_shared() || measured.iter().any(|l| l == control) {
        return Ok(());
    }
    let give_up = std::time::Instant::now() + CONTROL_WAIT;
    let mut told = false;
    while let Some(lease) = store.live_lease(control)? {
        if std::time::Instant::now() >= give_up {
            tracing::warn!(
                "control lane {control}: run {} is still measuring it after {}; judging without waiting longer",
                lease.run_id,
                humantime::format_duration(CONTROL_WAIT)
            );
            break;
        }
        if !told {
            tracing::info!(
                "control lane {control}: waiting for run {} ({}) to finish measuring it",
                lease.run_id,
                lease.runner
            );
            told = true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    Ok(())
}

/// Judges the stored run, commits the verdicts, writes the metrics file, alerts, then prints.
#[allow(clippy::too_many_arguments)]
async fn conclude(
    cli: &Cli,
    args: &RunArgs,
    config: &crate::config::Config,
    set: &PromptSet,
    router: &Router,
    store: &mut Store,
    run_id: i64,
    stored: usize,
    skipped: &[(String, String)],
) -> anyhow::Result<i32> {
    let judgement = Judge::new(config, store, set).run(run_id, Against::Baselines)?;
    let exit_code = judgement.exit_code();
    let items: Vec<_> = judgement
        .lanes
        .iter()
        .flat_map(|lane| {
            lane.items.iter().map(|i| crate::store::VerdictRow {
                lane: lane.lane.clone(),
                prompt_id: i.judgement.id.clone(),
                verdict: i.judgement.verdict.as_str().to_string(),
                similarity: i.judgement.similarity,
                review: i.judgement.review,
                reasons: i.judgement.reasons.clone(),
                mode: i.judgement.mode.map(|m| m.as_str().to_string()),
                p_value: i.judgement.p_value,
            })
        })
        .collect();
    let lanes: Vec<_> = judgement
        .lanes
        .iter()
        .map(|l| crate::store::LaneVerdictRow {
            run_id,
            lane: l.lane.clone(),
            verdict: l.verdict.as_str().to_string(),
            reasons: l.reasons.clone(),
            p_value: l.test.map(|t| t.p_value),
        })
        .collect();
    store.finish_run(run_id, &items, &lanes, exit_code)?;
    // Consecutive drifted runs up to this one, for lanes that drifted in it.
    let mut streaks = std::collections::BTreeMap::new();
    for lane in &judgement.lanes {
        let streak = if lane.verdict == crate::verdict::Verdict::Drifted {
            alert::drift_streak(store, &lane.lane, run_id, config.drift.confirm)?
        } else {
            0
        };
        streaks.insert(lane.lane.clone(), streak);
    }

    if let Some(path) = &config.metrics_file
        && let Err(err) =
            crate::metrics::write_file(path, &metrics_text(router, &judgement, run_id))
    {
        tracing::warn!("cannot write metrics file {}: {err}", path.display());
    }

    if let Some(report) = &config.report
        && let Err(err) = write_report(config, store, &judgement, &report.path)
    {
        tracing::warn!("cannot write the report {}: {err:#}", report.path.display());
    }

    // Alerts come after the results and verdicts are committed: a failed delivery loses
    // nothing, stays pending for the next run, and never changes the exit code. They also come
    // before the output, so a reader that goes away cannot stop them.
    if args.no_alert {
        tracing::debug!("--no-alert: no alerts for run {run_id}");
    } else {
        let (channels, broken) = alert::channels(config, &process_env);
        for err in broken {
            tracing::warn!("alert channel not set up, nothing sent through it: {err}");
        }
        let complete = args.prompts.is_empty() && args.shard.is_none();
        if let Err(err) = alert::after_run(
            config,
            store,
            &judgement,
            &channels,
            chrono::Utc::now(),
            complete,
        )
        .await
        {
            tracing::warn!("alerts of run {run_id} could not be stored: {err}");
        }
    }

    // Retention last: this run and its alerts are safe in the store before anything old goes.
    if let Some(keep) = config.store_keep {
        match super::prune::prune(config, store, keep, false) {
            Ok(done) if done.pruned.runs > 0 => tracing::info!(
                "store.keep {}: removed {} runs started before {} ({} results)",
                humantime::format_duration(keep),
                done.pruned.runs,
                &done.cutoff[..10],
                done.pruned.results
            ),
            Ok(_) => {}
            Err(err) => tracing::warn!("store.keep: nothing pruned: {err:#}"),
        }
    }

    let latency = report::latency(&store.results(run_id)?);
    let text = match cli.format {
        Format::Json => {
            let mut json = report::to_json(&judgement, &latency);
            json["results"] = serde_json::json!(stored);
            json["confirm"] = serde_json::json!(config.drift.confirm);
            if let Some(lanes) = json["lanes"].as_array_mut() {
                for lane in lanes {
                    let name = lane["lane"].as_str().unwrap_or_default().to_string();
                    lane["drift_streak"] =
                        serde_json::json!(streaks.get(&name).copied().unwrap_or(0));
                }
            }
            json["skipped_lanes"] = serde_json::json!(
                skipped
                    .iter()
                    .map(|(lane, why)| serde_json::json!({"lane": lane, "why": why}))
                    .collect::<Vec<_>>()
            );
            format!("{}\n", serde_json::to_string_pretty(&json)?)
        }
        Format::Text => summary(
            &judgement,
            &latency,
            config,
            run_id,
            stored,
            &streaks,
            color_enabled(cli.color),
        ),
    };
    emit(&text)?;
    Ok(exit_code)
}

/// The text summary: the verdict table, the drifted items, the status and what to do next.
fn summary(
    judgement: &crate::judge::RunJudgement,
    latency: &std::collections::BTreeMap<String, (i64, i64)>,
    config: &crate::config::Config,
    run_id: i64,
    stored: usize,
    streaks: &std::collections::BTreeMap<String, u32>,
    color: bool,
) -> String {
    use std::fmt::Write as _;
    let mut out = format!(
        "run {run_id}: {stored} results in {}\n",
        config.store.display()
    );
    out.push_str(&report::table(judgement, latency));
    let drifted: Vec<String> = judgement
        .lanes
        .iter()
        .flat_map(|lane| {
            lane.items
                .iter()
                .filter(|i| i.judgement.verdict == crate::verdict::Verdict::Drifted)
                .map(move |i| {
                    format!(
                        "{}/{}: {}",
                        lane.lane,
                        i.judgement.id,
                        i.judgement.reasons.join("; ")
                    )
                })
        })
        .collect();
    if !drifted.is_empty() {
        out.push_str("\ndrifted:\n");
        for line in &drifted {
            let _ = writeln!(out, "  {line}");
        }
    }
    let confirm = config.drift.confirm;
    for lane in &judgement.lanes {
        let streak = streaks.get(&lane.lane).copied().unwrap_or(0);
        if lane.verdict == crate::verdict::Verdict::Drifted && confirm > 1 && streak < confirm {
            let _ = writeln!(
                out,
                "\n{}: drifted in {streak} consecutive run{} of the {confirm} drift.confirm asks for before alerting",
                lane.lane,
                if streak == 1 { "" } else { "s" }
            );
        }
    }
    let exit_code = judgement.exit_code();
    let status = match exit_code {
        0 => "no drift",
        1 => "DRIFT",
        _ => "no drift seen, but some lane or prompt could not be measured",
    };
    let style = console::Style::new().bold().force_styling(color);
    let _ = writeln!(out, "\n{} (exit {exit_code})", style.apply_to(status));
    let needs_review = judgement.lanes.iter().any(|l| {
        l.items
            .iter()
            .any(|i| i.judgement.verdict == crate::verdict::Verdict::New)
    });
    if exit_code != 0 || needs_review {
        let _ = writeln!(
            out,
            "review with: canary diff --run {run_id}   accept with: canary accept --run {run_id}"
        );
    }
    out
}

/// Rewrites the configured report with this run, through a temp file, so a web server never
/// serves half a page.
fn write_report(
    config: &crate::config::Config,
    store: &Store,
    judgement: &crate::judge::RunJudgement,
    path: &std::path::Path,
) -> anyhow::Result<()> {
    let run = store.run(Some(judgement.run_id))?;
    let lanes: Vec<String> = judgement.lanes.iter().map(|l| l.lane.clone()).collect();
    let histories = crate::html::report::history(store, &lanes, run.id, REPORT_RUNS)?;
    let page = crate::html::report::page(&run, judgement, &histories, config.drift.alpha);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut temp = path.as_os_str().to_os_string();
    temp.push(".tmp");
    std::fs::write(&temp, page)?;
    std::fs::rename(&temp, path)?;
    Ok(())
}

/// Runs the report kept by `canary run` shows.
const REPORT_RUNS: usize = 30;

/// How the run is sampled, for its first log line: `10 samples × 8, 1 sample × 5`.
fn sampling_summary(plan: &Plan<'_>) -> String {
    let mut by_count: std::collections::BTreeMap<u32, usize> = std::collections::BTreeMap::new();
    for item in &plan.items {
        *by_count.entry(item.samples).or_default() += 1;
    }
    by_count
        .iter()
        .rev()
        .map(|(samples, items)| {
            format!(
                "{samples} sample{} × {items}",
                if *samples == 1 { "" } else { "s" }
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The configured heartbeat, if any; a broken one is logged, never fatal.
fn heartbeat(config: &crate::config::Config) -> Option<Heartbeat> {
    let settings = config.alerts.as_ref()?.heartbeat.as_ref()?;
    match Heartbeat::new(settings, &process_env) {
        Ok(heartbeat) => Some(heartbeat),
        Err(err) => {
            tracing::warn!("{err}; no heartbeat pings");
            None
        }
    }
}

async fn beat(heartbeat: &Heartbeat, beat: Beat) {
    if let Err(err) = heartbeat.ping(beat).await {
        tracing::warn!("{err}");
    }
}

fn metrics_text(router: &Router, judgement: &crate::judge::RunJudgement, run_id: i64) -> String {
    use crate::metrics::{FloatGauge, LaneLabel};
    use prometheus_client::encoding::EncodeLabelSet;
    use prometheus_client::metrics::{family::Family, gauge::Gauge};

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct LaneVerdict {
        lane: String,
        verdict: String,
    }

    let mut registry = router.metrics_registry();
    let gauge = |value: i64| {
        let gauge = Gauge::<i64>::default();
        gauge.set(value);
        gauge
    };
    registry.register(
        "canary_last_run_timestamp_seconds",
        "When the last run finished",
        gauge(chrono::Utc::now().timestamp()),
    );
    registry.register("canary_last_run_id", "Id of the last run", gauge(run_id));
    registry.register(
        "canary_last_run_exit_code",
        "Exit code of the last run (0 ok, 1 drift, 3 unmeasured)",
        gauge(i64::from(judgement.exit_code())),
    );
    let prompts = Family::<LaneVerdict, Gauge>::default();
    let drifted = Family::<LaneLabel, Gauge>::default();
    let p_values = Family::<LaneLabel, FloatGauge>::default();
    for lane in &judgement.lanes {
        for verdict in crate::verdict::Verdict::ALL {
            prompts
                .get_or_create(&LaneVerdict {
                    lane: lane.lane.clone(),
                    verdict: verdict.to_string(),
                })
                .set(lane.count(verdict) as i64);
        }
        let label = LaneLabel {
            lane: lane.lane.clone(),
        };
        drifted
            .get_or_create(&label)
            .set(i64::from(lane.verdict == crate::verdict::Verdict::Drifted));
        if let Some(test) = &lane.test {
            p_values.get_or_create(&label).set(test.p_value);
        }
    }
    registry.register(
        "canary_prompts",
        "Prompts of the last run by lane and verdict",
        prompts,
    );
    registry.register(
        "canary_lane_drifted",
        "Whether the lane's verdict in the last run was drifted",
        drifted,
    );
    registry.register(
        "canary_lane_drift_p_value",
        "p-value of the two-sample test of the lane's sampled prompts in the last run (drift when at most drift.alpha)",
        p_values,
    );
    crate::metrics::encode(&registry)
}
