//! What a decode backend does: one token at a time at the next position, then the logits or the
//! greedy choice of that step. The CPU reference implements it ([`super::cpu`]); the GPU engine
//! will, with the greedy choice fused into its lm_head so only one id crosses to the host.

use super::error::Result;
use super::sampler::Sampler;

/// One sequence being decoded. Positions advance by one per [`Backend::step`] from 0 after
/// [`Backend::reset`].
pub trait Backend {
    /// What runs the step, for the user ("CPU reference", "GPU (H200), CUDA graph").
    fn name(&self) -> String;

    /// The number of token ids the model takes and scores.
    fn vocab(&self) -> usize;

    /// Forgets the sequence: every state back to position 0.
    fn reset(&mut self) -> Result<()>;

    /// Decodes `token` at the next position. A token id ≥ [`Backend::vocab`] is an error.
    fn step(&mut self, token: u32) -> Result<()>;

    /// The logits [vocab] of the last step: the scores of the token after it.
    fn logits(&mut self) -> Result<Vec<f32>>;

    /// The argmax of the last step's logits, the lower id on ties.
    fn greedy(&mut self) -> Result<u32>;

    /// The bytes the step reads from memory per token (weights and state), when the backend knows
    /// them: the byte floor the timing report compares against.
    fn bytes_per_token(&self) -> Option<u64>;

    /// The next token drawn by `sampler` from the last step (`position`: the next token's, which
    /// seeds the host sampler's uniform). By default on the host from [`Backend::logits`]; a
    /// backend that samples on the device returns its own draw.
    fn sample(&mut self, sampler: &Sampler, position: u64) -> Result<u32> {
        sampler.sample(&self.logits()?, position)
    }
}
