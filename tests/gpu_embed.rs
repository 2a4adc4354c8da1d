//! The embedding kernel on a GPU: every stream holds the token's row bit for bit (fresh random
//! table and tokens, streams poisoned first), every tile candidate; a token past the vocabulary
//! gives zeros, not a read out of bounds; one captured graph serves a new token each replay (the
//! token is read from device memory).

use engine::cuda::{DeviceBuffer, Gpu};
use engine::kernels::embed::embed_streams;
use flashnext::rng::Rng;
use half::bf16;
use kernel_dsl::{KernelDef, TileSet};

const POISON: u8 = 0xab;

fn args(
    table: &DeviceBuffer<bf16>,
    token: &DeviceBuffer<u32>,
    streams: &mut DeviceBuffer<bf16>,
    vocab: usize,
    d: usize,
    n: usize,
) -> embed_streams::Args {
    embed_streams::Args {
        embed: table.ptr(),
        token: token.ptr(),
        streams: streams.ptr_mut(),
        vocab: vocab as u32,
        d: d as u32,
        n: n as u32,
    }
}

/// (vocab, d, n).
type Shape = (usize, usize, usize);

fn expect_rows(gpu: &Gpu, streams: &DeviceBuffer<bf16>, table: &[bf16], token: u32, (vocab, d, n): Shape, label: &str) {
    let got = gpu.download(streams).expect("streams");
    for s in 0..n {
        for i in 0..d {
            let want = if (token as usize) < vocab { table[token as usize * d + i].to_bits() } else { 0 };
            assert_eq!(got[s * d + i].to_bits(), want, "{label}: stream {s}, element {i}");
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn every_stream_holds_the_token_row() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("embed");
    for (vocab, d, n) in [(512, 256, 4), (4096, 2560, 4), (300, 48, 3)] {
        let table = rng.bf16_normal(vocab * d, 1.0);
        let d_table = gpu.upload(&table).expect("table");
        let mut token = gpu.alloc::<u32>(1).expect("token");
        let mut streams = gpu.alloc::<bf16>(n * d).expect("streams");
        for tiles in embed_streams::Tiles::candidates() {
            let k = gpu.kernel::<embed_streams::Kernel>(tiles).expect("compile");
            let a = args(&d_table, &token, &mut streams, vocab, d, n);
            for t in [0, vocab as u32 - 1, (rng.next_u64() % vocab as u64) as u32, vocab as u32, u32::MAX] {
                let label = format!("{tiles:?} vocab {vocab} d {d} n {n} token {t}");
                gpu.write(&mut token, &[t]).expect("token");
                gpu.fill_bytes(&mut streams, POISON).expect("poison");
                // SAFETY: the table holds vocab × d values, streams n × d, token one.
                unsafe { k.launch(&gpu, &a) }.expect("launch");
                expect_rows(&gpu, &streams, &table, t, (vocab, d, n), &label);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_graph_reads_the_token_of_each_replay() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("embed graph");
    let (vocab, d, n) = (1000, 2560, 4);
    let table = rng.bf16_normal(vocab * d, 1.0);
    let d_table = gpu.upload(&table).expect("table");
    let mut token = gpu.alloc::<u32>(1).expect("token");
    let mut streams = gpu.alloc::<bf16>(n * d).expect("streams");
    let k = gpu.kernel::<embed_streams::Kernel>(TileSet::DEFAULT).expect("compile");
    let a = args(&d_table, &token, &mut streams, vocab, d, n);
    assert!(embed_streams::Kernel::launch_dims(k.tiles(), &a).is_ok());
    // SAFETY: as above.
    let g = gpu.capture(|| unsafe { k.launch(&gpu, &a) }).expect("capture");
    for _ in 0..4 {
        let t = (rng.next_u64() % vocab as u64) as u32;
        gpu.write(&mut token, &[t]).expect("token");
        gpu.fill_bytes(&mut streams, POISON).expect("poison");
        g.launch().expect("replay");
        expect_rows(&gpu, &streams, &table, t, (vocab, d, n), &format!("replay, token {t}"));
    }
}
