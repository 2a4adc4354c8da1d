//! The DSL kernels on a GPU against their CPU references: fresh random inputs every run, outputs
//! poisoned first (0xff bytes are bf16 NaNs), every element checked.

use engine::cuda::{DeviceBuffer, Gpu};
use engine::kernels::gemv_bf16::gemv_bf16;
use engine::kernels::zc_rmsnorm::zc_rmsnorm;
use engine::reference;
use flashnext::compare::{check, round_bf16};
use flashnext::rng::{Rng, to_f32};
use half::bf16;
use kernel_dsl::{KernelDef, TileSet};

const POISON: u8 = 0xff;

/// GEMV shapes: small ones exercise the edges, the large ones are the model's.
const GEMV_SHAPES: &[(usize, usize)] = &[(8, 256), (24, 512), (64, 2048), (10240, 2560), (320, 10240)];

struct GemvCase {
    w: Vec<bf16>,
    x: Vec<bf16>,
    want: Vec<f32>,
    magnitude: Vec<f32>,
    dw: DeviceBuffer<bf16>,
    dx: DeviceBuffer<bf16>,
    dy: DeviceBuffer<bf16>,
    partial: DeviceBuffer<f32>,
    counters: DeviceBuffer<u32>,
}

impl GemvCase {
    fn new(gpu: &Gpu, rng: &mut Rng, rows: usize, cols: usize) -> GemvCase {
        let w = rng.bf16_normal(rows * cols, 1.0);
        let x = rng.bf16_normal(cols, 1.0);
        let (wf, xf) = (to_f32(&w), to_f32(&x));
        let want = reference::gemv::gemv(&wf, &xf, rows, cols);
        let magnitude = reference::gemv::gemv_magnitudes(&wf, &xf, cols);
        let max_split = 16;
        GemvCase {
            dw: gpu.upload(&w).expect("upload W"),
            dx: gpu.upload(&x).expect("upload x"),
            dy: gpu.alloc(rows).expect("alloc y"),
            partial: gpu.alloc(max_split * rows).expect("alloc partials"),
            // Zero before the first launch, as the kernel requires; each launch leaves them zero.
            counters: gpu.alloc(rows).expect("alloc counters"),
            w,
            x,
            want,
            magnitude,
        }
    }

    fn run(&mut self, gpu: &Gpu, tiles: gemv_bf16::Tiles) -> Result<Vec<f32>, String> {
        let (rows, cols) = (self.want.len(), self.x.len());
        let k = gpu.kernel::<gemv_bf16::Kernel>(tiles).map_err(|e| e.to_string())?;
        gpu.fill_bytes(&mut self.dy, POISON).map_err(|e| e.to_string())?;
        let args = gemv_bf16::Args {
            w: self.dw.ptr(),
            x: self.dx.ptr(),
            y: self.dy.ptr_mut(),
            partial: self.partial.ptr_mut(),
            counters: self.counters.ptr_mut(),
            rows: rows as u32,
            cols: cols as u32,
        };
        // SAFETY: W is rows×cols, x cols, y rows, partial 16·rows ≥ K_SPLIT·rows, counters rows ≥ grid.x.
        unsafe { k.launch(gpu, &args) }.map_err(|e| e.to_string())?;
        let y = gpu.download(&self.dy).map_err(|e| e.to_string())?;
        Ok(to_f32(&y))
    }

