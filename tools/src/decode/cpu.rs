//! The CPU backend: the plain reference decoder (`engine::reference::decoder`), f32 throughout.
//! Slow on the real model (seconds per token), exact by construction: what parity is measured
//! against, and what runs where there is no GPU.

use engine::model::weights::ModelWeights;
use engine::reference::decoder::{Decoder, argmax};

use super::backend::Backend;
use super::error::{Result, fail};

/// The reference decoder over weights read into f32 (borrowed: they outlive every sequence).
#[derive(Debug)]
pub struct CpuBackend<'w> {
    decoder: Decoder<'w>,
    /// The last step's logits; None before the first step.
    logits: Option<Vec<f32>>,
}

impl<'w> CpuBackend<'w> {
    pub fn new(weights: &'w ModelWeights) -> CpuBackend<'w> {
        CpuBackend { decoder: Decoder::new(weights), logits: None }
    }

    fn last(&self) -> Result<&[f32]> {
        match &self.logits {
            Some(l) => Ok(l),
            None => fail("no logits yet: the backend has decoded no token since its reset"),
        }
    }
}

impl Backend for CpuBackend<'_> {
    fn name(&self) -> String {
        "CPU reference".to_owned()
    }

    fn vocab(&self) -> usize {
        self.decoder.config().vocab_size
    }

    fn reset(&mut self) -> Result<()> {
        self.decoder.reset();
        self.logits = None;
        Ok(())
    }

    fn step(&mut self, token: u32) -> Result<()> {
        self.logits = Some(self.decoder.step(token)?);
        Ok(())
    }

    fn logits(&mut self) -> Result<Vec<f32>> {
        Ok(self.last()?.to_vec())
    }

    fn greedy(&mut self) -> Result<u32> {
        Ok(argmax(self.last()?))
    }

    fn bytes_per_token(&self) -> Option<u64> {
        None
    }
}
