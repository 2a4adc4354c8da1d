//! tools/gpu-pack.sh's refusals, which need no build: no target named, an unknown argument, a
//! file that is not there; each exits 2 with a line that says so, and packs nothing.

use std::process::Command;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/gpu-pack.sh");

fn run(args: &[&str]) -> (i32, String) {
    let o = Command::new("bash").arg(SCRIPT).args(args).output().expect("bash runs the script");
    (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn bad_arguments_are_refused_before_anything_is_built() {
    for (args, says) in [
        (&[][..], "name at least one --test, --bench or --bin"),
        (&["--tests", "gpu_gdn"][..], "unknown argument --tests"),
        (
            &["--test", "gpu_gdn", "--file", "/nonexistent/pinned.json"][..],
            "--file /nonexistent/pinned.json: no such file",
        ),
    ] {
        let (rc, err) = run(args);
        assert_eq!(rc, 2, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("Compiling"), "{args:?} started a build: {err}");
    }
}

#[test]
fn help_says_what_it_takes() {
    let o = Command::new("bash").arg(SCRIPT).arg("--help").output().expect("bash runs the script");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    for word in ["--test", "--bench", "--bin", "--file", "64 MiB", ".gpu-pack"] {
        assert!(out.contains(word), "--help lacks {word}: {out}");
    }
}
