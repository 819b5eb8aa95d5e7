//! Rendered diffs, pinned as snapshots: a change to how a diff looks shows up in review.

use canary::diff::render_text;

const BASELINE: &str = "The capital of France is Paris.\n\
It is known for the Eiffel Tower.\n\
Paris has about two million people.\n\
The Seine runs through it.\n\
Its museums include the Louvre.\n\
French is the official language.\n\
The city hosted the 2024 Olympics.\n";

fn reworded() -> String {
    BASELINE
        .replace("known for the Eiffel Tower", "famous for the Eiffel Tower")
        .replace(
            "hosted the 2024 Olympics",
            "hosted the Summer Olympics in 2024",
        )
}

#[test]
fn a_reworded_answer_renders_with_line_numbers_and_context() {
    insta::assert_snapshot!(render_text(
        BASELINE,
        &reworded(),
        "baseline (run 1)",
        "run 2 sample 0",
        false
    ));
}

#[test]
fn changed_words_are_emphasised_in_colour() {
    let text = render_text(BASELINE, &reworded(), "baseline", "run 2", true);
    insta::assert_snapshot!(text.escape_debug().to_string().replace("\\n", "\n"));
}

#[test]
fn a_one_line_answer_that_flipped() {
    insta::assert_snapshot!(render_text(
        "Yes.",
        "No, 17077 is not prime.",
        "baseline",
        "run 3",
        false
    ));
}

#[test]
fn identical_texts_say_so() {
    insta::assert_snapshot!(render_text("same\n", "same\n", "baseline", "run 4", false));
}
