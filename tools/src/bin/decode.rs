//! The decode binary: `decode --help` explains every option; tools/src/decode holds its parts.

use std::process::ExitCode;

use clap::Parser;
use tools::decode::cli::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match tools::decode::run::run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
