//! HTML for alerts and reports. Model output is untrusted text: everything that comes from a
//! lane, a prompt or a baseline is escaped before it is placed in markup.

use std::fmt::Write as _;

use crate::diff::{LineKind, hunks};
use crate::judge::{JudgedItem, JudgedLane};
use crate::verdict::Verdict;

/// Escapes text for HTML element content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A diff as an HTML table with inline styles (mail clients drop style sheets): line numbers,
/// removed lines red with `<del>` on changed words, added lines green with `<ins>`.
pub fn diff_table(old: &str, new: &str, old_label: &str, new_label: &str) -> String {
    let mut out = String::from(
        "<table style=\"border-collapse:collapse;font-family:monospace;font-size:13px\">",
    );
    let _ = write!(
        out,
        "<tr><td colspan=\"3\" style=\"color:#b00\">-{}</td></tr><tr><td colspan=\"3\" style=\"color:#070\">+{}</td></tr>",
        escape(old_label),
        escape(new_label)
    );
    let all = hunks(old, new);
    if all.is_empty() {
        out.push_str("<tr><td colspan=\"3\">(no differences)</td></tr>");
    }
    for (index, hunk) in all.iter().enumerate() {
        if index > 0 {
            out.push_str("<tr><td colspan=\"3\" style=\"color:#999\">⋯</td></tr>");
        }
        for line in hunk {
            let (background, sign, tag) = match line.kind {
                LineKind::Same => ("#fff", " ", ""),
                LineKind::Removed => ("#fdd", "-", "del"),
                LineKind::Added => ("#dfd", "+", "ins"),
            };
            let number = |n: Option<usize>| n.map_or(String::new(), |n| n.to_string());
            let _ = write!(
                out,
                "<tr style=\"background:{background}\"><td style=\"color:#999;padding-right:6px\">{}</td><td style=\"color:#999;padding-right:6px\">{}</td><td style=\"white-space:pre-wrap\">{sign}",
                number(line.old),
                number(line.new)
            );
            for (emphasised, text) in &line.segments {
                if *emphasised && !tag.is_empty() {
                    let _ = write!(
                        out,
                        "<{tag} style=\"font-weight:bold\">{}</{tag}>",
                        escape(text)
                    );
                } else {
                    out.push_str(&escape(text));
                }
            }
            out.push_str("</td></tr>");
        }
    }
    out.push_str("</table>");
    out
}

/// One judged item: heading, reasons, and the diff of baseline vs output (or the output alone
/// when there is no baseline to compare with).
pub fn item(lane: &str, item: &JudgedItem, run_id: i64) -> String {
    let j = &item.judgement;
    let mut out = format!("<h3>{} / {}: {}", escape(lane), escape(&j.id), j.verdict);
    if let Some(sim) = j.similarity {
        let _ = write!(out, " (similarity {sim:.2})");
    }
    if j.review {
        out.push_str(" [for review]");
    }
    out.push_str("</h3>");
    if !j.reasons.is_empty() {
        out.push_str("<ul>");
        for reason in &j.reasons {
            let _ = write!(out, "<li>{}</li>", escape(reason));
        }
        out.push_str("</ul>");
    }
    let output = item.samples.iter().find_map(|s| s.output.as_deref());
    match (&item.baseline, output) {
        (Some(_), Some(_)) => {
            let (pairs, more) = item.diff_pairs(crate::report::DIFFS_PER_ITEM);
            for pair in &pairs {
                let (old_label, new_label) = crate::report::diff_labels(item, pair, run_id);
                out.push_str(&diff_table(
                    &pair.baseline.text,
                    pair.output,
                    &old_label,
                    &new_label,
                ));
            }
            if more > 0 {
                let _ = write!(out, "<p>({more} more distinct answers not shown)</p>");
            }
        }
        (None, Some(output)) => {
            let _ = write!(
                out,
                "<pre style=\"white-space:pre-wrap\">{}</pre>",
                escape(output)
            );
        }
        _ => {}
    }
    out
}

/// One lane's verdict counts as an HTML table.
pub fn lane_table(lane: &JudgedLane) -> String {
    let mut out = String::from("<table style=\"border-collapse:collapse\"><tr>");
    out.push_str("<th style=\"text-align:left;padding-right:12px\">lane</th><th style=\"text-align:left;padding-right:12px\">verdict</th>");
    for verdict in Verdict::ALL {
        let _ = write!(out, "<th style=\"padding-right:12px\">{verdict}</th>");
    }
    let _ = write!(
        out,
        "</tr><tr><td style=\"padding-right:12px\">{}</td><td style=\"padding-right:12px\"><b>{}</b></td>",
        escape(&lane.lane),
        lane.verdict
    );
    for verdict in Verdict::ALL {
        let n = lane.count(verdict);
        let _ = write!(
            out,
            "<td style=\"text-align:right;padding-right:12px\">{n}</td>"
        );
    }
    out.push_str("</tr></table>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_model_output_is_escaped() {
        let html = diff_table(
            "ok",
            "<script>alert('x')</script> & \"more\"",
            "baseline",
            "run <2>",
        );
        assert!(!html.contains("<script>"), "{html}");
        assert!(
            html.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"),
            "{html}"
        );
        assert!(html.contains("&amp; &quot;more&quot;"), "{html}");
        assert!(html.contains("run &lt;2&gt;"), "{html}");
    }

    #[test]
    fn changed_words_are_marked() {
        let html = diff_table("It is known.\n", "It is famous.\n", "a", "b");
        assert!(
            html.contains("<del style=\"font-weight:bold\">known.</del>"),
            "{html}"
        );
        assert!(
            html.contains("<ins style=\"font-weight:bold\">famous.</ins>"),
            "{html}"
        );
    }
}
