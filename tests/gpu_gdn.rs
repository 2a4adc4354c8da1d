//! The Gated DeltaNet layer on a GPU (in_proj with conv and gates, the state update with the
//! gated norm, out_proj: three launches) against the CPU reference `reference::gdn`, over 64
//! consecutive tokens with the conv history and the fp32 state carried on the device: every
//! token's bf16 output within 1e-2 relative L2, the state and the conv history within 1e-4 after
//! the last token, every element finite (outputs and scratch poisoned before each token). The
//! input projection in bf16 and in NVFP4 (the reference reads the dequantised values). A tiny
//! shape with dk ≠ dv and three value heads per key head runs every tile candidate of the input
//! projection and of the delta rule (the gated norm in its whole-head blocks' epilogue), and
//! out_proj's one-tile variations; the published shape runs the defaults. A second run of the
//! same tokens gives the same bits. Fresh random inputs each run.

use engine::cuda::Gpu;
use engine::kernels::gdn::in_proj::gdn_in_proj_nvfp4;
use engine::kernels::gemv_bf16::gemv_bf16;
use engine::kernels::gemv_nvfp4::gemv_nvfp4;
use engine::layers::gdn::{
    CONV_KERNEL, GdnKernels, GdnScratch, GdnShape, GdnStateOnDevice, GdnTiles, GdnWeightsOnDevice, enqueue,
};
use engine::model::config::ModelConfig;
use engine::model::nvfp4::Nvfp4Matrix;
use engine::model::weights::{GdnWeights, Linear};
use engine::reference;
use engine::reference::gdn::GdnState;
use flashnext::compare::rel_l2;
use flashnext::rng::{Rng, to_f32};
use half::bf16;
use kernel_dsl::TileSet;

const TOKENS: usize = 64;
const POISON: u8 = 0xff;

/// Three value heads per key head, dk ≠ dv: a wrong head mapping or a transposed state shows.
const TINY: GdnShape =
    GdnShape { hidden: 256, key_heads: 2, value_heads: 6, key_dim: 64, value_dim: 128, eps: 1e-6, sigmoid_gate: true };
/// The NVFP4 kernel takes 512 columns a step.
const TINY_NVFP4: GdnShape = GdnShape { hidden: 512, ..TINY };
const PUBLISHED: GdnShape = GdnShape {
    hidden: 2560,
    key_heads: 16,
    value_heads: 48,
    key_dim: 128,
    value_dim: 128,
    eps: 1e-6,
    sigmoid_gate: true,
};

/// A model config whose GDN fields are `shape`'s (the reference reads only those).
fn config(shape: GdnShape) -> ModelConfig {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-dense/config.json");
    let mut c = ModelConfig::from_file(std::path::Path::new(path)).expect("tiny config");
    c.hidden_size = shape.hidden;
    c.linear_key_heads = shape.key_heads;
    c.linear_value_heads = shape.value_heads;
    c.linear_key_dim = shape.key_dim;
    c.linear_value_dim = shape.value_dim;
    c.linear_conv_kernel = CONV_KERNEL;
    c.rms_norm_eps = shape.eps;
    c.gdn_gate_sigmoid = shape.sigmoid_gate;
    assert_eq!(GdnShape::from_config(&c).expect("shape"), shape);
    c
}

fn bf16_values(rng: &mut Rng, n: usize, scale: f32, offset: f32) -> Vec<f32> {
    (0..n).map(|_| bf16::from_f32(offset + scale * rng.normal()).to_f32()).collect()
}

fn linear(rng: &mut Rng, rows: usize, cols: usize) -> Linear {
    Linear { rows, cols, w: bf16_values(rng, rows * cols, 1.0 / (cols as f32).sqrt(), 0.0), bias: None }
}

/// Random weights, all bf16-representable. The decay α = exp(−A·softplus(a + dt_bias)) lands
/// mostly above 0.5, so that the state carries tokens far back.
fn weights(rng: &mut Rng, sh: GdnShape) -> GdnWeights {
    let (d, hv) = (sh.hidden, sh.value_heads);
    GdnWeights {
        in_qkv: linear(rng, sh.conv_dim(), d),
        in_z: linear(rng, sh.z_dim(), d),
        in_b: linear(rng, hv, d),
        in_a: linear(rng, hv, d),
        conv: bf16_values(rng, CONV_KERNEL * sh.conv_dim(), 0.5, 0.0),
        dt_bias: (0..hv).map(|_| -2.5 + 0.5 * rng.normal()).collect(),
        a_log: (0..hv).map(|_| (0.5 + 3.5 * rng.uniform()).ln()).collect(),
        norm: bf16_values(rng, sh.value_dim, 0.2, 1.0),
        out: linear(rng, d, sh.z_dim()),
    }
}

