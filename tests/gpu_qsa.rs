//! QSA's indexer kernels on a GPU against the CPU reference `reference::qsa`: the block scores
//! (every element within f32 rounding of the f64 reference, nothing written past the complete
//! blocks, the block count left for the top-k) and the top-k (the selected blocks identical to
//! `top_blocks`, in order, on random scores with many ties, at 10, 512, 513 and 65,536 blocks,
//! the count read from device memory). Outputs poisoned before each launch; a second launch gives
//! the same bits; every tile candidate runs. Fresh random inputs each run. The multi-block top-k
//! (`qsa_top_blocks_grid`) the same way at more lengths (up to 131,072), three launches on one
//! scratch per case, then many launches back to back and graph replays with n changed between
//! them, the barrier counter crossing u32 wrap-around, the scratch checked at rest after each.

use engine::cuda::{DeviceBuffer, Gpu};
use engine::kernels::qsa::attention::qsa_attention;
use engine::kernels::qsa::block_scores::qsa_block_scores;
use engine::kernels::qsa::combine::qsa_attention_combine;
use engine::kernels::qsa::prepare::qsa_prepare;
use engine::kernels::qsa::top_blocks::qsa_top_blocks;
use engine::kernels::qsa::top_blocks_grid::{self, qsa_top_blocks_grid};
use engine::layers::qsa::QsaShape;
use engine::reference::qsa::{block_scores, top_blocks};
use flashnext::rng::Rng;
use kernel_dsl::{KernelDef, TileSet};

const POISON: u8 = 0xab;
/// The published budget: 2048 tokens in blocks of 4.
const TOP: usize = QsaShape::PUBLISHED.top;
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
            Scores::Continuous if i > 0 && rng.next_u64().is_multiple_of(8) => v[(rng.next_u64() % i as u64) as usize],
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

/// The multi-block top-k's buffers: the scores (padded to `GRID_CAPACITY` with large scores that
/// must not be chosen), n in device memory, the outputs, and the one scratch every launch shares.
struct GridTopK {
    scores: DeviceBuffer<f32>,
    n: DeviceBuffer<u32>,
    selected: DeviceBuffer<u32>,
    count: DeviceBuffer<u32>,
}

/// The multi-block top-k's score buffers: 131,072 scores. A tile set's capacity is the most it
/// takes (BLOCKS·THREADS·8) up to that; n past it is clamped, as the kernel clamps it.
const GRID_CAPACITY: usize = 131_072;

/// The capacity a tile set is launched with.
fn grid_capacity(tiles: qsa_top_blocks_grid::Tiles) -> usize {
    GRID_CAPACITY.min((tiles.blocks * tiles.threads * 8) as usize)
}

impl GridTopK {
    fn new(gpu: &Gpu, scores: &[f32], n: usize, top: usize) -> GridTopK {
        let mut padded = scores.to_vec();
        padded.resize(GRID_CAPACITY, 1e30);
        GridTopK {
            scores: gpu.upload(&padded).expect("scores"),
            n: gpu.upload(&[n as u32]).expect("n"),
            selected: gpu.alloc(top).expect("selected"),
            count: gpu.alloc(1).expect("count"),
        }
    }

    fn args(&mut self, scratch: &mut DeviceBuffer<u32>, capacity: usize, top: usize) -> qsa_top_blocks_grid::Args {
        qsa_top_blocks_grid::Args {
            scores: self.scores.ptr(),
            n_blocks: self.n.ptr(),
            selected: self.selected.ptr_mut(),
            count: self.count.ptr_mut(),
            scratch: scratch.ptr_mut(),
            capacity: capacity as u32,
            top: top as u32,
        }
    }

    fn poison(&mut self, gpu: &Gpu) {
        gpu.fill_bytes(&mut self.selected, POISON).expect("poison");
        gpu.fill_bytes(&mut self.count, POISON).expect("poison");
    }

    fn result(&self, gpu: &Gpu) -> (Vec<u32>, u32) {
        (gpu.download(&self.selected).expect("selected"), gpu.download(&self.count).expect("count")[0])
    }
}

/// The reference's selection of `top` among `scores` (u32::MAX past the count) and the count.
fn reference_selection(scores: &[f32], top: usize) -> (Vec<u32>, u32) {
    let k = top.min(scores.len());
    let mut want: Vec<u32> = top_blocks(scores, k).iter().map(|&b| b as u32).collect();
    want.resize(top, u32::MAX);
    (want, k as u32)
}

