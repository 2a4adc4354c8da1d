//! Writes the PLE n-gram table of a checkpoint into the one file the engine maps, or checks one.
//!
//! `ple_table write [--nvfp4] <checkpoint dir> <table file>`: every PLE layer's rows (the whole
//! tensor or its `shard_{s}` parts), layer after layer, bf16 or NVFP4, after a header with the hash
//! fingerprint, the layers' global scales and a checksum. `ple_table check <checkpoint dir> <table file>`: opens the table against the
//! checkpoint's config (size, header, hash) and verifies the checksum over every row.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use engine::model::checkpoint::Checkpoint;
use engine::model::config::ModelConfig;
use engine::model::ple_table::{PleTableFile, RowFormat, write_table};

/// The PLE table file: write it from a checkpoint, or check it against one.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Writes the table of the checkpoint in CHECKPOINT into TABLE.
    Write {
        checkpoint: PathBuf,
        table: PathBuf,
        /// NVFP4 rows (quantised here, one global scale per layer) instead of bf16.
        #[arg(long)]
        nvfp4: bool,
    },
    /// Checks TABLE against the config in CHECKPOINT and verifies its checksum.
    Check { checkpoint: PathBuf, table: PathBuf },
}

fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    let start = Instant::now();
    match cli.command {
        Command::Write { checkpoint, table, nvfp4 } => {
            let cfg = ModelConfig::from_file(&checkpoint.join("config.json"))?;
            let ck = Checkpoint::open(&checkpoint)?;
            let format = if nvfp4 { RowFormat::Nvfp4 } else { RowFormat::Bf16 };
            let h = write_table(&cfg, &ck, &table, format)?;
            println!(
                "{}: {} layers, {} rows of {} values ({:?}), {} bytes of rows, checksum {:#018x}, in {:.1} s",
                table.display(),
                h.layers,
                h.rows,
                h.width,
                h.format,
                h.data_bytes(),
                h.checksum,
                start.elapsed().as_secs_f64()
            );
        }
        Command::Check { checkpoint, table } => {
            let cfg = ModelConfig::from_file(&checkpoint.join("config.json"))?;
            let t = PleTableFile::open(&table, &cfg)?;
            t.verify()?;
            println!(
                "{}: a whole table for this config, checksum {:#018x} verified in {:.1} s",
                table.display(),
                t.header.checksum,
                start.elapsed().as_secs_f64()
            );
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ple_table: {e}");
            ExitCode::FAILURE
        }
    }
}
