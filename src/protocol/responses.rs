//! The Responses API (`/v1/responses`): the id an answer gives its
//! response, so that later calls naming it go to the backend that stored
//! it. What is read of its body is the OpenAI reader's; its usage is the
//! shared usage reader's.

use serde::Deserialize;

/// The id a Responses API answer gives its response: the document's `id`,
/// or an event's `response.id`.
#[derive(Deserialize)]
pub struct IdLite {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub response: Option<Box<IdLite>>,
}

pub fn response_id(json: &[u8]) -> Option<String> {
    let lite: IdLite = serde_json::from_slice(json).ok()?;
    match lite.response {
        Some(r) => r.id,
        None => lite.id,
    }
    .filter(|id| !id.is_empty())
}
