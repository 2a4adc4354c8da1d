//! The whole QSA layer on a GPU (the stacked projection, prepare, block scores, top-k, attention,
//! combine, o_proj: seven launches) against the CPU reference `reference::qsa::qsa`, stepping
//! token by token with the caches carried on the device:
//!
//! - two small shapes from an empty cache well past the budget (so that the top-k picks a few
//!   blocks out of many), one of them with 3 query heads a key/value head and other tiles;
//! - the published shape from an empty cache, and a few tokens after prefilled contexts of
//!   2,052 and 100,000 tokens (the caches written directly, random, the reference's state the same
//!   values), crossing a block's completion.
//!
//! Each token: the output within 1e-2 relative L2 of the reference's and every element finite (the
//! output and the scratch poisoned before each token); the block scores within 1e-4 relative L2
//! of the reference's; the selected blocks the reference's. The index projection is exact on both
//! sides (inputs on a grid of quarter integers, index weights of four ±1 or ±½ a row), so the
//! selections agree bar a near tie of the f32 and f64 scores; a token whose selection differs only
//! at a near tie is reported and its output not compared (at most a quarter of the tokens). Then
//! the same tokens replayed from one captured graph (the position written before each replay)
//! give the same bits as the eager pass. A position past the caches is refused before anything
//! runs (a CPU test too). Fresh random inputs each run.

use engine::cuda::Gpu;
use engine::error::Error;
use engine::layers::qsa::{
    QsaCaches, QsaContext, QsaKernels, QsaLaunches, QsaScratch, QsaShape, QsaTiles, QsaWeightsOnDevice, TopK,
    check_position,
};
use engine::model::config::ModelConfig;
use engine::model::weights::{Linear, QsaWeights};
use engine::reference::qsa::{QsaState, block_scores, qsa_traced, top_blocks};
use engine::reference::rope::Rope;
use flashnext::compare::rel_l2;
use flashnext::rng::{Rng, to_f32};
use half::bf16;
use kernel_dsl::TileSet;

/// 0xff bytes: NaN in bf16 and f32, u32::MAX.
const POISON: u8 = 0xff;

const PUBLISHED: QsaShape = QsaShape::PUBLISHED;
/// Two query heads a key/value head, a budget of 4 blocks (16 tokens).
const TINY: QsaShape = QsaShape {
    hidden: 256,
    q_heads: 4,
    kv_heads: 2,
    head_dim: 256,
    index_heads: 2,
    index_dim: 64,
    rotary: 64,
    block_tokens: 4,
    top: 4,
    eps: 1e-6,
    rope_theta: 1e4,
};
/// Three query heads a key/value head of 128 (the attention's 2-warp tiles), 3 index heads, a
/// budget of 3 blocks.
const TINY_GQA3: QsaShape =
    QsaShape { q_heads: 6, head_dim: 128, index_heads: 3, index_dim: 32, rotary: 32, top: 3, ..TINY };

/// A model config whose QSA fields are `shape`'s (the reference reads only those).
fn config(shape: QsaShape) -> ModelConfig {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-sparse/config.json");
    let mut c = ModelConfig::from_file(std::path::Path::new(path)).expect("tiny config");
    c.hidden_size = shape.hidden;
    c.num_heads = shape.q_heads;
    c.num_kv_heads = shape.kv_heads;
    c.head_dim = shape.head_dim;
    c.rotary_dim = shape.rotary;
    c.indexer_heads = shape.index_heads;
    c.indexer_head_dim = shape.index_dim;
    c.indexer_block = shape.block_tokens;
    c.indexer_budget = shape.top * shape.block_tokens;
    c.rms_norm_eps = shape.eps;
    c.rope_theta = shape.rope_theta;
    assert_eq!(QsaShape::from_config(&c).expect("shape"), shape);
    c
}

fn bf16_values(rng: &mut Rng, n: usize, scale: f32, offset: f32) -> Vec<f32> {
    (0..n).map(|_| bf16::from_f32(offset + scale * rng.normal()).to_f32()).collect()
}

fn linear(rng: &mut Rng, rows: usize, cols: usize) -> Linear {
    Linear { rows, cols, w: bf16_values(rng, rows * cols, 1.0 / (cols as f32).sqrt(), 0.0), bias: None }
}

/// Four nonzeros a row, each ±1 or ±½: with inputs on a grid of quarter integers, every output
/// is a multiple of 1/8 below 16 in magnitude, exact in bf16 and in any order of f32 sums.
fn sparse_linear(rng: &mut Rng, rows: usize, cols: usize) -> Linear {
    let mut w = vec![0.0f32; rows * cols];
    for r in 0..rows {
        for _ in 0..4 {
            let c = (rng.next_u64() % cols as u64) as usize;
            let v = if rng.next_u64().is_multiple_of(2) { 1.0 } else { 0.5 };
            w[r * cols + c] = if rng.next_u64().is_multiple_of(2) { v } else { -v };
        }
    }
    Linear { rows, cols, w, bias: None }
}

