//! The MoE block on a GPU (router, gate+up, down: three launches) against the CPU reference, with
//! NVFP4 and bf16 experts, at the published shape and a tiny one: router ids identical, the
//! routing weights, the shared expert's gate and the intermediate activations close, the bf16
//! output within 1e-2 relative L2, a second pass bit-identical. Fresh random inputs each run;
//! outputs (the route among them) poisoned first.

use engine::cuda::Gpu;
use engine::kernels::moe::gate_up::moe_gate_up_nvfp4 as gate_up_nvfp4;
use engine::layers::moe::{
    ExpertNvfp4, MoeKernels, MoeScratch, MoeShape, MoeTiles, MoeWeightsOnDevice, StackedNvfp4, enqueue,
};
use engine::model::nvfp4::Nvfp4Matrix;
use engine::model::weights::{ExpertWeights, Linear};
use engine::reference;
use flashnext::compare::rel_l2;
use flashnext::rng::{Rng, to_f32};
use half::bf16;
use kernel_dsl::TileSet;

const PUBLISHED: MoeShape =
    MoeShape { hidden: 2560, experts: 512, top_k: 10, inter: 640, shared_inter: 640, renormalise: true };
const TINY: MoeShape = MoeShape { hidden: 512, experts: 8, top_k: 2, inter: 128, shared_inter: 256, renormalise: true };

fn random_nvfp4(rng: &mut Rng, rows: usize, cols: usize) -> Nvfp4Matrix {
    let mut packed = vec![0u8; rows * cols / 2];
    for chunk in packed.chunks_mut(8) {
        let r = rng.next_u64().to_le_bytes();
        chunk.copy_from_slice(&r[..chunk.len()]);
    }
    // Block scales between 2^-2 and 2^2 (e4m3 exponent fields 5 to 8), any mantissa.
    let scales =
        (0..rows * cols / 16).map(|_| (((rng.next_u64() % 4 + 5) << 3) | (rng.next_u64() % 8)) as u8).collect();
    let scale_2 = 0.01 + 0.02 * rng.uniform();
    Nvfp4Matrix { rows, cols, packed, scales, scale_2 }
}

fn linear(m: &Nvfp4Matrix) -> Linear {
    Linear { rows: m.rows, cols: m.cols, w: m.dequantise(), bias: None }
}

/// How the router's rows make its logits.
#[derive(Clone, Copy, Debug)]
enum Logits {
    Random,
    TiedPairs,
    AllTied,
}

/// One block's inputs and weights, on the host.
struct Block {
    shape: MoeShape,
    router: Vec<bf16>,
    shared_gate: Vec<bf16>,
    x: Vec<bf16>,
}

impl Block {
    fn new(rng: &mut Rng, shape: MoeShape) -> Block {
        let d = shape.hidden;
        Block {
            shape,
            router: rng.bf16_normal(shape.experts * d, 1.0 / (d as f32).sqrt()),
            shared_gate: rng.bf16_normal(d, 1.0 / (d as f32).sqrt()),
            x: rng.bf16_normal(d, 1.0),
        }
    }

    /// Ties in the router's rows (`Logits`): the router must then take the lower expert first,
    /// as the reference does.
    fn with(mut self, logits: Logits) -> Block {
        let d = self.shape.hidden;
        match logits {
            Logits::Random => {}
            // Expert 2i + 1's row a copy of expert 2i's.
            Logits::TiedPairs => {
                for pair in 0..self.shape.experts / 2 {
                    let (a, b) = self.router.split_at_mut((2 * pair + 1) * d);
                    b[..d].copy_from_slice(&a[2 * pair * d..]);
                }
            }
            // Every row expert 0's: the route is experts 0 .. top_k, and every key is a candidate
            // of the router's FILTER top-k, which hands over to its rounds.
            Logits::AllTied => {
                let (first, rest) = self.router.split_at_mut(d);
                rest.chunks_mut(d).for_each(|row| row.copy_from_slice(first));
            }
        }
        self
    }

    /// σ(shared_gate·x): the shared expert's weight.
    fn shared_weight(&self) -> f32 {
        let x = to_f32(&self.x);
        reference::norm::sigmoid(to_f32(&self.shared_gate).iter().zip(&x).map(|(a, b)| a * b).sum())
    }

