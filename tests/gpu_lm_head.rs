//! The lm_head with its fused greedy choice on a GPU, against the CPU reference: every logit
//! against the f64 product of the same weights (bf16, or NVFP4 dequantised), and the token
//! exactly the lowest id of the largest logit the kernel wrote, which must also be the
//! reference's choice wherever the reference's top two are further apart than the error bound.
//! Rows tied on purpose (identical rows that win) must give the lowest of them. Logits and token
//! poisoned before each launch; a second launch and a graph replay give the same bits; the
//! reduction's counters are back at zero. Every tile candidate and several grid sizes run, on
//! fresh random inputs.

use engine::cuda::{DeviceBuffer, Gpu};
use engine::kernels::lm_head::lm_head_argmax_nvfp4;
use engine::layers::lm_head::{LmHead, LmHeadTiles};
use engine::model::nvfp4::Nvfp4Matrix;
use engine::reference::decoder::argmax;
use engine::reference::gemv::{gemv, gemv_magnitudes};
use flashnext::rng::{Rng, to_f32};
use half::bf16;
use kernel_dsl::TileSet;

const POISON: u8 = 0xab;

/// One problem: the matrix (as the reference reads it) and x.
struct Case {
    vocab: usize,
    hidden: usize,
    w: Vec<f32>,
    x: Vec<bf16>,
    /// Rows made identical copies of a winning row, ascending.
    tied: Vec<usize>,
}

fn case(rng: &mut Rng, vocab: usize, hidden: usize, ties: bool) -> Case {
    let mut w = to_f32(&rng.bf16_normal(vocab * hidden, 0.05));
    let x = rng.bf16_normal(hidden, 1.0);
    let mut tied = vec![];
    if ties {
        // A row aligned with x wins by far; copies of it further on tie with it exactly.
        let xf = to_f32(&x);
        let first = (rng.next_u64() % (vocab as u64 / 2)) as usize;
        tied = vec![first, first + 1 + (rng.next_u64() % (vocab as u64 / 4)) as usize, vocab - 1];
        for &r in &tied {
            for (k, v) in w[r * hidden..(r + 1) * hidden].iter_mut().enumerate() {
                *v = f32::from(bf16::from_f32(xf[k] * 0.25));
            }
        }
    }
    Case { vocab, hidden, w, x, tied }
}

/// Launches twice with logits and token poisoned each time; (logits, token) of each.
fn run(gpu: &Gpu, head: &mut LmHead, x: &DeviceBuffer<bf16>) -> [(Vec<f32>, u32); 2] {
    let mut logits = gpu.alloc::<f32>(head.vocab()).expect("logits");
    let mut token = gpu.alloc::<u32>(1).expect("token");
    let mut once = || {
        gpu.fill_bytes(&mut logits, POISON).expect("poison");
        gpu.fill_bytes(&mut token, POISON).expect("poison");
        head.launch(gpu, x, &mut logits, &mut token).expect("launch");
        (gpu.download(&logits).expect("logits"), gpu.download(&token).expect("token")[0])
    };
    [once(), once()]
}

/// Checks one launch's output against the reference logits `want` (error bound per row from
/// the rows' magnitudes), and the token against the kernel's own logits and the reference.
fn check(label: &str, c: &Case, got: &[f32], token: u32, want: &[f32], bound: &[f32]) {
    for r in 0..c.vocab {
        let err = (got[r] - want[r]).abs();
        assert!(err <= bound[r], "{label}: logit {r} is {}, the reference {} (bound {})", got[r], want[r], bound[r]);
    }
    assert_eq!(token, argmax(&got[..c.vocab]), "{label}: the token is not the lowest id of the largest logit written");
    if let Some(&first) = c.tied.first() {
        assert_eq!(token as usize, first, "{label}: rows {:?} tie; the lowest must win", c.tied);
    }
    // Where the reference's top two are clearly apart, the choice must be the reference's.
    let best = argmax(want) as usize;
    let runner_up = (0..c.vocab).filter(|&r| r != best).map(|r| want[r]).fold(f32::NEG_INFINITY, f32::max);
    if want[best] - runner_up > 2.0 * bound[best].max(bound.iter().copied().fold(0.0, f32::max)) {
        assert_eq!(token as usize, best, "{label}: the reference chooses {best}");
    }
}

/// Blocks per SM to try: one wave, an odd count, the default and more.
const WAVES: [u32; 4] = [1, 3, 4, 8];

