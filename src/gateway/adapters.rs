//! LoRA adapters the backends list in their `/v1/models` (entries with a
//! `parent`, as vLLM lists the adapters it was started with or loaded at
//! run time), on top of those the policy names. The poller reports each
//! backend's list; requests read the merged map without a lock.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

/// Adapter names a backend may list, at most: a misbehaving backend must
/// not grow the map without bound.
const MAX_PER_BACKEND: usize = 1024;

/// The adapters the backends list, and the base model each belongs to.
#[derive(Debug, Default)]
pub struct Discovered {
    /// By backend: its pool's model and the adapters it lists.
    by_backend: Mutex<BTreeMap<String, (String, Vec<String>)>>,
    /// Adapter → base model, merged over the backends.
    merged: ArcSwap<HashMap<String, String>>,
}

impl Discovered {
    /// `backend` (of `model`'s pool) lists `adapters` now.
    pub fn report(&self, backend: &str, model: &str, mut adapters: Vec<String>) {
        adapters.truncate(MAX_PER_BACKEND);
        adapters.sort();
        adapters.dedup();
        let mut by = self.by_backend.lock();
        let entry = (model.to_owned(), adapters);
        if by.get(backend) == Some(&entry) {
            return;
        }
        by.insert(backend.to_owned(), entry);
        self.rebuild(&by);
    }

    /// `backend` is no longer polled.
    pub fn forget(&self, backend: &str) {
        let mut by = self.by_backend.lock();
        if by.remove(backend).is_some() {
            self.rebuild(&by);
        }
    }

    /// An adapter two pools' backends both list belongs to the pool of
    /// the first backend by name (where names clash, list the adapter in
    /// the policy: that decides).
    fn rebuild(&self, by: &BTreeMap<String, (String, Vec<String>)>) {
        let mut merged = HashMap::new();
        for (model, adapters) in by.values() {
            for a in adapters {
                merged.entry(a.clone()).or_insert_with(|| model.clone());
            }
        }
        self.merged.store(Arc::new(merged));
    }

    /// The base model of adapter `name`, if a backend lists it.
    pub fn base_of(&self, name: &str) -> Option<String> {
        self.merged.load().get(name).cloned()
    }

    /// Every listed adapter with its base model.
    pub fn all(&self) -> Arc<HashMap<String, String>> {
        self.merged.load_full()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_adapters_merge_over_backends_and_go_with_them() {
        let d = Discovered::default();
        let body = br#"{"object":"list","data":[{"id":"base","parent":null},{"id":"sql","parent":"base"}]}"#;
        let listed = crate::poller::tasks::from_models_list(body).unwrap();
        assert_eq!(listed, ["sql"]);
        d.report("b0", "base", listed);
        d.report("b1", "base", vec!["chat".into()]);
        assert_eq!(d.base_of("sql").as_deref(), Some("base"));
        assert_eq!(d.base_of("chat").as_deref(), Some("base"));
        d.forget("b1");
        assert_eq!(d.base_of("chat"), None);
        assert_eq!(crate::poller::tasks::from_models_list(b"not json"), None);
    }
}
