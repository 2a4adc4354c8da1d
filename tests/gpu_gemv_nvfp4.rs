//! The NVFP4 GEMV on a GPU against the CPU reference on the dequantised matrix: fresh random
//! weights and inputs every run, the output poisoned first (0xff bytes are bf16 NaNs), every
//! element checked, at the step's shapes and at small ones for every tile set that fits.

use engine::cuda::{DeviceBuffer, Gpu};
use engine::kernels::gemv_nvfp4::gemv_nvfp4;
use engine::model::nvfp4::Nvfp4Matrix;
use engine::reference;
use flashnext::compare::check;
use flashnext::rng::{Rng, to_f32};
use half::bf16;
use kernel_dsl::{E2m1x2, KernelDef, TileSet};

const POISON: u8 = 0xff;

/// Small shapes for the edges (partial last row tiles among them: 102 rows end inside a tile of
/// 8, 16 or 4 rows); then the step's: GDN's out_proj (2560 × 6144), QSA's stacked input
/// projection and o_proj at the published geometry.
const SMALL: &[(usize, usize)] = &[(8, 256), (24, 512), (102, 1024)];
const STEP: &[(usize, usize)] = &[(2560, 6144), (8192 + 2 * 1024 + 4 * 128, 2560), (2560, 4096)];

struct Case {
    want: Vec<f32>,
    magnitude: Vec<f32>,
    packed: DeviceBuffer<E2m1x2>,
    scales: DeviceBuffer<u8>,
    scale2: DeviceBuffer<f32>,
    x: DeviceBuffer<bf16>,
    y: DeviceBuffer<bf16>,
    partial: DeviceBuffer<f32>,
    counters: DeviceBuffer<u32>,
    rows: usize,
    cols: usize,
    /// Where the second, third and fourth stacked matrix start.
    segs: [u32; 3],
}

impl Case {
    fn new(gpu: &Gpu, rng: &mut Rng, rows: usize, cols: usize) -> Case {
        // Rows of different magnitudes, so block scales and the tensor scale both matter.
        let mut w = to_f32(&rng.bf16_normal(rows * cols, 1.0));
        for (r, row) in w.chunks_mut(cols).enumerate() {
            let s = 0.25 + (r % 7) as f32;
            row.iter_mut().for_each(|v| *v *= s);
        }
        // Four stacked matrices quantised apart (as QSA's stacked projection is), with
        // boundaries that do not fall on a block's rows, each of a different magnitude so that
        // a row scaled by its neighbour's global scale shows.
        let bounds = [0, rows / 5, 2 * rows / 5 + 1, 3 * rows / 4, rows];
        let (mut packed, mut scales, mut scale2, mut wf) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (i, seg) in bounds.windows(2).enumerate() {
            let part: Vec<f32> = w[seg[0] * cols..seg[1] * cols].iter().map(|v| v * (1 << (2 * i)) as f32).collect();
            let m = Nvfp4Matrix::quantise(&part, seg[1] - seg[0], cols);
            packed.extend(m.packed.iter().map(|&b| E2m1x2(b)));
            scales.extend_from_slice(&m.scales);
            scale2.push(m.scale_2);
            wf.extend(m.dequantise());
        }
        let x = rng.bf16_normal(cols, 1.0);
        let xf = to_f32(&x);
        Case {
            want: reference::gemv::gemv(&wf, &xf, rows, cols),
            magnitude: reference::gemv::gemv_magnitudes(&wf, &xf, cols),
            packed: gpu.upload(&packed).expect("upload codes"),
            scales: gpu.upload(&scales).expect("upload scales"),
            scale2: gpu.upload(&scale2).expect("upload scales"),
            x: gpu.upload(&x).expect("upload x"),
            y: gpu.alloc(rows).expect("alloc y"),
            partial: gpu.alloc(8 * rows).expect("alloc partials"),
            // Zero before the first launch, as the kernel requires; each launch leaves them zero.
            counters: gpu.alloc(rows).expect("alloc counters"),
            rows,
            cols,
            segs: [bounds[1] as u32, bounds[2] as u32, bounds[3] as u32],
        }
    }

