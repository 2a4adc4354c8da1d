//! Temperature / top-p sampling on a GPU against `reference::sample`, on fresh random logits at
//! vocab 512 up to 262,144 (the published 248,320 among them), with the token poisoned before
//! every launch and a new position each time.
//!
//! The device sums fixed-point masses and the reference f64 ones, so where u·S falls within
//! [`TOL`] (of the total mass) of a boundary between two tokens, or the nucleus's cut within
//! [`TOL`] of one, either side is right. Every token must therefore be the reference's pick, or
//! lie within the nucleus and have a cumulative-mass interval that contains u·S, both within
//! [`TOL`]; and most picks (see [`MIN_EXACT`]) must be exactly the reference's. A small nucleus or
//! a low temperature must give exactly the reference's token; tied logits exercise the
//! kernel's tie path; graph replays must match eager launches bit for bit.

use engine::cuda::{DeviceBuffer, Gpu};
use engine::kernels::sample::sample_top_p;
use engine::layers::sample::{SampleParams, Sampler};
use engine::reference::decoder::argmax;
use engine::reference::sample::{Nucleus, uniform, uniform_bits};
use flashnext::rng::Rng;
use kernel_dsl::TileSet;

const POISON: u8 = 0xab;
/// The rounding allowed between the device's sums and the reference's, of the total mass.
const TOL: f64 = 1e-5;
/// The fewest exact picks, as a fraction of all (the rest lie within [`TOL`] of a boundary).
const MIN_EXACT: f64 = 0.9;

/// Logits: normal with standard deviation `scale`, or (tied) rounded to a few levels so that
/// many tokens share a logit exactly.
fn logits(rng: &mut Rng, vocab: usize, scale: f32, tied: bool) -> Vec<f32> {
    (0..vocab)
        .map(|_| {
            let v = rng.normal() * scale;
            if tied { (v * 0.5).round() * 2.0 } else { v }
        })
        .collect()
}

/// Whether `got` is acceptable for u (see the module's comment); `Ok(true)` when it is exactly
/// the reference's pick.
fn judge(n: &Nucleus, top_p: f32, u: f64, got: u32) -> Result<bool, String> {
    let want = n.pick(u);
    if got == want {
        return Ok(true);
    }
    let Some(rank) = n.order.iter().position(|&t| t == got) else {
        return Err(format!("token {got} is not an id (reference {want})"));
    };
    let z = *n.cumulative.last().expect("logits");
    let tol = TOL * z;
    let cut = if top_p >= 1.0 { z } else { f64::from(top_p) * z };
    let before = |k: usize| if k == 0 { 0.0 } else { n.cumulative[k - 1] };
    // Every nucleus size the cut allows within the tolerance.
    for kept in 1..=n.order.len() {
        if n.cumulative[kept - 1] < cut - tol || before(kept - 1) >= cut + tol {
            continue;
        }
        let target = u * n.cumulative[kept - 1];
        if rank < kept && before(rank) <= target + tol && n.cumulative[rank] > target - tol {
            return Ok(false);
        }
    }
    Err(format!(
        "token {got} (rank {rank}, cumulative {:.9} .. {:.9} of {z:.6}) for u {u:.9}; the reference picks {want} (rank {}), nucleus {} tokens, S {:.6}",
        before(rank),
        n.cumulative[rank],
        n.order.iter().position(|&t| t == want).unwrap_or(usize::MAX),
        n.kept,
        n.mass()
    ))
}

/// Launches at `positions`, the token poisoned before each; the tokens.
fn draw(gpu: &Gpu, s: &mut Sampler, logits: &DeviceBuffer<f32>, positions: &[u32]) -> Vec<u32> {
    let mut position = gpu.alloc::<u32>(1).expect("position");
    let mut token = gpu.alloc::<u32>(1).expect("token");
    positions
        .iter()
        .map(|&p| {
            gpu.write(&mut position, &[p]).expect("position");
            gpu.fill_bytes(&mut token, POISON).expect("poison");
            s.launch(gpu, logits, &position, &mut token).expect("launch");
            gpu.download(&token).expect("token")[0]
        })
        .collect()
}

