//! Rewrites the generated regions of BENCHMARKS.md from the benches' records.
//!
//! `bench-report --in DIR [--check] BENCHMARKS.md`: reads every `bench-*.jsonl` in DIR (as the
//! benches write them to `$OUT`), renders each `<!-- bench-report:<bench> begin -->` …
//! `<!-- bench-report:<bench> end -->` region from that bench's records, and leaves everything
//! else as it is. With `--check` it writes nothing and exits 1 if the file would change.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tools::bench_report;

/// BENCHMARKS.md's generated tables from the benches' JSON-lines records.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Cli {
    /// The folder holding the bench-*.jsonl files of a run.
    #[arg(long = "in", value_name = "DIR")]
    input: PathBuf,
    /// Write nothing; exit 1 if the document is stale against the records.
    #[arg(long)]
    check: bool,
    /// The document to update (BENCHMARKS.md).
    document: PathBuf,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: &Cli) -> Result<ExitCode, String> {
    let records = bench_report::read_dir(&cli.input)?;
    let name = cli.document.display().to_string();
    let doc = std::fs::read_to_string(&cli.document).map_err(|e| format!("{name}: {e}"))?;
    let out = bench_report::update(&doc, &name, &records)?;
    for w in &out.warnings {
        eprintln!("warning: {w}");
    }
    if out.text == doc {
        eprintln!("{name}: up to date ({} regions rendered: {})", out.rendered.len(), out.rendered.join(", "));
        return Ok(ExitCode::SUCCESS);
    }
    if cli.check {
        let (old, new) = (doc.lines(), out.text.lines());
        let first = old.zip(new).position(|(a, b)| a != b).unwrap_or(doc.lines().count().min(out.text.lines().count()));
        eprintln!(
            "{name}: stale against {} (first difference at line {}); regenerate with \
             `cargo run -p tools --bin bench-report -- --in {} {name}`",
            cli.input.display(),
            first + 1,
            cli.input.display()
        );
        return Ok(ExitCode::FAILURE);
    }
    std::fs::write(&cli.document, &out.text).map_err(|e| format!("{name}: {e}"))?;
    eprintln!("{name}: {} regions rendered: {}", out.rendered.len(), out.rendered.join(", "));
    Ok(ExitCode::SUCCESS)
}
