//! The GPU-seconds per token a request is charged when it is dispatched,
//! learned per pool and per concurrency class from settled requests.
//!
//! A request's GPU-seconds are its time share of its backend: a token
//! costs a whole engine step when the request runs alone and a fraction of
//! one in a full batch. One average over all loads charges a burst at the
//! price learned while the pool was quiet (replay, reference scenario:
//! p99 of 7–11× the settled cost under `drf`). So the model keeps one
//! average per class of in-flight requests on the backend at dispatch
//! (1, 2–3, 4–7, …, 128 and more); a class not yet seen borrows the
//! nearest learned one, scaled by the concurrency (a token's share falls
//! as 1/n), and with none learned the pool's overall average stands in.
//! Each sample moves its class by a tenth, and by at most a factor of 4,
//! so one odd request cannot swing the charges of the next.

/// Concurrency classes: in flight 1, 2–3, 4–7, …, 128 and more.
const CLASSES: usize = 8;

/// How far one sample may pull its class's average, as a factor.
const MAX_STEP: f64 = 4.0;

#[derive(Clone, Debug, Default)]
pub(super) struct GpuCostModel {
    per_token: [Option<f64>; CLASSES],
}

/// The class of `in_flight` requests on a backend (this one included).
pub(super) fn class(in_flight: u32) -> u8 {
    let log2 = 31 - in_flight.max(1).leading_zeros();
    log2.min(CLASSES as u32 - 1) as u8
}

impl GpuCostModel {
    /// GPU-seconds per token for a request dispatched in `class`;
    /// `prior` when no class has been learned yet.
    pub(super) fn per_token(&self, class: u8, prior: f64) -> f64 {
        let c = usize::from(class).min(CLASSES - 1);
        (0..CLASSES)
            .filter_map(|k| self.per_token[k].map(|v| (k, v)))
            .min_by_key(|(k, _)| k.abs_diff(c))
            .map_or(prior, |(k, v)| v * 2f64.powi(k as i32 - c as i32))
    }

    /// Learns from a settled request dispatched in `class`.
    pub(super) fn learn(&mut self, class: u8, sample: f64) {
        if !sample.is_finite() || sample <= 0.0 {
            return;
        }
        let c = usize::from(class).min(CLASSES - 1);
        self.per_token[c] = Some(match self.per_token[c] {
            None => sample,
            Some(v) => 0.9 * v + 0.1 * sample.clamp(v / MAX_STEP, v * MAX_STEP),
        });
    }
}

/// How many output tokens a tenant's requests produce, learned from its
/// settled requests: the share of `max_tokens` they use, and the tokens of
/// those sent without it. A request's output is estimated from these
/// rather than from `max_tokens` alone (which clients set to a ceiling:
/// the reference workload's tenants use a half to two thirds of it),
/// starting
/// from the prior that it uses all of it (or
/// [`super::DEFAULT_OUTPUT_ESTIMATE`]). Each sample moves an average by a
/// tenth.
#[derive(Clone, Debug)]
pub(super) struct OutputModel {
    /// Output tokens over `max_tokens`, for requests with `max_tokens`.
    share: f64,
    /// Output tokens of requests without `max_tokens`.
    tokens: f64,
}

impl Default for OutputModel {
    fn default() -> Self {
        OutputModel {
            share: 1.0,
            tokens: f64::from(super::DEFAULT_OUTPUT_ESTIMATE),
        }
    }
}

impl OutputModel {
    /// Estimated output tokens of a request asking for at most
    /// `max_tokens` (at least 1, at most `max_tokens`).
    pub(super) fn estimate(&self, max_tokens: Option<u32>) -> u32 {
        match max_tokens {
            Some(m) => ((f64::from(m) * self.share).round() as u32).clamp(1.min(m), m),
            None => (self.tokens.round() as u32).max(1),
        }
    }

    /// Learns from a request that asked for `max_tokens` and produced
    /// `output` tokens.
    pub(super) fn learn(&mut self, max_tokens: Option<u32>, output: u32) {
        match max_tokens {
            Some(m) if m > 0 => {
                let sample = (f64::from(output) / f64::from(m)).min(1.0);
                self.share = 0.9 * self.share + 0.1 * sample;
            }
            Some(_) => {}
            None => self.tokens = 0.9 * self.tokens + 0.1 * f64::from(output),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_estimated_from_the_share_of_max_tokens_a_tenant_uses() {
        let mut m = OutputModel::default();
        assert_eq!(m.estimate(Some(200)), 200, "the prior: all of it");
        assert_eq!(m.estimate(None), super::super::DEFAULT_OUTPUT_ESTIMATE);
        for _ in 0..100 {
            m.learn(Some(200), 100);
            m.learn(None, 40);
        }
        assert_eq!(m.estimate(Some(200)), 100);
        assert_eq!(m.estimate(Some(1000)), 500);
        assert_eq!(m.estimate(None), 40);
        // One sample moves it by a tenth; never beyond max_tokens.
        m.learn(Some(100), 1_000_000);
        assert_eq!(m.estimate(Some(1000)), 550);
        assert_eq!(m.estimate(Some(0)), 0);
    }

    #[test]
    fn classes_are_powers_of_two() {
        let got: Vec<u8> = [0, 1, 2, 3, 4, 7, 8, 127, 128, 5000]
            .iter()
            .map(|n| class(*n))
            .collect();
        assert_eq!(got, [0, 0, 1, 1, 2, 2, 3, 6, 7, 7]);
    }

    #[test]
    fn an_unseen_class_borrows_the_nearest_scaled_by_concurrency() {
        let mut m = GpuCostModel::default();
        assert_eq!(m.per_token(3, 0.5), 0.5);
        m.learn(0, 0.008);
        // Eight times the concurrency: an eighth of the price per token.
        assert!((m.per_token(3, 0.5) - 0.001).abs() < 1e-12);
        m.learn(3, 0.002);
        assert_eq!(m.per_token(3, 0.5), 0.002);
        assert_eq!(m.per_token(0, 0.5), 0.008);
    }

    #[test]
    fn a_sample_moves_its_class_by_a_tenth_and_by_at_most_a_factor_of_four() {
        let mut m = GpuCostModel::default();
        m.learn(2, 1.0);
        m.learn(2, 2.0);
        assert!((m.per_token(2, 0.0) - 1.1).abs() < 1e-12);
        m.learn(2, 1e6);
        // Clamped to 4 × 1.1 before it is averaged in.
        assert!((m.per_token(2, 0.0) - (0.9 * 1.1 + 0.1 * 4.4)).abs() < 1e-12);
        m.learn(2, f64::NAN);
        m.learn(2, -1.0);
        assert!((m.per_token(2, 0.0) - (0.9 * 1.1 + 0.1 * 4.4)).abs() < 1e-12);
    }
}
