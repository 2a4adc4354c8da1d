//! The PLE n-gram hash: which rows of the n-gram table a token and its history address.
//!
//! Per PLE layer (the k-th in ascending order): `ngram_size` odd multipliers from SplitMix64 of the
//! seed, and one prime-sized range per head. Primes are counted globally from
//! `ngram_vocab_size_base`, continuing from one PLE layer to the next; offsets restart in each
//! layer. Order-n heads (bigram heads first) mix the current token and the n−1 before it:
//! `mix = Σ_XOR token_i · multiplier_i`, `id = mix mod prime + offset`.
//!
//! History: before the sequence starts the previous tokens are eos; a context token more than one
//! step back is replaced by eos when an eos lies between it and the current token (the reset).

use super::config::ModelConfig;

const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
const PRIME_1: u64 = 10_007;

/// SplitMix64's output function applied to `v` (the state advanced by GAMMA first).
pub fn splitmix64(v: u64) -> u64 {
    let mut z = v.wrapping_add(GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn is_prime(n: u64) -> bool {
    if n < 2 {
        return false;
    }
    if n.is_multiple_of(2) {
        return n == 2;
    }
    let mut d = 3;
    while d * d <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 2;
    }
    true
}

/// The hash constants of one PLE layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NgramHash {
    pub multipliers: Vec<u64>,
    /// One prime per head: the size of its range of rows.
    pub primes: Vec<u64>,
    /// The first row of each head's range within this layer's table.
    pub offsets: Vec<u64>,
    /// Rows of the table: the primes' sum rounded up to `make_ngram_vocab_size_divisible_by`.
    pub rows_padded: u64,
    ngram_size: usize,
    heads_per_ngram: usize,
    eos: u32,
}

impl NgramHash {
    /// The constants of the `ple_index`-th PLE layer (0 for the first in ascending layer order).
    pub fn new(cfg: &ModelConfig, ple_index: usize) -> NgramHash {
        let vocab = cfg.vocab_size.max(1) as u64;
        let half_bound = ((i64::MAX as u64) / vocab / 2).max(1);
        let base = cfg.ple_seed.wrapping_add(PRIME_1.wrapping_mul(ple_index as u64));
        let multipliers = (0..cfg.ngram_size as u64)
            .map(|i| 2 * (splitmix64(base.wrapping_add(GAMMA.wrapping_mul(i + 1))) % half_bound) + 1)
            .collect();

        let heads = cfg.ngram_heads();
        let skip = ple_index * heads;
        let mut primes = Vec::with_capacity(heads);
        let mut n = cfg.ngram_vocab_size_base;
        let mut seen = 0;
        while primes.len() < heads {
            if is_prime(n) {
                if seen >= skip {
                    primes.push(n);
                }
                seen += 1;
            }
            n += 1;
        }
        let offsets: Vec<u64> = primes
            .iter()
            .scan(0u64, |acc, &p| {
                let o = *acc;
                *acc += p;
                Some(o)
            })
            .collect();
        let total: u64 = primes.iter().sum();
        let d = cfg.ngram_vocab_divisible_by.max(1);
        NgramHash {
            multipliers,
            primes,
            offsets,
            rows_padded: total.div_ceil(d) * d,
            ngram_size: cfg.ngram_size,
            heads_per_ngram: cfg.heads_per_ngram,
            eos: cfg.eos_token_id.unwrap_or(0),
        }
    }

    /// The tokens an n-gram spans: the current one and `ngram_size − 1` before it.
    pub fn ngram_size(&self) -> usize {
        self.ngram_size
    }

    /// Heads of each n-gram order; head h has order 2 + h / heads_per_ngram.
    pub fn heads_per_ngram(&self) -> usize {
        self.heads_per_ngram
    }

    /// The token that starts the history and resets it.
    pub fn eos(&self) -> u32 {
        self.eos
    }

    /// The start-of-sequence history: `ngram_size − 1` eos tokens, oldest first.
    pub fn initial_history(&self) -> Vec<u32> {
        vec![self.eos; self.ngram_size.saturating_sub(1)]
    }

