//! What a request costs in the fair queue.
//!
//! - `drf`: its dominant share (Ghodsi et al., "Dominant Resource Fairness",
//!   NSDI 2011) of the pool: the larger of its KV share (`prompt + output`
//!   tokens over the pool's KV capacity in tokens) and its compute share
//!   (GPU-seconds over the pool's GPUs, i.e. the fraction of one second of
//!   the whole pool). Long-context tenants pay for memory, heavy generators
//!   for compute.
//! - `wfq`: tokens, `prompt + output_token_weight × output`.
//! - `fifo`, `priority`: no counters; cost is irrelevant (returns tokens).
//!
//! The same function prices the estimate at dispatch (output = `max_tokens`,
//! GPU-seconds from the pool's running per-token average) and the actual
//! usage at completion (output = completion tokens, measured GPU-seconds).

use crate::core::spec::Discipline;

/// The pool capacity that shares are taken of.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolCapacity {
    /// KV capacity of the pool in tokens (sum over its backends).
    pub kv_tokens: f64,
    /// GPUs in the pool (GPU-seconds per second).
    pub gpus: f64,
}

/// One request's size, estimated or measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Work {
    pub prompt_tokens: f64,
    pub output_tokens: f64,
    pub gpu_seconds: f64,
}

/// The cost of `work` under `discipline`.
pub fn cost(
    discipline: Discipline,
    work: Work,
    pool: PoolCapacity,
    output_token_weight: f64,
) -> f64 {
    match discipline {
        Discipline::Drf => {
            let kv = (work.prompt_tokens + work.output_tokens) / pool.kv_tokens.max(1.0);
            let compute = work.gpu_seconds / pool.gpus.max(1.0);
            kv.max(compute)
        }
        Discipline::Wfq | Discipline::Fifo | Discipline::Priority => {
            work.prompt_tokens + output_token_weight * work.output_tokens
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POOL: PoolCapacity = PoolCapacity {
        kv_tokens: 10_000.0,
        gpus: 2.0,
    };

    #[test]
    fn drf_charges_the_dominant_resource() {
        let long_context = Work {
            prompt_tokens: 5000.0,
            output_tokens: 0.0,
            gpu_seconds: 0.1,
        };
        let heavy_compute = Work {
            prompt_tokens: 10.0,
            output_tokens: 10.0,
            gpu_seconds: 1.0,
        };
        assert!((cost(Discipline::Drf, long_context, POOL, 1.0) - 0.5).abs() < 1e-12);
        assert!((cost(Discipline::Drf, heavy_compute, POOL, 1.0) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn wfq_weights_output_tokens() {
        let w = Work {
            prompt_tokens: 100.0,
            output_tokens: 10.0,
            gpu_seconds: 9.0,
        };
        assert_eq!(cost(Discipline::Wfq, w, POOL, 2.0), 120.0);
    }
}
