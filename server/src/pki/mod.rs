//! Keys and certificates: the fleet CA with the gateway's serving
//! certificate and the node certificates it issues ([`ca`]), the worker
//! signing key ([`worker`]), and what that key signs: commands and NodeSpecs
//! ([`seal`]); the operator CA with the API's serving certificate and the
//! operators' client certificates ([`operator`]); the key join tokens are
//! sealed to ([`token_seal`]); the console's sign-in tokens ([`console`]).
//!
//! Everything here reads and writes the server's data directory and nothing
//! else; the store holds what was issued and sealed, never a key.

pub mod ca;
pub mod console;
pub mod operator;
pub mod seal;
pub mod secrets;
pub mod tickets;
pub mod token_seal;
pub mod worker;

pub use ca::Ca;
pub use operator::OperatorCa;
