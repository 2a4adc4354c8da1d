//! The long runs of the GPU engine (`longrun`, issue #11 item 4): greedy decoding for thousands of
//! tokens eagerly and through the CUDA graph, which must agree token for token (and, step by
//! step, logit for logit); and one long sequence with the device's free memory and the process's
//! resident set sampled as it goes, which must stay flat after a warm-up.
//!
//! The parts that need no GPU (the digests, the comparison, the memory samples and their check,
//! the synthetic prompt, where QSA's sparse selection begins) are here with their tests; the
//! binary (`src/bin/longrun.rs`) loads the models and drives the engine.

pub mod decode;
pub mod memory;

use std::io::Write;

/// FNV-1a over the bit patterns of `logits`: two steps agree bit for bit when their digests do
/// (up to a 2⁻⁶⁴ chance), without keeping every step's logits.
pub fn digest(logits: &[f32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in logits {
        h ^= u64::from(v.to_bits());
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Where two runs first part: the first differing entry, with both values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mismatch<T> {
    pub index: usize,
    pub first: Option<T>,
    pub second: Option<T>,
}

/// The first index at which `a` and `b` differ (a missing entry counts as a difference).
pub fn first_mismatch<T: Copy + PartialEq>(a: &[T], b: &[T]) -> Option<Mismatch<T>> {
    let n = a.len().max(b.len());
    (0..n).find(|&i| a.get(i) != b.get(i)).map(|index| Mismatch {
        index,
        first: a.get(index).copied(),
        second: b.get(index).copied(),
    })
}

/// `len` token ids below `vocab`, from a splitmix64 stream seeded with `seed`: a prompt for the
/// synthetic model, which has no tokenizer and no meaningful text.
pub fn synthetic_prompt(len: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            (z % vocab as u64) as u32
        })
        .collect()
}

/// How many of the positions `0..positions` a QSA layer decodes with its sparse selection: those
/// with more complete indexer blocks (of `block` tokens) than the `top` blocks the budget keeps.
/// Below that every block is attended and the top-k chooses nothing.
pub fn sparse_positions(positions: usize, block: usize, top: usize) -> usize {
    // Position p has (p + 1) / block complete blocks: sparse from p + 1 = (top + 1) · block on.
    let first = (top + 1) * block - 1;
    positions.saturating_sub(first)
}

/// One JSON line: printed, and appended to $OUT/longrun.jsonl when OUT is set.
pub fn emit(line: &serde_json::Value) {
    let text = line.to_string();
    println!("{text}");
    if let Some(dir) = std::env::var_os("OUT") {
        let path = std::path::Path::new(&dir).join("longrun.jsonl");
        let written =
            std::fs::OpenOptions::new().create(true).append(true).open(&path).and_then(|mut f| writeln!(f, "{text}"));
        if let Err(e) = written {
            eprintln!("warning: could not append to {}: {e}", path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_see_every_bit_and_the_order() {
        let a = [1.0f32, 2.0, 3.0];
        assert_eq!(digest(&a), digest(&[1.0, 2.0, 3.0]));
        assert_ne!(digest(&a), digest(&[1.0, 3.0, 2.0]));
        assert_ne!(digest(&a), digest(&[1.0, 2.0, f32::from_bits(3.0f32.to_bits() + 1)]));
        assert_ne!(digest(&[0.0]), digest(&[-0.0]));
        assert_ne!(digest(&a), digest(&a[..2]));
    }

    #[test]
    fn the_first_mismatch_is_found_and_lengths_count() {
        assert_eq!(first_mismatch(&[1, 2, 3], &[1, 2, 3]), None);
        assert_eq!(
            first_mismatch(&[1, 2, 3], &[1, 5, 3]),
            Some(Mismatch { index: 1, first: Some(2), second: Some(5) })
        );
        assert_eq!(first_mismatch(&[1, 2], &[1, 2, 3]), Some(Mismatch { index: 2, first: None, second: Some(3) }));
    }

    #[test]
    fn the_synthetic_prompt_is_seeded_and_in_the_vocabulary() {
        let p = synthetic_prompt(1000, 248_320, 7);
        assert_eq!(p, synthetic_prompt(1000, 248_320, 7));
        assert_ne!(p, synthetic_prompt(1000, 248_320, 8));
        assert!(p.iter().all(|&t| (t as usize) < 248_320));
        // Not a constant: many distinct ids.
        let mut d = p.clone();
        d.sort_unstable();
        d.dedup();
        assert!(d.len() > 900, "{} distinct ids", d.len());
    }

    #[test]
    fn sparse_selection_begins_past_the_budget() {
        // The published QSA: blocks of 4 tokens, 512 kept (a budget of 2,048 tokens).
        let (block, top) = (4, 512);
        // Position 2,050 has 512 complete blocks (all attended); 2,051 has 513.
        assert_eq!(sparse_positions(2051, block, top), 0);
        assert_eq!(sparse_positions(2052, block, top), 1);
        assert_eq!(sparse_positions(2512, block, top), 461);
        assert_eq!(sparse_positions(10, block, top), 0);
    }
}
