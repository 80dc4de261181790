//! One module per protocol Fairway serves, each owning what is read of a
//! request's body, its sizes, its usage and its error shape: OpenAI
//! (chat, completions, embeddings and pooling), Triton's KServe v2, and
//! audio uploads; [`error`] is the edge error type they share. No
//! scheduling and no connections here.

pub mod audio;
pub mod error;
pub mod openai;
pub mod read;
pub mod triton;
