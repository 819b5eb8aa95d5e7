use std::io::IsTerminal;

use clap::Parser;

use canary::cli::{Cli, ColorChoice};

fn main() {
    let cli = Cli::parse();
    init_logging(cli.verbose, cli.quiet, cli.color);
    let runtime = match canary::runtime() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            std::process::exit(canary::cmd::EXIT_ERROR);
        }
    };
    let code = match runtime.block_on(canary::cmd::run(cli)) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {}", canary::said_once(err.chain()));
            canary::cmd::EXIT_ERROR
        }
    };
    std::process::exit(code);
}

/// Logs go to stderr so stdout stays the command's output. `CANARY_LOG` overrides the level.
fn init_logging(verbose: u8, quiet: u8, color: ColorChoice) {
    let level = match (verbose, quiet) {
        (0, 0) => "info",
        (0, 1) => "warn",
        (0, _) => "error",
        (1, _) => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("CANARY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("warn,canary={level}")));
    let ansi = match color {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => {
            std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none()
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}