    fn check(&self, got: &[f32], label: &str) -> Result<(), String> {
        let want_rounded = round_bf16(&self.want);
        // bf16 output: half an ulp of rounding, plus an f32 summation error bounded by the row's Σ|w·x|.
        let tol = |i: usize| self.want[i].abs() / 128.0 + 2e-5 * self.magnitude[i];
        let agreement = check(label, got, &self.want, tol)?;
        // The rounded reference is within the same tolerance, so the bound is meaningful.
        check(&format!("{label} (rounded reference)"), &want_rounded, &self.want, tol)?;
        if agreement.rel_l2 > 4e-3 {
            return Err(format!("{label}: relative L2 error {:.2e} is above 4e-3", agreement.rel_l2));
        }
        Ok(())
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn gemv_matches_the_reference_for_every_valid_tile_set() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("gemv");
    let mut failures = Vec::new();
    for &(rows, cols) in GEMV_SHAPES {
        let mut case = GemvCase::new(&gpu, &mut rng, rows, cols);
        let large = rows * cols > 1 << 20;
        let mut tested = 0;
        for tiles in gemv_bf16::Tiles::candidates() {
            // Every candidate on the small shapes; at full size the defaults with every split and
            // vector width.
            let split_variant =
                gemv_bf16::Tiles { k_split: tiles.k_split, vec: tiles.vec, ..gemv_bf16::Tiles::DEFAULT };
            if large && tiles != split_variant {
                continue;
            }
            let args_ok = gemv_bf16::Kernel::launch_dims(
                &tiles,
                &gemv_bf16::Args {
                    w: case.dw.ptr(),
                    x: case.dx.ptr(),
                    y: case.dy.ptr_mut(),
                    partial: case.partial.ptr_mut(),
                    counters: case.counters.ptr_mut(),
                    rows: rows as u32,
                    cols: cols as u32,
                },
            );
            if args_ok.is_err() {
                continue;
            }
            tested += 1;
            let label = format!("gemv {rows}x{cols} {tiles:?}");
            let first = case.run(&gpu, tiles).and_then(|y| case.check(&y, &label).map(|()| y));
            // A second launch must give the same bits: the split-K counters were left at zero and
            // the reduction order is fixed.
            let verdict = first.and_then(|y1| {
                let y2 = case.run(&gpu, tiles)?;
                let same = y1.iter().zip(&y2).all(|(a, b)| a.to_bits() == b.to_bits());
                if same { Ok(()) } else { Err(format!("{label}: a second launch gave different bits")) }
            });
            if let Err(e) = verdict {
                failures.push(e);
            }
        }
        println!("gemv {rows}x{cols}: {tested} tile sets checked");
        assert!(tested > 0, "no tile set fits {rows}x{cols}");
        assert_eq!(case.w.len(), rows * cols);
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
#[ignore = "needs a CUDA device"]
fn gemv_rejects_a_shape_its_tiles_cannot_cover() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("gemv-reject");
    let mut case = GemvCase::new(&gpu, &mut rng, 8, 256);
    let tiles = gemv_bf16::Tiles { k_split: 2, ..gemv_bf16::Tiles::DEFAULT };
    // 256 columns split in two leave 128 per split, less than one step of 32 lanes × 8.
    let err = case.run(&gpu, tiles).expect_err("the requirement must fail");
    assert!(err.contains("cols % (K_SPLIT * 32 * VEC) == 0"), "{err}");
}

#[test]
#[ignore = "needs a CUDA device"]
fn zc_rmsnorm_matches_the_reference_for_every_tile_set() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("zc_rmsnorm");
    let eps = 1e-6;
    for &(groups, len) in &[(1usize, 8usize), (3, 64), (4, 2560), (7, 4104)] {
        // Inputs of a realistic spread; weights around zero (the norm scales by 1 + w).
        let x = rng.bf16_normal(groups * len, 3.0);
        let w = rng.bf16_normal(groups * len, 0.2);
        let want = reference::norm::zc_rms_norm(&to_f32(&x), &to_f32(&w), len, eps);
        let dx = gpu.upload(&x).expect("upload x");
        let dw = gpu.upload(&w).expect("upload w");
        let mut dy = gpu.alloc::<bf16>(groups * len).expect("alloc y");
        for tiles in zc_rmsnorm::Tiles::candidates() {
            let k = gpu.kernel::<zc_rmsnorm::Kernel>(tiles).expect("compile");
            gpu.fill_bytes(&mut dy, POISON).expect("poison");
            let args = zc_rmsnorm::Args {
                x: dx.ptr(),
                w: dw.ptr(),
                y: dy.ptr_mut(),
                groups: groups as u32,
                group_len: len as u32,
                eps,
            };
            // SAFETY: x, w and y hold groups × group_len elements.
            unsafe { k.launch(&gpu, &args) }.expect("launch");
            let got = to_f32(&gpu.download(&dy).expect("download"));
            // bf16 output: the reference rounded, give or take one bf16 step.
            let tol = |i: usize| want[i].abs() / 100.0 + 1e-6;
            let a = check(&format!("zc_rmsnorm {groups}x{len} {tiles:?}"), &got, &want, tol)
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(a.rel_l2 < 4e-3, "relative L2 {:.2e}", a.rel_l2);
        }
    }
}
