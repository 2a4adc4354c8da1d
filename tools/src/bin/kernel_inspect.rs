//! One kernel as the engine compiles it: its CUDA C at a tile set, the cubin's resources, and its
//! SASS mapped (`tools::inspect`).
//!
//! `kernel-inspect lm_head_argmax_nvfp4 --arch sm_90 --tiles "LANES=16 WARPS=8 STEPS=10" --sass`

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use engine::cuda::nvrtc;
use kernel_dsl::{Arch, emit};
use tools::inspect;

/// Compiles one kernel of the engine with NVRTC, as the engine does at load, and shows what came
/// out: registers, spills, shared memory and the cubin's size; the emitted CUDA C (--cuda); the
/// SASS reduced to its global loads, its most frequent opcodes (a static count: what a loop's
/// instructions a weight are made of) and a map of the loads' order against the grid dependency
/// wait, the barriers, the products and the places where a warp waits for a load's data, each
/// load after such a place a new round trip, with a static count of those rounds after the wait
/// (--sass, which needs cuobjdump and nvdisasm: a CUDA toolkit, the wheels the test command
/// installs into .nvrtc-tools/, or `pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm` with
/// their bin/ on the PATH). No GPU is needed. With --out the source, the cubin and the SASS are
/// written to a folder.
#[derive(Parser, Debug)]
#[command(version, about, long_about, name = "kernel-inspect")]
struct Cli {
    /// The kernel (its name in engine/src/kernels; --list shows them).
    #[arg(required_unless_present = "list")]
    kernel: Option<String>,
    /// List every kernel with its default tiles and its number of candidate tile sets.
    #[arg(long)]
    list: bool,
    /// The architecture: sm_90 (H200) or sm_121a (GB10).
    #[arg(long, default_value = "sm_90")]
    arch: String,
    /// A declared tile set, NAME=value pairs in any order (as the tuning tables write them); the
    /// tiles it does not name keep their defaults (`--tiles "MMA=1 DIRECT=0 ROWS=16"`); default:
    /// the kernel's defaults.
    #[arg(long, value_name = "TILES")]
    tiles: Option<String>,
    /// Print the emitted CUDA C.
    #[arg(long)]
    cuda: bool,
    /// Disassemble the cubin, count its opcodes and map its loads.
    #[arg(long)]
    sass: bool,
    /// Write <stem>.cu, <stem>.cubin (and <stem>.sass with --sass) into this folder.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: &Cli) -> Result<(), String> {
    let arch: Arch = cli.arch.parse()?;
    // Everything for stdout is gathered and written once (`show`), so that a reader that stops
    // early (`| head`) ends the output instead of a panic in println!.
    let mut text = String::new();
    if cli.list {
        for k in engine::kernels::ALL {
            let d = k.default_kernel(arch).map_err(|e| e.to_string())?;
            let n = k.candidate_kernels(arch).len();
            let _ = writeln!(text, "{:<24} {:<48} {n} candidates", k.name(), d.key.tiles_string());
        }
        return show(&text);
    }
    let name = cli.kernel.as_deref().ok_or("name a kernel, or --list")?;
    let kernel = inspect::at_tiles(inspect::find(name)?, arch, cli.tiles.as_deref())?;
    let source = emit::cuda(&kernel);
    nvrtc::load().map_err(|e| e.to_string())?;
    let cubin = nvrtc::compile(&source, name, arch).map_err(|e| e.to_string())?;
    let r = &cubin.resources;
    let _ = writeln!(text, "{}", kernel.key);
    let _ = writeln!(
        text,
        "{} threads a block (at least {} blocks an SM), {} registers, {} B spilled, {} B stack, {} B shared, {} B cubin",
        kernel.block_threads,
        kernel.min_blocks,
        r.registers,
        r.spill_store_bytes,
        r.stack_frame_bytes,
        r.shared_bytes,
        cubin.image.len()
    );
    if cli.cuda {
        text.push_str(&source);
    }
    let stem = kernel.key.file_stem();
    if let Some(dir) = &cli.out {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for (ext, bytes) in [("cu", source.as_bytes()), ("cubin", &cubin.image[..])] {
            let f = dir.join(format!("{stem}.{ext}"));
            std::fs::write(&f, bytes).map_err(|e| format!("{}: {e}", f.display()))?;
        }
    }
    if cli.sass {
        let tool = inspect::find_cuobjdump().ok_or(
            "--sass needs cuobjdump (and nvdisasm): none in $CUDA_PATH/bin, /usr/local/cuda/bin, on the PATH or in \
             .nvrtc-tools/; a CUDA toolkit has both, the test command (tools/test.sh) installs NVIDIA's wheels into \
             .nvrtc-tools/, or `pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm` and put their bin/ on the PATH",
        )?;
        let scratch = std::env::temp_dir();
        let sass = inspect::disassemble(&cubin.image, &tool, &scratch)?;
        if let Some(dir) = &cli.out {
            let f = dir.join(format!("{stem}.sass"));
            std::fs::write(&f, &sass).map_err(|e| format!("{}: {e}", f.display()))?;
        }
        let _ = writeln!(text, "{}", inspect::summarise(&sass));
    }
    show(&text)
}

/// Writes `text` to stdout; a closed pipe (the reader stopped) is not an error.
fn show(text: &str) -> Result<(), String> {
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("stdout: {e}")),
        _ => Ok(()),
    }
}
