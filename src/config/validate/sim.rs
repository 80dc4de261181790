//! A backend's `sim` table: the parameters of the simulated engine that
//! serves it in-process, over the engine's defaults.

use super::reader::{Reader, Value, Zero};
use crate::config::EngineParams;

const SIM_KEYS: &[&str] = &[
    "max_num_seqs",
    "kv_tokens",
    "block_size",
    "max_model_len",
    "max_num_batched_tokens",
    "prefill_tokens_per_s",
    "prefill_step_base",
    "decode_step_base",
    "decode_step_per_seq",
    "time_scale",
    "max_loras",
    "lora_load_time",
];

pub(super) fn read_sim(r: &mut Reader<'_>, v: &Value<'_>, path: &str) -> Option<EngineParams> {
    let t = r.table(v, path)?;
    r.check_keys(&t, SIM_KEYS);
    // Start from the defaults and overwrite what is set, so a parameter
    // added to the engine gets its default here without a change.
    let mut params = EngineParams::default();
    if let Some(v) = r.opt(&t, "max_num_seqs", Reader::positive_int) {
        params.max_num_seqs = v;
    }
    if let Some(v) = r.opt(&t, "kv_tokens", Reader::positive_int) {
        params.kv_tokens = v;
    }
    if let Some(v) = r.opt(&t, "block_size", Reader::positive_int) {
        params.block_size = v;
    }
    if let Some(v) = r.opt(&t, "max_model_len", Reader::positive_int) {
        params.max_model_len = v;
    }
    if let Some(v) = r.opt(&t, "max_num_batched_tokens", Reader::positive_int) {
        params.max_num_batched_tokens = v;
    }
    if let Some(v) = r.opt(&t, "prefill_tokens_per_s", Reader::positive) {
        params.prefill_tokens_per_s = v;
    }
    if let Some(v) = r.opt(&t, "prefill_step_base", |r, v, p| {
        r.duration(v, p, Zero::Allowed)
    }) {
        params.prefill_step_base = v;
    }
    if let Some(v) = r.opt(&t, "decode_step_base", |r, v, p| {
        r.duration(v, p, Zero::Refused)
    }) {
        params.decode_step_base = v;
    }
    if let Some(v) = r.opt(&t, "decode_step_per_seq", |r, v, p| {
        r.duration(v, p, Zero::Allowed)
    }) {
        params.decode_step_per_seq = v;
    }
    if let Some(v) = r.opt(&t, "time_scale", Reader::positive) {
        params.time_scale = v;
    }
    if let Some(v) = r.opt(&t, "max_loras", Reader::non_negative_int) {
        params.max_loras = v;
    }
    if let Some(v) = r.opt(&t, "lora_load_time", |r, v, p| {
        r.duration(v, p, Zero::Allowed)
    }) {
        params.lora_load_time = v;
    }
    Some(params)
}
