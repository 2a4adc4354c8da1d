//! The kernels of the workspace against their CPU references, with or without a GPU.
//!
//! The secondary command beside the decode binary: it shows the path a kernel takes (Rust
//! description → CUDA C → NVRTC → GPU) and checks each step it can reach here.

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use engine::cuda::timing::time_mean;
use engine::cuda::{Gpu, nvrtc};
use engine::kernels::gemv_bf16::gemv_bf16;
use engine::kernels::zc_rmsnorm::zc_rmsnorm;
use engine::reference;
use half::bf16;
use kernel_dsl::{Arch, TileSet};

/// Runs the DSL kernels against their CPU references.
///
/// Without a GPU it emits each kernel's CUDA, compiles it with NVRTC for sm_90 and sm_121a when
/// NVRTC is present (tools/test.sh installs it into .nvrtc/), and runs the CPU references. With a
/// GPU it also runs the kernels there and compares every element.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Cli {
    /// Rows of the GEMV matrix (a multiple of 8).
    #[arg(long, default_value_t = 10240)]
    rows: u32,
    /// Columns of the GEMV matrix (a multiple of 256).
    #[arg(long, default_value_t = 2560)]
    cols: u32,
    /// Streams (groups) of the norm.
    #[arg(long, default_value_t = 4)]
    groups: u32,
    /// Width of each norm group (a multiple of 8).
    #[arg(long, default_value_t = 2560)]
    width: u32,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print a kernel's generated CUDA at its default tiles for --arch and exit (any kernel of
    /// engine/src/kernels; `kernel-inspect` shows other tile sets, resources and SASS).
    #[arg(long, value_name = "KERNEL")]
    show_cuda: Option<String>,
    /// The architecture for --show-cuda: sm_90 or sm_121a.
    #[arg(long, default_value = "sm_90")]
    arch: String,
    /// Skip the GPU even when one is present.
    #[arg(long)]
    cpu_only: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A tiny deterministic generator for the inputs (the tests draw fresh ones every run).
struct Inputs(u64);

impl Inputs {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn bf16(&mut self, n: usize, scale: f32) -> Vec<bf16> {
        (0..n).map(|_| bf16::from_f32(self.next() * scale)).collect()
    }
}

fn f32s(v: &[bf16]) -> Vec<f32> {
    v.iter().map(|x| x.to_f32()).collect()
}

/// Max |a - b| / max(|b|, floor) over all elements, and whether every element is finite.
fn worst_relative(got: &[f32], want: &[f32], floor: f32) -> (f32, bool) {
    let finite = got.iter().all(|v| v.is_finite());
    let worst = got.iter().zip(want).map(|(g, w)| (g - w).abs() / w.abs().max(floor)).fold(0.0, f32::max);
    (worst, finite)
}

