//! `canary init`: a new canary project in one command.

use std::path::Path;

use anyhow::Context;

use super::EXIT_OK;
use crate::cli::InitArgs;

/// The starter files, shipped inside the binary.
const FILES: [(&str, &str); 6] = [
    ("canary.yaml", include_str!("../../canary.example.yaml")),
    (
        "prompts/facts.yaml",
        include_str!("../../prompts/facts.yaml"),
    ),
    (
        "prompts/format.yaml",
        include_str!("../../prompts/format.yaml"),
    ),
    (
        "prompts/judgement.yaml",
        include_str!("../../prompts/judgement.yaml"),
    ),
    (
        "prompts/language.yaml",
        include_str!("../../prompts/language.yaml"),
    ),
    ("snapshots/.gitkeep", ""),
];

/// Runs `canary init`.
pub fn run(args: &InitArgs) -> anyhow::Result<i32> {
    let dir = &args.dir;
    let mut written = 0;
    for (name, text) in FILES {
        let path = dir.join(name);
        if path.exists() {
            println!("kept     {} (already there)", path.display());
            continue;
        }
        write(&path, text)?;
        written += 1;
        println!("created  {}", path.display());
    }
    ensure_line(
        &dir.join(".gitignore"),
        ".canary/",
        ".canary/ holds the store, audit log and lock",
    )?;
    ensure_line(
        &dir.join(".gitattributes"),
        "*.snap -text",
        "baselines are compared byte for byte: git must not convert their line endings",
    )?;
    println!(
        "\n{written} files created. Next: edit {} (lanes, keys' env var names), then\n  canary check --probe\n  canary run\n  canary accept",
        dir.join("canary.yaml").display()
    );
    Ok(EXIT_OK)
}

/// Appends `line` to the file at `path` unless it already has it.
fn ensure_line(path: &Path, line: &str, why: &str) -> anyhow::Result<()> {
    let existing = std::fs::read_to_string(path).unwrap_or_default();
    if existing.lines().any(|l| l.trim() == line) {
        return Ok(());
    }
    let mut text = existing;
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(line);
    text.push('\n');
    write(path, &text)?;
    println!("updated  {} ({why})", path.display());
    Ok(())
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}
