//! HTML for alerts and reports, built with `maud`: every value placed in markup is escaped by
//! the template itself, so model output, prompt ids and reasons can never become markup, and no
//! call site can forget to escape.
//!
//! Components here use inline styles only, because mail clients drop style sheets; the report
//! page ([`report`]) adds its own style sheet around them. Charts are inline SVG ([`chart`]).

pub mod chart;
pub mod report;

use maud::{DOCTYPE, Markup, html};

use crate::diff::{LineKind, hunks};
use crate::judge::{JudgedItem, JudgedLane};
use crate::report::{DIFFS_PER_ITEM, diff_labels};
use crate::verdict::Verdict;

/// Background of a changed line, and of the words that changed inside it.
const REMOVED: (&str, &str) = ("#ffeef0", "#fdb8c0");
const ADDED: (&str, &str) = ("#e6ffed", "#acf2bd");

/// Colour of a verdict, everywhere it is shown.
pub fn verdict_color(verdict: &str) -> &'static str {
    match verdict {
        "unchanged" => "#2da44e",
        "within_noise" => "#8fd19e",
        "drifted" => "#cf222e",
        "new" => "#54aeff",
        "stale" => "#d4a72c",
        "failed" => "#6e7781",
        _ => "#d0d7de",
    }
}

/// A diff side by side: the baseline on the left, the run on the right, line numbers, changed
/// words marked, and long lines wrapped rather than running off the page.
pub fn diff(old: &str, new: &str, old_label: &str, new_label: &str) -> Markup {
    let rows = side_by_side(old, new);
    let cell = "vertical-align:top;padding:1px 6px;white-space:pre-wrap;overflow-wrap:anywhere;word-break:break-word;width:50%";
    let number =
        "vertical-align:top;color:#8c959f;padding:1px 4px;text-align:right;user-select:none";
    html! {
        table class="diff" style="border-collapse:collapse;font-family:ui-monospace,monospace;font-size:12px;width:100%;table-layout:fixed;margin:6px 0" {
            colgroup { col style="width:3em"; col; col style="width:3em"; col; }
            tr {
                th colspan="2" style="text-align:left;color:#cf222e;font-weight:normal;padding:2px 6px" { "− " (old_label) }
                th colspan="2" style="text-align:left;color:#1a7f37;font-weight:normal;padding:2px 6px" { "+ " (new_label) }
            }
            @if rows.is_empty() {
                tr { td colspan="4" style="padding:2px 6px;color:#57606a" { "(no differences)" } }
            }
            @for row in &rows {
                @match row {
                    Row::Gap => {
                        tr { td colspan="4" style="color:#8c959f;padding:0 6px" { "⋯" } }
                    }
                    Row::Pair(left, right) => {
                        tr {
                            td style=(number) { @if let Some(side) = left { (side.number) } }
                            td style=(format!("{cell};background:{}", left.as_ref().map_or("#fff", |s| s.background))) {
                                @if let Some(side) = left { (segments(side)) }
                            }
                            td style=(number) { @if let Some(side) = right { (side.number) } }
                            td style=(format!("{cell};background:{}", right.as_ref().map_or("#fff", |s| s.background))) {
                                @if let Some(side) = right { (segments(side)) }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// One side of a row of a side-by-side diff.
struct Side {
    number: usize,
    background: &'static str,
    mark: &'static str,
    segments: Vec<(bool, String)>,
}

enum Row {
    /// Lines apart in the two texts, changed or not.
    Pair(Option<Side>, Option<Side>),
    /// Unchanged lines left out between two hunks.
    Gap,
}

fn segments(side: &Side) -> Markup {
    html! {
        @for (emphasised, text) in &side.segments {
            @if *emphasised {
                span style=(format!("background:{}", side.mark)) { (text) }
            } @else {
                (text)
            }
        }
    }
}

/// The hunks of `old` → `new` as rows: unchanged lines on both sides, and each run of removed
/// lines beside the run of added lines that replaced it.
fn side_by_side(old: &str, new: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    for (index, hunk) in hunks(old, new).iter().enumerate() {
        if index > 0 {
            rows.push(Row::Gap);
        }
        let mut removed: Vec<Side> = Vec::new();
        let mut added: Vec<Side> = Vec::new();
        let flush = |removed: &mut Vec<Side>, added: &mut Vec<Side>, rows: &mut Vec<Row>| {
            let len = removed.len().max(added.len());
            let mut left = removed.drain(..);
            let mut right = added.drain(..);
            for _ in 0..len {
                rows.push(Row::Pair(left.next(), right.next()));
            }
        };
        for line in hunk {
            match line.kind {
                LineKind::Same => {
                    flush(&mut removed, &mut added, &mut rows);
                    let side = |number: Option<usize>| Side {
                        number: number.unwrap_or(0),
                        background: "#fff",
                        mark: "#fff",
                        segments: line.segments.clone(),
                    };
                    rows.push(Row::Pair(Some(side(line.old)), Some(side(line.new))));
                }
                LineKind::Removed => removed.push(Side {
                    number: line.old.unwrap_or(0),
                    background: REMOVED.0,
                    mark: REMOVED.1,
                    segments: line.segments.clone(),
                }),
                LineKind::Added => added.push(Side {
                    number: line.new.unwrap_or(0),
                    background: ADDED.0,
                    mark: ADDED.1,
                    segments: line.segments.clone(),
                }),
            }
        }
        flush(&mut removed, &mut added, &mut rows);
    }
    rows
}

/// One judged item: heading, reasons, and each distinct run answer that is not the baseline's
/// beside the baseline answer closest to it (or the answer alone when there is no baseline).
pub fn item(lane: &str, item: &JudgedItem, run_id: i64) -> Markup {
    let j = &item.judgement;
    let first_output = item.samples.iter().find_map(|s| s.output.as_deref());
    let (pairs, more) = item.diff_pairs(DIFFS_PER_ITEM);
    html! {
        div class="item" style="margin:12px 0 18px" {
            h3 style="font-size:15px;margin:4px 0" {
                (lane) " / " (j.id) ": "
                span style=(format!("color:{}", verdict_color(j.verdict.as_str()))) { (j.verdict) }
                @if let Some(sim) = j.similarity { " (similarity " (format!("{sim:.2}")) ")" }
                @if let Some(p) = j.p_value { ", p = " (crate::drift::format_p(p)) }
                @if j.review { " [for review]" }
            }
            @if !j.reasons.is_empty() {
                ul style="margin:2px 0 6px;padding-left:20px" {
                    @for reason in &j.reasons { li { (reason) } }
                }
            }
            @if item.baseline.is_some() {
                @for pair in &pairs {
                    @let (old_label, new_label) = diff_labels(item, pair, run_id);
                    (diff(&pair.baseline.text, pair.output, &old_label, &new_label))
                }
                @if more > 0 {
                    p style="color:#57606a;margin:2px 0" { "(" (more) " more distinct answers not shown)" }
                }
            } @else if let Some(output) = first_output {
                pre style="white-space:pre-wrap;overflow-wrap:anywhere;background:#f6f8fa;padding:6px;margin:4px 0" { (output) }
            }
        }
    }
}

/// One lane's verdict and its counts per verdict, as a table.
pub fn lane_table(lane: &JudgedLane) -> Markup {
    let th = "text-align:left;padding:2px 12px 2px 0;font-weight:normal;color:#57606a";
    let td = "text-align:right;padding:2px 12px 2px 0";
    html! {
        table style="border-collapse:collapse;margin:6px 0" {
            tr {
                th style=(th) { "lane" }
                th style=(th) { "verdict" }
                @for verdict in Verdict::ALL { th style=(th) { (verdict) } }
                @if lane.test.is_some() { th style=(th) { "p" } }
            }
            tr {
                td style="padding:2px 12px 2px 0" { (lane.lane) }
                td style=(format!("padding:2px 12px 2px 0;font-weight:bold;color:{}", verdict_color(lane.verdict.as_str()))) { (lane.verdict) }
                @for verdict in Verdict::ALL { td style=(td) { (lane.count(verdict)) } }
                @if let Some(test) = &lane.test { td style=(td) { (crate::drift::format_p(test.p_value)) } }
            }
        }
    }
}

/// A whole HTML document around `body`, for an email.
pub fn email(body: Markup) -> String {
    html! {
        (DOCTYPE)
        html {
            head { meta charset="utf-8"; }
            body style="font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;font-size:14px;color:#1f2328" { (body) }
        }
    }
    .into_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_model_output_is_escaped() {
        let html = diff(
            "ok",
            "<script>alert('x')</script> & \"more\" <img src=x onerror=alert(1)>",
            "baseline",
            "run <2>",
        )
        .into_string();
        assert!(
            !html.contains("<script>") && !html.contains("<img"),
            "{html}"
        );
        assert!(html.contains("&lt;script&gt;"), "{html}");
        assert!(html.contains("&amp; &quot;more&quot;"), "{html}");
        assert!(html.contains("run &lt;2&gt;"), "{html}");
    }

    #[test]
    fn changed_words_are_marked_and_replaced_lines_sit_side_by_side() {
        let html = diff(
            "Same line.\nIt is known.\n",
            "Same line.\nIt is famous.\n",
            "a",
            "b",
        )
        .into_string();
        assert!(
            html.contains("<span style=\"background:#fdb8c0\">known.</span>"),
            "{html}"
        );
        assert!(
            html.contains("<span style=\"background:#acf2bd\">famous.</span>"),
            "{html}"
        );
        let rows = side_by_side("Same line.\nIt is known.\n", "Same line.\nIt is famous.\n");
        assert_eq!(rows.len(), 2, "the unchanged line, then the pair");
        assert!(matches!(&rows[1], Row::Pair(Some(l), Some(r)) if l.number == 2 && r.number == 2));
    }

    #[test]
    fn a_removed_line_without_a_replacement_leaves_the_right_side_empty() {
        let rows = side_by_side("a\nb\nc\n", "a\nc\n");
        assert!(
            rows.iter()
                .any(|r| matches!(r, Row::Pair(Some(l), None) if l.number == 2)),
            "b is gone"
        );
    }
}
