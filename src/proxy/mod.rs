//! The I/O shell: listeners (`server`), the scheduling path of a request
//! (`dispatch`), the backend connections (`pool`), the streaming relay
//! (`relay`), the admin listener
//! (`admin`), reload, and the edge error type (`error`).

pub mod access;
pub mod adapters;
pub mod admin;
pub mod audio;
pub mod body;
pub mod conn;
pub mod dispatch;
pub mod error;
pub mod gateway;
pub mod layers;
pub mod openai;
pub mod passthrough;
pub mod pool;
pub mod relay;
pub mod reload;
pub mod server;
pub mod tenant;
pub mod ticket;
pub mod tls;
pub mod triton;
pub mod upstream;
pub mod usage;