/// Panics at the first slot where `got` differs from the reference.
fn check_selection(label: &str, scores: &[f32], got: &(Vec<u32>, u32), want: &(Vec<u32>, u32)) {
    assert_eq!(got.1, want.1, "{label}: count");
    if let Some(i) = (0..want.0.len()).find(|&i| got.0[i] != want.0[i]) {
        panic!(
            "{label}: slot {i} holds {:#x}, the reference {:#x} (score {:?} vs {:?})",
            got.0[i],
            want.0[i],
            scores.get(got.0[i] as usize),
            scores.get(want.0[i] as usize)
        );
    }
}

/// The scratch at rest: every histogram word zero, the barrier counter a multiple of 128.
fn check_scratch_at_rest(gpu: &Gpu, scratch: &DeviceBuffer<u32>, label: &str) -> u32 {
    let s = gpu.download(scratch).expect("scratch");
    if let Some(i) = (0..top_blocks_grid::SCRATCH_HISTOGRAMS).find(|&i| s[i] != 0) {
        panic!("{label}: histogram word {i} left at {} after the launch", s[i]);
    }
    let counter = s[top_blocks_grid::SCRATCH_BARRIER];
    assert_eq!(counter % 128, 0, "{label}: barrier counter {counter} left between two barriers");
    counter
}

/// The tile sets whose whole grid this device holds at once (the grid barrier needs it); the
/// default must be among them.
fn co_resident_grid_tiles(gpu: &Gpu) -> Vec<qsa_top_blocks_grid::Tiles> {
    let mut fit = Vec::new();
    for tiles in qsa_top_blocks_grid::Tiles::candidates() {
        let k = gpu.kernel::<qsa_top_blocks_grid::Kernel>(tiles).expect("compile");
        let resident = k.co_resident_blocks(gpu).expect("occupancy");
        let grid = tiles.blocks;
        println!("{tiles:?}: grid {grid}, {resident} blocks co-resident ({} registers)", k.resources().registers);
        if grid <= resident {
            fit.push(tiles);
        } else {
            assert!(
                tiles != TileSet::DEFAULT,
                "the default tile set's grid {grid} exceeds the {resident} co-resident blocks"
            );
            println!("  skipped: the grid barrier could deadlock");
        }
    }
    fit
}

#[test]
#[ignore = "needs a CUDA device"]
fn grid_top_k_selects_the_reference_blocks() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("qsa grid top-k");
    // One scratch for every case and tile set, zeroed once.
    let mut scratch = gpu.alloc::<u32>(top_blocks_grid::SCRATCH_WORDS).expect("scratch");
    let mut cases: Vec<(usize, usize)> =
        [10, 512, 513, 8_192, 65_536, 100_000, 50_001].iter().map(|&n| (n, TOP)).collect();
    cases.extend([(10, 1), (513, 7), (4_099, 300), (65_536, 1), (131_072, 512), (6_000, 5_999)]);
    let mut counter = 0;
    for tiles in co_resident_grid_tiles(&gpu) {
        let k = gpu.kernel::<qsa_top_blocks_grid::Kernel>(tiles).expect("compile");
        let capacity = grid_capacity(tiles);
        for &(n, top) in &cases {
            for kind in [Scores::FewLevels, Scores::Continuous, Scores::AllZero, Scores::Signed] {
                let label = format!("{tiles:?} capacity {capacity} n {n} top {top} {kind:?}");
                let scores = draw(&mut rng, kind, n);
                let want = reference_selection(&scores[..n.min(capacity)], top);
                let mut bufs = GridTopK::new(&gpu, &scores, n, top);
                let args = bufs.args(&mut scratch, capacity, top);
                // Three launches back to back on the same scratch, each checked.
                for launch in 0..3 {
                    bufs.poison(&gpu);
                    // SAFETY: scores hold GRID_CAPACITY ≥ capacity values, selected `top`, count and n one,
                    // scratch SCRATCH_WORDS; the grid is co-resident (checked above).
                    unsafe { k.launch(&gpu, &args) }.expect("launch");
                    check_selection(&format!("{label} launch {launch}"), &scores, &bufs.result(&gpu), &want);
                }
                let now = check_scratch_at_rest(&gpu, &scratch, &label);
                assert!(n <= top || now != counter, "{label}: the barrier counter did not move");
                counter = now;
            }
        }
    }
}

