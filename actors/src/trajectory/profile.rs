//! Harness profiles: which priority class each candidate leaf belongs to
//! (SPEC 3.5).
//!
//! A profile is data, not code: a [`ProfileConfig`] lists the classes in
//! priority order and first-match rules over what a leaf looks like (tokens
//! near the start of its root's system prompt, tokens just before its output,
//! its agent thread). Users adapt a profile to their harness and tokenizer by
//! editing JSON, not by forking. A call's recorded `role`, when present,
//! overrides the rules for the leaf it produces. [`HarnessProfile`] is the
//! trait for anything that classifies; [`RuleProfile`] is the data-driven one.

use serde::{Deserialize, Serialize};

use super::tree::{NodeId, TrajectoryTree};

/// Index into a profile's class list; 0 is the highest priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ClassId(pub u16);

/// What a profile may look at when classifying one leaf.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeafView<'a> {
    /// Role recorded with the call that produced the leaf.
    pub role: Option<&'a str>,
    pub thread: Option<&'a str>,
    /// The first tokens of the root-to-leaf path (the system prompt).
    pub head: &'a [u32],
    /// The last context tokens before the leaf call's output.
    pub tail: &'a [u32],
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    #[error("profile {profile}: {problem}")]
    Invalid { profile: String, problem: String },
    #[error("profile {profile} has no class named {role:?} (classes: {classes})")]
    UnknownRole {
        profile: String,
        role: String,
        classes: String,
    },
}

/// Classifies leaves into priority classes.
pub trait HarnessProfile {
    fn name(&self) -> &str;
    /// Class names, highest priority first.
    fn classes(&self) -> &[String];
    /// How many path tokens `head` and `tail` should hold.
    fn windows(&self) -> (usize, usize);
    fn classify(&self, leaf: &LeafView<'_>) -> Result<ClassId, ProfileError>;

    fn class_by_name(&self, name: &str) -> Option<ClassId> {
        self.classes()
            .iter()
            .position(|c| c == name)
            .map(|i| ClassId(i as u16))
    }
}

/// A test on a leaf; compose with `all`, `any`, `not`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Condition {
    Always,
    /// The token sequence occurs in the head window (the system prompt).
    HeadContains(Vec<u32>),
    /// The token sequence occurs in the tail window (e.g. a compaction
    /// instruction just before the output).
    TailContains(Vec<u32>),
    Thread(String),
    ThreadPrefix(String),
    HasThread,
    All(Vec<Condition>),
    Any(Vec<Condition>),
    Not(Box<Condition>),
}

fn contains(hay: &[u32], needle: &[u32]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

impl Condition {
    pub fn matches(&self, leaf: &LeafView<'_>) -> bool {
        match self {
            Condition::Always => true,
            Condition::HeadContains(m) => contains(leaf.head, m),
            Condition::TailContains(m) => contains(leaf.tail, m),
            Condition::Thread(t) => leaf.thread == Some(t.as_str()),
            Condition::ThreadPrefix(p) => leaf.thread.is_some_and(|t| t.starts_with(p.as_str())),
            Condition::HasThread => leaf.thread.is_some(),
            Condition::All(cs) => cs.iter().all(|c| c.matches(leaf)),
            Condition::Any(cs) => cs.iter().any(|c| c.matches(leaf)),
            Condition::Not(c) => !c.matches(leaf),
        }
    }

    fn check(&self) -> Result<(), String> {
        match self {
            Condition::HeadContains(m) | Condition::TailContains(m) if m.is_empty() => {
                Err("an empty token marker matches nothing".into())
            }
            Condition::All(cs) | Condition::Any(cs) => cs.iter().try_for_each(Condition::check),
            Condition::Not(c) => c.check(),
            _ => Ok(()),
        }
    }
}

/// One rule: leaves matching `when` belong to `class`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassRule {
    pub class: String,
    pub when: Condition,
}

fn default_head_window() -> usize {
    4096
}

fn default_tail_window() -> usize {
    512
}

