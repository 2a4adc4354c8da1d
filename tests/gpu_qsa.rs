//! QSA's indexer kernels on a GPU against the CPU reference `reference::qsa`: the block scores
//! (every element within f32 rounding of the f64 reference, nothing written past the complete
//! blocks, the block count left for the top-k) and the top-k (the selected blocks identical to
//! `top_blocks`, in order, on random scores with many ties, at 10, 512, 513 and 65,536 blocks,
//! the count read from device memory). Outputs poisoned before each launch; a second launch gives
//! the same bits; every tile candidate runs. Fresh random inputs each run.

use engine::cuda::{DeviceBuffer, Gpu};
use engine::kernels::qsa::block_scores::qsa_block_scores;
use engine::kernels::qsa::top_blocks::qsa_top_blocks;
use engine::reference::qsa::{block_scores, top_blocks};
use flashnext::rng::Rng;
use kernel_dsl::{KernelDef, TileSet};

const POISON: u8 = 0xab;
/// The published budget: 2048 tokens in blocks of 4.
const TOP: usize = 512;
/// The score buffer's capacity: 65,536 blocks (262,144 tokens).
const CAPACITY: usize = 65_536;

/// How a case's scores are drawn.
#[derive(Clone, Copy, Debug)]
enum Scores {
    /// 64 levels: most scores tie with hundreds of others, at the k-th too.
    FewLevels,
    /// Non-negative values of every magnitude (as ReLU sums are), one in eight repeating an
    /// earlier value.
    Continuous,
    /// Every score 0 (every index query's product negative): the lowest blocks win.
    AllZero,
    /// Both signs, ±0 among them: the order is `f32::total_cmp`'s.
    Signed,
}

fn draw(rng: &mut Rng, kind: Scores, n: usize) -> Vec<f32> {
    let mut v: Vec<f32> = Vec::with_capacity(n);
    for i in 0..n {
        let x = match kind {
            Scores::FewLevels => (rng.next_u64() % 64) as f32 * 0.125,
            Scores::Continuous if i > 0 && rng.next_u64() % 8 == 0 => v[(rng.next_u64() % i as u64) as usize],
            Scores::Continuous => rng.uniform() * 2f32.powi((rng.next_u64() % 40) as i32 - 20),
            Scores::AllZero => 0.0,
            Scores::Signed => match rng.next_u64() % 8 {
                0 => 0.0,
                1 => -0.0,
                _ => rng.normal(),
            },
        };
        v.push(x);
    }
    v
}

/// Runs the top-k twice on `scores` (the buffer's tail past n poisoned with large scores that
/// must not be chosen): the selection and the count of each run.
fn top_k_on_gpu(gpu: &Gpu, tiles: qsa_top_blocks::Tiles, scores: &[f32], n: usize, top: usize) -> [(Vec<u32>, u32); 2] {
    let mut padded = scores.to_vec();
    padded.resize(CAPACITY, 1e30);
    let d_scores = gpu.upload(&padded).expect("scores");
    let d_n = gpu.upload(&[n as u32]).expect("n");
    let mut selected = gpu.alloc::<u32>(top).expect("selected");
    let mut count = gpu.alloc::<u32>(1).expect("count");
    let k = gpu.kernel::<qsa_top_blocks::Kernel>(tiles).expect("compile");
    let args = qsa_top_blocks::Args {
        scores: d_scores.ptr(),
        n_blocks: d_n.ptr(),
        selected: selected.ptr_mut(),
        count: count.ptr_mut(),
        capacity: CAPACITY as u32,
        top: top as u32,
    };
    let mut run = || {
        gpu.fill_bytes(&mut selected, POISON).expect("poison");
        gpu.fill_bytes(&mut count, POISON).expect("poison");
        // SAFETY: scores hold `capacity` values, selected `top`, count and n one each.
        unsafe { k.launch(gpu, &args) }.expect("launch");
        (gpu.download(&selected).expect("selected"), gpu.download(&count).expect("count")[0])
    };
    [run(), run()]
}