/// Many launches back to back with nothing between them, then graphs of launches replayed, all
/// on one scratch, with the barrier counter started just below u32 wrap-around; n changes between
/// replays (one graph serves every length). Every launch's output is checked.
#[test]
#[ignore = "needs a CUDA device"]
fn grid_top_k_survives_back_to_back_launches_and_graph_replays() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("qsa grid top-k replays");
    let mut scratch = gpu.alloc::<u32>(top_blocks_grid::SCRATCH_WORDS).expect("scratch");
    let mut start = vec![0u32; top_blocks_grid::SCRATCH_WORDS];
    // 2^32 − 4·128: a few launches (up to four barriers each) cross the wrap.
    start[top_blocks_grid::SCRATCH_BARRIER] = 0u32.wrapping_sub(4 * 128);
    gpu.write(&mut scratch, &start).expect("scratch");
    let kinds = [Scores::FewLevels, Scores::Continuous, Scores::AllZero, Scores::Signed];
    for tiles in co_resident_grid_tiles(&gpu) {
        let k = gpu.kernel::<qsa_top_blocks_grid::Kernel>(tiles).expect("compile");
        let capacity = grid_capacity(tiles);
        // Eight problems, launched 25 times each in turn without a sync between them.
        let problems: Vec<(Vec<f32>, usize)> = (0..8)
            .map(|i| {
                let n = [65_536, 100_000, 8_192, 513][i % 4];
                (draw(&mut rng, kinds[i % 4], n), n)
            })
            .collect();
        let mut bufs: Vec<GridTopK> = problems.iter().map(|(s, n)| GridTopK::new(&gpu, s, *n, TOP)).collect();
        let args: Vec<qsa_top_blocks_grid::Args> =
            bufs.iter_mut().map(|b| b.args(&mut scratch, capacity, TOP)).collect();
        for b in &mut bufs {
            b.poison(&gpu);
        }
        for _ in 0..25 {
            for a in &args {
                // SAFETY: as in the test above.
                unsafe { k.launch(&gpu, a) }.expect("launch");
            }
        }
        for (i, ((scores, n), b)) in problems.iter().zip(&bufs).enumerate() {
            let label = format!("{tiles:?} back to back, problem {i} (n {n}, capacity {capacity})");
            let want = reference_selection(&scores[..(*n).min(capacity)], TOP);
            check_selection(&label, scores, &b.result(&gpu), &want);
        }
        check_scratch_at_rest(&gpu, &scratch, &format!("{tiles:?} back to back"));

        // The same launches captured once, replayed with n changed between replays.
        let g = gpu
            .capture(|| {
                for a in &args {
                    // SAFETY: as above; the buffers outlive the graph.
                    unsafe { k.launch(&gpu, a) }?;
                }
                Ok(())
            })
            .expect("capture");
        for (replay, n) in [65_536usize, 513, 100_000, 10, 8_192, 65_535, 512, 77_777].into_iter().enumerate() {
            for b in &mut bufs {
                gpu.write(&mut b.n, &[n as u32]).expect("n");
                b.poison(&gpu);
            }
            g.launch().expect("replay");
            for (i, ((scores, _), b)) in problems.iter().zip(&bufs).enumerate() {
                let label = format!("{tiles:?} replay {replay}, problem {i} at n {n} (capacity {capacity})");
                // Past its own length a problem's buffer holds 1e30 scores: they are chosen.
                let mut padded = scores.clone();
                padded.resize(GRID_CAPACITY, 1e30);
                let len = n.min(capacity);
                check_selection(&label, &padded[..len], &b.result(&gpu), &reference_selection(&padded[..len], TOP));
            }
            check_scratch_at_rest(&gpu, &scratch, &format!("{tiles:?} replay {replay}"));
        }
    }
}

