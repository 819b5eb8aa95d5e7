//! Baseline-versus-output diffs in the style of `cargo insta`: old and new line numbers, a few
//! lines of context, and the changed words emphasised inside changed lines.
//!
//! The diff is computed once into [`Hunk`]s so the terminal, the email and the HTML report all
//! show the same thing. Patience diff with a deadline keeps huge outputs bounded in time.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use console::Style;
use similar::{Algorithm, ChangeTag, TextDiff};

/// Lines of unchanged context around each change.
pub const CONTEXT_LINES: usize = 3;
/// The whole diff (lines and the words inside them) must be computed within this.
const TIME_LIMIT: Duration = Duration::from_secs(1);

/// What a diff line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineKind {
    /// The same on both sides.
    Same,
    /// Only in the baseline.
    Removed,
    /// Only in the output.
    Added,
}

/// One line of a diff, split into runs of text that are or are not emphasised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiffLine {
    /// Line number in the baseline (1-based).
    pub old: Option<usize>,
    /// Line number in the output (1-based).
    pub new: Option<usize>,
    /// What the line is.
    pub kind: LineKind,
    /// `(emphasised, text)` runs, without the trailing newline.
    pub segments: Vec<(bool, String)>,
}

/// A run of changed lines with their context.
pub type Hunk = Vec<DiffLine>;

/// Computes the hunks of `old` → `new`.
pub fn hunks(old: &str, new: &str) -> Vec<Hunk> {
    let deadline = Instant::now() + TIME_LIMIT;
    let diff = TextDiff::configure()
        .algorithm(Algorithm::Patience)
        .deadline(deadline)
        .diff_lines(old, new);
    diff.grouped_ops(CONTEXT_LINES)
        .iter()
        .map(|group| {
            group
                .iter()
                .flat_map(|op| diff.iter_inline_changes_deadline(op, Some(deadline)))
                .map(|change| DiffLine {
                    old: change.old_index().map(|i| i + 1),
                    new: change.new_index().map(|i| i + 1),
                    kind: match change.tag() {
                        ChangeTag::Equal => LineKind::Same,
                        ChangeTag::Delete => LineKind::Removed,
                        ChangeTag::Insert => LineKind::Added,
                    },
                    segments: change
                        .iter_strings_lossy()
                        .map(|(emphasised, text)| {
                            (emphasised, text.trim_end_matches(['\n', '\r']).to_string())
                        })
                        .filter(|(_, text)| !text.is_empty())
                        .collect(),
                })
                .collect()
        })
        .collect()
}

/// Renders a diff for a terminal or a log, with colour when `color` is on.
///
/// `old_label` and `new_label` name the two sides (`baseline (run 4)`, `run 9`).
pub fn render_text(old: &str, new: &str, old_label: &str, new_label: &str, color: bool) -> String {
    let style = |s: Style| s.force_styling(color);
    let dim = style(Style::new().dim());
    let red = style(Style::new().red());
    let green = style(Style::new().green());
    let red_em = style(Style::new().red().underlined().bold());
    let green_em = style(Style::new().green().underlined().bold());
    let width = 10;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}",
        red.apply_to(format!("{:width$} -{old_label}", ""))
    );
    let _ = writeln!(
        out,
        "{}",
        green.apply_to(format!("{:width$} +{new_label}", ""))
    );
    let rule = "─".repeat(width + 1);
    let _ = writeln!(
        out,
        "{}",
        dim.apply_to(format!("{rule}┬{}", "─".repeat(40)))
    );
    let hunks = hunks(old, new);
    if hunks.is_empty() {
        let _ = writeln!(out, "{:width$} │ {}", "", dim.apply_to("(no differences)"));
    }
    for (index, hunk) in hunks.iter().enumerate() {
        if index > 0 {
            let _ = writeln!(
                out,
                "{}",
                dim.apply_to(format!("{}┼{}", "┈".repeat(width + 1), "┈".repeat(40)))
            );
        }
        for line in hunk {
            let number = |n: Option<usize>| n.map_or(String::new(), |n| n.to_string());
            let gutter = dim.apply_to(format!("{:>5}{:>5} │", number(line.old), number(line.new)));
            let (sign, plain, emphasis) = match line.kind {
                LineKind::Same => (" ", &dim, &dim),
                LineKind::Removed => ("-", &red, &red_em),
                LineKind::Added => ("+", &green, &green_em),
            };
            let _ = write!(out, "{gutter}{}", plain.apply_to(sign));
            for (emphasised, text) in &line.segments {
                let chosen = if *emphasised { emphasis } else { plain };
                let _ = write!(out, "{}", chosen.apply_to(text));
            }
            out.push('\n');
        }
    }
    let _ = writeln!(
        out,
        "{}",
        dim.apply_to(format!("{rule}┴{}", "─".repeat(40)))
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changed_words_are_emphasised_inside_changed_lines() {
        let hunks = hunks("The capital is Paris.\n", "The capital is Lyon.\n");
        let removed = &hunks[0][0];
        assert_eq!(removed.kind, LineKind::Removed);
        assert!(
            removed.segments.contains(&(true, "Paris.".into())),
            "{removed:?}"
        );
        let added = &hunks[0][1];
        assert!(
            added.segments.contains(&(true, "Lyon.".into())),
            "{added:?}"
        );
        assert!(
            added.segments.contains(&(false, "The capital is ".into())),
            "{added:?}"
        );
    }

    #[test]
    fn far_apart_changes_make_separate_hunks_with_context() {
        let old: String = (1..=20).map(|i| format!("line {i}\n")).collect();
        let new = old
            .replace("line 2\n", "line two\n")
            .replace("line 18\n", "line eighteen\n");
        let hunks = hunks(&old, &new);
        assert_eq!(hunks.len(), 2);
        assert_eq!(hunks[0].first().unwrap().old, Some(1));
        assert_eq!(hunks[1].last().unwrap().old, Some(20));
    }

    #[test]
    fn huge_outputs_render_in_bounded_time() {
        let old: String = (0..20_000).map(|i| format!("{i} alpha beta\n")).collect();
        let new: String = (0..20_000)
            .map(|i| format!("{} beta alpha\n", i * 7 % 20_000))
            .collect();
        let start = Instant::now();
        let text = render_text(&old, &new, "baseline", "run", false);
        assert!(!text.is_empty());
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
    }
}