#[test]
#[ignore = "needs a CUDA device"]
fn top_k_selects_the_reference_blocks() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("qsa top-k");
    let mut cases: Vec<(usize, usize)> = [10, 512, 513, 65_536].iter().map(|&n| (n, TOP)).collect();
    // Small budgets too: one block wanted, and a k far from a power of two.
    cases.extend([(10, 1), (513, 7), (4_099, 300), (65_536, 1)]);
    for tiles in qsa_top_blocks::Tiles::candidates() {
        for &(n, top) in &cases {
            for kind in [Scores::FewLevels, Scores::Continuous, Scores::AllZero, Scores::Signed] {
                let label = format!("{tiles:?} n {n} top {top} {kind:?}");
                let scores = draw(&mut rng, kind, n);
                let k = top.min(n);
                let mut want: Vec<u32> = top_blocks(&scores, k).iter().map(|&b| b as u32).collect();
                want.resize(top, u32::MAX);
                let [(got, count), second] = top_k_on_gpu(&gpu, tiles, &scores, n, top);
                assert_eq!(count as usize, k, "{label}: count");
                if let Some(i) = (0..top).find(|&i| got[i] != want[i]) {
                    panic!(
                        "{label}: slot {i} holds {:#x}, the reference {:#x} (score {:?} vs {:?})",
                        got[i],
                        want[i],
                        scores.get(got[i] as usize),
                        scores.get(want[i] as usize)
                    );
                }
                assert_eq!(second, (got, count), "{label}: a second launch gave different bits");
            }
        }
    }
}

/// One block-scores problem: the index queries, the pooled keys, the position.
struct ScoresCase {
    heads: usize,
    dim: usize,
    block_tokens: usize,
    capacity: usize,
    position: usize,
}

/// Runs the block scores twice (scores and the count poisoned first): scores, n_blocks, per run.
fn block_scores_on_gpu(
    gpu: &Gpu,
    tiles: qsa_block_scores::Tiles,
    c: &ScoresCase,
    q: &[f32],
    keys: &[f32],
) -> Option<[(Vec<f32>, u32); 2]> {
    let d_q = gpu.upload(q).expect("q");
    let d_keys = gpu.upload(keys).expect("keys");
    let d_pos = gpu.upload(&[c.position as u32]).expect("position");
    let mut scores: DeviceBuffer<f32> = gpu.alloc(c.capacity).expect("scores");
    let mut n_blocks = gpu.alloc::<u32>(1).expect("n_blocks");
    let args = qsa_block_scores::Args {
        index_q: d_q.ptr(),
        block_keys: d_keys.ptr(),
        position: d_pos.ptr(),
        scores: scores.ptr_mut(),
        n_blocks: n_blocks.ptr_mut(),
        heads: c.heads as u32,
        dim: c.dim as u32,
        block_tokens: c.block_tokens as u32,
        capacity: c.capacity as u32,
    };
    qsa_block_scores::Kernel::launch_dims(&tiles, &args).ok()?;
    let k = gpu.kernel::<qsa_block_scores::Kernel>(tiles).expect("compile");
    let mut run = || {
        gpu.fill_bytes(&mut scores, POISON).expect("poison");
        gpu.fill_bytes(&mut n_blocks, POISON).expect("poison");
        // SAFETY: q holds heads·dim values, keys capacity·dim, scores capacity, the rest one each.
        unsafe { k.launch(gpu, &args) }.expect("launch");
        (gpu.download(&scores).expect("scores"), gpu.download(&n_blocks).expect("n")[0])
    };
    Some([run(), run()])
}

#[test]
#[ignore = "needs a CUDA device"]
fn block_scores_match_the_reference() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("qsa block scores");
    let poison = f32::from_bits(u32::from_ne_bytes([POISON; 4]));
    let published = |position| ScoresCase { heads: 4, dim: 128, block_tokens: 4, capacity: CAPACITY, position };
    let tiny = |position| ScoresCase { heads: 2, dim: 16, block_tokens: 4, capacity: 40, position };
    // No complete block, 10, 512, 513 (one in the making), and the whole capacity.
    let mut cases: Vec<(ScoresCase, bool)> =
        [2, 41, 2_047, 2_054, 4 * CAPACITY - 1].into_iter().map(|p| (published(p), false)).collect();
    // The tiny shape runs every tile candidate, at a position past its capacity too.
    cases.extend([2, 13, 159, 1_000].into_iter().map(|p| (tiny(p), true)));
    for (c, every_tile) in &cases {
        let q: Vec<f32> = (0..c.heads * c.dim).map(|_| rng.normal()).collect();
        let keys: Vec<f32> = (0..c.capacity * c.dim).map(|_| rng.normal() + 0.3).collect();
        let n = ((c.position + 1) / c.block_tokens).min(c.capacity);
        let q_rows: Vec<Vec<f32>> = q.chunks(c.dim).map(<[f32]>::to_vec).collect();
        let key_rows: Vec<Vec<f32>> = keys.chunks(c.dim).take(n).map(<[f32]>::to_vec).collect();
        let want = block_scores(&q_rows, &key_rows);
        // f32 sums of dim products: a bound from the sum of their magnitudes.
        let magnitude: Vec<f64> = key_rows
            .iter()
            .map(|k| {
                q_rows.iter().flat_map(|qr| qr.iter().zip(k).map(|(a, b)| f64::from((a * b).abs()))).sum::<f64>()
                    / (c.dim as f64).sqrt()
            })
            .collect();
        let tile_sets: Vec<qsa_block_scores::Tiles> =
            if *every_tile { qsa_block_scores::Tiles::candidates() } else { vec![TileSet::DEFAULT] };
        let mut ran = 0;
        for tiles in tile_sets {
            let label = format!("{tiles:?} heads {} dim {} position {}", c.heads, c.dim, c.position);
            let Some([(got, got_n), second]) = block_scores_on_gpu(&gpu, tiles, c, &q, &keys) else { continue };
            ran += 1;
            assert_eq!(got_n as usize, n, "{label}: n_blocks");
            for b in 0..n {
                let tol = 1e-5 * magnitude[b] + 1e-6;
                assert!(
                    (f64::from(got[b]) - f64::from(want[b])).abs() <= tol,
                    "{label}: block {b} scores {} against the reference's {}",
                    got[b],
                    want[b]
                );
            }
            if let Some(b) = (n..c.capacity).find(|&b| got[b].to_bits() != poison.to_bits()) {
                panic!("{label}: block {b} past the {n} complete ones was written ({})", got[b]);
            }
            assert!(
                second.1 == got_n && second.0.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{label}: a second launch gave different bits"
            );
        }
        assert!(ran > 0, "no tile set runs heads {} dim {}", c.heads, c.dim);
    }
}

