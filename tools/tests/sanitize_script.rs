//! tools/sanitize.sh against a stand-in for compute-sanitizer and for the bundled binaries (no GPU
//! needed): it picks the GPU test binaries by their ignored tests, runs each tool it was asked for,
//! reads the tools' summaries (errors, racecheck hazards, no summary at all), tells failed tests
//! and timeouts apart, and exits non-zero on any of them.

use std::path::{Path, PathBuf};
use std::process::Command;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/sanitize.sh");

/// A stand-in test binary: lists one ignored test when `gpu`, passes or fails when run.
fn test_binary(gpu: bool, rc: i32) -> String {
    format!(
        "#!/bin/bash\nif [ \"$1\" = --list ]; then {} exit 0; fi\necho 'test a_gpu_test ... ok'\n\
         echo 'test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 2 filtered out; finished in 0.5s'\nexit {rc}\n",
        if gpu { "echo 'a_gpu_test: test';" } else { "" }
    )
}

/// compute-sanitizer's stand-in: runs the program, then prints the summary the tool would for the
/// binaries the cases name.
const SANITIZER: &str = r#"#!/bin/bash
[ "$1" = --version ] && { echo "Version 2099.1"; exit 0; }
tool=memcheck; while [ $# -gt 0 ] && [[ "$1" != .gpu/* ]]; do [ "$1" = --tool ] && tool=$2; shift; done
echo "========= COMPUTE-SANITIZER"
"$@"; rc=$?
case "$tool:$1" in
  memcheck:*gpu_oob) echo "========= Invalid __global__ read of size 4 bytes"; echo "=========     at k+0x10";
                     echo "========= ERROR SUMMARY: 2 errors"; exit 1;;
  racecheck:*gpu_race) echo "========= Error: Race reported between Write access and Read access";
                       echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"; exit 1;;
  racecheck:*gpu_step) echo "========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)";;
  *:*gpu_silent) ;;
  *) echo "========= ERROR SUMMARY: 0 errors";;
esac
exit $rc
"#;

fn write_exe(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// A copy's root with .gpu/ holding the named test binaries ((name, gpu, rc)) and longrun.
fn bundle(tag: &str, tests: &[(&str, bool, i32)], step_sleeps: bool) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flashnext-sanitize-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join(".gpu/tests")).expect("mkdir");
    std::fs::create_dir_all(dir.join(".gpu/bin")).expect("mkdir");
    std::fs::create_dir_all(dir.join("out")).expect("mkdir");
    for &(name, gpu, rc) in tests {
        write_exe(&dir.join(".gpu/tests").join(format!("flashnext--test--{name}")), &test_binary(gpu, rc));
    }
    let step = if step_sleeps { "sleep 3" } else { "echo step-once: ok" };
    write_exe(&dir.join(".gpu/bin/longrun"), &format!("#!/bin/bash\n{step}\n"));
    write_exe(&dir.join("fake-sanitizer"), SANITIZER);
    dir
}

/// Runs the script in `dir`: (exit status, summary).
fn sanitize(dir: &Path, args: &[&str]) -> (i32, String) {
    let _ = std::fs::remove_file(dir.join("out/sanitize-summary.txt"));
    let out = Command::new("bash")
        .arg(SCRIPT)
        .args(args)
        .current_dir(dir)
        .env("OUT", dir.join("out"))
        .env("SANITIZER", dir.join("fake-sanitizer"))
        .output()
        .expect("bash runs");
    let summary = std::fs::read_to_string(dir.join("out/sanitize-summary.txt")).unwrap_or_default();
    println!("{}{}\n{summary}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), summary)
}

fn line<'a>(summary: &'a str, binary: &str, tool: &str) -> &'a str {
    summary
        .lines()
        .find(|l| {
            let mut w = l.split_whitespace();
            w.next().is_some_and(|b| b.ends_with(binary)) && w.next() == Some(tool)
        })
        .unwrap_or_else(|| panic!("no line for {binary} {tool} in\n{summary}"))
}

