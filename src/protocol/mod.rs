//! One module per protocol Fairway serves, each owning what is read of a
//! request's body, its usage and its error shape: OpenAI (chat,
//! completions, embeddings and pooling; `openai`), the Responses API
//! (`responses`), Anthropic's Messages (`anthropic`), Triton's KServe v2
//! (`triton`), audio uploads (`audio`) and the Files and Batch APIs'
//! objects and lines (`batch`). What they share: the edge
//! error type with OpenAI's shape (`error`), reading a client's body
//! (`read`), the usage reader every shape goes through (`usage`) and SSE
//! framing (`sse`). No scheduling and no connections here.

pub mod anthropic;
pub mod audio;
pub mod batch;
pub mod error;
pub mod message_batches;
pub mod openai;
pub mod prompt;
pub mod read;
pub mod responses;
pub mod resume;
pub mod sse;
pub mod triton;
pub mod upstream;
pub mod usage;