    fn route(&self) -> Vec<(usize, f32)> {
        let router = Linear { rows: self.shape.experts, cols: self.shape.hidden, w: to_f32(&self.router), bias: None };
        reference::moe::route(&to_f32(&self.x), &router, self.shape.top_k, self.shape.renormalise)
    }

    /// y and each slot's h, from the routed experts' and the shared expert's f32 weights.
    fn reference(
        &self,
        route: &[(usize, f32)],
        expert: impl Fn(usize) -> ExpertWeights,
        shared: &ExpertWeights,
    ) -> (Vec<f32>, Vec<Vec<f32>>) {
        let x = to_f32(&self.x);
        let mut y = vec![0.0f32; self.shape.hidden];
        let mut hs = Vec::new();
        let h_of = |w: &ExpertWeights| -> Vec<f32> {
            w.gate.apply(&x).iter().zip(w.up.apply(&x)).map(|(&g, u)| reference::norm::silu(g) * u).collect()
        };
        for &(e, weight) in route {
            let w = expert(e);
            let h = h_of(&w);
            w.down.apply(&h).iter().zip(y.iter_mut()).for_each(|(v, acc)| *acc += weight * v);
            hs.push(h);
        }
        let sg = self.shared_weight();
        let h = h_of(shared);
        shared.down.apply(&h).iter().zip(y.iter_mut()).for_each(|(v, acc)| *acc += sg * v);
        hs.push(h);
        (y, hs)
    }
}

/// Runs one pass on the GPU three times (poisoning y, h and the staged activations first), the
/// third with overlapped launches off: ids, weights, h, y; and whether the other passes gave the
/// same bits.
fn run(
    gpu: &Gpu,
    k: &MoeKernels,
    w: &MoeWeightsOnDevice,
    x: &[bf16],
    nvfp4: bool,
) -> (Vec<u32>, Vec<f32>, Vec<f32>, Vec<f32>, bool) {
    let sh = w.shape;
    let dx = gpu.upload(x).expect("x");
    let mut dy = gpu.alloc::<bf16>(sh.hidden).expect("y");
    let mut s = MoeScratch::new(gpu, sh).expect("scratch");
    let mut outputs = Vec::new();
    for pass in 0..3 {
        gpu.set_overlap_launches(pass < 2);
        gpu.fill_bytes(&mut dy, 0xff).expect("poison");
        gpu.fill_bytes(&mut s.h, 0xff).expect("poison");
        gpu.fill_bytes(&mut s.h_bf16, 0xff).expect("poison");
        gpu.fill_bytes(&mut s.h_staged, 0xff).expect("poison");
        gpu.fill_bytes(&mut s.x_staged, 0xff).expect("poison");
        gpu.fill_bytes(&mut s.ids, 0xff).expect("poison");
        gpu.fill_bytes(&mut s.weights, 0xff).expect("poison");
        // SAFETY: x and y hold `hidden` elements; they are not part of the weights or scratch.
        unsafe { enqueue(gpu, k, w, &mut s, dx.ptr(), dy.ptr_mut()) }.expect("enqueue");
        outputs.push(to_f32(&gpu.download(&dy).expect("y")));
    }
    gpu.set_overlap_launches(true);
    let same = outputs[1..].iter().all(|o| o.iter().zip(&outputs[0]).all(|(a, b)| a.to_bits() == b.to_bits()));
    let ids = gpu.download(&s.ids).expect("ids");
    let weights = gpu.download(&s.weights).expect("weights");
    let h = if nvfp4 { gpu.download(&s.h).expect("h") } else { to_f32(&gpu.download(&s.h_bf16).expect("h")) };
    (ids, weights, h, outputs.swap_remove(0), same)
}