fn weights(rng: &mut Rng, sh: QsaShape) -> QsaWeights {
    let d = sh.hidden;
    QsaWeights {
        q: linear(rng, 2 * sh.attn_dim(), d),
        k: linear(rng, sh.kv_dim(), d),
        v: linear(rng, sh.kv_dim(), d),
        o: linear(rng, d, sh.attn_dim()),
        q_norm: bf16_values(rng, sh.head_dim, 0.2, 0.0),
        k_norm: bf16_values(rng, sh.head_dim, 0.2, 0.0),
        index_qk: sparse_linear(rng, (sh.index_heads + 1) * sh.index_dim, d),
        index_q_norm: bf16_values(rng, sh.index_dim, 0.2, 0.0),
        index_k_norm: bf16_values(rng, sh.index_dim, 0.2, 0.0),
    }
}

/// Inputs on a grid of quarter integers in [−2, 2].
fn grid_input(rng: &mut Rng, n: usize) -> Vec<bf16> {
    (0..n).map(|_| bf16::from_f32(((rng.next_u64() % 17) as f32 - 8.0) / 4.0)).collect()
}

/// Caches written directly for a prefilled context of `tokens`, on the device and in the
/// reference's state alike; the device rows past them poisoned.
fn prefill(gpu: &Gpu, rng: &mut Rng, sh: QsaShape, tokens: usize, caches: &mut QsaCaches) -> QsaState {
    let (kv, di, c) = (sh.kv_dim(), sh.index_dim, sh.block_tokens);
    let cap = caches.capacity();
    let nan_bf16 = bf16::from_bits(u16::from_ne_bytes([POISON; 2]));
    let nan_f32 = f32::from_bits(u32::from_ne_bytes([POISON; 4]));
    let mut k = rng.bf16_normal(tokens * kv, 1.0);
    let mut v = rng.bf16_normal(tokens * kv, 1.0);
    let mut index_keys: Vec<f32> = (0..tokens * di).map(|_| rng.normal()).collect();
    let blocks = tokens / c;
    // Pooled keys of norm ~√dim, leaning positive, as normed keys are.
    let mut block_keys: Vec<f32> = (0..blocks * di).map(|_| rng.normal() + 0.2).collect();
    let st = QsaState {
        keys: k.chunks(kv).map(to_f32).collect(),
        values: v.chunks(kv).map(to_f32).collect(),
        index_keys: index_keys.chunks(di).map(<[f32]>::to_vec).collect(),
        block_keys: block_keys.chunks(di).map(<[f32]>::to_vec).collect(),
    };
    k.resize(cap * kv, nan_bf16);
    v.resize(cap * kv, nan_bf16);
    index_keys.resize(cap * di, nan_f32);
    block_keys.resize(cap / c * di, nan_f32);
    gpu.write(&mut caches.k, &k).expect("k cache");
    gpu.write(&mut caches.v, &v).expect("v cache");
    gpu.write(&mut caches.index_keys, &index_keys).expect("index keys");
    gpu.write(&mut caches.block_keys, &block_keys).expect("block keys");
    st
}

/// What one token of a pass produced on the device.
#[derive(Clone, PartialEq)]
struct Step {
    y: Vec<bf16>,
    selected: Vec<u32>,
    count: u32,
    scores: Vec<f32>,
}

fn poison_scratch(gpu: &Gpu, s: &mut QsaScratch) {
    gpu.fill_bytes(&mut s.proj, POISON).expect("poison");
    gpu.fill_bytes(&mut s.o, POISON).expect("poison");
    for b in [&mut s.q, &mut s.gate, &mut s.index_q, &mut s.scores, &mut s.partial_acc, &mut s.partial_ml] {
        gpu.fill_bytes(b, POISON).expect("poison");
    }
    for b in [&mut s.n_blocks, &mut s.selected, &mut s.count] {
        gpu.fill_bytes(b, POISON).expect("poison");
    }
}

