//! `canary alert test`: prove each channel reaches someone before a real drift needs it.

use super::{EXIT_ERROR, EXIT_OK, load_config, process_env};
use crate::alert::heartbeat::{Beat, Heartbeat};
use crate::alert::{channels, message};
use crate::cli::Cli;

/// Runs `canary alert test`.
pub async fn test(cli: &Cli) -> anyhow::Result<i32> {
    let config = load_config(&cli.config)?;
    let Some(alerts) = &config.alerts else {
        anyhow::bail!(
            "no alert channels configured: add `alerts:` with `email:`, `webhook:` or `heartbeat:` to {}",
            config.path.display()
        );
    };
    let (channels, broken) = channels(&config, &process_env);
    let message = message::test(&config.path.display().to_string());
    let mut failed = broken.len();
    let mut tried = broken.len();
    for err in &broken {
        println!("FAILED: {err}");
    }
    for channel in &channels {
        tried += 1;
        match channel.send(&message).await {
            Ok(()) => println!("{}: sent", channel.name()),
            Err(err) => {
                failed += 1;
                println!("{}: FAILED: {err}", channel.name());
            }
        }
    }
    if let Some(settings) = &alerts.heartbeat {
        tried += 1;
        let result = match Heartbeat::new(settings, &process_env) {
            Ok(heartbeat) => heartbeat.ping(Beat::Success).await,
            Err(err) => Err(err),
        };
        match result {
            Ok(()) => println!("heartbeat: pinged (it counts as a check-in)"),
            Err(err) => {
                failed += 1;
                println!("heartbeat: FAILED: {err}");
            }
        }
    }
    if tried == 0 {
        anyhow::bail!("alerts: has no channel: add `email:`, `webhook:` or `heartbeat:`");
    }
    Ok(if failed == 0 { EXIT_OK } else { EXIT_ERROR })
}
