//! A real SMTP server for the alert tests: aiosmtpd from PyPI, started on loopback.
//! `scripts/mailbox` installs it on first use into a venv in the cache, so the tests need
//! nothing installed by hand.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// One received message, as the server decoded it.
pub type Received = serde_json::Value;

/// A running SMTP server.
pub struct SmtpServer {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    out: tempfile::TempDir,
}

/// TLS and login settings for the server.
#[derive(Default)]
pub struct SmtpOptions<'a> {
    /// Listen on this port (0 = any free one).
    pub port: u16,
    /// Certificate chain and key (PEM files): STARTTLS is then required.
    pub tls: Option<(&'a Path, &'a Path)>,
    /// Required login.
    pub login: Option<(&'a str, &'a str)>,
}

impl SmtpServer {
    /// Starts the server and waits until it listens.
    pub fn start(options: SmtpOptions<'_>) -> SmtpServer {
        let out = tempfile::tempdir().unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/mailbox.py");
        let mut command = Command::new(python());
        command
            .arg(script)
            .arg("--out")
            .arg(out.path())
            .arg("--port")
            .arg(options.port.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some((cert, key)) = options.tls {
            command.arg("--cert").arg(cert).arg("--key").arg(key);
        }
        if let Some((user, password)) = options.login {
            command
                .arg("--user")
                .arg(user)
                .arg("--password")
                .arg(password);
        }
        let mut child = command.spawn().expect("python3 runs");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().unwrap_or_else(|_| {
            panic!("the SMTP test server did not start (see its stderr above)")
        });
        SmtpServer { child, port, out }
    }

    /// Messages received so far, oldest first.
    pub fn received(&self) -> Vec<Received> {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(self.out.path())
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        paths.sort();
        paths
            .iter()
            .map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap())
            .collect()
    }

    /// Waits (up to 5 s) until `count` messages arrived.
    pub async fn wait_for(&self, count: usize) -> Vec<Received> {
        for _ in 0..100 {
            let got = self.received();
            if got.len() >= count {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.received()
    }
}

/// The python of the mailbox's venv, provisioned once per test run by `scripts/mailbox`.
fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/mailbox");
        let out = Command::new(script)
            .arg("python")
            .output()
            .expect("scripts/mailbox runs");
        assert!(
            out.status.success(),
            "scripts/mailbox could not install aiosmtpd: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

impl Drop for SmtpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A test CA and a certificate it signed for `localhost` and 127.0.0.1, written as PEM files.
pub struct TestCertificates {
    /// Keeps the files alive as long as the certificates are used.
    _dir: tempfile::TempDir,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCertificates {
    pub fn new() -> TestCertificates {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "canary test CA");
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let leaf_key = KeyPair::generate().unwrap();
        let leaf_params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
        let write = |name: &str, text: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        TestCertificates {
            ca: write("ca.pem", ca_cert.pem()),
            cert: write("cert.pem", leaf.pem()),
            key: write("key.pem", leaf_key.serialize_pem()),
            _dir: dir,
        }
    }
}
