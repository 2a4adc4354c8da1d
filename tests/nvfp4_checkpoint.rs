//! NVFP4 in the ModelOpt layout: the Rust quantiser reproduces, byte for byte, the NVFP4
//! checkpoint the goldens script wrote (its own implementation of the same rules) from the bf16
//! weights, and the NVFP4 checkpoint loads as the dequantised values.

use std::path::{Path, PathBuf};

use engine::model::checkpoint::Checkpoint;
use engine::model::nvfp4::Nvfp4Matrix;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

#[test]
fn rust_quantiser_matches_the_nvfp4_checkpoint() {
    let bf16 = Checkpoint::open(&data("tiny-sparse")).expect("bf16 checkpoint");
    let nvfp4 = Checkpoint::open(&data("tiny-sparse-nvfp4")).expect("NVFP4 checkpoint");
    let mut checked = 0;
    for name in nvfp4.names() {
        let Some(base) = name.strip_suffix(".weight_scale_2") else { continue };
        let weight = format!("{base}.weight");
        let src = bf16.require(&weight).expect("the bf16 original");
        let (rows, cols) = (src.shape[0], src.shape[1]);
        let q = Nvfp4Matrix::quantise(&src.to_f32().expect("f32"), rows, cols);
        let packed = nvfp4.require(&weight).expect("packed");
        let scales = nvfp4.require(&format!("{weight}_scale")).expect("scales");
        let scale_2 = nvfp4.require(name).expect("scale_2").to_f32().expect("f32");
        assert_eq!(scale_2, [q.scale_2], "{name}");
        assert_eq!(scales.bytes, q.scales.as_slice(), "{weight}_scale");
        assert_eq!(packed.bytes, q.packed.as_slice(), "{weight}");
        checked += 1;
    }
    assert!(checked >= 50, "only {checked} NVFP4 tensors found");
}