#[test]
#[ignore = "needs a CUDA device"]
fn bf16_logits_and_token_match_the_reference() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("lm_head bf16");
    let mut ran = std::collections::HashSet::new();
    for (vocab, hidden, ties) in [(1000, 256, false), (1000, 256, true), (248_320, 256, true), (32_768, 2560, true)] {
        let c = case(&mut rng, vocab, hidden, ties);
        let want = gemv(&c.w, &to_f32(&c.x), vocab, hidden);
        // f32 sums of bf16 products: a relative error of a few ulps of the magnitudes.
        let bound: Vec<f32> = gemv_magnitudes(&c.w, &to_f32(&c.x), hidden).iter().map(|m| 1e-5 * m + 1e-6).collect();
        let wb: Vec<bf16> = c.w.iter().map(|&v| bf16::from_f32(v)).collect();
        let x = gpu.upload(&c.x).expect("x");
        let shapes_tiles: Vec<_> = if vocab <= 1000 {
            engine::kernels::lm_head::lm_head_argmax_bf16::Tiles::candidates()
        } else {
            vec![TileSet::DEFAULT]
        };
        for tiles in shapes_tiles {
            for waves in WAVES {
                let t = LmHeadTiles { bf16: tiles, waves, ..LmHeadTiles::default() };
                let Ok(mut head) = LmHead::bf16(&gpu, &wb, vocab, hidden, t) else { continue };
                let label = format!("bf16 {vocab} × {hidden} {tiles:?} {} blocks", head.blocks());
                ran.insert(format!("{tiles:?}"));
                let [(got, token), second] = run(&gpu, &mut head, &x);
                check(&label, &c, &got, token, &want, &bound);
                assert_eq!(second, (got, token), "{label}: a second launch gave different bits");
                assert_eq!(head.counters(&gpu).expect("counters"), [0, 0], "{label}: counters left set");
            }
        }
    }
    let all = engine::kernels::lm_head::lm_head_argmax_bf16::Tiles::candidates().len();
    assert_eq!(ran.len(), all, "every tile candidate fits one of the shapes");
}

#[test]
#[ignore = "needs a CUDA device"]
fn nvfp4_logits_and_token_match_the_reference() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("lm_head nvfp4");
    let mut ran = std::collections::HashSet::new();
    for (vocab, hidden, ties) in [(1024, 256, false), (1024, 512, true), (248_320, 256, true), (32_768, 2560, true)] {
        let c = case(&mut rng, vocab, hidden, ties);
        let m = Nvfp4Matrix::quantise(&c.w, vocab, hidden);
        let deq = m.dequantise();
        let xf = to_f32(&c.x);
        let want = gemv(&deq, &xf, vocab, hidden);
        // x is staged as f16 per 16-value chunk scaled by its max (an error of ~2^-11 of the
        // chunk's largest value) and the products are summed in f16 within a 16-value block.
        let bound: Vec<f32> = gemv_magnitudes(&deq, &xf, hidden).iter().map(|m| 2e-3 * m + 1e-5).collect();
        let x = gpu.upload(&c.x).expect("x");
        // The tiny shapes hand every row out at run time when DYNAMIC > 0 (fewer rows than the
        // grid has groups); the large ones take each DYNAMIC candidate too, where most rows go
        // round the grid and the last eighths at run time.
        let tile_sets: Vec<_> = if vocab <= 1024 {
            lm_head_argmax_nvfp4::Tiles::candidates()
        } else {
            let base = lm_head_argmax_nvfp4::Tiles::DEFAULT;
            let dynamic: std::collections::BTreeSet<u32> =
                lm_head_argmax_nvfp4::Tiles::candidates().into_iter().map(|t| t.dynamic).collect();
            dynamic.into_iter().map(|dynamic| lm_head_argmax_nvfp4::Tiles { dynamic, ..base }).collect()
        };
        for tiles in tile_sets {
            for waves in WAVES {
                let t = LmHeadTiles { nvfp4: tiles, waves, ..LmHeadTiles::default() };
                let Ok(mut head) = LmHead::nvfp4(&gpu, &m, t) else { continue };
                let label = format!("nvfp4 {vocab} × {hidden} {tiles:?} {} blocks", head.blocks());
                ran.insert(format!("{tiles:?}"));
                let [(got, token), second] = run(&gpu, &mut head, &x);
                check(&label, &c, &got, token, &want, &bound);
                assert_eq!(second, (got, token), "{label}: a second launch gave different bits");
                assert_eq!(head.counters(&gpu).expect("counters"), [0, 0], "{label}: counters left set");
            }
        }
    }
    let all = lm_head_argmax_nvfp4::Tiles::candidates().len();
    assert_eq!(ran.len(), all, "every tile candidate fits one of the shapes");
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_graph_replay_gives_the_launch_bits() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("lm_head graph");
    let c = case(&mut rng, 50_000, 512, true);
    let wb: Vec<bf16> = c.w.iter().map(|&v| bf16::from_f32(v)).collect();
    let x = gpu.upload(&c.x).expect("x");
    let mut head = LmHead::bf16(&gpu, &wb, c.vocab, c.hidden, LmHeadTiles::default()).expect("lm_head");
    let [(eager, token), _] = run(&gpu, &mut head, &x);
    let mut logits = gpu.alloc::<f32>(c.vocab).expect("logits");
    let mut tok = gpu.alloc::<u32>(1).expect("token");
    let g = gpu.capture(|| head.launch(&gpu, &x, &mut logits, &mut tok)).expect("capture");
    for replay in 0..3 {
        gpu.fill_bytes(&mut logits, POISON).expect("poison");
        gpu.fill_bytes(&mut tok, POISON).expect("poison");
        g.launch().expect("replay");
        assert_eq!(gpu.download(&logits).expect("logits"), eager, "replay {replay}: logits");
        assert_eq!(gpu.download(&tok).expect("token")[0], token, "replay {replay}: token");
    }
}
