//! What device memory is for. A cell's role decides which tags are
//! resident: rollout keeps weights and KV cache, training keeps parameters,
//! optimizer state and gradients (SPEC 2.5 step 5).

use std::fmt;

/// A named region's purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tag {
    RolloutWeights,
    KvCache,
    TrainParams,
    OptimizerState,
    Gradients,
}

impl Tag {
    pub const ALL: [Tag; 5] = [
        Tag::RolloutWeights,
        Tag::KvCache,
        Tag::TrainParams,
        Tag::OptimizerState,
        Tag::Gradients,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Tag::RolloutWeights => "rollout_weights",
            Tag::KvCache => "kv_cache",
            Tag::TrainParams => "train_params",
            Tag::OptimizerState => "optimizer_state",
            Tag::Gradients => "gradients",
        }
    }

    /// Accepts the names above and SGLang's `weights` for rollout weights.
    pub fn parse(s: &str) -> Option<Tag> {
        match s {
            "weights" => Some(Tag::RolloutWeights),
            _ => Tag::ALL.into_iter().find(|t| t.name() == s),
        }
    }

    pub fn role(self) -> Role {
        match self {
            Tag::RolloutWeights | Tag::KvCache => Role::Rollout,
            _ => Role::Training,
        }
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The two roles a cell switches between.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    Rollout,
    Training,
}

impl Role {
    pub fn tags(self) -> &'static [Tag] {
        match self {
            Role::Rollout => &[Tag::RolloutWeights, Tag::KvCache],
            Role::Training => &[Tag::TrainParams, Tag::OptimizerState, Tag::Gradients],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_roles_partition_tags() {
        for t in Tag::ALL {
            assert_eq!(Tag::parse(t.name()), Some(t));
            assert!(t.role().tags().contains(&t));
        }
        assert_eq!(Tag::parse("weights"), Some(Tag::RolloutWeights));
        assert_eq!(Tag::parse("nope"), None);
    }
}