#[test]
fn clean_runs_pass_and_cpu_binaries_are_left_out() {
    let dir = bundle("clean", &[("gpu_step", true, 0), ("generated", false, 0)], false);
    let (rc, summary) = sanitize(&dir, &["--quick"]);
    assert_eq!(rc, 0, "{summary}");
    for tool in ["initcheck", "memcheck", "racecheck"] {
        assert!(line(&summary, "step-once", tool).contains("OK"));
    }
    assert!(line(&summary, "gpu_step", "memcheck").contains("OK (ok. 1 passed"));
    // A racecheck warning is shown, and fails only with --strict.
    assert!(line(&summary, "gpu_step", "racecheck").contains("1 racecheck warnings"));
    assert!(!summary.contains("generated"), "a binary without GPU tests is not sanitized");
    assert!(summary.contains("OK: 5 runs"));
    let (rc, _) = sanitize(&dir, &["--quick", "--strict", "gpu_step"]);
    assert_eq!(rc, 1);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn reports_failed_tests_and_missing_summaries_fail() {
    let tests = [("gpu_oob", true, 0), ("gpu_race", true, 0), ("gpu_fails", true, 101), ("gpu_silent", true, 0)];
    let dir = bundle("reports", &tests, false);
    let (rc, summary) = sanitize(&dir, &["--no-step"]);
    assert_eq!(rc, 1, "{summary}");
    assert!(line(&summary, "gpu_oob", "memcheck").contains("2 errors: Invalid __global__ read"));
    assert!(line(&summary, "gpu_oob", "racecheck").contains("OK"));
    assert!(line(&summary, "gpu_race", "racecheck").contains("1 errors: Error: Race reported"));
    assert!(line(&summary, "gpu_fails", "memcheck").contains("test failed (rc=101)"));
    assert!(line(&summary, "gpu_silent", "memcheck").contains("NO SANITIZER SUMMARY"));
    assert!(summary.contains("FAILED: 6 of 8 runs"));
    // --quick races only gpu_step (absent here), --tools racecheck leaves memcheck out: nothing to run.
    let (rc, _) = sanitize(&dir, &["--quick", "--tools", "racecheck", "--no-step"]);
    assert_eq!(rc, 3);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn timeouts_fail_and_the_budget_leaves_runs_skipped() {
    let dir = bundle("time", &[("gpu_step", true, 0)], true);
    let (rc, summary) = sanitize(&dir, &["--tools", "initcheck", "--timeout", "2", "--budget", "0"]);
    assert_eq!(rc, 1, "{summary}");
    assert!(line(&summary, "step-once", "initcheck").contains("TIMED OUT"));
    // A budget of 32 s: the first run (3 s) passes, then less than 30 s are left: the rest are
    // skipped, and a clean but incomplete run exits 2.
    let (rc, summary) = sanitize(&dir, &["--quick", "--budget", "32"]);
    assert_eq!(rc, 2, "{summary}");
    assert!(line(&summary, "step-once", "initcheck").contains("OK"));
    assert!(line(&summary, "gpu_step", "memcheck").contains("SKIPPED"));
    assert!(summary.contains("INCOMPLETE"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn gpu_overlaps_timing_test_is_left_out_unless_asked_for() {
    let dir = bundle("timing", &[("gpu_overlap", true, 0), ("gpu_trace", true, 0), ("gpu_step", true, 0)], false);
    let log = |dir: &Path, name: &str| {
        std::fs::read_to_string(dir.join(format!("out/sanitize/flashnext--test--{name}.memcheck.log"))).expect("log")
    };
    // One prefix names gpu_overlap's and gpu_trace's timing tests; libtest's --skip matches it.
    let timing = "--skip an_overlapped_launch_starts_before_its_predecessor_ends";
    let (rc, summary) = sanitize(&dir, &["--tools", "memcheck", "--no-step"]);
    assert_eq!(rc, 0, "{summary}");
    for timed in ["gpu_overlap", "gpu_trace"] {
        assert!(log(&dir, timed).lines().next().expect("the command").ends_with(timing), "{timed}");
    }
    assert!(!log(&dir, "gpu_step").contains("--skip"), "only gpu_overlap and gpu_trace leave a test out");
    assert!(summary.contains("(gpu_overlap, gpu_trace: also --skip an_overlapped_launch_starts"));
    let (rc, _) = sanitize(&dir, &["--tools", "memcheck", "--no-step", "--with-timing", "gpu_overlap"]);
    assert_eq!(rc, 0);
    assert!(!log(&dir, "gpu_overlap").contains("--skip"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_pattern_equal_to_a_test_name_picks_that_binary_alone() {
    let dir = bundle("names", &[("gpu_qsa", true, 0), ("gpu_qsa_layer", true, 0), ("gpu_moe", true, 0)], false);
    let (rc, summary) = sanitize(&dir, &["--tools", "memcheck", "--no-step", "gpu_qsa"]);
    assert_eq!(rc, 0, "{summary}");
    assert!(line(&summary, "--gpu_qsa", "memcheck").contains("OK"));
    assert!(!summary.contains("gpu_qsa_layer") && !summary.contains("gpu_moe"), "{summary}");
    // A fragment that is no binary's name picks every binary that contains it.
    let (_, summary) = sanitize(&dir, &["--tools", "memcheck", "--no-step", "gpu_q"]);
    assert!(summary.contains("gpu_qsa_layer") && summary.contains("--gpu_qsa ") && !summary.contains("gpu_moe"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_plan_splits_every_run_into_calls_that_fit() {
    // With a bundle: its GPU binaries; without one (here, the tools folder): the script's table.
    let dir = bundle("plan", &[("gpu_moe", true, 0), ("gpu_step", true, 0), ("generated", false, 0)], false);
    let plan = |dir: &Path, args: &[&str]| {
        let out = Command::new("bash").arg(SCRIPT).args(args).current_dir(dir).output().expect("bash runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).expect("UTF-8")
    };
    let text = plan(&dir, &["--plan", "540"]);
    println!("{text}");
    assert!(text.starts_with("# tools/sanitize.sh --plan 540: 7 runs in "), "{text}");
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("OUT=")).collect();
    let count = |tool: &str, name: &str| {
        lines.iter().filter(|l| l.contains(&format!("--tools {tool} ")) && l.split(' ').any(|w| w == name)).count()
    };
    assert_eq!(count("memcheck", "gpu_moe"), 1);
    assert_eq!(count("racecheck", "gpu_moe"), 1);
    assert_eq!(count("racecheck", "gpu_step"), 1);
    assert!(!text.contains("generated"));
    assert!(lines.iter().any(|l| l.contains("--tools initcheck,memcheck,racecheck") || l.contains("step-once")));
    assert!(lines.iter().all(|l| l.contains("--until $e")));
    // Every call's estimate is within the call, save a single run longer than it.
    for call in text.split("\n# call ").skip(1) {
        let secs: u32 =
            call.split(&[' ', 's'][..]).nth(1).and_then(|w| w.trim_start_matches('~').parse().ok()).expect("~N s");
        assert!(secs <= 540 * 85 / 100 || call.contains("one run over the call"), "{call}");
    }
    // The table covers the tools package's decode test; options a run needs are carried over.
    let tools_dir = Path::new(SCRIPT).parent().expect("tools/");
    let text = plan(tools_dir, &["--plan", "300", "--tools", "memcheck", "--no-pdl", "decode", "gpu_qsa"]);
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("OUT=")).collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert!(
        lines[0].ends_with("--until $e --timeout 300 --no-pdl decode gpu_qsa") || lines[0].ends_with("gpu_qsa decode"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn until_sets_the_budget_from_the_clock() {
    let dir = bundle("until", &[("gpu_step", true, 0)], false);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    // Ten seconds from now: less than 30 s left, so nothing starts.
    let (rc, summary) = sanitize(&dir, &["--until", &(now + 10).to_string()]);
    assert_eq!(rc, 2, "{summary}");
    assert!(line(&summary, "step-once", "initcheck").contains("SKIPPED"));
    let (rc, summary) = sanitize(&dir, &["--quick", "--until", &(now + 300).to_string()]);
    assert_eq!(rc, 0, "{summary}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_binary_with_a_long_test_listing_is_still_picked() {
    // Its ignored test first, then a listing far longer than a pipe holds: the script must read it
    // all (a `| grep -q` that stops at the first match, under pipefail, dropped such a binary).
    let dir = bundle("listing", &[], false);
    let long = "#!/bin/bash\nif [ \"$1\" = --list ]; then echo 'a_gpu_test: test'; \
                for i in $(seq 1 20000); do echo \"filler_$i: bench\"; done; exit 0; fi\n\
                echo 'test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.5s'\n";
    write_exe(&dir.join(".gpu/tests/flashnext--test--gpu_long"), long);
    let (rc, summary) = sanitize(&dir, &["--no-step", "--tools", "memcheck", "gpu_long"]);
    assert_eq!(rc, 0, "{summary}");
    assert!(line(&summary, "gpu_long", "memcheck").contains("OK"), "{summary}");
    let _ = std::fs::remove_dir_all(dir);
}
