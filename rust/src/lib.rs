//! durable_agent_native: the optional native kernels of durable-agent.
//!
//! The kernels are plain Rust ([`aead`], [`b64`], [`codec`], [`keycache`], [`token`], [`transcode`]); the PyO3 glue (module
//! `glue`, built with the `python` feature) only moves values between Python and them.
#![forbid(unsafe_code)]

pub mod aead;
pub mod b64;
pub mod codec;
pub mod keycache;
pub mod token;
pub mod transcode;

#[cfg(feature = "python")]
mod glue;