/// A random NVFP4 matrix: codes anything, block scales between 2^-2 and 2^2, a global scale that
/// gives values of about 1/√cols.
fn random_nvfp4(rng: &mut Rng, rows: usize, cols: usize) -> Nvfp4Matrix {
    let mut packed = vec![0u8; rows * cols / 2];
    for chunk in packed.chunks_mut(8) {
        let r = rng.next_u64().to_le_bytes();
        chunk.copy_from_slice(&r[..chunk.len()]);
    }
    let scales =
        (0..rows * cols / 16).map(|_| (((rng.next_u64() % 4 + 5) << 3) | (rng.next_u64() % 8)) as u8).collect();
    let scale_2 = (0.5 + rng.uniform()) / (3.0 * (cols as f32).sqrt());
    Nvfp4Matrix { rows, cols, packed, scales, scale_2 }
}

/// The reference's outputs for every token and its state after the last one.
struct Expected {
    ys: Vec<Vec<f32>>,
    state: GdnState,
}

fn expected(cfg: &ModelConfig, w: &GdnWeights, xs: &[Vec<bf16>]) -> Expected {
    let mut state = GdnState::new(cfg);
    let ys = xs.iter().map(|x| reference::gdn::gdn(&to_f32(x), w, cfg, &mut state)).collect();
    Expected { ys, state }
}

/// What one GPU run of the token sequence produced.
struct Got {
    ys: Vec<Vec<f32>>,
    state: Vec<f32>,
    conv_hist: Vec<f32>,
}

fn run(gpu: &Gpu, k: &GdnKernels, w: &GdnWeightsOnDevice, xs: &[Vec<bf16>]) -> Got {
    let sh = w.shape;
    let mut st = GdnStateOnDevice::new(gpu, sh).expect("state");
    let mut s = GdnScratch::new(gpu, sh).expect("scratch");
    let dxs: Vec<_> = xs.iter().map(|x| gpu.upload(x).expect("x")).collect();
    let mut dy = gpu.alloc::<bf16>(sh.hidden).expect("y");
    let mut ys = Vec::new();
    for dx in &dxs {
        gpu.fill_bytes(&mut dy, POISON).expect("poison");
        gpu.fill_bytes(&mut s.proj, POISON).expect("poison");
        gpu.fill_bytes(&mut s.normed, POISON).expect("poison");
        // SAFETY: x and y hold `hidden` elements; they are neither weights, state nor scratch.
        unsafe { enqueue(gpu, k, w, &mut st, &mut s, dx.ptr(), dy.ptr_mut()) }.expect("enqueue");
        ys.push(to_f32(&gpu.download(&dy).expect("y")));
    }
    Got {
        ys,
        state: gpu.download(&st.state).expect("state"),
        conv_hist: gpu.download(&st.conv_hist).expect("conv history"),
    }
}

fn check(label: &str, want: &Expected, got: &Got) {
    let mut worst = 0.0f64;
    for (t, (g, e)) in got.ys.iter().zip(&want.ys).enumerate() {
        assert!(g.iter().all(|v| v.is_finite()), "{label}: token {t}: y has unwritten (NaN) elements");
        let err = rel_l2(g, e);
        assert!(err < 1e-2, "{label}: token {t}: y is {err:.2e} from the reference (relative L2)");
        worst = worst.max(err);
    }
    assert!(got.state.iter().all(|v| v.is_finite()), "{label}: the state has non-finite elements");
    let state_err = rel_l2(&got.state, &want.state.state);
    assert!(state_err < 1e-4, "{label}: the state is {state_err:.2e} from the reference (relative L2)");
    let hist: Vec<f32> = want.state.conv_inputs.concat();
    let hist_err = rel_l2(&got.conv_hist, &hist);
    assert!(hist_err < 1e-4, "{label}: the conv history is {hist_err:.2e} from the reference (relative L2)");
    println!(
        "{label}: {TOKENS} tokens, y within {worst:.2e} (worst token), state {state_err:.2e}, conv history {hist_err:.2e}"
    );
}

