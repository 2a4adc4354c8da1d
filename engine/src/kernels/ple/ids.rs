//! The n-gram row ids of the newest token, for every PLE layer at once, hashed on the device.
//!
//! Why on the device: the newest token is produced on the device (the sampler writes it there),
//! and the step is one CUDA graph. Hashing it on the host would put a device-to-host copy, a host
//! wait and a host-to-device copy between the sampler and the gather, none of which a graph can
//! hold without splitting the step, and each of which costs microseconds on the critical path.
//! On the device the ids are one tiny launch (one block, a few hundred integer operations per
//! thread) that can run first in the step, right after the token is written; the gather follows
//! it and both overlap layer 0 on a side stream.
//!
//! The hash is exactly [`crate::model::ngram_hash::NgramHash::ids`]: order-n heads XOR the
//! current token and the n−1 before it, each times its layer's odd multiplier (wrapping u64
//! products), `id = mix mod prime + offset`. The history resets as the host's does: a context
//! token more than one step back becomes eos when an eos lies between it and the current token.
//! The kernel then advances the history by the token, as `NgramHash::push` does, so one launch
//! per step keeps it current (the history is state, like a conv buffer: replaying a step's graph
//! twice for one token would advance it twice).

use kernel_macros::kernel;

/// `ids[l·heads + h]` = the row of head `h` of PLE layer `l` for `token[0]` after `history`, and
/// then `history` ← history[1..] + token.
///
/// `history` [ngram_size − 1]: the previous tokens, oldest first (eos before the sequence starts).
/// `multipliers` [layers, ngram_size]; `primes`, `offsets` [layers, heads]. An offset may include
/// the first row of its layer's table within a table that holds every PLE layer, so the ids
/// address that table directly. Heads are ordered by n-gram order (bigram heads first),
/// `heads_per_ngram` of each, so head h has order 2 + h / heads_per_ngram.
///
/// One block: every thread reads the history before the barrier, one thread advances it after.
#[kernel(block = 128, grid = 1, require(ngram_size >= 2, heads == (ngram_size - 1) * heads_per_ngram))]
pub fn ple_ids(
    token: &[u32],
    history: &mut [u32],
    multipliers: &[u64],
    primes: &[u64],
    offsets: &[u64],
    ids: &mut [u64],
    layers: u32,
    heads: u32,
    heads_per_ngram: u32,
    ngram_size: u32,
    eos: u32,
) {
    let context = ngram_size - 1;
    let current = token[0];
    for i in (thread_idx()..layers * heads).step_by(block_dim()) {
        let layer = i / heads;
        let order = 2 + (i % heads) / heads_per_ngram;
        let mut mix = (current as u64) * multipliers[layer * ngram_size];
        // Once an eos is seen going back, every older token reads as eos.
        let mut reset = false;
        for k in 1..order {
            let back = history[context - k];
            let gram = if reset { eos } else { back };
            mix ^= (gram as u64) * multipliers[layer * ngram_size + k];
            if back == eos {
                reset = true;
            }
        }
        ids[i] = mix % primes[i] + offsets[i];
    }
    sync_threads();
    if thread_idx() == 0 {
        for k in 0..context - 1 {
            history[k] = history[k + 1];
        }
        history[context - 1] = current;
    }
}
