//! The better-compute control plane.
//!
//! One crate, one binary (`better-compute`), organised by layer, one file
//! per domain in each:
//!
//! - [`serve`]: process assembly (store, keys, listeners, which loops run).
//! - [`api`]: the operator API and the join service; [`api::status`] is the
//!   one mapping of store refusals to gRPC statuses.
//! - [`gateway`]: node sessions over mutual TLS, leases, the feeds.
//! - [`controllers`]: liveness, the command sweeper, rollouts.
//! - [`boot`]: the plain-HTTP boot endpoint for PXE clients.
//! - [`pki`]: the fleet CA, the worker key and what it seals.
//! - [`cli`] (with [`client`]): the operator's command line.
//! - [`check`]: the invariant checkers (the fleet simulator that runs
//!   them is the `bc-sim` crate).
//! - [`backup`]: backup sets of the store and keys, and restores.
//!
//! All state lives in the store, `bc-store` (`server/store`), which knows
//! nothing of the wire; processes keep nothing a restart would miss and
//! anchor their clock to the store's. Decisions shared with the agent (the
//! epoch rules, the command lifecycle) come from `bcd-core`; the wire comes
//! from `bcd-proto`. A peer never sees SQL text, paths or backtraces: see
//! [`api::status`].
#![forbid(unsafe_code)]
// Unit tests are exempt from the one-clock rule (clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod api;
pub mod backup;
pub mod boot;
pub mod certs;
pub mod check;
pub mod cli;
pub mod client;
pub mod clock;
pub mod console;
pub mod controllers;
pub mod doctor;
pub mod evidence;
pub mod gateway;
pub mod http;
pub mod labels;
pub mod metrics;
pub mod pki;
pub mod serve;
pub mod services;
pub mod systemd;
pub mod words;
