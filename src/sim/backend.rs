//! HTTP front of the simulated engine (being written).
