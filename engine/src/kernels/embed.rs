//! The first kernel of the step: the token's embedding row, copied into every residual stream.

use kernel_macros::kernel;

/// `streams[s·d + i] = embed[token[0]·d + i]` for every stream s < n, in bf16 (the model starts
/// its n residual streams equal).
///
/// The token is read from device memory (the previous step's lm_head wrote it there, or the host
/// for a prompt), so one captured graph serves every token. A token at or past `vocab` cannot come
/// from the lm_head and the host refuses it before upload; should one arrive anyway the streams
/// are zeroed rather than read out of bounds.
///
/// Each thread moves 8 values (16 bytes) of the row to all n streams.
#[kernel(
    block = THREADS,
    grid = div_ceil(d / 8, THREADS),
    require(d % 8 == 0, n >= 1),
)]
pub fn embed_streams(
    #[tile(default = 128, candidates = [64, 128, 256])] THREADS: u32,
    embed: &[bf16],
    token: &[u32],
    streams: &mut [bf16],
    vocab: u32,
    d: u32,
    n: u32,
) {
    let i = (block_idx() * THREADS + thread_idx()) * 8;
    if i < d {
        let t = token[0];
        let v = if t < vocab { load_vec::<u32x4>(embed, t * d + i) } else { u32x4(0, 0, 0, 0) };
        for s in 0..n {
            store_vec(streams, s * d + i, v);
        }
    }
}