/// Steps the layer over `xs` from position `first`, eagerly or by replays of `graph`.
#[allow(clippy::too_many_arguments)]
fn pass(
    gpu: &Gpu,
    k: &QsaKernels,
    launches: &QsaLaunches,
    graph: Option<&engine::cuda::Graph>,
    ctx: &mut QsaContext,
    s: &mut QsaScratch,
    dx: &mut engine::cuda::DeviceBuffer<bf16>,
    dy: &mut engine::cuda::DeviceBuffer<bf16>,
    xs: &[Vec<bf16>],
    first: usize,
) -> Vec<Step> {
    let mut steps = Vec::new();
    for (t, x) in xs.iter().enumerate() {
        gpu.write(dx, x).expect("x");
        ctx.set_position(gpu, first + t).expect("position");
        gpu.fill_bytes(dy, POISON).expect("poison");
        poison_scratch(gpu, s);
        match graph {
            Some(g) => g.launch().expect("replay"),
            // SAFETY: the launches were built from live buffers; x and y hold `hidden` elements
            // apart from everything else; the position was set (below the capacity) just above.
            None => unsafe { launches.enqueue(gpu, k) }.expect("enqueue"),
        }
        steps.push(Step {
            y: gpu.download(dy).expect("y"),
            selected: gpu.download(&s.selected).expect("selected"),
            count: gpu.download(&s.count).expect("count")[0],
            scores: gpu.download(&s.scores).expect("scores"),
        });
    }
    steps
}

/// `steps` tokens after a prefilled context of `context` tokens: every token against the
/// reference, then the graph replays against the eager pass, then the refusal past the caches.
fn case(gpu: &Gpu, rng: &mut Rng, sh: QsaShape, tiles: QsaTiles, context: usize, steps: usize) {
    let label = format!("{sh:?} context {context}");
    let cfg = config(sh);
    let w = weights(rng, sh);
    let rope = Rope::new(sh.rope_theta, sh.rotary);
    let dw = QsaWeightsOnDevice::upload_bf16(gpu, sh, &w).expect("upload");
    let k = QsaKernels::load(gpu, tiles).expect("kernels");
    let mut ctx = QsaContext::new(gpu, sh, context + steps).expect("context");
    let mut caches = QsaCaches::new(gpu, sh, &ctx).expect("caches");
    let mut s = QsaScratch::new(gpu, sh, &ctx).expect("scratch");
    let mut st = prefill(gpu, rng, sh, context, &mut caches);
    let xs: Vec<Vec<bf16>> = (0..steps).map(|_| grid_input(rng, sh.hidden)).collect();
    let mut dx = gpu.alloc::<bf16>(sh.hidden).expect("x");
    let mut dy = gpu.alloc::<bf16>(sh.hidden).expect("y");
    let launches = QsaLaunches::new(&k, &dw, &mut ctx, &mut caches, &mut s, dx.ptr(), dy.ptr_mut()).expect("launches");

    let eager = pass(gpu, &k, &launches, None, &mut ctx, &mut s, &mut dx, &mut dy, &xs, context);
    let (c, top) = (sh.block_tokens, sh.top);
    let mut near_ties = 0;
    let mut worst = 0.0f64;
    let mut sparse_tokens = 0;
    for (t, (x, got)) in xs.iter().zip(&eager).enumerate() {
        let pos = context + t;
        let at = format!("{label} position {pos}");
        let trace = qsa_traced(&to_f32(x), pos, &w, &cfg, &rope, &mut st);
        let y = to_f32(&got.y);
        if let Some(i) = y.iter().position(|v| !v.is_finite()) {
            panic!("{at}: y[{i}] = {} (unwritten?)", y[i]);
        }
        let complete = (pos + 1) / c;
        assert_eq!(got.count as usize, complete.min(top), "{at}: the selection's count");
        let got_blocks: Vec<usize> = got.selected[..complete.min(top)].iter().map(|&b| b as usize).collect();
        let want_blocks: Vec<usize> = if complete > top {
            sparse_tokens += 1;
            let want_scores = block_scores(&trace.index_q, &st.block_keys[..complete]);
            let e = rel_l2(&got.scores[..complete], &want_scores);
            assert!(e < 1e-4, "{at}: block scores {e:.2e} from the reference's (relative L2)");
            let want = top_blocks(&want_scores, top);
            if got_blocks != want {
                // Only a near tie at the k-th score may differ.
                let mut sorted = want_scores.clone();
                sorted.sort_by(|a, b| b.total_cmp(a));
                let kth = sorted[top - 1];
                let scale = sorted[0].abs().max(1.0);
                for b in got_blocks
                    .iter()
                    .filter(|b| !want.contains(b))
                    .chain(want.iter().filter(|b| !got_blocks.contains(b)))
                {
                    let gap = (want_scores[*b] - kth).abs();
                    assert!(
                        gap <= 1e-5 * scale,
                        "{at}: block {b} (score {}) is in one selection only, {gap:.2e} from the k-th score {kth}",
                        want_scores[*b]
                    );
                }
                near_ties += 1;
                println!("{at}: the selections differ at a near tie; output not compared");
                continue;
            }
            want
        } else {
            (0..complete).collect()
        };
        assert_eq!(got_blocks, want_blocks, "{at}: selected blocks");
        let want_tokens: Vec<usize> =
            want_blocks.iter().flat_map(|&b| c * b..c * (b + 1)).chain(c * complete..=pos).collect();
        assert_eq!(trace.tokens, want_tokens, "{at}: the reference's tokens");
        let e = rel_l2(&y, &trace.y);
        worst = worst.max(e);
        assert!(e < 1e-2, "{at}: y is {e:.2e} from the reference (relative L2)");
    }
    assert!(near_ties * 4 <= steps, "{label}: {near_ties} near ties in {steps} tokens");
    println!(
        "{label}: {steps} tokens ({sparse_tokens} through the top-k), y within {worst:.2e} of the reference (relative L2), {near_ties} near ties"
    );

    // The same tokens from one captured graph; the caches' rows past the context are rewritten
    // in the same order, and nothing before it was touched.
    let graph = gpu
        .capture(|| {
            // SAFETY: as for the eager pass; capture runs nothing.
            unsafe { launches.enqueue(gpu, &k) }
        })
        .expect("capture");
    let replayed = pass(gpu, &k, &launches, Some(&graph), &mut ctx, &mut s, &mut dx, &mut dy, &xs, context);
    for (t, (a, b)) in replayed.iter().zip(&eager).enumerate() {
        assert!(
            a.y.iter().zip(&b.y).all(|(p, q)| p.to_bits() == q.to_bits()) && a.selected == b.selected,
            "{label} position {}: the graph replay gave other bits than the eager pass",
            context + t
        );
    }

    // Past the caches: refused, the device position left as it was.
    let last = context + steps - 1;
    let cap = ctx.capacity();
    match ctx.set_position(gpu, cap) {
        Err(Error::ContextTooLong { needed, capacity }) => assert_eq!((needed, capacity), (cap + 1, cap)),
        other => panic!("{label}: position {cap} of a {cap}-token cache: {other:?}"),
    }
    assert_eq!(gpu.download(&ctx.position).expect("position"), [last as u32], "{label}: position overwritten");
}