/// Every (T, top_p) case of a logits set: (draws, exact picks).
fn run_cases(gpu: &Gpu, rng: &mut Rng, vocab: usize, tied: bool, draws: u32, tiles: sample_top_p::Tiles) -> (u32, u32) {
    let host = logits(rng, vocab, 3.0, tied);
    let dev = gpu.upload(&host).expect("logits");
    let (mut total, mut exact) = (0, 0);
    for (temperature, top_p) in [(1.0, 1.0), (0.7, 0.9), (1.5, 0.5), (0.3, 0.95), (2.0, 1.0), (1.0, 1e-6), (1e-3, 1.0)]
    {
        let params = SampleParams { temperature, top_p, seed: rng.next_u64() };
        let label =
            format!("vocab {vocab} tied {tied} T {temperature} top_p {top_p} seed {:#x} {tiles:?}", params.seed);
        let mut s = Sampler::load(gpu, vocab, params, tiles).unwrap_or_else(|e| panic!("{label}: {e}"));
        let n = Nucleus::new(&host, temperature, top_p);
        let first = rng.next_u64() as u32 % 1_000_000;
        let positions: Vec<u32> = (first..first + draws).collect();
        let got = draw(gpu, &mut s, &dev, &positions);
        for (&p, &g) in positions.iter().zip(&got) {
            let u = uniform(uniform_bits(params.seed, p));
            let ok = judge(&n, top_p, u, g).unwrap_or_else(|e| panic!("{label} position {p}: {e}"));
            total += 1;
            exact += u32::from(ok);
            if top_p <= 1e-6 {
                // One token in the nucleus: exactly the largest logit, the lowest id on ties.
                assert_eq!(g, argmax(&host), "{label} position {p}: a tiny nucleus is the argmax");
            }
        }
        assert_eq!(s.barrier_count(gpu).expect("scratch") % 128, 0, "{label}: the barrier is not at rest");
    }
    (total, exact)
}

fn report(label: &str, (total, exact): (u32, u32)) {
    println!("{label}: {exact} of {total} picks exactly the reference's, the rest within {TOL:e} of a boundary");
    assert!(f64::from(exact) >= MIN_EXACT * f64::from(total), "{label}: too few exact picks");
}

#[test]
#[ignore = "needs a CUDA device"]
fn small_vocabularies_match_the_reference_for_every_tile_set() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("sample small");
    let (mut total, mut exact) = (0, 0);
    for tiles in sample_top_p::Tiles::candidates() {
        for (vocab, tied) in [(512, false), (512, true), (1000, false), (7, false)] {
            let (t, e) = run_cases(&gpu, &mut rng, vocab, tied, 40, tiles);
            total += t;
            exact += e;
        }
    }
    report("vocab 7 to 1000, every tile set", (total, exact));
}

#[test]
#[ignore = "needs a CUDA device"]
fn published_vocabulary_matches_the_reference() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("sample large");
    let (mut total, mut exact) = (0, 0);
    // The default tiles and the ones `Sampler::new` takes on this device (wider blocks on an H100).
    let chosen = Sampler::tiles_for(&gpu).expect("the sampler's tiles");
    let tile_sets = if chosen == TileSet::DEFAULT { vec![chosen] } else { vec![TileSet::DEFAULT, chosen] };
    for tiles in tile_sets {
        for (vocab, tied) in [(248_320, false), (248_320, true), (100_003, false), (262_144, false)] {
            let (t, e) = run_cases(&gpu, &mut rng, vocab, tied, 24, tiles);
            total += t;
            exact += e;
        }
    }
    report("vocab 100,003 to 262,144", (total, exact));
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_graph_replay_at_each_position_matches_eager_launches() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("sample graph");
    let vocab = 248_320;
    let host = logits(&mut rng, vocab, 3.0, false);
    let dev = gpu.upload(&host).expect("logits");
    let params = SampleParams { temperature: 0.8, top_p: 0.95, seed: rng.next_u64() };
    let mut s = Sampler::new(&gpu, vocab, params).expect("sampler");
    let positions: Vec<u32> = (100..164).collect();
    let eager = draw(&gpu, &mut s, &dev, &positions);
    let mut position = gpu.alloc::<u32>(1).expect("position");
    let mut token = gpu.alloc::<u32>(1).expect("token");
    let g = gpu.capture(|| s.launch(&gpu, &dev, &position, &mut token)).expect("capture");
    let n = Nucleus::new(&host, params.temperature, params.top_p);
    let mut distinct = std::collections::BTreeSet::new();
    for (i, &p) in positions.iter().enumerate() {
        gpu.write(&mut position, &[p]).expect("position");
        gpu.fill_bytes(&mut token, POISON).expect("poison");
        g.launch().expect("replay");
        let got = gpu.download(&token).expect("token")[0];
        assert_eq!(got, eager[i], "position {p}: the replay gives another token than the eager launch");
        judge(&n, params.top_p, uniform(uniform_bits(params.seed, p)), got)
            .unwrap_or_else(|e| panic!("position {p}: {e}"));
        distinct.insert(got);
    }
    assert_eq!(s.barrier_count(&gpu).expect("scratch") % 128, 0, "the barrier is not at rest");
    println!("graph: {} positions, {} distinct tokens, nucleus {} tokens", positions.len(), distinct.len(), n.kept);
    assert!(distinct.len() > 1, "every position gave the same token: the position is not read per replay");
}
