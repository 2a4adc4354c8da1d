//! generated/ holds the CUDA every kernel emits at its default tiles, for each architecture: the
//! code a reviewer reads. This test fails when a file is stale, missing or orphaned.
//! Refresh with: UPDATE_GENERATED=1 cargo test --test generated

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use kernel_dsl::Arch;

fn generated_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("generated")
}

#[test]
fn generated_cuda_is_current() {
    let update = std::env::var_os("UPDATE_GENERATED").is_some();
    let dir = generated_dir();
    let mut stale = Vec::new();
    let mut expected = BTreeSet::new();
    for kernel in engine::kernels::ALL {
        for arch in Arch::ALL {
            let spec = kernel.default_kernel(arch).unwrap_or_else(|e| panic!("{e}"));
            let text = kernel_dsl::emit::cuda(&spec);
            let path = dir.join(arch.nvrtc_target()).join(format!("{}.cu", kernel.name()));
            expected.insert(path.clone());
            let current = std::fs::read_to_string(&path).ok();
            if current.as_deref() == Some(text.as_str()) {
                continue;
            }
            if update {
                std::fs::create_dir_all(path.parent().expect("a parent")).expect("create generated/<arch>");
                std::fs::write(&path, &text).expect("write generated file");
            } else {
                stale.push(path.display().to_string());
            }
        }
    }
    let mut orphans = Vec::new();
    for arch in Arch::ALL {
        let Ok(entries) = std::fs::read_dir(dir.join(arch.nvrtc_target())) else { continue };
        for e in entries.flatten() {
            if e.path().extension().is_some_and(|x| x == "cu") && !expected.contains(&e.path()) {
                if update {
                    std::fs::remove_file(e.path()).expect("remove an orphaned file");
                } else {
                    orphans.push(e.path().display().to_string());
                }
            }
        }
    }
    assert!(
        stale.is_empty() && orphans.is_empty(),
        "generated/ is out of date.\nstale or missing: {stale:#?}\nno kernel emits: {orphans:#?}\n\
         Run `UPDATE_GENERATED=1 cargo test --test generated` and commit generated/."
    );
}
