//! The Kubernetes wire formats the placement service speaks, only as far
//! as it reads and writes them:
//! - kube-scheduler's extender API (`k8s.io/kube-scheduler/extender/v1`):
//!   `ExtenderArgs` in, `ExtenderFilterResult` or `HostPriorityList` out;
//! - `admission.k8s.io/v1` `AdmissionReview`, whose object is a `Pod` (on
//!   pod `CREATE`) or a `Binding` (on `pods/binding`).
//!
//! Objects are kept as JSON where they are handed back untouched (the
//! extender's `Node` objects), so nothing the scheduler sent is lost.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::core::placement::PodRequest;

/// The annotation naming the model a pod serves.
pub const MODEL_ANNOTATION: &str = "fairway.dev/model";
/// The annotation giving the GPU memory the model needs on one GPU, in
/// decimal GB.
pub const SIZE_ANNOTATION: &str = "fairway.dev/model-size-gb";
/// The field guide's name for [`SIZE_ANNOTATION`], accepted too.
pub const GUIDE_SIZE_ANNOTATION: &str = "model-size-gb";

/// `metadata`, the fields placement reads.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub generate_name: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// A `Pod`: its metadata and the node it names, if any.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Pod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: PodSpec,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    /// Set when the pod is created already bound (no scheduler, no
    /// binding request follows).
    #[serde(default)]
    pub node_name: String,
}

/// A pod whose size annotation is not a size: the pod author's fault,
/// and the same pod is refused again. Its message is the one Kubernetes
/// shows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod}: annotation {annotation}: \"{text}\" is not a positive number of GB")]
pub struct BadSize {
    /// The pod's `namespace/name`.
    pub pod: String,
    pub annotation: &'static str,
    pub text: String,
}

impl Pod {
    /// `namespace/name`, or the generated name's prefix when unnamed.
    pub fn key(&self) -> String {
        let name = if self.metadata.name.is_empty() {
            format!("{}*", self.metadata.generate_name)
        } else {
            self.metadata.name.clone()
        };
        format!("{}/{name}", self.metadata.namespace)
    }

    /// What the pod asks of a GPU; `Ok(None)` for a pod without the size
    /// annotation (not a model server pod placement looks at).
    pub fn request(&self) -> Result<Option<PodRequest>, BadSize> {
        let notes = &self.metadata.annotations;
        let Some((key, text)) = [SIZE_ANNOTATION, GUIDE_SIZE_ANNOTATION]
            .iter()
            .find_map(|k| notes.get(*k).map(|v| (*k, v)))
        else {
            return Ok(None);
        };
        let gb = text
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|gb| gb.is_finite() && *gb > 0.0 && *gb < 1e6)
            .ok_or_else(|| BadSize {
                pod: self.key(),
                annotation: key,
                text: text.clone(),
            })?;
        let model = notes
            .get(MODEL_ANNOTATION)
            .filter(|m| !m.trim().is_empty())
            .cloned()
            .unwrap_or_else(|| self.key());
        Ok(Some(PodRequest {
            model,
            memory: (gb * 1e9) as u64,
        }))
    }
}

/// A `Binding` (`pods/binding`): which pod goes to which node.
#[derive(Clone, Debug, Deserialize)]
pub struct Binding {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub target: ObjectReference,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ObjectReference {
    #[serde(default)]
    pub kind: String,
    pub name: String,
}

/// `ExtenderArgs`. Field names are the JSON tags of the current type;
/// older schedulers sent the Go field names, which are accepted too.
#[derive(Debug, Deserialize)]
pub struct ExtenderArgs {
    #[serde(alias = "Pod")]
    pub pod: Pod,
    /// Full `NodeList`, when the extender is not `nodeCacheCapable`.
    #[serde(default, alias = "Nodes")]
    pub nodes: Option<NodeList>,
    #[serde(default, alias = "NodeNames")]
    pub nodenames: Option<Vec<String>>,
}

/// A `NodeList`: items kept as JSON, to be handed back as they came.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct NodeList {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    #[serde(default)]
    pub items: Vec<Value>,
}

/// The name of one `Node` of a [`NodeList`].
pub fn node_name(node: &Value) -> Option<&str> {
    node.get("metadata")?.get("name")?.as_str()
}

/// `ExtenderFilterResult`.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExtenderFilterResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeList>,
    #[serde(rename = "nodenames", skip_serializing_if = "Option::is_none")]
    pub node_names: Option<Vec<String>>,
    /// Node name to why it failed.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub failed_nodes: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// One entry of a `HostPriorityList`.
#[derive(Debug, Serialize)]
pub struct HostPriority {
    pub host: String,
    pub score: i64,
}

/// `AdmissionReview` as it arrives.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReview {
    pub api_version: String,
    pub kind: String,
    pub request: Option<AdmissionRequest>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    pub uid: String,
    pub resource: GroupVersionResource,
    #[serde(default)]
    pub sub_resource: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    pub operation: String,
    #[serde(default)]
    pub object: Option<Value>,
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(Debug, Deserialize)]
pub struct GroupVersionResource {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    pub resource: String,
}

/// The answer to one admission request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    pub allowed: bool,
    /// Why not (HTTP-like code and message), for a refusal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Status {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl Verdict {
    pub fn allow() -> Self {
        Verdict {
            allowed: true,
            status: None,
            warnings: Vec::new(),
        }
    }

    pub fn allow_with(warning: String) -> Self {
        Verdict {
            warnings: vec![warning],
            ..Verdict::allow()
        }
    }

    /// A refusal: 403 for a rule, 400 for a request placement cannot read.
    pub fn deny(code: u16, message: String) -> Self {
        Verdict {
            allowed: false,
            status: Some(Status {
                code,
                reason: if code == 400 {
                    "BadRequest"
                } else {
                    "Forbidden"
                },
                message,
            }),
            warnings: Vec::new(),
        }
    }

    /// The `AdmissionReview` answering the request `uid`.
    pub fn review(&self, uid: &str) -> Value {
        let mut response = serde_json::to_value(self).unwrap_or_default();
        response["uid"] = Value::String(uid.to_owned());
        serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": response,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(notes: &[(&str, &str)]) -> Pod {
        let annotations: serde_json::Map<String, Value> = notes
            .iter()
            .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "vllm-0", "namespace": "models", "annotations": annotations},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]}
        }))
        .unwrap()
    }

    #[test]
    fn the_request_comes_from_the_annotations() {
        let p = pod(&[(MODEL_ANNOTATION, "llama"), (SIZE_ANNOTATION, "16")]);
        let r = p.request().unwrap().unwrap();
        assert_eq!((r.model.as_str(), r.memory), ("llama", 16_000_000_000));
        let guide = pod(&[(GUIDE_SIZE_ANNOTATION, "7.5")]).request().unwrap();
        assert_eq!(guide.unwrap().model, "models/vllm-0");
        assert_eq!(pod(&[]).request().unwrap(), None);
        for bad in ["", "x", "-1", "0", "NaN", "inf"] {
            let err = pod(&[(SIZE_ANNOTATION, bad)])
                .request()
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("models/vllm-0") && err.contains(SIZE_ANNOTATION),
                "{err}"
            );
        }
    }

    #[test]
    fn a_refusal_is_an_admission_review_with_the_uid() {
        let v = Verdict::deny(403, "no".into()).review("u-1");
        assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(v["response"]["uid"], "u-1");
        assert_eq!(v["response"]["allowed"], false);
        assert_eq!(v["response"]["status"]["code"], 403);
        assert_eq!(v["response"]["status"]["message"], "no");
    }
}
