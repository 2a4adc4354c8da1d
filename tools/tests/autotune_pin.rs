//! `autotune --pin` as a user runs it (no GPU): the table it writes is one the engine takes for
//! the named device, with the pinned knob at its tiles and the rest at the plan's; a pin that
//! takes nothing, or that the shape refuses, ends in an error that says why, and writes nothing.

use std::path::PathBuf;
use std::process::{Command, Output};

use engine::model::config::ModelConfig;
use engine::step::{Formats, StepPlan};
use engine::tuned::Table;
use kernel_dsl::Arch;

const BIN: &str = env!("CARGO_BIN_EXE_autotune");

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("autotune runs")
}

fn out_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flashnext-autotune-pin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    p
}

const H200: [&str; 6] = ["--device", "NVIDIA H200", "--arch", "sm_90", "--sms", "132"];

#[test]
fn a_pinned_table_is_taken_by_the_step() {
    let out = out_path("pinned.json");
    let mut args = vec!["--pin", "gdn.in_proj=ROWS=4 MMA=0 DIRECT=1", "--out", out.to_str().expect("utf-8")];
    args.extend(H200);
    let o = run(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = Table::read(&out).expect("the pinned table");
    assert!(table.untimed && table.rule.starts_with("pinned"), "{}", table.rule);
    assert_eq!(table.entries.len(), 1, "only the NVFP4 GDN unit declares that tile set");
    let plan = StepPlan::new(&ModelConfig::published(), Formats::NVFP4, 32_768).expect("plan");
    let (tuned, notices) = plan.clone().tuned(&table, Arch::Sm90, 132);
    assert!(!notices.iter().any(|n| n.starts_with("gdn")), "{notices:?}");
    let (before, after) = (plan.gdn.expect("gdn").1, tuned.gdn.expect("gdn").1);
    assert_eq!((after.in_proj_nvfp4.mma, after.in_proj_nvfp4.rows, after.in_proj_nvfp4.direct), (0, 4, 1));
    assert_eq!(after.in_proj_nvfp4.warps, before.in_proj_nvfp4.warps, "unnamed tiles keep the plan's");
    assert_eq!(after.out_proj_nvfp4, before.out_proj_nvfp4);
}

#[test]
fn pins_that_take_nothing_or_do_not_fit_are_refused() {
    let out = out_path("refused.json");
    let o_str = out.to_str().expect("utf-8");
    for (pin, says) in [
        ("gdn.in_prj=ROWS=16", "no unit has a knob `in_prj`"),
        ("gdn.in_proj=LANES=2", "the tile set `LANES=2`"),
        ("attention.in_proj=ROWS=16", "no family `attention`"),
        ("gdn.in_proj=ROWS=16 WARPS=8 MMA=1 DIRECT=0", "do not fit the step's shape"),
    ] {
        let mut args = vec!["--pin", pin, "--out", o_str];
        args.extend(H200);
        let o = run(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(says), "{pin}: {err}");
        assert!(!out.exists(), "{pin}: a refused pin wrote {}", out.display());
    }
    let o = run(&["--pin", "gdn.in_proj=ROWS=4 MMA=0 DIRECT=1"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--out"));
    let o = run(&["--pin", "gdn"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("FAMILY.KNOB=TILES"));
}
