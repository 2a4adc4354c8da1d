//! `bench-report` over the committed records (tests/data/bench-report) and over broken inputs:
//! the rendering is stable, the committed BENCHMARKS.md is current, and every error names its
//! place.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tools::bench_report;

const BIN: &str = env!("CARGO_BIN_EXE_bench-report");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
}

fn records() -> PathBuf {
    root().join("tests/data/bench-report")
}

fn run(args: &[&Path]) -> Output {
    Command::new(BIN).args(args).output().expect("bench-report runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The MoE table the committed records render to.
fn committed_moe_region() -> String {
    let all = bench_report::read_dir(&records()).expect("the committed records");
    bench_report::render("moe", &all["moe"])
}

/// A fresh folder for one test.
fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("bench-report-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch folder");
    d
}

#[test]
fn a_region_renders_the_same_table() {
    // A frozen copy of transcribed records, apart from the live ones a bench run replaces.
    let all = bench_report::read_dir(&records().join("snapshot")).expect("the frozen records");
    insta::assert_snapshot!("moe_region", bench_report::render("moe", &all["moe"]));
    // QSA's: sweep groups (their fastest candidate), days with and without a time.
    insta::assert_snapshot!("qsa_region", bench_report::render("qsa", &all["qsa"]));
}

#[test]
fn the_committed_benchmarks_are_current() {
    let o = run(&[Path::new("--check"), Path::new("--in"), &records(), &root().join("BENCHMARKS.md")]);
    assert!(o.status.success(), "BENCHMARKS.md is stale against tests/data/bench-report:\n{}", stderr(&o));
    // Every bench with records has its region.
    assert!(!stderr(&o).contains("no region"), "{}", stderr(&o));
}

#[test]
fn check_fails_on_a_stale_document_and_writes_nothing() {
    let d = scratch("stale");
    let doc = d.join("B.md");
    let text = "# B\n\nprose\n<!-- bench-report:moe begin -->\nold table\n<!-- bench-report:moe end -->\nmore prose\n";
    std::fs::write(&doc, text).expect("doc");
    let o = run(&[Path::new("--check"), Path::new("--in"), &records(), &doc]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("stale"), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&doc).expect("doc"), text);
    // Without --check it is rewritten, the prose kept, and then it is current.
    let o = run(&[Path::new("--in"), &records(), &doc]);
    assert!(o.status.success(), "{}", stderr(&o));
    let new = std::fs::read_to_string(&doc).expect("doc");
    assert!(new.starts_with("# B\n\nprose\n<!-- bench-report:moe begin -->\n"), "{new}");
    assert!(new.ends_with("<!-- bench-report:moe end -->\nmore prose\n"), "{new}");
    // The region now holds what the committed records render to (their latest figures).
    assert!(!new.contains("old table") && new.contains(&committed_moe_region()), "{new}");
    let o = run(&[Path::new("--check"), Path::new("--in"), &records(), &doc]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn a_malformed_line_names_its_file_and_line() {
    let d = scratch("malformed");
    let good = std::fs::read_to_string(records().join("bench-lm_head.jsonl")).expect("records");
    let first = good.lines().next().expect("a record");
    std::fs::write(
        d.join("bench-lm_head.jsonl"),
        format!("{first}\n\n{{\"bench\":\"lm_head\",\"median_us\":\"fast\"}}\n"),
    )
    .expect("records");
    let o = run(&[Path::new("--check"), Path::new("--in"), &d, &root().join("BENCHMARKS.md")]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("bench-lm_head.jsonl:3: malformed record"), "{}", stderr(&o));
}

#[test]
fn a_region_without_records_is_kept() {
    let d = scratch("partial");
    std::fs::copy(records().join("bench-moe.jsonl"), d.join("bench-moe.jsonl")).expect("records");
    // A PyTorch comparison in its own schema is skipped, not an error.
    std::fs::write(d.join("bench-moe-torch.jsonl"), "{\"bench\": \"moe-torch\", \"us_per_layer\": 150.7}\n")
        .expect("torch");
    let doc = d.join("B.md");
    let kept = "<!-- bench-report:gdn begin -->\n| the published | GDN figures |\n<!-- bench-report:gdn end -->\n";
    std::fs::write(&doc, format!("intro\n{kept}<!-- bench-report:moe begin -->\n<!-- bench-report:moe end -->\n"))
        .expect("doc");
    let o = run(&[Path::new("--in"), &d, &doc]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("B.md:2: no records of the bench `gdn`: its region is kept"), "{}", stderr(&o));
    let new = std::fs::read_to_string(&doc).expect("doc");
    assert!(new.starts_with(&format!("intro\n{kept}")), "{new}");
    assert!(new.contains(&committed_moe_region()), "{new}");
}

#[test]
fn broken_markers_and_a_missing_folder_are_errors() {
    let d = scratch("markers");
    let doc = d.join("B.md");
    std::fs::write(&doc, "a\n<!-- bench-report:moe begin -->\nb\n").expect("doc");
    let o = run(&[Path::new("--check"), Path::new("--in"), &records(), &doc]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("B.md:2: the region `moe` has no end marker"), "{}", stderr(&o));
    std::fs::write(&doc, "<!-- bench-report:moe begin -->\n<!-- bench-report:gdn end -->\n").expect("doc");
    let o = run(&[Path::new("--check"), Path::new("--in"), &records(), &doc]);
    assert!(stderr(&o).contains("B.md:2: end marker of `gdn` closes the region `moe`"), "{}", stderr(&o));
    let o = run(&[Path::new("--check"), Path::new("--in"), &d.join("absent"), &doc]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("absent"), "{}", stderr(&o));
    // A folder without any bench-*.jsonl (the wrong folder) is an error too.
    let o = run(&[Path::new("--check"), Path::new("--in"), &d, &doc]);
    assert!(stderr(&o).contains("no bench-*.jsonl"), "{}", stderr(&o));
}
