//! `canary ask`: one job through the shared router.

use std::io::Read;

use anyhow::Context;
use serde::Serialize;

use super::{EXIT_OK, EXIT_UNANSWERED, emit, load_config, process_env};
use crate::cli::{AskArgs, Cli, Format};
use crate::completion::{ChatRequest, Params, Usage};
use crate::deadline::Deadline;
use crate::router::{Attempt, Routed, Router};

/// The contract's JSON object for `canary ask --format json`.
#[derive(Debug, Serialize)]
struct AskJson<'a> {
    text: Option<&'a str>,
    lane: Option<&'a str>,
    model: Option<&'a str>,
    fingerprint: Option<&'a str>,
    finish_reason: Option<&'a str>,
    usage: Option<Usage>,
    elapsed_ms: u64,
    attempts: &'a [Attempt],
    job_id: &'a str,
}

/// Runs `canary ask`.
pub async fn run(cli: &Cli, args: &AskArgs) -> anyhow::Result<i32> {
    let config = load_config(&cli.config)?;
    let prompt = if args.prompt == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read the prompt from standard input")?;
        text
    } else {
        args.prompt.clone()
    };
    if prompt.trim().is_empty() {
        anyhow::bail!("the prompt is empty");
    }
    let router = Router::new(&config, &process_env)?;
    let request = ChatRequest::from_prompt(
        args.system.as_deref(),
        &prompt,
        Params {
            temperature: Some(args.temperature),
            max_tokens: args.max_tokens,
            ..Params::default()
        },
    );
    // The edge: the one place this job's deadline is minted.
    let deadline = Deadline::after(args.deadline.unwrap_or(config.deadline));
    let routed = if args.lanes.is_empty() {
        router.route(&request, deadline).await
    } else {
        router.route_among(&args.lanes, &request, deadline).await?
    };
    match cli.format {
        Format::Json => print_json(&routed)?,
        Format::Text => print_text(&routed)?,
    }
    Ok(if routed.completion.is_some() {
        EXIT_OK
    } else {
        EXIT_UNANSWERED
    })
}

fn print_json(routed: &Routed) -> anyhow::Result<()> {
    let completion = routed.completion.as_ref();
    let json = AskJson {
        text: completion.map(|c| c.text.as_str()),
        lane: completion.map(|c| c.lane.as_str()),
        model: completion.and_then(|c| c.model.as_deref()),
        fingerprint: completion.and_then(|c| c.fingerprint.as_deref()),
        finish_reason: completion.and_then(|c| c.finish_reason.as_deref()),
        usage: completion.map(|c| c.usage),
        elapsed_ms: routed.elapsed.as_millis() as u64,
        attempts: &routed.attempts,
        job_id: &routed.job_id,
    };
    emit(&format!("{}\n", serde_json::to_string_pretty(&json)?))?;
    Ok(())
}

/// The answer on stdout (so `canary ask ... > answer.txt` keeps only the answer), the routing
/// story on stderr.
fn print_text(routed: &Routed) -> anyhow::Result<()> {
    match &routed.completion {
        Some(completion) => {
            emit(&format!("{}\n", completion.text))?;
            let mut about = Vec::new();
            if let Some(model) = &completion.model {
                about.push(format!("model {model}"));
            }
            if let Some(fingerprint) = &completion.fingerprint {
                about.push(format!("fingerprint {fingerprint}"));
            }
            if let Some(reason) = &completion.finish_reason {
                about.push(format!("finish {reason}"));
            }
            eprintln!(
                "\nserved by {} in {} ms ({})",
                completion.lane,
                routed.elapsed.as_millis(),
                about.join(", ")
            );
        }
        None => eprintln!(
            "no lane answered within the deadline ({} ms)",
            routed.elapsed.as_millis()
        ),
    }
    let width = routed
        .attempts
        .iter()
        .map(|a| a.lane.len())
        .max()
        .unwrap_or(4);
    for attempt in &routed.attempts {
        let detail = attempt
            .detail
            .as_deref()
            .map(|d| format!("  {d}"))
            .unwrap_or_default();
        eprintln!(
            "  {:width$}  {:16}  queue {:>5} ms  call {:>6} ms{detail}",
            attempt.lane,
            attempt.outcome.as_str(),
            attempt.queue_ms,
            attempt.call_ms,
        );
    }
    Ok(())
}
