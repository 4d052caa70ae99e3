//! The better-compute control plane.
//!
//! One crate, one binary (`better-compute`), several roles: the gateway
//! (`gateway`: node sessions over mutual TLS), the join service and fleet CA
//! (`joinsvc`, `ca`), the operator API (`admin`, used by `client`), and the
//! liveness controller (in `serve`). All state lives in the store (`store`):
//! embedded SQLite by default. Processes keep nothing that a restart would
//! miss; they anchor their clock to the store's.
//!
//! Decisions shared with the agent (the epoch rules) come from `bcd-core`;
//! the wire comes from `bcd-proto`. This crate never sends a peer SQL text,
//! paths or backtraces: see `store::Refusal`.
#![forbid(unsafe_code)]

pub mod admin;
pub mod boot;
pub mod ca;
pub mod check;
pub mod cli;
pub mod client;
pub mod commands;
pub mod files;
pub mod gateway;
pub mod images;
pub mod joinsvc;
pub mod rollouts;
pub mod serve;
pub mod sim;
pub mod specs;
pub mod store;
