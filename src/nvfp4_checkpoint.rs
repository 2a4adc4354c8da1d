//! A small NVFP4 checkpoint in NVIDIA ModelOpt's layout, made from a bf16 one (tests/data's
//! tiny-step), and what the device must hold of it: for the tests that check an NVFP4
//! checkpoint's codes and scales reach the step unchanged.
//!
//! The global scale of each quantised weight is a chosen multiple of ModelOpt's rule
//! (`amax / (6 · 448)`), as if calibration had seen a larger amax than the weight's own: then a
//! re-quantisation of the dequantised values picks another global scale (and so other block
//! scales and codes), so a loader that re-quantises cannot pass for one that keeps the stored form.

use engine::model::checkpoint::Checkpoint;
use engine::model::nvfp4::Nvfp4Matrix;
use engine::model::weights::names;
use safetensors::Dtype;
use safetensors::tensor::TensorView;

/// The names of the 2-D `.weight`s the loader reads as linears (so may be NVFP4): every one but
/// the embedding and the PLE n-gram tables; the lm_head only where `lm_head`.
pub fn is_linear(name: &str, lm_head: bool) -> bool {
    name.ends_with(".weight")
        && !name.contains("embed_tokens")
        && !name.contains("ngram_embedding")
        && (lm_head || name != "lm_head.weight")
}

/// The safetensors bytes of `src` with every 2-D tensor `quantise(name)` picks (its columns a
/// multiple of 16) in NVFP4 (`{name}` U8 [rows, cols/2], `{name}_scale` F8_E4M3 [rows, cols/16],
/// `{name}_scale_2` F32 []), its global scale `scale_2_factor` times ModelOpt's; the rest as stored.
pub fn nvfp4_checkpoint(src: &Checkpoint, quantise: impl Fn(&str) -> bool, scale_2_factor: f32) -> Vec<u8> {
    let mut out: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = vec![];
    for name in src.names() {
        let t = src.require(name).expect("listed");
        let fits = t.shape.len() == 2 && t.shape[1].is_multiple_of(16);
        if !(fits && quantise(name)) {
            out.push((name.to_owned(), t.dtype, t.shape.to_vec(), t.bytes.to_vec()));
            continue;
        }
        let (rows, cols) = (t.shape[0], t.shape[1]);
        let w = t.to_f32().expect("a floating-point weight");
        let amax = w.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let m = Nvfp4Matrix::quantise_with_scale_2(&w, rows, cols, Nvfp4Matrix::scale_2_for(amax) * scale_2_factor);
        out.push((format!("{name}_scale"), Dtype::F8_E4M3, vec![rows, cols / 16], m.scales));
        out.push((format!("{name}_scale_2"), Dtype::F32, vec![], m.scale_2.to_le_bytes().to_vec()));
        out.push((name.to_owned(), Dtype::U8, vec![rows, cols / 2], m.packed));
    }
    let views: Vec<(String, TensorView<'_>)> = out
        .iter()
        .map(|(n, dtype, shape, data)| (n.clone(), TensorView::new(*dtype, shape.clone(), data).expect("a view")))
        .collect();
    safetensors::serialize(views, None).expect("serialise")
}

/// The linear `name` (without `.weight`) as `ck` stores it in NVFP4, or None where it is not.
pub fn stored(ck: &Checkpoint, name: &str) -> Option<Nvfp4Matrix> {
    let w = ck.get(&format!("{name}.weight"))?;
    let scales = ck.get(&format!("{name}.weight_scale"))?;
    let scale_2 = ck.require(&format!("{name}.weight_scale_2")).expect("a global scale").to_f32().expect("f32");
    Some(Nvfp4Matrix {
        rows: w.shape[0],
        cols: w.shape[1] * 2,
        packed: w.bytes.to_vec(),
        scales: scales.bytes.to_vec(),
        scale_2: scale_2[0],
    })
}

/// Layer `l`'s experts (`experts` routed, then the shared one) as the MoE kernels read them,
/// straight from the checkpoint's bytes: gate then up rows of each expert, then every down.
#[derive(Debug, PartialEq)]
pub struct StoredExperts {
    pub gate_up_packed: Vec<u8>,
    pub gate_up_scales: Vec<u8>,
    pub gate_up_scale2: Vec<f32>,
    pub down_packed: Vec<u8>,
    pub down_scales: Vec<u8>,
    pub down_scale2: Vec<f32>,
}

/// [`StoredExperts`] of layer `l`; panics where an expert's matrix is not NVFP4 in `ck`.
pub fn stored_experts(ck: &Checkpoint, l: usize, experts: usize) -> StoredExperts {
    let mut s = StoredExperts {
        gate_up_packed: vec![],
        gate_up_scales: vec![],
        gate_up_scale2: vec![],
        down_packed: vec![],
        down_scales: vec![],
        down_scale2: vec![],
    };
    for e in (0..experts).map(Some).chain([None]) {
        let [gate, up, down] =
            names::expert_projections(&names::expert(l, e)).map(|n| stored(ck, &n).expect("an NVFP4 expert"));
        for m in [gate, up] {
            s.gate_up_packed.extend(m.packed);
            s.gate_up_scales.extend(m.scales);
            s.gate_up_scale2.push(m.scale_2);
        }
        s.down_packed.extend(down.packed);
        s.down_scales.extend(down.scales);
        s.down_scale2.push(down.scale_2);
    }
    s
}

/// `got` is `want` element for element (f32s bit for bit); the first difference is named.
pub fn assert_same<T: PartialEq + std::fmt::Debug>(what: &str, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: {} elements, the checkpoint has {}", got.len(), want.len());
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: element {i} is {:?}, the checkpoint's is {:?}", got[i], want[i]);
    }
}

/// An NVFP4 matrix is the checkpoint's `name`, every code byte, block scale and the global scale.
pub fn assert_stored(what: &str, got: &Nvfp4Matrix, ck: &Checkpoint, name: &str) {
    let want = stored(ck, name).unwrap_or_else(|| panic!("{what}: `{name}` is not NVFP4 in the checkpoint"));
    assert_eq!((got.rows, got.cols), (want.rows, want.cols), "{what}: shape");
    assert_same(&format!("{what}: codes"), &got.packed, &want.packed);
    assert_same(&format!("{what}: block scales"), &got.scales, &want.scales);
    assert_eq!(got.scale_2.to_bits(), want.scale_2.to_bits(), "{what}: global scale");
}