/// A profile as data. Rules are tried in order, first match wins, otherwise
/// `default_class`; `classes` gives the priority order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileConfig {
    pub name: String,
    pub classes: Vec<String>,
    pub rules: Vec<ClassRule>,
    pub default_class: String,
    #[serde(default = "default_head_window")]
    pub head_window: usize,
    #[serde(default = "default_tail_window")]
    pub tail_window: usize,
}

/// Class names of the Claude-Code-like profile, in priority order (SPEC (4)).
pub const CLAUDE_CODE_CLASSES: [&str; 4] =
    ["main", "main-summary", "sub-agent", "sub-agent-summary"];

impl ProfileConfig {
    /// Claude Code: the main agent is recognised by a marker in its system
    /// prompt, compaction requests by a marker in the instruction that ends
    /// their context; everything else is a sub-agent.
    pub fn claude_code(main_system_marker: Vec<u32>, compaction_marker: Vec<u32>) -> Self {
        let main = Condition::HeadContains(main_system_marker);
        Self::claude_code_with(main, Some(Condition::TailContains(compaction_marker)))
    }

    /// Claude Code for traces that name the main agent's thread instead of
    /// carrying tokens a marker could match: thread `main` (or no thread at
    /// all) is the main agent; summaries only through recorded roles or the
    /// optional compaction marker.
    pub fn claude_code_by_thread(compaction_marker: Option<Vec<u32>>) -> Self {
        let main = Condition::Any(vec![
            Condition::Thread("main".into()),
            Condition::Not(Box::new(Condition::HasThread)),
        ]);
        Self::claude_code_with(main, compaction_marker.map(Condition::TailContains))
    }

    fn claude_code_with(main: Condition, compaction: Option<Condition>) -> Self {
        let mut rules = Vec::new();
        if let Some(c) = &compaction {
            rules.push(ClassRule {
                class: "main-summary".into(),
                when: Condition::All(vec![main.clone(), c.clone()]),
            });
        }
        rules.push(ClassRule {
            class: "main".into(),
            when: main,
        });
        if let Some(c) = compaction {
            rules.push(ClassRule {
                class: "sub-agent-summary".into(),
                when: c,
            });
        }
        ProfileConfig {
            name: "claude-code".into(),
            classes: CLAUDE_CODE_CLASSES.iter().map(|s| s.to_string()).collect(),
            rules,
            default_class: "sub-agent".into(),
            head_window: default_head_window(),
            tail_window: default_tail_window(),
        }
    }

    /// One agent: its turns, and (with a marker) its compaction summaries.
    pub fn generic(compaction_marker: Option<Vec<u32>>) -> Self {
        let rules = compaction_marker
            .map(|m| ClassRule {
                class: "agent-summary".into(),
                when: Condition::TailContains(m),
            })
            .into_iter()
            .collect();
        ProfileConfig {
            name: "generic".into(),
            classes: vec!["agent".into(), "agent-summary".into()],
            rules,
            default_class: "agent".into(),
            head_window: default_head_window(),
            tail_window: default_tail_window(),
        }
    }
}

/// The data-driven profile, validated.
#[derive(Clone, Debug)]
pub struct RuleProfile {
    config: ProfileConfig,
    rules: Vec<(ClassId, Condition)>,
    default_class: ClassId,
}

impl RuleProfile {
    pub fn new(config: ProfileConfig) -> Result<Self, ProfileError> {
        let invalid = |problem: String| ProfileError::Invalid {
            profile: config.name.clone(),
            problem,
        };
        if config.classes.is_empty() || config.classes.len() > usize::from(u16::MAX) {
            return Err(invalid("needs between 1 and 65535 classes".into()));
        }
        for (i, c) in config.classes.iter().enumerate() {
            if config.classes[..i].contains(c) {
                return Err(invalid(format!("class {c:?} is listed twice")));
            }
        }
        let id = |name: &str| {
            config
                .classes
                .iter()
                .position(|c| c == name)
                .map(|i| ClassId(i as u16))
                .ok_or_else(|| invalid(format!("rule names unknown class {name:?}")))
        };
        let mut rules = Vec::new();
        for r in &config.rules {
            r.when.check().map_err(&invalid)?;
            rules.push((id(&r.class)?, r.when.clone()));
        }
        let default_class = id(&config.default_class)?;
        Ok(RuleProfile {
            config,
            rules,
            default_class,
        })
    }

