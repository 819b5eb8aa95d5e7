//! What an alert says: subject, plain text and HTML, built from a judged lane.

use std::fmt::Write as _;

use maud::html;

use crate::html;
use crate::judge::JudgedLane;
use crate::report;
use crate::verdict::Verdict;

/// One alert message, the same for every channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Subject line (email subject, first line of a webhook post).
    pub subject: String,
    /// Plain-text body.
    pub text: String,
    /// HTML body; everything from a lane is escaped.
    pub html: String,
}

/// A lane drifted: how many prompts, the reasons, the diffs, the commands to review, and the
/// report (`report`: where it is, for people) when one is kept.
pub fn drift(run_id: i64, lane: &JudgedLane, report: Option<&str>) -> Message {
    let drifted: Vec<_> = lane
        .items
        .iter()
        .filter(|i| i.judgement.verdict == Verdict::Drifted && !i.judgement.review)
        .collect();
    let judged = lane
        .items
        .iter()
        .filter(|i| {
            matches!(
                i.judgement.verdict,
                Verdict::Unchanged | Verdict::WithinNoise | Verdict::Drifted
            )
        })
        .count();
    let identity: Vec<&String> = lane
        .reasons
        .iter()
        .filter(|r| r.contains(" changed on "))
        .collect();
    let mut what = Vec::new();
    if !identity.is_empty() {
        what.push("identity changed".to_string());
    }
    if !drifted.is_empty() {
        let noun = if drifted.len() == 1 {
            "prompt"
        } else {
            "prompts"
        };
        what.push(format!("{} of {judged} {noun} drifted", drifted.len()));
    }
    if let Some(test) = lane.test.filter(|t| t.rejected()) {
        what.push(format!(
            "sampled answers moved (p = {})",
            crate::drift::format_p(test.p_value)
        ));
    }
    let subject = format!("[canary] {}: {} (run {run_id})", lane.lane, what.join(", "));

    let review = format!("canary diff --run {run_id} --lane {}", lane.lane);
    let accept = format!("canary accept --run {run_id} --lane {}", lane.lane);
    let mut text = format!("canary: lane {} drifted in run {run_id}.\n\n", lane.lane);
    for reason in &lane.reasons {
        let _ = writeln!(text, "  - {reason}");
    }
    text.push('\n');
    text.push_str(&lane_table_text(lane));
    for item in &drifted {
        text.push('\n');
        text.push_str(&report::item(&lane.lane, item, run_id, false));
    }
    let _ = write!(
        text,
        "\nReview:  {review}\nAccept what is right:  {accept}\n"
    );
    if let Some(report) = report {
        let _ = writeln!(text, "Report (this lane over the last runs):  {report}");
    }

    let body = html! {
        p { "canary: lane " b { (lane.lane) } " drifted in run " (run_id) "." }
        ul { @for reason in &lane.reasons { li { (reason) } } }
        (html::lane_table(lane))
        @for judged in &drifted { (html::item(&lane.lane, judged, run_id)) }
        p {
            "Review: " code { (review) } br;
            "Accept what is right: " code { (accept) }
            @if let Some(report) = report {
                br;
                "Report (this lane over the last runs): "
                @if report.starts_with("https://") || report.starts_with("http://") {
                    a href=(report) { (report) }
                } @else {
                    code { (report) }
                }
            }
        }
    };
    Message {
        subject,
        text,
        html: html::email(body),
    }
}

/// A lane that drifted before measures within its baselines again.
pub fn recovered(run_id: i64, lane: &JudgedLane) -> Message {
    let subject = format!(
        "[canary] {}: recovered, no drift in run {run_id}",
        lane.lane
    );
    let text = format!(
        "canary: lane {} no longer drifts (run {run_id}, verdict {}).\n\n{}",
        lane.lane,
        lane.verdict,
        lane_table_text(lane)
    );
    let html = html::email(html! {
        p { "canary: lane " b { (lane.lane) } " no longer drifts (run " (run_id) ", verdict " (lane.verdict) ")." }
        (html::lane_table(lane))
    });
    Message {
        subject,
        text,
        html,
    }
}

/// The message of `canary alert test`.
pub fn test(config_path: &str) -> Message {
    let subject = "[canary] test alert".to_string();
    let text = format!(
        "This is a test alert from canary ({config_path}).\nIf you can read it, drift alerts will reach you here.\n"
    );
    let html = html::email(html! {
        p { "This is a test alert from canary (" code { (config_path) } ")." }
        p { "If you can read it, drift alerts will reach you here." }
    });
    Message {
        subject,
        text,
        html,
    }
}

fn lane_table_text(lane: &JudgedLane) -> String {
    let mut out = String::new();
    for verdict in Verdict::ALL {
        let n = lane.count(verdict);
        if n > 0 {
            let _ = write!(out, "{verdict}: {n}  ");
        }
    }
    format!("{}: {}  ({})\n", lane.lane, lane.verdict, out.trim_end())
}