/// The two kernels chained on the device, the count passed from one to the other in device
/// memory: the selection is the reference's top-k of the scores the GPU computed.
#[test]
#[ignore = "needs a CUDA device"]
fn scores_then_top_k_on_the_device() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("qsa scores and top-k");
    let (heads, dim, block_tokens) = (4usize, 128usize, 4usize);
    let q: Vec<f32> = (0..heads * dim).map(|_| rng.normal()).collect();
    let keys: Vec<f32> = (0..CAPACITY * dim).map(|_| rng.normal() + 0.1).collect();
    let d_q = gpu.upload(&q).expect("q");
    let d_keys = gpu.upload(&keys).expect("keys");
    let mut d_pos = gpu.alloc::<u32>(1).expect("position");
    let mut scores = gpu.alloc::<f32>(CAPACITY).expect("scores");
    let mut n_blocks = gpu.alloc::<u32>(1).expect("n_blocks");
    let mut selected = gpu.alloc::<u32>(TOP).expect("selected");
    let mut count = gpu.alloc::<u32>(1).expect("count");
    let ks = gpu.kernel::<qsa_block_scores::Kernel>(TileSet::DEFAULT).expect("compile");
    let kt = gpu.kernel::<qsa_top_blocks::Kernel>(TileSet::DEFAULT).expect("compile");
    let scores_args = qsa_block_scores::Args {
        index_q: d_q.ptr(),
        block_keys: d_keys.ptr(),
        position: d_pos.ptr(),
        scores: scores.ptr_mut(),
        n_blocks: n_blocks.ptr_mut(),
        heads: heads as u32,
        dim: dim as u32,
        block_tokens: block_tokens as u32,
        capacity: CAPACITY as u32,
    };
    let top_args = qsa_top_blocks::Args {
        scores: scores.ptr(),
        n_blocks: n_blocks.ptr(),
        selected: selected.ptr_mut(),
        count: count.ptr_mut(),
        capacity: CAPACITY as u32,
        top: TOP as u32,
    };
    for position in [40usize, 2_047, 2_051, 100_000, 4 * CAPACITY - 1] {
        gpu.write(&mut d_pos, &[position as u32]).expect("position");
        gpu.fill_bytes(&mut selected, POISON).expect("poison");
        gpu.fill_bytes(&mut count, POISON).expect("poison");
        // SAFETY: every buffer has the length the two kernels index at this capacity and budget.
        unsafe {
            ks.launch(&gpu, &scores_args).expect("scores");
            kt.launch(&gpu, &top_args).expect("top-k");
        }
        let n = (position + 1) / block_tokens;
        let got_scores = gpu.download(&scores).expect("scores");
        let mut want: Vec<u32> = top_blocks(&got_scores[..n], TOP.min(n)).iter().map(|&b| b as u32).collect();
        want.resize(TOP, u32::MAX);
        assert_eq!(gpu.download(&count).expect("count")[0] as usize, TOP.min(n), "position {position}: count");
        assert_eq!(gpu.download(&selected).expect("selected"), want, "position {position}: selection");
    }
}