#[test]
#[ignore = "needs a CUDA device"]
fn qsa_layer_tiny_shapes_through_the_budget() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("qsa layer tiny");
    // 80 tokens: 20 blocks against a budget of 4.
    // Both top-k kernels: one block, and the multi-block one with its grid barriers.
    for top_k in [TopK::OneBlock(TileSet::DEFAULT), TopK::Grid(TileSet::DEFAULT)] {
        let tiles = QsaTiles { top_k, ..QsaTiles::fitting(TINY) };
        tiles.check(TINY, TINY.capacity_for(80)).expect("tiles");
        case(&gpu, &mut rng, TINY, tiles, 0, 80);
        // Head dim 128 takes the attention's 2-warp tiles; chunks of 32.
        let mut tiles = QsaTiles { top_k, ..QsaTiles::fitting(TINY_GQA3) };
        tiles.attention.chunk = 32;
        tiles.check(TINY_GQA3, TINY_GQA3.capacity_for(61)).expect("tiles");
        case(&gpu, &mut rng, TINY_GQA3, tiles, 0, 61);
        // After a prefilled context past the budget, crossing two block completions.
        case(&gpu, &mut rng, TINY, QsaTiles { top_k, ..QsaTiles::fitting(TINY) }, 203, 9);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn qsa_layer_published_shape_matches_the_reference() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("qsa layer published");
    // From an empty cache (dense), then past the budget (513 blocks at the first token) and at
    // 100k; each crosses a block's completion. Both top-k kernels.
    for top_k in [TopK::OneBlock(TileSet::DEFAULT), TopK::Grid(TileSet::DEFAULT)] {
        let tiles = QsaTiles { top_k, ..QsaTiles::default() };
        for (context, steps) in [(0, 6), (2_052, 4), (100_000, 4)] {
            case(&gpu, &mut rng, PUBLISHED, tiles, context, steps);
        }
    }
}

/// The refusal of a token past the caches, on the CPU: the caches hold `capacity_for(n)` tokens.
#[test]
fn a_token_past_the_caches_is_refused() {
    let cap = PUBLISHED.capacity_for(32_768);
    assert_eq!(cap, 32_768);
    assert!(check_position(cap - 1, cap).is_ok());
    let err = check_position(cap, cap).expect_err("one token too many");
    assert!(matches!(err, Error::ContextTooLong { needed: 32_769, capacity: 32_768 }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("32769") && msg.contains("32768"), "{msg}");
    // Capacities round up to whole groups of 4 blocks.
    assert_eq!(TINY.capacity_for(17), 32);
    assert!(check_position(31, TINY.capacity_for(17)).is_ok());
}
