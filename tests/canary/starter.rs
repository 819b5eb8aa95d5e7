//! The prompt set canary ships: it loads, covers the drift axes, and every prompt is checked.

use canary::checks::Check;
use canary::prompts::PromptSet;

#[test]
fn the_shipped_prompt_set_loads_and_every_prompt_has_checks() {
    let set =
        PromptSet::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("prompts")).unwrap();
    assert!(set.prompts.len() >= 12, "{} prompts", set.prompts.len());
    for prompt in &set.prompts {
        assert!(!prompt.checks.is_empty(), "{} has no checks", prompt.id);
        assert_eq!(
            prompt.request.params.temperature,
            Some(0.0),
            "{} is pinned at temperature 0",
            prompt.id
        );
    }
    let has = |f: fn(&Check) -> bool| set.prompts.iter().any(|p| p.checks.iter().any(f));
    assert!(
        has(|c| matches!(c, Check::Answer(_))),
        "an extracted answer"
    );
    assert!(has(|c| matches!(c, Check::Json(true))), "strict JSON");
    assert!(
        has(|c| matches!(c, Check::Refuses(true))),
        "a request that should be declined"
    );
    assert!(has(|c| matches!(c, Check::MaxWords(_))), "a length limit");
}
