//! The sans-IO scheduling core: admission, fair queue, dispatch windows,
//! routing and GPU-seconds accounting. Every time-dependent method takes
//! `now`; nothing here reads a clock, opens a socket, spawns, logs or counts.

pub mod time;
