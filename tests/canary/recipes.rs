//! The deployment recipes README points to (deploy/) are checked, not just written.

use std::path::{Path, PathBuf};

use canary::config::Config;
use canary::schedule::parse_expression;

fn recipe(path: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("deploy")
            .join(path),
    )
    .unwrap()
}

#[test]
fn the_crontab_line_is_a_valid_schedule_running_canary_run() {
    let text = recipe("crontab");
    let line = text
        .lines()
        .find(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    parse_expression(&fields[..5].join(" ")).unwrap();
    let command = fields[5..].join(" ");
    assert!(command.contains("canary run"), "{command}");
    assert!(!command.contains("flock"), "canary locks itself");
}

/// `key=value` lines of an ini-style unit file, by section.
fn unit(text: &str) -> Vec<(String, String, String)> {
    let mut section = String::new();
    let mut entries = Vec::new();
    for line in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
        } else {
            let (key, value) = line
                .split_once('=')
                .unwrap_or_else(|| panic!("not key=value: {line}"));
            entries.push((section.clone(), key.to_string(), value.to_string()));
        }
    }
    entries
}

fn get<'a>(entries: &'a [(String, String, String)], section: &str, key: &str) -> Option<&'a str> {
    entries
        .iter()
        .find(|(s, k, _)| s == section && k == key)
        .map(|(_, _, v)| v.as_str())
}

#[test]
fn the_systemd_service_and_timer_run_canary_nightly() {
    let service = unit(&recipe("systemd/canary.service"));
    assert_eq!(get(&service, "Service", "Type"), Some("oneshot"));
    assert!(
        get(&service, "Service", "ExecStart")
            .unwrap()
            .ends_with(" run")
    );
    assert_eq!(
        get(&service, "Service", "SuccessExitStatus"),
        Some("1"),
        "drift is not a unit failure"
    );
    let timer = unit(&recipe("systemd/canary.timer"));
    assert_eq!(get(&timer, "Timer", "OnCalendar"), Some("*-*-* 03:00:00"));
    assert_eq!(get(&timer, "Timer", "Persistent"), Some("true"));
    assert_eq!(get(&timer, "Install", "WantedBy"), Some("timers.target"));

    // systemd's own checker, where the machine has it, on copies pointing at this build.
    if let Ok(status) = std::process::Command::new("systemd-analyze")
        .arg("--version")
        .output()
        && status.status.success()
    {
        let dir = tempfile::tempdir().unwrap();
        let service = recipe("systemd/canary.service")
            .replace("/usr/local/bin/canary", env!("CARGO_BIN_EXE_canary"));
        std::fs::write(dir.path().join("canary.service"), service).unwrap();
        std::fs::write(
            dir.path().join("canary.timer"),
            recipe("systemd/canary.timer"),
        )
        .unwrap();
        let out = std::process::Command::new("systemd-analyze")
            .arg("verify")
            .arg(dir.path().join("canary.service"))
            .arg(dir.path().join("canary.timer"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The documents of a multi-document Kubernetes recipe.
fn manifests(path: &str) -> Vec<serde_json::Value> {
    serde_saphyr::from_str_multiple(&recipe(path)).unwrap()
}

/// The document of `kind` among `docs`.
fn of_kind<'a>(docs: &'a [serde_json::Value], kind: &str) -> &'a serde_json::Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
}

#[test]
fn the_kubernetes_cronjob_forbids_overlap_keeps_the_store_on_a_volume_and_ships_a_valid_config() {
    let docs = manifests("kubernetes/cronjob.yaml");
    let kind = |k: &str| of_kind(&docs, k);
    let cronjob = kind("CronJob");
    assert_eq!(cronjob["spec"]["concurrencyPolicy"], "Forbid");
    parse_expression(cronjob["spec"]["schedule"].as_str().unwrap()).unwrap();
    let pod = &cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"];
    assert_eq!(pod["restartPolicy"], "Never");
    let args: Vec<&str> = pod["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args, ["-c", "/config/canary.yaml", "run"]);
    let claim = kind("PersistentVolumeClaim")["metadata"]["name"]
        .as_str()
        .unwrap();
    let data = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "data")
        .unwrap();
    assert_eq!(data["persistentVolumeClaim"]["claimName"], claim);

    let yaml = kind("ConfigMap")["data"]["canary.yaml"].as_str().unwrap();
    let config = Config::parse(&PathBuf::from("/config/canary.yaml"), yaml).unwrap();
    assert!(
        config
            .store
            .sqlite_path()
            .is_some_and(|p| p.starts_with("/data")),
        "the store is on the volume: {:?}",
        config.store
    );
    assert_eq!(config.prompts, PathBuf::from("/config/prompts"));
}

#[test]
fn the_kubernetes_postgres_variant_runs_one_lane_per_index_with_the_password_from_a_secret() {
    let docs = manifests("kubernetes/postgres.yaml");
    let kind = |k: &str| of_kind(&docs, k);
    let cronjob = kind("CronJob");
    assert_eq!(cronjob["spec"]["concurrencyPolicy"], "Forbid");
    parse_expression(cronjob["spec"]["schedule"].as_str().unwrap()).unwrap();
    let job = &cronjob["spec"]["jobTemplate"]["spec"];
    assert_eq!(job["completionMode"], "Indexed");
    let pods = job["completions"].as_u64().unwrap();
    assert_eq!(job["parallelism"].as_u64(), Some(pods));
    let container = &job["template"]["spec"]["containers"][0];
    let script = container["args"][0].as_str().unwrap();
    let lanes = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "LANES")
        .unwrap()["value"]
        .as_str()
        .unwrap();

    let yaml = kind("ConfigMap")["data"]["canary.yaml"].as_str().unwrap();
    let config = Config::parse(&PathBuf::from("/config/canary.yaml"), yaml).unwrap();
    let configured: Vec<&str> = config.lanes.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(lanes.split_whitespace().collect::<Vec<_>>(), configured);
    assert_eq!(pods as usize, configured.len(), "one pod per lane");
    // What the shell in each pod runs: index i measures the i-th lane.
    for (index, lane) in configured.iter().enumerate() {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(script.replace("exec canary", "echo canary"))
            .env("JOB_COMPLETION_INDEX", index.to_string())
            .env("LANES", lanes)
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("canary -c /config/canary.yaml run --lane {lane}")
        );
    }

    let canary::store::StoreLocation::Postgres(target) = &config.store else {
        panic!("not a PostgreSQL store: {:?}", config.store)
    };
    assert!(target.url.contains("sslmode=require"), "{}", target.url);
    let ca = target
        .ca_file
        .as_deref()
        .expect("a CA for the database's certificate");
    let mounted = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| ca.starts_with(m["mountPath"].as_str().unwrap()) && m["name"] == "db-ca");
    assert!(mounted, "{} is on a mounted volume", ca.display());
    let password_env = target.password_env.as_deref().unwrap();
    let secret = kind("Secret");
    assert!(
        secret["stringData"].get(password_env).is_some(),
        "the Secret holds {password_env}"
    );
    let from_secrets: Vec<&str> = container["envFrom"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["secretRef"]["name"].as_str().unwrap())
        .collect();
    assert!(from_secrets.contains(&secret["metadata"]["name"].as_str().unwrap()));
}
