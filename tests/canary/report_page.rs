//! The report page in a real browser: headless Chromium (`scripts/browser` installs Debian's
//! package when it is missing) loads the file canary wrote, and what it rendered is checked from
//! the DOM it built and from the pixels of a screenshot.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use crate::support::{LaneSpec, Project, Reply, TestServer, canary_with_env, prompt_of, text};

/// Model output that would run if the page ever treated it as markup.
const HOSTILE: &str = "<script>document.title='pwned'</script>Paris, <img src=x onerror=\"document.title='pwned'\"> really.";

const BREAKFASTS: [&str; 4] = [
    "Eggs on toast with orange juice.",
    "Oatmeal with banana and honey.",
    "Yogurt with berries and granola.",
    "Pancakes with maple syrup.",
];

fn browser() -> &'static Path {
    static BROWSER: OnceLock<PathBuf> = OnceLock::new();
    BROWSER.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/browser");
        let out = Command::new(script)
            .arg("path")
            .output()
            .expect("scripts/browser runs");
        assert!(
            out.status.success(),
            "no browser for the report tests: {}",
            text(&out.stderr)
        );
        PathBuf::from(text(&out.stdout).trim())
    })
}

/// Runs headless Chromium on `page` with `args` (`--dump-dom`, `--screenshot=...`).
fn chromium(page: &Path, args: &[&str]) -> Output {
    let profile = tempfile::tempdir().unwrap();
    Command::new(browser())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("chromium runs")
}

/// A project with four runs: a baseline, two unchanged runs, and one where the free lane
/// drifted with hostile output; returns it with its report written.
async fn reported() -> (TestServer, Project, PathBuf) {
    let drifted = Arc::new(AtomicBool::new(false));
    let server = {
        let drifted = drifted.clone();
        TestServer::start(move |n, seen| {
            let prompt = prompt_of(seen);
            let now = drifted.load(Ordering::SeqCst);
            let answer = if prompt.contains("breakfast") {
                let mut rng = fastrand::Rng::with_seed(n as u64);
                let choice = if now {
                    0
                } else {
                    rng.usize(..BREAKFASTS.len())
                };
                BREAKFASTS[choice].to_string()
            } else if prompt.contains("capital") {
                if now {
                    HOSTILE.to_string()
                } else {
                    "The capital of France is Paris.".to_string()
                }
            } else if now {
                format!(
                    "No. {}",
                    "A very long line that keeps going without a break, ".repeat(12)
                )
            } else {
                "Yes.".to_string()
            };
            Reply::completion(&answer, "m")
        })
        .await
    };
    let project = Project::new(&[], &[LaneSpec::new("free", server.base_url())]);
    project.write_prompts(
        "set.yaml",
        r#"
- id: breakfast
  prompt: "Suggest a breakfast."
  params: { temperature: 0.8 }
- id: capital
  prompt: "What is the capital of France?"
- id: prime
  prompt: "Is 17077 prime?"
  checks:
    - answer: '(?i)\b(yes|no)\b'
"#,
    );
    let run = |args: &'static [&'static str]| {
        let project = &project;
        async move { canary_with_env(project, args, &[]).await }
    };
    run(&["run"]).await;
    run(&["accept"]).await;
    for _ in 0..2 {
        let out = run(&["run"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    }
    drifted.store(true, Ordering::SeqCst);
    let out = run(&["run"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let page = project.file("report.html");
    let out = canary_with_env(&project, &["report", "-o", page.to_str().unwrap()], &[]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    (server, project, page)
}

#[tokio::test]
async fn the_report_is_one_file_with_no_script_and_nothing_fetched() {
    let (_server, _project, page) = reported().await;
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        !html.contains("<script"),
        "no script of its own, none from a lane"
    );
    assert!(!html.contains("<img"), "no image element, none from a lane");
    for external in ["src=\"http", "href=\"http", "<link", "@import", "url("] {
        assert!(!html.contains(external), "fetches nothing ({external})");
    }
    assert!(
        html.contains("&lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt;")
            || html.contains("&lt;script&gt;document.title='pwned'&lt;/script&gt;"),
        "the hostile answer is shown as text"
    );
}

#[tokio::test]
async fn headless_chromium_renders_the_charts_the_grid_and_the_diffs_and_runs_nothing() {
    let (_server, project, page) = reported().await;

    let dom = chromium(&page, &["--dump-dom"]);
    assert!(dom.status.success(), "{}", text(&dom.stderr));
    let dom = text(&dom.stdout);
    assert!(
        dom.contains("<title>canary run 4: drifted</title>"),
        "nothing rewrote the title: {}",
        &dom[..dom.len().min(400)]
    );
    assert!(!dom.contains("pwned</title>"));
    assert!(
        dom.contains("<svg class=\"chart drift\""),
        "the drift chart"
    );
    assert!(
        dom.contains("<svg class=\"chart latency\""),
        "the latency chart"
    );
    assert!(
        dom.contains("class=\"p-value\""),
        "the p-value line of the sampled prompt"
    );
    assert_eq!(
        dom.matches("class=\"verdict ").count(),
        4,
        "one verdict mark per run"
    );
    // The grid: three prompts × four runs, and the night the drift started.
    assert_eq!(dom.matches("class=\"cell ").count(), 3 * 4);
    assert!(dom.contains("title=\"run 4 · capital: drifted\""), "{dom}");
    assert!(dom.contains("title=\"run 3 · capital: unchanged\""));
    // The diffs, side by side, with the hostile answer as text and no element made from it.
    assert!(dom.contains("<table class=\"diff\""));
    assert!(dom.contains("&lt;script&gt;document.title='pwned'&lt;/script&gt;Paris"));
    assert!(
        !dom.contains("<img"),
        "the answer's img tag is text, not an element"
    );

    let shot = project.file("report.png");
    let out = chromium(
        &page,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1200,1800",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size().unwrap()];
    let frame = reader.next_frame(&mut pixels).unwrap();
    assert_eq!((frame.width, frame.height), (1200, 1800));
    let channels = frame.line_size / frame.width as usize;
    let rgb = |i: usize| (pixels[i], pixels[i + 1], pixels[i + 2]);
    let (mut ink, mut red, mut green) = (0usize, 0usize, 0usize);
    for i in (0..frame.buffer_size()).step_by(channels) {
        let (r, g, b) = rgb(i);
        if (r, g, b) != (255, 255, 255) {
            ink += 1;
        }
        // The drifted colour (#cf222e) of the grid and the verdict strip.
        if r > 190 && g < 60 && b < 70 {
            red += 1;
        }
        // The unchanged colour (#2da44e).
        if r < 70 && g > 150 && b < 100 {
            green += 1;
        }
    }
    let total = (frame.width * frame.height) as usize;
    assert!(
        ink * 20 > total,
        "the page is not blank: {ink} of {total} pixels"
    );
    assert!(red > 100, "drift shows in red: {red} pixels");
    assert!(green > 100, "unchanged runs show in green: {green} pixels");
}
