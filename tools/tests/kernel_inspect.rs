//! `kernel-inspect` as a user runs it: the listing covers every kernel, a tile set picks the
//! kernel the engine would compile, what it writes is what the engine emits (the committed
//! generated/ file at the defaults), and bad input ends in a clear error. NVRTC is needed (the
//! test command installs it); the SASS part runs where cuobjdump is found and otherwise checks
//! the error that says how to get it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kernel_dsl::{AnyKernel, Arch};

const BIN: &str = env!("CARGO_BIN_EXE_kernel-inspect");

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("kernel-inspect runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
}

#[test]
fn the_listing_names_every_kernel_with_its_defaults() {
    let o = run(&["--list", "--arch", "sm_121a"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert_eq!(out.lines().count(), engine::kernels::ALL.len(), "{out}");
    for k in engine::kernels::ALL {
        let d = k.default_kernel(Arch::Sm121a).expect("default");
        let line = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(k.name()))
            .unwrap_or_else(|| panic!("{} is not listed:\n{out}", k.name()));
        assert!(line.contains(&d.key.tiles_string()), "{line}");
    }
}

#[test]
fn a_tile_set_gives_that_kernel_and_the_files_are_what_the_engine_emits() {
    let dir = std::env::temp_dir().join(format!("kernel-inspect-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let k: &dyn AnyKernel = tools::inspect::find("moe_down_nvfp4").expect("the kernel");

    // The defaults: the written source is the committed generated/ file.
    let d = k.default_kernel(Arch::Sm90).expect("default");
    let o = run(&["moe_down_nvfp4", "--out", dir.to_str().expect("utf-8")]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.starts_with(&d.key.to_string()) && out.contains(" registers, "), "{out}");
    let written = std::fs::read_to_string(dir.join(format!("{}.cu", d.key.file_stem()))).expect("the .cu");
    let committed = std::fs::read_to_string(root().join("generated/sm_90/moe_down_nvfp4.cu")).expect("generated/");
    assert_eq!(written, committed, "kernel-inspect emits what the engine does");
    let cubin = std::fs::read(dir.join(format!("{}.cubin", d.key.file_stem()))).expect("the .cubin");
    assert!(cubin.starts_with(b"\x7fELF"), "a cubin is an ELF file");

    // Another declared set, its pairs in another order, on the other architecture.
    let c = k.candidate_kernels(Arch::Sm121a).into_iter().filter_map(Result::ok).next_back().expect("a candidate");
    assert_ne!(c.key.tiles, d.key.tiles);
    let reordered: Vec<&str> = c.key.tiles.iter().rev().map(|(n, _)| n.as_str()).collect();
    let tiles: Vec<String> = reordered
        .iter()
        .map(|n| format!("{n}={}", c.key.tiles.iter().find(|(m, _)| m == n).expect("the tile").1))
        .collect();
    let o = run(&["moe_down_nvfp4", "--arch", "sm_121a", "--tiles", &tiles.join(" "), "--cuda"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.starts_with(&c.key.to_string()), "{out}");
    assert!(out.contains(&kernel_dsl::emit::cuda(&c)), "--cuda prints the emitted source");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_input_ends_in_an_error_that_says_what_would_do() {
    let o = run(&["lm_head"]);
    assert_eq!(o.status.code(), Some(2));
    let e = text(&o.stderr);
    assert!(e.contains("no kernel `lm_head`") && e.contains("lm_head_argmax_nvfp4"), "{e}");

    let o = run(&["lm_head_argmax_nvfp4", "--tiles", "LANES=7"]);
    assert_eq!(o.status.code(), Some(2));
    let e = text(&o.stderr);
    assert!(e.contains("not a tile set") && e.contains("default `"), "{e}");

    let o = run(&["lm_head_argmax_nvfp4", "--arch", "sm_80"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("sm_90 or sm_121a"), "{}", text(&o.stderr));

    let o = run(&[]);
    assert!(!o.status.success(), "a kernel or --list is required");
}

/// With cuobjdump (a CUDA toolkit), the map shows the MoE down kernel's weight loads before its
/// grid dependency wait, as BENCHMARKS.md says; without it, the error says how to get it.
#[test]
fn sass_maps_the_loads_or_says_how_to_get_cuobjdump() {
    let o = run(&["moe_down_nvfp4", "--sass"]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    match tools::inspect::find_cuobjdump() {
        None => {
            assert_eq!(o.status.code(), Some(2));
            assert!(err.contains("needs cuobjdump") && err.contains("nvidia-cuda-cuobjdump"), "{err}");
        }
        Some(_) => {
            assert!(o.status.success(), "{err}");
            let order = out.lines().find_map(|l| l.strip_prefix("order: ")).expect("the map");
            let wait = order.find('W').expect("the kernel waits on its grid dependency");
            let wide_before = order[..wait].matches('G').count();
            assert!(wide_before >= 32, "the codes' loads come before the wait: {order}");
            // The opcode tally: counts, most frequent first, the loads among them.
            let ops = out.lines().find_map(|l| l.strip_prefix("most frequent opcodes: ")).expect("the tally");
            let counts: Vec<(usize, &str)> = ops
                .split(", ")
                .map(|p| {
                    let (n, op) = p.split_once(' ').expect("count opcode");
                    (n.parse().expect("a count"), op)
                })
                .collect();
            assert!(counts.windows(2).all(|w| w[0].0 >= w[1].0), "most frequent first: {ops}");
            assert!(counts.iter().any(|&(n, op)| op == "LDG" && n >= 32), "{ops}");
        }
    }
}

/// Sessions 47 to 49 gave seven kernels and a tile set of an eighth fewer rounds of global loads
/// after their grid dependency wait, where ptxas had left several one after another
/// (BENCHMARKS.md, step section: the step 1.5% and 0.5% faster in sessions 47 and 48). The
/// static count on sm_90, at the defaults or the tiles named beside the bound (every path of the
/// listing, so a branch's paths add up), may not grow back: an edit that splits a batch of loads
/// again fails here. The counts before the change are beside each bound. Needs cuobjdump and
/// nvdisasm, which the test command installs (tools/test.sh, into .nvrtc-tools/).
#[test]
fn the_kernels_given_one_round_of_loads_after_their_wait_keep_it() {
    assert!(
        tools::inspect::find_cuobjdump().is_some(),
        "no cuobjdump: run the test command (tools/test.sh installs NVIDIA's cuobjdump and nvdisasm wheels into .nvrtc-tools/), or put a CUDA toolkit's bin/ on the PATH"
    );
    // The step's tiles where they are not the kernel's defaults; the row path with x by the copy
    // engine (XBULK 1), which the step does not take (slower in the H200's step, session 50).
    let row_path = engine::tuned::tiles_string(&engine::kernels::gemv_nvfp4::gemv_nvfp4::Tiles {
        xbulk: 1,
        ..engine::kernels::gemv_nvfp4::ROW_PATH
    });
    // (kernel, the tiles when not the defaults, the most rounds now, the count before sessions
    // 47 to 49)
    let bounds = [
        ("moe_router", "", 5, 13),
        ("mix_up_bf16", "", 1, 4),
        // 7 in session 47 (its partials' loads interleaved with their adds), 1 in session 48.
        ("mix_up_nvfp4", "", 1, 5),
        ("gdn_delta_rule_normed", "", 1, 5),
        // Mostly the pooled key's path (a loop over the block's tokens, once every few tokens).
        ("qsa_prepare", "", 53, 55),
        // The queries' copy in one round (session 48), then the key loop's later batches (the
        // attention: the rows' loads after its barrier).
        ("qsa_block_scores", "", 2, 13),
        ("qsa_attention", "", 2, 7),
        // The row path (GDN's out_proj, QSA's o_proj) with x by one bulk copy (session 49),
        // where the lanes load it in three dependent rounds, one a step.
        ("gemv_nvfp4", row_path.as_str(), 1, 4),
    ];
    let mut problems = Vec::new();
    for (kernel, tiles, most, before) in bounds {
        let mut args = vec![kernel, "--arch", "sm_90", "--sass"];
        if !tiles.is_empty() {
            args.extend(["--tiles", tiles]);
        }
        let o = run(&args);
        assert!(o.status.success(), "{kernel}: {}", text(&o.stderr));
        let out = text(&o.stdout);
        let rounds: usize = out
            .lines()
            .find_map(|l| l.strip_prefix("load rounds after the wait: "))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{kernel}: no count of load rounds:\n{out}"));
        if rounds > most {
            let order = out.lines().find(|l| l.starts_with("order: ")).unwrap_or("");
            problems.push(format!(
                "{kernel}: {rounds} load rounds after the wait, at most {most} (it had {before}): {order}"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
