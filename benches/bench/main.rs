//! canary's benchmarks. `scripts/bench` runs them all and writes the tables of BENCHMARKS.md;
//! one part alone: `cargo bench --bench bench -- PART [--smoke]`.
//!
//! Each part prints a Markdown section on stdout and progress on stderr. `--smoke` runs a
//! small size of each, to keep the benchmark building and honest in CI.

#[path = "../../tests/canary/stores.rs"]
mod stores;
#[path = "../../tests/canary/support.rs"]
mod support;

mod deadline;
mod huge;
mod loopback;
mod overhead;
mod serve;
mod year;

const USAGE: &str = "usage: cargo bench --bench bench -- PART [ARGS] [--smoke]

parts:
  serve      a loopback lane answering after a fixed latency (for the peers benchmark)
  overhead   the router's added time per call against a bare reqwest client
  deadline   overshoot past a 200 ms deadline against hung and trickling servers
  huge       peak memory while a lane returns a 64 MiB body
  year       a year of nightly history: store size, commit path, diff/history/report times;
             `year --store postgres` on a PostgreSQL server of its own (scripts/postgres)";

fn main() {
    // `cargo bench` passes `--bench`; ignore it.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let smoke = args.iter().any(|a| a == "--smoke");
    let rest: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| *a != "--smoke")
        .collect();
    let Some((&part, rest)) = rest.split_first() else {
        eprintln!("{USAGE}");
        std::process::exit(2);
    };
    let result = match part {
        "serve" => serve::main(rest),
        "overhead" => overhead::main(smoke),
        "deadline" => deadline::main(smoke),
        "huge" => huge::main(smoke),
        "year" => year::main(smoke, rest),
        _ => {
            eprintln!("unknown part `{part}`\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    if let Err(err) = result {
        eprintln!("bench {part}: {err:#}");
        std::process::exit(1);
    }
}