/// The tiles that fit `shape` ([`GdnTiles::fitting`]), then every candidate of the input
/// projection of this format and of the delta rule, and each candidate of the plain bf16 GEMV one
/// tile off its default (gpu_kernels covers it in full), the others at the base: those that fit.
fn tile_variants(shape: GdnShape, nvfp4: bool) -> Vec<GdnTiles> {
    let base = GdnTiles::fitting(shape, nvfp4).unwrap_or_else(|| panic!("no tile set fits {shape:?}"));
    let mut v = vec![base];
    if nvfp4 {
        v.extend(TileSet::candidates().into_iter().map(|t| GdnTiles { in_proj_nvfp4: t, ..base }));
    } else {
        v.extend(TileSet::candidates().into_iter().map(|t| GdnTiles { in_proj: t, ..base }));
    }
    v.extend(TileSet::candidates().into_iter().map(|t| GdnTiles { delta_rule_normed: t, ..base }));
    let d = <gemv_bf16::Tiles as TileSet>::DEFAULT.values();
    v.extend(
        <gemv_bf16::Tiles as TileSet>::candidates()
            .into_iter()
            .filter(|t| t.values().iter().zip(&d).filter(|(a, b)| a != b).count() == 1)
            .map(|t| GdnTiles { out_proj: t, ..base }),
    );
    let mut unique: Vec<GdnTiles> = Vec::new();
    for t in v {
        if t.check(shape, nvfp4).is_ok() && !unique.contains(&t) {
            unique.push(t);
        }
    }
    unique
}

/// The layer over `TOKENS` tokens at each of `tiles`: the input projection in NVFP4 when `nvfp4`,
/// out_proj too when `nvfp4_out` (the reference on the dequantised matrices).
fn case(gpu: &Gpu, rng: &mut Rng, shape: GdnShape, nvfp4: bool, tiles: &[GdnTiles]) {
    case_with(gpu, rng, shape, nvfp4, false, tiles)
}