    fn args(&mut self) -> gemv_nvfp4::Args {
        gemv_nvfp4::Args {
            packed: self.packed.ptr(),
            scales: self.scales.ptr(),
            scale2: self.scale2.ptr(),
            x: self.x.ptr(),
            y: self.y.ptr_mut(),
            partial: self.partial.ptr_mut(),
            counters: self.counters.ptr_mut(),
            rows: self.rows as u32,
            cols: self.cols as u32,
            seg1: self.segs[0],
            seg2: self.segs[1],
            seg3: self.segs[2],
        }
    }

    fn run(&mut self, gpu: &Gpu, tiles: gemv_nvfp4::Tiles) -> Result<Vec<f32>, String> {
        let k = gpu.kernel::<gemv_nvfp4::Kernel>(tiles).map_err(|e| e.to_string())?;
        gpu.fill_bytes(&mut self.y, POISON).map_err(|e| e.to_string())?;
        let args = self.args();
        // SAFETY: the codes are rows × cols/2 bytes, the scales rows × cols/16, x cols, y rows,
        // partial 8·rows ≥ K_SPLIT·rows, counters rows ≥ grid.x, all zero.
        unsafe { k.launch(gpu, &args) }.map_err(|e| e.to_string())?;
        Ok(to_f32(&gpu.download(&self.y).map_err(|e| e.to_string())?))
    }

    fn check(&self, got: &[f32], label: &str) -> Result<f64, String> {
        // bf16 output (half an ulp), plus the staging of x in f16 with a scale per 16 values
        // (2^-11 of each chunk's largest term) and the f16 sums of four products: bounded by the
        // row's Σ|w·x|.
        let tol = |i: usize| self.want[i].abs() / 128.0 + 2e-3 * self.magnitude[i];
        let agreement = check(label, got, &self.want, tol)?;
        if agreement.rel_l2 > 4e-3 {
            return Err(format!("{label}: relative L2 error {:.2e} is above 4e-3", agreement.rel_l2));
        }
        Ok(agreement.rel_l2)
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn gemv_nvfp4_matches_the_reference_for_every_fitting_tile_set() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("gemv-nvfp4");
    let mut failures = Vec::new();
    for (&(rows, cols), large) in SMALL.iter().map(|s| (s, false)).chain(STEP.iter().map(|s| (s, true))) {
        let mut case = Case::new(&gpu, &mut rng, rows, cols);
        let (mut tested, mut worst) = (0, 0.0f64);
        for tiles in gemv_nvfp4::Tiles::candidates() {
            // Every candidate on the small shapes; at the step's the defaults with every split
            // and lane count, and every set of the row path (which covers those columns in more
            // than one step only there).
            let variant =
                gemv_nvfp4::Tiles { k_split: tiles.k_split, lanes: tiles.lanes, ..gemv_nvfp4::Tiles::DEFAULT };
            if large && tiles != variant && tiles.rows == 0 {
                continue;
            }
            if gemv_nvfp4::Kernel::launch_dims(&tiles, &case.args()).is_err() {
                continue;
            }
            tested += 1;
            let label = format!("gemv_nvfp4 {rows}x{cols} {tiles:?}");
            let first = case.run(&gpu, tiles).and_then(|y| case.check(&y, &label).map(|e| (y, e)));
            // A second launch must give the same bits: the counters were left at zero and the
            // reduction order is fixed.
            let verdict = first.and_then(|(y1, e)| {
                worst = worst.max(e);
                let y2 = case.run(&gpu, tiles)?;
                let same = y1.iter().zip(&y2).all(|(a, b)| a.to_bits() == b.to_bits());
                if same { Ok(()) } else { Err(format!("{label}: a second launch gave different bits")) }
            });
            if let Err(e) = verdict {
                failures.push(e);
            }
        }
        println!("gemv_nvfp4 {rows}x{cols}: {tested} tile sets checked, worst relative L2 {worst:.2e}");
        assert!(tested > 0, "no tile set fits {rows}x{cols}");
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
#[ignore = "needs a CUDA device"]
fn gemv_nvfp4_refuses_a_shape_its_tiles_cannot_cover() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("gemv-nvfp4-reject");
    let mut case = Case::new(&gpu, &mut rng, 8, 256);
    let tiles = gemv_nvfp4::Tiles { k_split: 2, lanes: 16, ..gemv_nvfp4::Tiles::DEFAULT };
    // 256 columns split in two leave 128 per split, less than one step of 16 lanes × 16.
    let err = case.run(&gpu, tiles).expect_err("the requirement must fail");
    assert!(err.contains("cols % (K_SPLIT * 16 * LANES) == 0"), "{err}");
}