fn run(cli: &Cli) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(name) = &cli.show_cuda {
        let arch: Arch = cli.arch.parse()?;
        let kernel = tools::inspect::find(name)?;
        print!("{}", kernel_dsl::emit::cuda(&kernel.default_kernel(arch)?));
        return Ok(());
    }
    if cli.rows == 0 || !cli.rows.is_multiple_of(8) || cli.cols == 0 || !cli.cols.is_multiple_of(256) {
        return Err(format!(
            "--rows must be a positive multiple of 8 and --cols of 256 (got {} and {})",
            cli.rows, cli.cols
        )
        .into());
    }
    if cli.groups == 0 || cli.width == 0 || !cli.width.is_multiple_of(8) {
        return Err(format!(
            "--groups must be positive and --width a positive multiple of 8 (got {} and {})",
            cli.groups, cli.width
        )
        .into());
    }

    println!("== 1. Rust description -> CUDA C -> NVRTC");
    match nvrtc::load() {
        Ok(v) => {
            println!("NVRTC {}.{}", v.major, v.minor);
            for k in engine::kernels::ALL {
                for arch in Arch::ALL {
                    let spec = k.default_kernel(arch)?;
                    let source = kernel_dsl::emit::cuda(&spec);
                    let t = Instant::now();
                    let c = nvrtc::compile(&source, k.name(), arch)?;
                    println!(
                        "  {:<28} {:>5} lines of CUDA -> {:>6} B cubin in {:>4} ms, {} registers, {} B spilled",
                        spec.key.to_string(),
                        source.lines().count(),
                        c.image.len(),
                        t.elapsed().as_millis(),
                        c.resources.registers,
                        c.resources.spill_store_bytes
                    );
                }
            }
        }
        Err(e) => println!("skipped: {e}"),
    }

    println!("== 2. CPU references");
    let mut inputs = Inputs(cli.seed);
    let (rows, cols) = (cli.rows as usize, cli.cols as usize);
    let w = inputs.bf16(rows * cols, 1.0);
    let x = inputs.bf16(cols, 1.0);
    let t = Instant::now();
    let y_ref = reference::gemv::gemv(&f32s(&w), &f32s(&x), rows, cols);
    println!("  gemv {rows}x{cols}: y[0..4] = {:?} ({} ms)", &y_ref[..4.min(rows)], t.elapsed().as_millis());
    let (groups, width) = (cli.groups as usize, cli.width as usize);
    let nx = inputs.bf16(groups * width, 3.0);
    let nw = inputs.bf16(groups * width, 0.2);
    let eps = 1e-6;
    let n_ref = reference::norm::zc_rms_norm(&f32s(&nx), &f32s(&nw), width, eps);
    println!("  zc_rmsnorm {groups}x{width}: y[0..4] = {:?}", &n_ref[..4]);

    println!("== 3. The GPU");
    if cli.cpu_only {
        println!("skipped (--cpu-only)");
        return Ok(());
    }
    let gpu = match Gpu::open(0) {
        Ok(g) => g,
        Err(e) => {
            println!("no GPU here ({e}); steps 1 and 2 are what this machine can check");
            return Ok(());
        }
    };
    let info = gpu.info();
    println!("  {} (sm_{}{}, {} SMs)", info.name, info.compute_capability.0, info.compute_capability.1, info.sm_count);

    let dw = gpu.upload(&w)?;
    let dx = gpu.upload(&x)?;
    let mut dy = gpu.alloc::<bf16>(rows)?;
    let mut partial = gpu.alloc::<f32>(8 * rows)?;
    let mut counters = gpu.alloc::<u32>(rows)?;
    let gemv = gpu.kernel::<gemv_bf16::Kernel>(gemv_bf16::Tiles::DEFAULT)?;
    gpu.fill_bytes(&mut dy, 0xff)?;
    let args = gemv_bf16::Args {
        w: dw.ptr(),
        x: dx.ptr(),
        y: dy.ptr_mut(),
        partial: partial.ptr_mut(),
        counters: counters.ptr_mut(),
        rows: cli.rows,
        cols: cli.cols,
    };
    // SAFETY: W is rows×cols, x cols, y rows, partial 8·rows, counters rows.
    let t = time_mean(&gpu, 3, 20, |_| unsafe { gemv.launch(&gpu, &args) })?;
    let y = f32s(&gpu.download(&dy)?);
    let (worst, finite) = worst_relative(&y, &y_ref, 1.0);
    let bytes = (rows * cols + rows + cols) * 2;
    println!(
        "  gemv_bf16 {rows}x{cols}: worst relative error {worst:.2e}{}, {:.1} us, {:.0} GB/s (W in L2 when it fits: the bench rotates copies)",
        if finite { "" } else { ", NON-FINITE OUTPUT" },
        t.as_secs_f64() * 1e6,
        bytes as f64 / t.as_secs_f64() / 1e9
    );

    let dnx = gpu.upload(&nx)?;
    let dnw = gpu.upload(&nw)?;
    let mut dny = gpu.alloc::<bf16>(groups * width)?;
    gpu.fill_bytes(&mut dny, 0xff)?;
    let norm = gpu.kernel::<zc_rmsnorm::Kernel>(zc_rmsnorm::Tiles::DEFAULT)?;
    let nargs = zc_rmsnorm::Args {
        x: dnx.ptr(),
        w: dnw.ptr(),
        y: dny.ptr_mut(),
        groups: cli.groups,
        group_len: cli.width,
        eps,
    };
    // SAFETY: x, w and y hold groups × width elements.
    unsafe { norm.launch(&gpu, &nargs) }?;
    let ny = f32s(&gpu.download(&dny)?);
    let (worst, finite) = worst_relative(&ny, &n_ref, 1e-3);
    println!(
        "  zc_rmsnorm {groups}x{width}: worst relative error {worst:.2e}{}",
        if finite { "" } else { ", NON-FINITE OUTPUT" }
    );
    if !finite || worst > 0.02 {
        return Err("a GPU result disagrees with its reference".into());
    }
    Ok(())
}