    pub fn config(&self) -> &ProfileConfig {
        &self.config
    }
}

impl HarnessProfile for RuleProfile {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn classes(&self) -> &[String] {
        &self.config.classes
    }

    fn windows(&self) -> (usize, usize) {
        (self.config.head_window, self.config.tail_window)
    }

    fn classify(&self, leaf: &LeafView<'_>) -> Result<ClassId, ProfileError> {
        if let Some(role) = leaf.role {
            return self
                .class_by_name(role)
                .ok_or_else(|| ProfileError::UnknownRole {
                    profile: self.config.name.clone(),
                    role: role.to_string(),
                    classes: self.config.classes.join(", "),
                });
        }
        Ok(self
            .rules
            .iter()
            .find(|(_, c)| c.matches(leaf))
            .map_or(self.default_class, |(id, _)| *id))
    }
}

/// A leaf and its class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LeafClass {
    pub leaf: NodeId,
    pub class: ClassId,
}

/// Classifies every leaf of `tree`, in [`TrajectoryTree::leaves`] order.
pub fn classify_leaves(
    tree: &TrajectoryTree,
    profile: &dyn HarnessProfile,
) -> Result<Vec<LeafClass>, ProfileError> {
    let (head_n, tail_n) = profile.windows();
    tree.leaves()
        .into_iter()
        .map(|leaf| {
            let meta = tree.call(tree.creator(leaf));
            let head = tree.head_tokens(leaf, head_n);
            let tail = tree.tail_tokens(meta.input_end, tail_n);
            let view = LeafView {
                role: meta.role.as_deref(),
                thread: meta.thread.as_deref(),
                head: &head,
                tail: &tail,
            };
            Ok(LeafClass {
                leaf,
                class: profile.classify(&view)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view<'a>(head: &'a [u32], tail: &'a [u32], thread: Option<&'a str>) -> LeafView<'a> {
        LeafView {
            role: None,
            thread,
            head,
            tail,
        }
    }

    #[test]
    fn claude_code_classes_by_markers() {
        let p = RuleProfile::new(ProfileConfig::claude_code(vec![7, 8], vec![9, 9])).unwrap();
        let main = [1, 7, 8, 2];
        let sub = [1, 6, 2];
        assert_eq!(p.classify(&view(&main, &[3], None)).unwrap(), ClassId(0));
        assert_eq!(
            p.classify(&view(&main, &[9, 9, 4], None)).unwrap(),
            ClassId(1)
        );
        assert_eq!(p.classify(&view(&sub, &[3], None)).unwrap(), ClassId(2));
        assert_eq!(
            p.classify(&view(&sub, &[4, 9, 9], None)).unwrap(),
            ClassId(3)
        );
    }

    #[test]
    fn role_overrides_and_unknown_roles_fail() {
        let p = RuleProfile::new(ProfileConfig::claude_code_by_thread(None)).unwrap();
        let mut v = view(&[1], &[2], Some("worker-1"));
        assert_eq!(p.classify(&v).unwrap(), ClassId(2));
        v.thread = None;
        assert_eq!(p.classify(&v).unwrap(), ClassId(0));
        v.role = Some("sub-agent-summary");
        assert_eq!(p.classify(&v).unwrap(), ClassId(3));
        v.role = Some("critic");
        assert!(matches!(
            p.classify(&v),
            Err(ProfileError::UnknownRole { .. })
        ));
    }

    #[test]
    fn profiles_round_trip_as_json_and_are_validated() {
        let cfg = ProfileConfig::claude_code(vec![7], vec![9]);
        let json = serde_json::to_string(&cfg).unwrap();
        let back: ProfileConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(back, cfg);
        let mut bad = ProfileConfig::generic(None);
        bad.default_class = "nope".into();
        assert!(RuleProfile::new(bad).is_err());
        let mut bad = ProfileConfig::generic(None);
        bad.classes.push("agent".into());
        assert!(RuleProfile::new(bad).is_err());
        assert!(RuleProfile::new(ProfileConfig::generic(Some(vec![]))).is_err());
    }
}
