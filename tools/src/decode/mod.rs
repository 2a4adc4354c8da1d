//! The decode binary: a prompt in, tokens out, through a [`Backend`] (the GPU engine, or the CPU
//! reference), with timing; or teacher-forced scoring that writes every position's logits.
//!
//! One concept a module: the options ([`cli`]), the errors ([`error`]), the backend interface
//! ([`backend`]) and its CPU implementation ([`cpu`]), where the model comes from ([`model`]), text
//! to ids and back ([`tokenizer`]), token id lists ([`ids`]), the sampler ([`sampler`]), the
//! generation loop ([`generate`]), scoring ([`score`]), the timing report ([`stats`]) and the
//! whole run ([`run`]).

pub mod backend;
pub mod cli;
pub mod cpu;
pub mod error;
pub mod generate;
pub mod gpu;
pub mod ids;
pub mod model;
pub mod run;
pub mod sampler;
pub mod score;
pub mod stats;
pub mod tokenizer;

pub use backend::Backend;
pub use error::{DecodeError, Result};