fn case_with(gpu: &Gpu, rng: &mut Rng, shape: GdnShape, nvfp4: bool, nvfp4_out: bool, tiles: &[GdnTiles]) {
    let cfg = config(shape);
    let mut w = weights(rng, shape);
    let lin = |m: &Nvfp4Matrix| Linear { rows: m.rows, cols: m.cols, w: m.dequantise(), bias: None };
    let in_proj = nvfp4.then(|| {
        let (d, hv) = (shape.hidden, shape.value_heads);
        let m = [
            random_nvfp4(rng, shape.conv_dim(), d),
            random_nvfp4(rng, shape.z_dim(), d),
            random_nvfp4(rng, hv, d),
            random_nvfp4(rng, hv, d),
        ];
        (w.in_qkv, w.in_z, w.in_b, w.in_a) = (lin(&m[0]), lin(&m[1]), lin(&m[2]), lin(&m[3]));
        m
    });
    let out_proj = nvfp4_out.then(|| {
        let m = random_nvfp4(rng, shape.hidden, shape.z_dim());
        w.out = lin(&m);
        m
    });
    let mut dw = match &in_proj {
        // upload_nvfp4 and upload_bf16 where they cover the case, `upload` with out_proj in NVFP4
        // (the input projection's codes in the first tile set's layout, rearranged on the host).
        Some(m) if out_proj.is_none() => GdnWeightsOnDevice::upload_nvfp4(gpu, shape, [&m[0], &m[1], &m[2], &m[3]], &w),
        None if out_proj.is_none() => GdnWeightsOnDevice::upload_bf16(gpu, shape, &w),
        _ => {
            let in_proj = in_proj.as_ref().map(|m| [&m[0], &m[1], &m[2], &m[3]]);
            let layout = tiles[0].in_proj_layout(gpu.arch());
            GdnWeightsOnDevice::upload(gpu, shape, &w, in_proj, out_proj.as_ref(), layout)
        }
    }
    .expect("upload");
    let xs: Vec<Vec<bf16>> = (0..TOKENS).map(|_| rng.bf16_normal(shape.hidden, 1.0)).collect();
    let want = expected(&cfg, &w, &xs);
    for (i, t) in tiles.iter().enumerate() {
        let k = GdnKernels::load(gpu, *t).expect("compile");
        // The tensor-core path reads its codes in the paired layout, the f32 path in ModelOpt's.
        dw.set_in_proj_layout(gpu, t.in_proj_layout(gpu.arch())).expect("codes in the kernel's layout");
        let label = format!(
            "{}{} {shape:?} {t:?}",
            if nvfp4 { "nvfp4" } else { "bf16" },
            if nvfp4_out { " + nvfp4 out_proj" } else { "" }
        );
        let got = run(gpu, &k, &dw, &xs);
        check(&label, &want, &got);
        // The first tile set runs twice.
        if i == 0 {
            let again = run(gpu, &k, &dw, &xs);
            let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                got.ys.iter().zip(&again.ys).all(|(a, b)| same(a, b)) && same(&got.state, &again.state),
                "{label}: a second run of the same tokens gave different bits"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn gdn_tiny_every_tile_candidate_matches_the_reference() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("gdn tiny");
    let tiles = tile_variants(TINY, false);
    println!("tiny shape, bf16: {} tile sets", tiles.len());
    case(&gpu, &mut rng, TINY, false, &tiles);
    // The SiLU output gate (a config without output_gate_type), at the tiles that fit (the
    // defaults are tuned for the published head size, which the tiny shape does not have).
    let silu = GdnShape { sigmoid_gate: false, ..TINY };
    case(&gpu, &mut rng, silu, false, &[GdnTiles::fitting(silu, false).expect("fitting tiles")]);
}

#[test]
#[ignore = "needs a CUDA device"]
fn gdn_nvfp4_tiny_every_tile_candidate_matches_the_reference() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("gdn nvfp4 tiny");
    let tiles = tile_variants(TINY_NVFP4, true);
    println!("tiny shape, nvfp4: {} tile sets", tiles.len());
    case(&gpu, &mut rng, TINY_NVFP4, true, &tiles);
}

/// The tensor-core input projection alone, at every tile set of it that fits the tiny NVFP4
/// shape (the sweep above holds them among 30 others): a run short enough for racecheck, whose
/// concern is this path's two meetings in shared memory (x staged behind a barrier, the warps'
/// sums behind another).
#[test]
#[ignore = "needs a CUDA device"]
fn gdn_nvfp4_tensor_core_tiles_match_the_reference() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("gdn nvfp4 tensor cores");
    let base = GdnTiles::fitting(TINY_NVFP4, true).expect("fitting tiles");
    let tiles: Vec<GdnTiles> = <gdn_in_proj_nvfp4::Tiles as TileSet>::candidates()
        .into_iter()
        .filter(|t| t.mma == 1)
        .map(|in_proj_nvfp4| GdnTiles { in_proj_nvfp4, ..base })
        .filter(|t| t.check(TINY_NVFP4, true).is_ok())
        .collect();
    println!("tiny shape, nvfp4 tensor-core input projection: {} tile sets", tiles.len());
    assert!(tiles.len() >= 6, "{tiles:?}");
    case(&gpu, &mut rng, TINY_NVFP4, true, &tiles);
}

#[test]
#[ignore = "needs a CUDA device"]
fn gdn_published_shape_matches_the_reference() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("gdn published");
    let tiles = [GdnTiles::default()];
    case(&gpu, &mut rng, PUBLISHED, false, &tiles);
    // NVFP4: the input projection on its tensor-core path (the default; codes in the paired
    // layout) at each residency it declares, and on its f32 path (codes in ModelOpt's layout).
    let mut nvfp4 = tiles.to_vec();
    let in_projs = [0, 4, 8].map(|min_blocks| gdn_in_proj_nvfp4::Tiles { min_blocks, ..TileSet::DEFAULT });
    for in_proj_nvfp4 in in_projs.into_iter().chain([engine::kernels::gdn::in_proj::F32_PATH]) {
        let t = GdnTiles { in_proj_nvfp4, ..GdnTiles::default() };
        if t.check(PUBLISHED, true).is_ok() && !nvfp4.contains(&t) {
            nvfp4.push(t);
        }
    }
    assert!(nvfp4.iter().any(|t| t.in_proj_nvfp4.mma == 1), "{nvfp4:?}");
    assert!(nvfp4.iter().any(|t| t.in_proj_nvfp4.mma == 0), "{nvfp4:?}");
    case(&gpu, &mut rng, PUBLISHED, true, &nvfp4);
}

