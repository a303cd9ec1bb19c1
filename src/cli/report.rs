//! How a failed command's error reaches the user: its message, then each
//! cause the message does not already say. Many of Gyre's error types show
//! their source in their own message (so a log line of one error is whole)
//! and also return it as `source()`, so printing the full chain as anyhow
//! does would print those causes twice.

use std::fmt::Write;

/// The error and the causes its messages do not already include, as
/// anyhow lays them out (`Error: …`, then `Caused by:` and one indented
/// cause a line).
pub fn report(e: &anyhow::Error) -> String {
    let mut shown: Vec<String> = Vec::new();
    let mut said = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        let trimmed = text.trim();
        if !shown.is_empty() && (trimmed.is_empty() || said.contains(trimmed)) {
            continue;
        }
        said.push_str(&text);
        said.push('\n');
        shown.push(text);
    }
    let mut out = format!("Error: {}", shown.first().map_or("", |s| s.trim_end()));
    if shown.len() > 1 {
        out.push_str("\n\nCaused by:");
        for cause in &shown[1..] {
            for (i, line) in cause.trim_end().lines().enumerate() {
                let lead = if i == 0 { "    " } else { "      " };
                let _ = write!(out, "\n{lead}{line}");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("configuration: {0}")]
    struct Wrapper(#[from] std::io::Error);

    #[test]
    fn a_cause_the_message_already_says_is_not_repeated() {
        let io = std::io::Error::other("no such table `x`");
        let e = anyhow::Error::new(Wrapper(io)).context("reading run.toml");
        assert_eq!(
            report(&e),
            "Error: reading run.toml\n\nCaused by:\n    configuration: no such table `x`"
        );
    }

    #[test]
    fn every_cause_not_yet_said_is_shown_in_order() {
        let e = anyhow::anyhow!("no space left")
            .context("writing the checkpoint")
            .context("step 3");
        assert_eq!(
            report(&e),
            "Error: step 3\n\nCaused by:\n    writing the checkpoint\n    no space left"
        );
        assert_eq!(report(&anyhow::anyhow!("alone")), "Error: alone");
    }

    #[test]
    fn a_cause_of_several_lines_is_indented_under_its_first() {
        let e = anyhow::anyhow!("invalid type\nin `sched.cells`\n").context("configuration c.toml");
        assert_eq!(
            report(&e),
            "Error: configuration c.toml\n\nCaused by:\n    invalid type\n      in `sched.cells`"
        );
    }
}