fn check(
    label: &str,
    b: &Block,
    route: &[(usize, f32)],
    ref_y: &[f32],
    ref_h: &[Vec<f32>],
    got: (Vec<u32>, Vec<f32>, Vec<f32>, Vec<f32>, bool),
) {
    let (ids, weights, h, y, same) = got;
    let want_ids: Vec<u32> = route.iter().map(|&(e, _)| e as u32).collect();
    assert_eq!(ids, want_ids, "{label}: router ids");
    for (k, &(_, w)) in route.iter().enumerate() {
        assert!((weights[k] - w).abs() <= 1e-5 + 1e-4 * w.abs(), "{label}: routing weight {k}: {} vs {w}", weights[k]);
    }
    let (sg, got_sg) = (b.shared_weight(), weights[route.len()]);
    assert!((got_sg - sg).abs() <= 1e-5 + 1e-4 * sg.abs(), "{label}: shared expert's gate: {got_sg} vs {sg}");
    let stride = b.shape.h_stride();
    for (slot, want) in ref_h.iter().enumerate() {
        let e = rel_l2(&h[slot * stride..slot * stride + want.len()], want);
        assert!(e < 1e-2, "{label}: h of slot {slot} is {e:.2e} from the reference (relative L2)");
    }
    assert!(y.iter().all(|v| v.is_finite()), "{label}: y has unwritten (NaN) elements");
    let e = rel_l2(&y, ref_y);
    println!("{label}: y within {e:.2e} of the reference (relative L2)");
    assert!(e < 1e-2, "{label}: y is {e:.2e} from the reference (relative L2)");
    assert!(same, "{label}: a second pass gave different bits");
}

fn nvfp4_case(gpu: &Gpu, rng: &mut Rng, shape: MoeShape, tiles: &[MoeTiles], logits: Logits) {
    let b = Block::new(rng, shape).with(logits);
    let (d, i, is) = (shape.hidden, shape.inter, shape.shared_inter);
    let expert = |rng: &mut Rng, inter: usize| ExpertNvfp4 {
        gate: random_nvfp4(rng, inter, d),
        up: random_nvfp4(rng, inter, d),
        down: random_nvfp4(rng, d, inter),
    };
    let experts: Vec<ExpertNvfp4> = (0..shape.experts).map(|_| expert(rng, i)).collect();
    let shared = expert(rng, is);
    let stacked = StackedNvfp4::stack(&experts, &shared);
    let w = MoeWeightsOnDevice::upload_nvfp4(gpu, shape, &b.router, &b.shared_gate, &stacked).expect("upload");
    let route = b.route();
    let as_f32 = |e: &ExpertNvfp4| ExpertWeights { gate: linear(&e.gate), up: linear(&e.up), down: linear(&e.down) };
    let (ref_y, ref_h) = b.reference(&route, |e| as_f32(&experts[e]), &as_f32(&shared));
    for t in tiles {
        let k = MoeKernels::load(gpu, *t).expect("compile");
        check(&format!("nvfp4 {shape:?} {logits:?} {t:?}"), &b, &route, &ref_y, &ref_h, run(gpu, &k, &w, &b.x, true));
    }
}

fn bf16_case(gpu: &Gpu, rng: &mut Rng, shape: MoeShape, tiles: &[MoeTiles]) {
    let b = Block::new(rng, shape);
    let (d, i, is, e) = (shape.hidden, shape.inter, shape.shared_inter, shape.experts);
    let gate_up = rng.bf16_normal(2 * (e * i + is) * d, 1.0 / (d as f32).sqrt());
    let down = rng.bf16_normal((e * i + is) * d, 1.0 / (i as f32).sqrt());
    let w = MoeWeightsOnDevice::upload_bf16(gpu, shape, &b.router, &b.shared_gate, &gate_up, &down).expect("upload");
    let lin = |v: &[bf16], rows, cols| Linear { rows, cols, w: to_f32(v), bias: None };
    let expert = |ex: usize| {
        let (inter, gu0, dn0) = if ex < e { (i, 2 * ex * i * d, ex * i * d) } else { (is, 2 * e * i * d, e * i * d) };
        ExpertWeights {
            gate: lin(&gate_up[gu0..gu0 + inter * d], inter, d),
            up: lin(&gate_up[gu0 + inter * d..gu0 + 2 * inter * d], inter, d),
            down: lin(&down[dn0..dn0 + d * inter], d, inter),
        }
    };
    let route = b.route();
    let (ref_y, ref_h) = b.reference(&route, expert, &expert(e));
    for t in tiles {
        let k = MoeKernels::load(gpu, *t).expect("compile");
        check(&format!("bf16 {shape:?} {t:?}"), &b, &route, &ref_y, &ref_h, run(gpu, &k, &w, &b.x, false));
    }
}

