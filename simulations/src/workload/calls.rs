//! The context of one execution as its model calls grow it: counts only.
//!
//! Before every call after the first, tool results and new instructions are
//! appended; when the prompt would pass the context limit the harness
//! compacts it into a summary first, so the prompt drops and the engine's
//! cached prefix no longer matches. Every sampled output is appended too.
//! Lifetime tokens count everything that ever entered the context.

use rand::Rng;

use super::WorkloadModel;

/// Draws uniformly from an inclusive `[min, max]`.
pub fn draw(range: [u64; 2], rng: &mut impl Rng) -> u64 {
    let (lo, hi) = (range[0].min(range[1]), range[0].max(range[1]));
    rng.random_range(lo..=hi)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Context {
    /// Tokens in the context now.
    pub tokens: u64,
    /// Tokens that ever entered it.
    pub lifetime: u64,
    pub compactions: u32,
    pub calls: u32,
    /// Largest prompt sent.
    pub peak: u64,
}

impl Context {
    pub fn start(model: &WorkloadModel, rng: &mut impl Rng) -> Self {
        let t = draw(model.first_prompt_tokens, rng);
        Self {
            tokens: t,
            lifetime: t,
            ..Self::default()
        }
    }

    /// The prompt of the next call, compacting first if it would not fit.
    pub fn next_prompt(&mut self, model: &WorkloadModel, rng: &mut impl Rng) -> u64 {
        if self.calls > 0 {
            let growth = draw(model.growth_tokens, rng);
            if self.tokens + growth > model.context_limit_tokens {
                self.tokens = draw(model.compacted_tokens, rng);
                self.compactions += 1;
            }
            self.tokens += growth;
            self.lifetime += growth;
        }
        self.calls += 1;
        self.peak = self.peak.max(self.tokens);
        self.tokens
    }

    /// The model's answer joins the context.
    pub fn answered(&mut self, output_tokens: u64) {
        self.tokens += output_tokens;
        self.lifetime += output_tokens;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::tests::model;
    use rand::SeedableRng;

    #[test]
    fn contexts_grow_and_compaction_keeps_them_under_the_limit() {
        let m = model();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let mut c = Context::start(&m, &mut rng);
        let first = c.tokens;
        let mut last = 0;
        for i in 0..400 {
            let p = c.next_prompt(&m, &mut rng);
            if i == 0 {
                assert_eq!(p, first);
            }
            assert!(p <= m.context_limit_tokens, "{p}");
            c.answered(draw(m.output_tokens, &mut rng));
            last = p;
        }
        assert!(c.compactions >= 2, "{c:?}");
        assert!(c.lifetime > 400 * m.growth_tokens[0]);
        assert!(c.lifetime > c.peak && c.peak >= last);
        assert_eq!(c.calls, 400);
    }
}