/// One block-scores problem: the index queries, the pooled keys, the position, and the budget
/// below which no score is needed (0: every complete block's score).
struct ScoresCase {
    heads: usize,
    dim: usize,
    block_tokens: usize,
    capacity: usize,
    position: usize,
    top: usize,
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
        top: c.top as u32,
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
    let p = QsaShape::PUBLISHED;
    let published = |position| ScoresCase {
        heads: p.index_heads,
        dim: p.index_dim,
        block_tokens: p.block_tokens,
        capacity: CAPACITY,
        position,
        top: 0,
    };
    let tiny = |position| ScoresCase { heads: 2, dim: 16, block_tokens: 4, capacity: 40, position, top: 0 };
    // No complete block, 10, 512, 513 (one in the making), and the whole capacity.
    let mut cases: Vec<(ScoresCase, bool)> =
        [2, 41, 2_047, 2_054, 4 * CAPACITY - 1].into_iter().map(|p| (published(p), false)).collect();
    // The tiny shape runs every tile candidate, at a position past its capacity too, and so does
    // the published one at 1k (1 to 8 pieces of a key a lane, as LANES goes from 32 to 4).
    cases.extend([2, 13, 159, 1_000].into_iter().map(|p| (tiny(p), true)));
    cases.push((published(1_023), true));
    // With the budget: 256 complete blocks of a budget of 512 need no score (every block is
    // selected), 513 need them all (the 513th just complete, then one token into the next); the
    // tiny shape's 8 of a budget of 8 (the budget itself) none, 9 and 40 all, every tile set.
    cases.extend([1_023, 2_051, 2_052].map(|p| (ScoresCase { top: TOP, ..published(p) }, false)));
    cases.extend([31, 35, 159].map(|p| (ScoresCase { top: 8, ..tiny(p) }, true)));
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
            let label = format!("{tiles:?} heads {} dim {} position {} top {}", c.heads, c.dim, c.position, c.top);
            let Some([(got, got_n), second]) = block_scores_on_gpu(&gpu, tiles, c, &q, &keys) else { continue };
            ran += 1;
            assert_eq!(got_n as usize, n, "{label}: n_blocks");
            // Scores are written for the complete blocks only, and only past the budget.
            let scored = if n > c.top { n } else { 0 };
            for b in 0..scored {
                let tol = 1e-5 * magnitude[b] + 1e-6;
                assert!(
                    (f64::from(got[b]) - f64::from(want[b])).abs() <= tol,
                    "{label}: block {b} scores {} against the reference's {}",
                    got[b],
                    want[b]
                );
            }
            if let Some(b) = (scored..c.capacity).find(|&b| got[b].to_bits() != poison.to_bits()) {
                panic!("{label}: block {b} was written ({}), with {n} complete of a budget of {}", got[b], c.top);
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
/// memory: the selection is the reference's top-k of the scores the GPU computed (at and below
/// the budget, where none is computed, every complete block).
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
        top: TOP as u32,
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

/// One attention problem: the shape, the budget and the context.
#[derive(Clone, Copy, Debug)]
struct AttentionCase {
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    block_tokens: usize,
    top: usize,
    /// Tokens in the cache, the current one last (position = context − 1).
    context: usize,
}

/// The tokens the reference attends to, from a model config with this case's indexer fields.
fn reference_tokens(c: &AttentionCase, scores: &[f32]) -> Vec<usize> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-sparse/config.json");
    let mut cfg = engine::model::config::ModelConfig::from_file(std::path::Path::new(path)).expect("tiny config");
    cfg.indexer_block = c.block_tokens;
    cfg.indexer_budget = c.top * c.block_tokens;
    assert_eq!(cfg.indexer_top_blocks(), c.top);
    engine::reference::qsa::selection(&cfg, c.context - 1, || scores.to_vec())
}

/// Runs the attention of `c` then its combine on random inputs for each pair of tile sets: o
/// within 1e-2 relative L2 of `reference::qsa::gated_attention` over the reference's tokens,
/// every element finite, a second launch bit-identical.
fn attention_case(
    gpu: &Gpu,
    rng: &mut Rng,
    c: AttentionCase,
    tile_sets: &[(qsa_attention::Tiles, qsa_attention_combine::Tiles)],
) {
    use half::bf16;
    let (hq, hkv, dh) = (c.q_heads, c.kv_heads, c.head_dim);
    let n = c.context / c.block_tokens;
    let scores = draw(rng, Scores::FewLevels, n);
    let chosen = top_blocks(&scores, c.top.min(n));
    let tokens = reference_tokens(&c, &scores);
    // Caches as the device holds them (bf16), and the same values per token for the reference
    // (only the attended tokens filled in).
    let k_cache: Vec<bf16> = rng.bf16_normal(c.context * hkv * dh, 1.0);
    let v_cache: Vec<bf16> = rng.bf16_normal(c.context * hkv * dh, 1.0);
    let row = |cache: &[bf16], t: usize| cache[t * hkv * dh..(t + 1) * hkv * dh].iter().map(|v| v.to_f32()).collect();
    let mut keys: Vec<Vec<f32>> = vec![Vec::new(); c.context];
    let mut values: Vec<Vec<f32>> = vec![Vec::new(); c.context];
    for &t in &tokens {
        keys[t] = row(&k_cache, t);
        values[t] = row(&v_cache, t);
    }
    // Queries of norm ~√D·2, so that the softmax is far from uniform.
    let q: Vec<f32> = (0..hq * dh).map(|_| 2.0 * rng.normal()).collect();
    let gate: Vec<f32> = (0..hq * dh).map(|_| rng.normal()).collect();
    let want = engine::reference::qsa::gated_attention(&q, &gate, &keys, &values, &tokens, hkv);

    let mut sel_host: Vec<u32> = chosen.iter().map(|&b| b as u32).collect();
    sel_host.resize(c.top, u32::MAX);
    let d_q = gpu.upload(&q).expect("q");
    let d_gate = gpu.upload(&gate).expect("gate");
    let d_k = gpu.upload(&k_cache).expect("k cache");
    let d_v = gpu.upload(&v_cache).expect("v cache");
    let d_sel = gpu.upload(&sel_host).expect("selected");
    let d_pos = gpu.upload(&[(c.context - 1) as u32]).expect("position");
    let splits_max = (c.top * c.block_tokens + c.block_tokens).div_ceil(16);
    let mut acc = gpu.alloc::<f32>(hq * splits_max * dh).expect("partials");
    let mut ml = gpu.alloc::<f32>(hq * splits_max * 2).expect("partials");
    let mut o = gpu.alloc::<bf16>(hq * dh).expect("o");
    let mut ran = 0;
    for &(tiles, combine_tiles) in tile_sets {
        let label = format!("{c:?} {tiles:?} {combine_tiles:?}");
        let args = qsa_attention::Args {
            q: d_q.ptr(),
            k_cache: d_k.ptr(),
            v_cache: d_v.ptr(),
            selected: d_sel.ptr(),
            position: d_pos.ptr(),
            partial_acc: acc.ptr_mut(),
            partial_ml: ml.ptr_mut(),
            q_heads: hq as u32,
            kv_heads: hkv as u32,
            head_dim: dh as u32,
            block_tokens: c.block_tokens as u32,
            top: c.top as u32,
            scale: 1.0 / (dh as f32).sqrt(),
        };
        let Ok(dims) = qsa_attention::Kernel::launch_dims(&tiles, &args) else {
            continue;
        };
        let combine_args = qsa_attention_combine::Args {
            partial_acc: acc.ptr(),
            partial_ml: ml.ptr(),
            gate: d_gate.ptr(),
            position: d_pos.ptr(),
            o: o.ptr_mut(),
            q_heads: hq as u32,
            head_dim: dh as u32,
            splits: dims.grid[1],
            chunk: tiles.chunk,
            block_tokens: c.block_tokens as u32,
            top: c.top as u32,
        };
        if qsa_attention_combine::Kernel::launch_dims(&combine_tiles, &combine_args).is_err() {
            continue;
        }
        assert!(dims.grid[1] as usize <= splits_max, "{label}: more splits than the partials hold");
        ran += 1;
        let k = gpu.kernel::<qsa_attention::Kernel>(tiles).expect("compile");
        let kc = gpu.kernel::<qsa_attention_combine::Kernel>(combine_tiles).expect("compile");
        let mut outputs = Vec::new();
        for _ in 0..2 {
            gpu.fill_bytes(&mut o, POISON).expect("poison");
            gpu.fill_bytes(&mut acc, POISON).expect("poison");
            gpu.fill_bytes(&mut ml, POISON).expect("poison");
            // SAFETY: the caches hold `context` tokens of kv_heads·head_dim, the selection `top`
            // blocks below n; the partials are sized for the most splits any tile set makes, and
            // the combine reads them at the attention's split count.
            unsafe {
                k.launch(gpu, &args).expect("launch");
                kc.launch(gpu, &combine_args).expect("combine");
            }
            outputs.push(gpu.download(&o).expect("o"));
        }
        let got: Vec<f32> = outputs[0].iter().map(|v| v.to_f32()).collect();
        if let Some(i) = got.iter().position(|v| !v.is_finite()) {
            panic!("{label}: o[{i}] = {} (unwritten?)", got[i]);
        }
        let e = flashnext::compare::rel_l2(&got, &want);
        println!("{label}: {} tokens, o within {e:.2e} of the reference (relative L2)", tokens.len());
        assert!(e < 1e-2, "{label}: o is {e:.2e} from the reference (relative L2)");
        assert!(
            outputs[1].iter().zip(&outputs[0]).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{label}: a second launch gave different bits"
        );
    }
    assert!(ran > 0, "no tile set runs {c:?}");
}

#[test]
#[ignore = "needs a CUDA device"]
fn attention_through_the_selection_matches_the_reference() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("qsa attention");
    // The published shape: 24 query heads on 2 key/value heads of 256, blocks of 4, 512 kept.
    let p = QsaShape::PUBLISHED;
    let published = |context| AttentionCase {
        q_heads: p.q_heads,
        kv_heads: p.kv_heads,
        head_dim: p.head_dim,
        block_tokens: p.block_tokens,
        top: p.top,
        context,
    };
    for context in [100, 2_052, 4_096, 100_000] {
        attention_case(&gpu, &mut rng, published(context), &[(TileSet::DEFAULT, TileSet::DEFAULT)]);
    }
    // Every combine tile set at the published shape (some need its 256 dimensions), the
    // attention at its defaults.
    let combines: Vec<(qsa_attention::Tiles, qsa_attention_combine::Tiles)> =
        qsa_attention_combine::Tiles::candidates().into_iter().map(|t| (TileSet::DEFAULT, t)).collect();
    attention_case(&gpu, &mut rng, published(2_052), &combines);
    // Every attention tile set at the published shape (its 12 query heads a block or shared over
    // 2, 3 or 4 blocks), dense and past the budget.
    let attentions: Vec<(qsa_attention::Tiles, qsa_attention_combine::Tiles)> =
        qsa_attention::Tiles::candidates().into_iter().map(|t| (t, TileSet::DEFAULT)).collect();
    for context in [1_024, 100_000] {
        attention_case(&gpu, &mut rng, published(context), &attentions);
    }
    // A small shape (head_dim 128, 3 query heads a key/value head, a budget of 8 blocks), every
    // tile candidate of each kernel, the other at its defaults or, where those do not fit the
    // shape, at the first candidate that does (the combine's sets beside a 2-warp attention):
    // dense, at the budget, past it with and without a tail.
    let small = |context| AttentionCase { q_heads: 6, kv_heads: 2, head_dim: 128, block_tokens: 4, top: 8, context };
    // The attention's lanes cover head_dim in 64-dimension warps (its `head_dim == 64 * WARPS`).
    let fits = |t: &qsa_attention::Tiles| (64 * t.warps) as usize == small(1).head_dim;
    let small_attention = *qsa_attention::Tiles::candidates().iter().find(|t| fits(t)).expect("an attention that fits");
    let candidates: Vec<(qsa_attention::Tiles, qsa_attention_combine::Tiles)> = qsa_attention::Tiles::candidates()
        .into_iter()
        .map(|t| (t, TileSet::DEFAULT))
        .chain(
            qsa_attention_combine::Tiles::candidates()
                .into_iter()
                .filter(|t| *t != TileSet::DEFAULT)
                .map(|t| (small_attention, t)),
        )
        .collect();
    for context in [1, 7, 32, 33, 131, 400] {
        attention_case(&gpu, &mut rng, small(context), &candidates);
    }
}