/// Every candidate of a kernel that differs from its default in one tile.
fn one_off<T: TileSet>() -> Vec<T> {
    let d = T::DEFAULT.values();
    T::candidates().into_iter().filter(|t| t.values().iter().zip(&d).filter(|(a, b)| a != b).count() == 1).collect()
}

/// The defaults' one-tile changes of one kernel, each set into the defaults by `with`.
fn one_off_sets<T: TileSet>(with: impl Fn(MoeTiles, T) -> MoeTiles) -> Vec<MoeTiles> {
    one_off::<T>().into_iter().map(|t| with(MoeTiles::default(), t)).collect()
}

/// The defaults, and the router's one-off candidates that fit `shape` (its two top-k paths among
/// them).
fn router_variants(shape: MoeShape) -> Vec<MoeTiles> {
    fitting(shape, [one_off_sets(|b, t| MoeTiles { router: t, ..b })])
}

/// The defaults, and the down kernel's one-off candidates that fit `shape` (the published
/// shape's 440 tasks fill 14 of a lane's 16 batch slots, where the tiny shape's fill one).
fn down_variants(shape: MoeShape) -> Vec<MoeTiles> {
    fitting(shape, [one_off_sets(|b, t| MoeTiles { down_nvfp4: t, ..b })])
}

/// The defaults, and for each kernel every candidate that differs from its default in one tile,
/// among those that fit `shape`.
fn tile_variants(shape: MoeShape) -> Vec<MoeTiles> {
    fitting(
        shape,
        [
            one_off_sets(|b, t| MoeTiles { router: t, ..b }),
            one_off_sets(|b, t| MoeTiles { gate_up_nvfp4: t, ..b }),
            one_off_sets(|b, t| MoeTiles { down_nvfp4: t, ..b }),
            one_off_sets(|b, t| MoeTiles { gate_up_bf16: t, ..b }),
            one_off_sets(|b, t| MoeTiles { down_bf16: t, ..b }),
        ],
    )
}

/// The defaults, then `sets` in order, keeping those that fit `shape`.
fn fitting<const N: usize>(shape: MoeShape, sets: [Vec<MoeTiles>; N]) -> Vec<MoeTiles> {
    let mut v = vec![MoeTiles::default()];
    v.extend(sets.into_iter().flatten());
    v.retain(|t| t.check(shape).is_ok());
    v
}

/// The gate/up kernel's two ways of streaming its weights: by the lanes' own loads into registers
/// (the defaults), and by bulk copies into shared memory (`BULK`) at each of that path's batch and
/// residency candidates, which a one-tile change from the defaults cannot reach (it needs whole
/// warps a row group).
fn gate_up_paths(shape: MoeShape) -> Vec<MoeTiles> {
    let bulk = gate_up_nvfp4::Tiles::candidates().into_iter().filter(|t| t.bulk > 0 && !t.prefetch);
    let v = fitting(shape, [bulk.map(|t| MoeTiles { gate_up_nvfp4: t, ..MoeTiles::default() }).collect()]);
    assert!(v.len() > 1, "a bulk tile set and the defaults must fit {shape:?}");
    v
}

#[test]
#[ignore = "needs a CUDA device"]
fn moe_nvfp4_matches_the_reference() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("moe nvfp4");
    let tiny = tile_variants(TINY);
    println!("tiny shape: {} tile sets", tiny.len());
    nvfp4_case(&gpu, &mut rng, TINY, &tiny, Logits::Random);
    // The router's and the down kernel's variants at the published shape too, and with tied
    // logits (the lower expert first) at both shapes.
    let mut published = router_variants(PUBLISHED);
    published.extend(down_variants(PUBLISHED).into_iter().skip(1));
    println!("published shape: {} tile sets", published.len());
    nvfp4_case(&gpu, &mut rng, PUBLISHED, &published, Logits::Random);
    let (tiny_paths, published_paths) = (gate_up_paths(TINY), gate_up_paths(PUBLISHED));
    println!(
        "gate/up paths: {} tile sets at the tiny shape, {} at the published one",
        tiny_paths.len(),
        published_paths.len()
    );
    nvfp4_case(&gpu, &mut rng, TINY, &tiny_paths, Logits::Random);
    nvfp4_case(&gpu, &mut rng, PUBLISHED, &published_paths, Logits::Random);
    for logits in [Logits::TiedPairs, Logits::AllTied] {
        nvfp4_case(&gpu, &mut rng, TINY, &router_variants(TINY), logits);
        nvfp4_case(&gpu, &mut rng, PUBLISHED, &published, logits);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn moe_bf16_matches_the_reference() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("moe bf16");
    let tiny = tile_variants(TINY);
    bf16_case(&gpu, &mut rng, TINY, &tiny);
    bf16_case(&gpu, &mut rng, PUBLISHED, &[MoeTiles::default()]);
}

