//! NVFP4 codes into the paired layout on the device (`kernel_dsl::e2m1_pairs`), in place: for
//! weights made where they live (`crate::synthetic`), which would otherwise come back to the
//! host only to be rearranged. Uploaded weights are rearranged on the host before the copy.

use kernel_macros::kernel;

/// `codes` (`len` bytes, ModelOpt's layout, a multiple of 16) in the paired layout: each thread
/// rearranges one 16-byte group, four words. The host's `kernel_dsl::e2m1_pairs::pair_word` is
/// the reference; here each pair's two moves (magnitudes, signs) are one mask and one shift for
/// both halves of the word: nibbles k and k + 4 move by the same amount.
#[kernel(
    block = THREADS,
    grid = (len / 16).div_ceil(u64::from(THREADS)) as u32,
    require(len >= 16, len % 16 == 0, (len / 16).div_ceil(u64::from(THREADS)) <= 2_147_483_647),
)]
pub fn e2m1_pair_words(#[tile(default = 256, candidates = [128, 256])] THREADS: u32, codes: &mut [u8], len: u64) {
    let i = ((block_idx() as u64) * (THREADS as u64) + (thread_idx() as u64)) * 16;
    if i < len {
        let v = load_vec::<u32x4>(codes, i);
        let mut w = [0u32; 4];
        w[0] = v.x;
        w[1] = v.y;
        w[2] = v.z;
        w[3] = v.w;
        #[unroll]
        for e in 0..4 {
            let c = w[e];
            // Pair 0 (nibbles 0, 4): magnitudes to bits 9.., signs to 15; pair 1 (nibbles 1, 5):
            // 6.. and 12; pair 2 (nibbles 2, 6): 3.. and 13; pair 3 (nibbles 3, 7): 0.. and 14.
            w[e] = ((c & 0x0007_0007) << 9)
                | ((c & 0x0008_0008) << 12)
                | ((c & 0x0070_0070) << 2)
                | ((c & 0x0080_0080) << 5)
                | ((c & 0x0700_0700) >> 5)
                | ((c & 0x0800_0800) << 2)
                | ((c & 0x7000_7000) >> 12)
                | ((c & 0x8000_8000) >> 1);
        }
        store_vec(codes, i, u32x4(w[0], w[1], w[2], w[3]));
    }
}