/// One preparation problem: the shape and the token's position.
#[derive(Clone, Copy, Debug)]
struct PrepareCase {
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    index_heads: usize,
    index_dim: usize,
    rotary: usize,
    block_tokens: usize,
    position: usize,
}

/// Runs `qsa_prepare` for `c` at each tile set (outputs poisoned, twice) against the reference's
/// norms and RoPE: q, the index queries and a completed block's pooled key within f32 rounding,
/// the cached key within a bf16 step, value and gate exact, nothing else written.
fn prepare_case(gpu: &Gpu, rng: &mut Rng, c: PrepareCase, tile_sets: &[qsa_prepare::Tiles]) {
    use engine::reference::norm::zc_rms_norm_shared;
    use engine::reference::rope::Rope;
    use half::bf16;
    let (hq, hkv, dh, hi, di, bt, pos) =
        (c.q_heads, c.kv_heads, c.head_dim, c.index_heads, c.index_dim, c.block_tokens, c.position);
    let eps = 1e-6f32;
    let tokens = (pos + 1).div_ceil(bt) * bt;
    let rows = hq * 2 * dh + 2 * hkv * dh + (hi + 1) * di;
    let proj: Vec<bf16> = rng.bf16_normal(rows, 1.0);
    let norm = |rng: &mut Rng, n| rng.bf16_normal(n, 0.2);
    let (q_norm, k_norm, iq_norm, ik_norm) = (norm(rng, dh), norm(rng, dh), norm(rng, di), norm(rng, di));
    let rope = Rope::new(1e7, c.rotary);
    let table = rope.table(tokens);
    // The raw index keys of the block's earlier tokens, as earlier launches left them.
    let poison = f32::from_bits(u32::from_ne_bytes([POISON; 4]));
    let mut index_keys = vec![poison; tokens * di];
    let first = pos / bt * bt;
    for v in &mut index_keys[first * di..pos * di] {
        *v = rng.normal();
    }

    // The reference.
    let f = |v: &[bf16]| v.iter().map(|x| x.to_f32()).collect::<Vec<f32>>();
    let p = f(&proj);
    let rotated = |x: &[f32], w: &[bf16], at: usize| {
        let mut y = zc_rms_norm_shared(x, &f(w), eps);
        rope.apply(&mut y, at);
        y
    };
    let want_q: Vec<f32> = (0..hq).flat_map(|h| rotated(&p[h * 2 * dh..h * 2 * dh + dh], &q_norm, pos)).collect();
    let want_gate: Vec<f32> = (0..hq).flat_map(|h| p[h * 2 * dh + dh..(h + 1) * 2 * dh].to_vec()).collect();
    let k_base = hq * 2 * dh;
    let want_k: Vec<f32> =
        (0..hkv).flat_map(|j| rotated(&p[k_base + j * dh..k_base + (j + 1) * dh], &k_norm, pos)).collect();
    let v_base = k_base + hkv * dh;
    let iq_base = v_base + hkv * dh;
    let want_iq: Vec<f32> =
        (0..hi).flat_map(|j| rotated(&p[iq_base + j * di..iq_base + (j + 1) * di], &iq_norm, pos)).collect();
    let ik_base = iq_base + hi * di;
    let mut want_index_keys = index_keys.clone();
    want_index_keys[pos * di..(pos + 1) * di].copy_from_slice(&p[ik_base..ik_base + di]);
    let completes = (pos + 1) % bt == 0;
    let want_block: Vec<f32> = if completes {
        let mean: Vec<f32> = (0..di)
            .map(|i| {
                ((first..first + bt).map(|t| f64::from(want_index_keys[t * di + i])).sum::<f64>() / bt as f64) as f32
            })
            .collect();
        rotated(&mean, &ik_norm, first)
    } else {
        Vec::new()
    };

    let d_proj = gpu.upload(&proj).expect("proj");
    let (d_qn, d_kn) = (gpu.upload(&q_norm).expect("norm"), gpu.upload(&k_norm).expect("norm"));
    let (d_iqn, d_ikn) = (gpu.upload(&iq_norm).expect("norm"), gpu.upload(&ik_norm).expect("norm"));
    let d_rope = gpu.upload(&table).expect("rope");
    let d_pos = gpu.upload(&[pos as u32]).expect("position");
    let mut q = gpu.alloc::<f32>(hq * dh).expect("q");
    let mut gate = gpu.alloc::<f32>(hq * dh).expect("gate");
    let mut k_cache = gpu.alloc::<bf16>(tokens * hkv * dh).expect("k cache");
    let mut v_cache = gpu.alloc::<bf16>(tokens * hkv * dh).expect("v cache");
    let mut index_q = gpu.alloc::<f32>(hi * di).expect("index q");
    let mut d_index_keys = gpu.alloc::<f32>(tokens * di).expect("index keys");
    let mut block_keys = gpu.alloc::<f32>(tokens / bt * di).expect("block keys");
    let mut ran = 0;
    for &tiles in tile_sets {
        let label = format!("{c:?} {tiles:?}");
        let args = qsa_prepare::Args {
            proj: d_proj.ptr(),
            q_norm: d_qn.ptr(),
            k_norm: d_kn.ptr(),
            index_q_norm: d_iqn.ptr(),
            index_k_norm: d_ikn.ptr(),
            rope: d_rope.ptr(),
            position: d_pos.ptr(),
            q: q.ptr_mut(),
            gate: gate.ptr_mut(),
            k_cache: k_cache.ptr_mut(),
            v_cache: v_cache.ptr_mut(),
            index_q: index_q.ptr_mut(),
            index_keys: d_index_keys.ptr_mut(),
            block_keys: block_keys.ptr_mut(),
            q_heads: hq as u32,
            kv_heads: hkv as u32,
            head_dim: dh as u32,
            index_heads: hi as u32,
            index_dim: di as u32,
            rotary: c.rotary as u32,
            block_tokens: bt as u32,
            eps,
        };
        if qsa_prepare::Kernel::launch_dims(&tiles, &args).is_err() {
            continue;
        }
        ran += 1;
        let k = gpu.kernel::<qsa_prepare::Kernel>(tiles).expect("compile");
        let mut runs = Vec::new();
        for _ in 0..2 {
            for b in [&mut q, &mut gate, &mut index_q, &mut block_keys] {
                gpu.fill_bytes(b, POISON).expect("poison");
            }
            gpu.fill_bytes(&mut k_cache, POISON).expect("poison");
            gpu.fill_bytes(&mut v_cache, POISON).expect("poison");
            gpu.write(&mut d_index_keys, &index_keys).expect("index keys");
            // SAFETY: proj holds every projection row, the caches and the RoPE table `tokens`
            // positions (> position), the block keys tokens / block_tokens blocks.
            unsafe { k.launch(gpu, &args) }.expect("launch");
            runs.push((
                gpu.download(&q).expect("q"),
                gpu.download(&gate).expect("gate"),
                gpu.download(&k_cache).expect("k"),
                gpu.download(&v_cache).expect("v"),
                gpu.download(&index_q).expect("iq"),
                gpu.download(&d_index_keys).expect("ik"),
                gpu.download(&block_keys).expect("bk"),
            ));
        }
        let (gq, ggate, gk, gv, giq, gik, gbk) = &runs[0];
        let close = |what: &str, got: &[f32], want: &[f32]| {
            for (i, (a, b)) in got.iter().zip(want).enumerate() {
                assert!((a - b).abs() <= 2e-5 * b.abs().max(1.0), "{label}: {what}[{i}] = {a}, the reference {b}");
            }
        };
        close("q", gq, &want_q);
        close("index_q", giq, &want_iq);
        assert_eq!(ggate, &want_gate, "{label}: gate");
        let row = pos * hkv * dh..(pos + 1) * hkv * dh;
        for (i, (a, b)) in gk[row.clone()].iter().zip(&want_k).enumerate() {
            let a = a.to_f32();
            assert!((a - b).abs() <= b.abs() / 128.0 + 1e-6, "{label}: k[{i}] = {a}, the reference {b}");
        }
        assert!(
            gv[row.clone()].iter().zip(&proj[v_base..v_base + hkv * dh]).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{label}: v"
        );
        let untouched = |v: &[bf16]| v.iter().all(|x| x.to_bits() == u16::from_ne_bytes([POISON; 2]));
        assert!(untouched(&gk[..row.start]) && untouched(&gk[row.end..]), "{label}: k cache written off its row");
        assert!(untouched(&gv[..row.start]) && untouched(&gv[row.end..]), "{label}: v cache written off its row");
        assert!(
            gik.iter().zip(&want_index_keys).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{label}: index keys (the raw key at the position, nothing else)"
        );
        let done = pos / bt;
        for (blk, chunk) in gbk.chunks(di).enumerate() {
            if completes && blk == done {
                close("block key", chunk, &want_block);
            } else {
                assert!(chunk.iter().all(|x| x.to_bits() == poison.to_bits()), "{label}: block key {blk} written");
            }
        }
        let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        let (q2, _, k2, _, iq2, _, bk2) = &runs[1];
        assert!(
            same(gq, q2)
                && same(giq, iq2)
                && same(gbk, bk2)
                && gk.iter().zip(k2).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{label}: a second launch gave different bits"
        );
    }
    assert!(ran > 0, "no tile set runs {c:?}");
}

#[test]
#[ignore = "needs a CUDA device"]
fn prepare_matches_the_reference_norms_and_rope() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("qsa prepare");
    let p = QsaShape::PUBLISHED;
    let published = |position| PrepareCase {
        q_heads: p.q_heads,
        kv_heads: p.kv_heads,
        head_dim: p.head_dim,
        index_heads: p.index_heads,
        index_dim: p.index_dim,
        rotary: p.rotary,
        block_tokens: p.block_tokens,
        position,
    };
    // A token inside a block, one completing the first block, one completing block 512, the last
    // of a 128k context.
    for position in [0, 3, 2_049, 2_051, 131_071] {
        prepare_case(&gpu, &mut rng, published(position), &[TileSet::DEFAULT]);
    }
    let candidates = qsa_prepare::Tiles::candidates();
    for position in [0, 3, 5, 7] {
        let c = PrepareCase {
            q_heads: 4,
            kv_heads: 2,
            head_dim: 64,
            index_heads: 3,
            index_dim: 16,
            rotary: 16,
            block_tokens: 4,
            position,
        };
        prepare_case(&gpu, &mut rng, c, &candidates);
    }
}