    /// The table rows for `token` after `history` (oldest first, `ngram_size − 1` tokens), one per
    /// head: the bigram heads, then the trigram heads, ...
    pub fn ids(&self, history: &[u32], token: u32) -> Vec<u64> {
        let context = history.len();
        // grams[k] is the token k steps back, eos once an eos lies strictly between it and now.
        let mut grams = vec![u64::from(token)];
        let mut reset = false;
        for k in 1..self.ngram_size {
            let tok = history.get(context.wrapping_sub(k)).copied().unwrap_or(self.eos);
            grams.push(if reset { u64::from(self.eos) } else { u64::from(tok) });
            if tok == self.eos {
                reset = true;
            }
        }
        let mut ids = Vec::with_capacity(self.primes.len());
        for order in 2..=self.ngram_size {
            let mix = (0..order).fold(0u64, |m, i| m ^ grams[i].wrapping_mul(self.multipliers[i]));
            for h in (order - 2) * self.heads_per_ngram..(order - 1) * self.heads_per_ngram {
                ids.push(mix % self.primes[h] + self.offsets[h]);
            }
        }
        ids
    }

    /// The history after `token`.
    pub fn push(&self, history: &mut Vec<u32>, token: u32) {
        if !history.is_empty() {
            history.remove(0);
            history.push(token);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn published() -> ModelConfig {
        let json = serde_json::json!({
            "vocab_size": 248320, "hidden_size": 2560, "num_hidden_layers": 4, "num_attention_heads": 24,
            "head_dim": 256, "rope_parameters": {"rope_theta": 1e7, "partial_rotary_factor": 0.25},
            "linear_num_key_heads": 16, "linear_num_value_heads": 48,
            "hc_count": 4, "hc_lowrank": 320, "eos_token_id": 248044, "ple_layer_ids": [2],
            "indexer_n_heads": 4, "indexer_kv_heads": 1, "indexer_head_dim": 128, "indexer_budget": 2048, "indexer_compress_ratio": 4,
        });
        ModelConfig::from_json(&json.to_string()).expect("published geometry")
    }

    #[test]
    fn published_constants() {
        let cfg = published();
        let h = NgramHash::new(&cfg, 0);
        assert_eq!(h.multipliers, [23_703_573_157_769, 20_109_073_645_365, 8_052_911_324_071]);
        assert_eq!(
            h.primes,
            [
                20000003, 20000023, 20000033, 20000047, 20000059, 20000063, 20000069, 20000077, 20000081, 20000093,
                20000107, 20000147, 20000153, 20000159, 20000161, 20000171
            ]
        );
        assert_eq!(h.offsets[1], 20000003);
        assert_eq!(h.offsets[15], 300001275);
        assert_eq!(h.rows_padded, 320001536);
        let second = NgramHash::new(&cfg, 1);
        assert_eq!(second.multipliers, [3_352_040_966_061, 19_752_442_147_475, 10_742_103_100_073]);
    }

    /// Test vectors computed with the reference's hashing (transformers 5.17).
    #[test]
    fn ids_match_the_reference_with_eos_resets() {
        let cfg = published();
        let h = NgramHash::new(&cfg, 0);
        let tokens = [9707u32, 11, 1879, 248044, 151, 2, 248044, 248044, 33, 44, 55];
        let want: [[u64; 16]; 3] = [
            [
                16410909, 39682429, 55103279, 60931720, 87006904, 116506179, 131512017, 152932897, 169641436,
                182022480, 209277433, 237891023, 256841529, 277007269, 290665954, 300984276,
            ],
            [
                18827606, 27700912, 56521518, 65780303, 81132822, 100518937, 120474864, 142052741, 163793416,
                184135950, 219854666, 227756662, 248975183, 271245822, 285569892, 318943450,
            ],
            [
                9682030, 33069611, 54765013, 73140348, 83177992, 119857649, 124877301, 158237529, 168007371, 188809931,
                219748214, 222439924, 252845353, 263251013, 293386531, 304063634,
            ],
        ];
        let mut history = h.initial_history();
        let mut got = Vec::new();
        for &t in &tokens {
            got.push(h.ids(&history, t));
            h.push(&mut history, t);
        }
        assert_eq!(got[0], want[0]);
        assert_eq!(got[3], want[1]);
        assert_eq!(got[10], want[2]);
    }
}