#[test]
#[ignore = "needs a CUDA device"]
fn gdn_published_shape_with_nvfp4_out_proj_matches_the_reference() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("gdn published nvfp4 out_proj");
    // out_proj's NVFP4 GEMV at the defaults (the row path), at every split of the split path that
    // fits, and at other tiles of the row path (two and four rows a block, the weights loaded
    // after the wait and before; the step's with x copied by the copy engine, XBULK).
    let base = GdnTiles::default();
    let mut tiles = vec![base];
    let at = |out_proj_nvfp4| GdnTiles { out_proj_nvfp4, ..base };
    let (row_path, split_path) = (engine::kernels::gemv_nvfp4::ROW_PATH, engine::kernels::gemv_nvfp4::SPLIT_PATH);
    let splits = [1, 2, 4, 8].map(|k_split| at(gemv_nvfp4::Tiles { k_split, ..split_path }));
    let rows = [(2, 0, 0), (4, 0, 0), (4, 8, 0), (2, 8, 1)]
        .map(|(rows, early, xbulk)| at(gemv_nvfp4::Tiles { rows, early, xbulk, ..row_path }));
    for t in splits.into_iter().chain(rows) {
        if t.check_out_proj_nvfp4(PUBLISHED).is_ok() {
            tiles.push(t);
        }
    }
    assert!(tiles.len() >= 8, "{tiles:?}");
    case_with(&gpu, &mut rng, PUBLISHED, true, true, &tiles);
}

/// No GPU: the test's config and inputs are what the GPU tests assume (a valid shape, finite
/// outputs, decays that keep the state, a state that grows from zero).
#[test]
fn the_test_inputs_carry_the_state() {
    let mut rng = Rng::fresh("gdn inputs");
    let cfg = config(TINY);
    let w = weights(&mut rng, TINY);
    let xs: Vec<Vec<bf16>> = (0..TOKENS).map(|_| rng.bf16_normal(TINY.hidden, 1.0)).collect();
    let e = expected(&cfg, &w, &xs);
    assert!(e.ys.iter().flatten().all(|v| v.is_finite()));
    assert!(e.state.state.iter().all(|v| v.is_finite()) && e.state.state.iter().any(|&v| v != 0.0));
    let x = to_f32(&xs[0]);
    let decays: Vec<f32> = w
        .in_a
        .apply(&x)
        .iter()
        .enumerate()
        .map(|(h, &a)| (-(w.a_log[h].exp()) * reference::norm::softplus(a + w.dt_bias[h])).exp())
        .collect();
    println!("decays of token 0: {decays:?}");
    assert!(decays.iter().all(|&a| a > 0.0 && a < 1.0), "{decays:?}");
    assert!(
        2 * decays.iter().filter(|&&a| a > 0.5).count() >= decays.len(),
        "most heads keep half their state: {decays:?}"
    );
}

/// The tile sets the tiny GPU cases run (checked here without a GPU): a base that fits, and for
/// each kernel at least one variation of it that fits.
#[test]
fn the_tiny_shape_runs_variations_of_every_kernel() {
    for (shape, nvfp4) in [(TINY, false), (TINY_NVFP4, true)] {
        let v = tile_variants(shape, nvfp4);
        let base = v[0];
        let varied = |f: fn(&GdnTiles, &GdnTiles) -> bool| v.iter().any(|t| f(t, &base));
        assert!(varied(|t, b| t.in_proj != b.in_proj || t.in_proj_nvfp4 != b.in_proj_nvfp4), "input projection");
        // Every fitting candidate of the whole-head delta rule (3 at dk 64, dv 128, times TRIGGER).
        let fitting = <engine::kernels::gdn::delta_rule_normed::gdn_delta_rule_normed::Tiles as TileSet>::candidates()
            .into_iter()
            .filter(|c| GdnTiles { delta_rule_normed: *c, ..base }.check(shape, nvfp4).is_ok())
            .count();
        assert!(fitting >= 6, "whole-head delta rule: {fitting} candidates fit");
        let normed = v.iter().filter(|t| t.delta_rule_normed != base.delta_rule_normed).count() + 1;
        assert!(normed >= fitting, "whole-head delta rule: {normed} of {fitting} candidates run");
        assert!(varied(|t, b| t.out_proj != b.out_proj), "out_proj");
        println!("tiny shape, nvfp4 {nvfp4}: {} tile sets", v.len());
    }
}