/// Layers chained on one stream with one scratch, each reading the previous one's output, as the
/// decode step runs them: the overlapped launches (each kernel starting before its predecessor
/// ends), eager and captured in a graph, give the bits of layers run one at a time with a host
/// synchronisation between them.
#[test]
#[ignore = "needs a CUDA device"]
fn chained_layers_give_the_bits_of_layers_run_apart() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("moe chain");
    for shape in [TINY, PUBLISHED] {
        let d = shape.hidden;
        let layers: Vec<MoeWeightsOnDevice> = (0..4)
            .map(|_| {
                let b = Block::new(&mut rng, shape);
                let expert = |rng: &mut Rng, inter: usize| ExpertNvfp4 {
                    gate: random_nvfp4(rng, inter, d),
                    up: random_nvfp4(rng, inter, d),
                    down: random_nvfp4(rng, d, inter),
                };
                let experts: Vec<ExpertNvfp4> = (0..shape.experts).map(|_| expert(&mut rng, shape.inter)).collect();
                let shared = expert(&mut rng, shape.shared_inter);
                let stacked = StackedNvfp4::stack(&experts, &shared);
                MoeWeightsOnDevice::upload_nvfp4(&gpu, shape, &b.router, &b.shared_gate, &stacked).expect("upload")
            })
            .collect();
        let k = MoeKernels::load(&gpu, MoeTiles::default()).expect("compile");
        let mut s = MoeScratch::new(&gpu, shape).expect("scratch");
        let x: Vec<bf16> = rng.bf16_normal(d, 1.0);
        // Activations: acts[0] = x, acts[l + 1] = layer l's output.
        let mut acts: Vec<_> = std::iter::once(gpu.upload(&x).expect("x"))
            .chain((0..layers.len()).map(|_| gpu.alloc::<bf16>(d).expect("activations")))
            .collect();
        let mut enqueue_all = |acts: &mut Vec<engine::cuda::DeviceBuffer<bf16>>, sync: bool| {
            for (l, w) in layers.iter().enumerate() {
                let (head, tail) = acts.split_at_mut(l + 1);
                // SAFETY: distinct buffers of `hidden` elements, apart from weights and scratch.
                unsafe { enqueue(&gpu, &k, w, &mut s, head[l].ptr(), tail[0].ptr_mut()) }.expect("enqueue");
                if sync {
                    gpu.synchronize().expect("sync");
                }
            }
        };
        let poison = |acts: &mut Vec<engine::cuda::DeviceBuffer<bf16>>| {
            for a in acts.iter_mut().skip(1) {
                gpu.fill_bytes(a, 0xff).expect("poison");
            }
        };
        poison(&mut acts);
        enqueue_all(&mut acts, true);
        let apart = gpu.download(&acts[layers.len()]).expect("y");
        assert!(apart.iter().all(|v| v.is_finite()), "{shape:?}: unwritten output");
        poison(&mut acts);
        enqueue_all(&mut acts, false);
        let chained = gpu.download(&acts[layers.len()]).expect("y");
        assert_eq!(chained, apart, "{shape:?}: chained layers differ from layers run apart");
        poison(&mut acts);
        let graph = gpu
            .capture(|| {
                enqueue_all(&mut acts, false);
                Ok(())
            })
            .expect("capture");
        graph.launch().expect("replay");
        let replayed = gpu.download(&acts[layers.len()]).expect("y");
        assert_eq!(replayed, apart, "{shape:?}: the captured chain differs from layers run apart");
        println!("{shape:?}: 4 chained layers, overlapped eager and graph = apart");
    }
}
