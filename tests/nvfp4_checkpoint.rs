//! NVFP4 in the ModelOpt layout: the Rust quantiser reproduces, byte for byte, the NVFP4
//! checkpoint the goldens script wrote (its own implementation of the same rules) from the bf16
//! weights, and the NVFP4 checkpoint loads as the dequantised values. An NVFP4 checkpoint's codes,
//! block scales and global scales are what the step uploads where it asks for NVFP4 (the host
//! matrices the upload is given, every element), not a re-quantisation of the dequantised values,
//! which a checkpoint built for it shows would differ. (On the device: tests/gpu_nvfp4_checkpoint.rs.)

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use engine::model::checkpoint::Checkpoint;
use engine::model::config::ModelConfig;
use engine::model::nvfp4::Nvfp4Matrix;
use engine::model::weights::{MixerWeights, ModelWeights, names};
use engine::step::weights::{gdn_in_proj_nvfp4, lm_head_nvfp4, mix_nvfp4, moe_nvfp4, nvfp4_matrix};
use flashnext::nvfp4_checkpoint::{assert_same, assert_stored, is_linear, nvfp4_checkpoint, stored, stored_experts};

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

/// tests/data/tiny-step with every linear in NVFP4 (the lm_head too where `lm_head`), its global
/// scales `factor` times ModelOpt's; the checkpoint and its weights.
fn tiny_step_nvfp4(lm_head: bool, factor: f32) -> (Checkpoint, ModelWeights) {
    let cfg = ModelConfig::from_file(&data("tiny-step").join("config.json")).expect("config");
    let bf16 = Checkpoint::open(&data("tiny-step")).expect("tiny-step");
    let bytes = nvfp4_checkpoint(&bf16, |n| is_linear(n, lm_head), factor);
    let ck = Checkpoint::from_bytes("<tiny-step nvfp4>", bytes).expect("an NVFP4 checkpoint");
    let w = ModelWeights::load(&cfg, &ck).expect("the NVFP4 checkpoint loads");
    (ck, w)
}

/// Every linear the step has NVFP4 kernels for (experts, mix sites, GDN input projections,
/// lm_head) is handed to the upload with the checkpoint's codes, block scales and global scale,
/// every element; a weight the checkpoint keeps in bf16 (here the lm_head) is quantised at load.
#[test]
fn the_upload_gets_the_checkpoints_nvfp4_codes_and_scales() {
    let (ck, w) = tiny_step_nvfp4(false, 1.5);
    let cfg = &w.config;
    let stored_names = ck.names().iter().filter(|n| n.ends_with(".weight_scale_2")).count();
    assert_eq!(w.nvfp4.len(), stored_names, "every NVFP4 linear is kept as stored");
    let mut checked = 0;
    for l in 0..cfg.num_layers {
        let s = moe_nvfp4(&w, l);
        let want = stored_experts(&ck, l, cfg.num_experts);
        assert_same(&format!("layer {l} gate/up codes"), &s.gate_up_packed, &want.gate_up_packed);
        assert_same(&format!("layer {l} gate/up scales"), &s.gate_up_scales, &want.gate_up_scales);
        assert_same(&format!("layer {l} gate/up global scales"), &s.gate_up_scale2, &want.gate_up_scale2);
        assert_same(&format!("layer {l} down codes"), &s.down_packed, &want.down_packed);
        assert_same(&format!("layer {l} down scales"), &s.down_scales, &want.down_scales);
        assert_same(&format!("layer {l} down global scales"), &s.down_scale2, &want.down_scale2);
        checked += 3 * (cfg.num_experts + 1);
        for (attn, m) in [(true, &w.layers[l].attn_mix), (false, &w.layers[l].mlp_mix)] {
            let site = names::mix_site(l, attn);
            checked += check_mix(&ck, &w, &site, m);
        }
        if let Some(m) = gdn_in_proj_nvfp4(&w, l) {
            for (m, name) in m.iter().zip(names::gdn_in_proj(l)) {
                assert!(matches!(m, Cow::Borrowed(_)), "{name} is the stored matrix");
                assert_stored(&name, m, &ck, &name);
                checked += 1;
            }
        }
    }
    checked += check_mix(&ck, &w, names::FINAL_MIX, &w.final_mix);
    println!("{checked} NVFP4 matrices handed to the upload as stored");
    // Three layers' 9 experts of 3 matrices, six mix sites of 3 and the final one of 2, two GDN
    // layers' 4 input projections.
    assert_eq!(checked, 3 * 9 * 3 + 6 * 3 + 2 + 2 * 4, "matrices checked");

    // The lm_head is bf16 in this checkpoint: quantised at load from its values, as before.
    assert!(stored(&ck, "lm_head").is_none());
    let head = lm_head_nvfp4(&w);
    assert!(matches!(head, Cow::Owned(_)));
    assert_eq!(*head, Nvfp4Matrix::quantise(&w.lm_head.w, w.lm_head.rows, w.lm_head.cols));

    // Stored in NVFP4 too, it goes up as stored.
    let (ck, w) = tiny_step_nvfp4(true, 1.5);
    assert_stored("lm_head", &lm_head_nvfp4(&w), &ck, "lm_head");
}

/// Checks a mix site's three (or two) matrices against the checkpoint; how many.
fn check_mix(ck: &Checkpoint, w: &ModelWeights, site: &str, m: &engine::model::weights::MixWeights) -> usize {
    let q = mix_nvfp4(w, site, m);
    let [down, up, inject] = names::mix_projections(site);
    assert_stored(&down, &q.down, ck, &down);
    assert_stored(&up, &q.up, ck, &up);
    match &q.inject {
        Some(i) => {
            assert_stored(&inject, i, ck, &inject);
            3
        }
        None => 2,
    }
}

/// The checkpoint the test above reads is one where re-quantising the dequantised values (what
/// the upload did before) gives other codes or scales: for every NVFP4 linear here; so that test
/// fails on an upload that re-quantises. With ModelOpt's own global scale it may or may not differ
/// (printed).
#[test]
fn requantising_the_dequantised_checkpoint_would_differ() {
    let (_, w) = tiny_step_nvfp4(true, 1.5);
    let differ = |w: &ModelWeights| {
        w.nvfp4.values().filter(|m| Nvfp4Matrix::quantise(&m.dequantise(), m.rows, m.cols) != **m).count()
    };
    let n = differ(&w);
    println!("global scales 1.5 × ModelOpt's: {n} of {} matrices re-quantise to other codes or scales", w.nvfp4.len());
    assert_eq!(n, w.nvfp4.len(), "every matrix of this checkpoint re-quantises differently");
    let (_, plain) = tiny_step_nvfp4(true, 1.0);
    println!(
        "ModelOpt's global scales: {} of {} matrices re-quantise to other codes or scales",
        differ(&plain),
        plain.nvfp4.len()
    );
}

/// The NVFP4 form is kept beside the dequantised values the CPU reference and every bf16 upload
/// read: those are the stored matrices' values, element for element.
#[test]
fn the_dequantised_values_are_the_stored_ones() {
    let (ck, w) = tiny_step_nvfp4(true, 1.5);
    let gdn = w.layers.iter().find_map(|l| match &l.mixer {
        MixerWeights::Gdn(g) => Some(g),
        MixerWeights::Qsa(_) => None,
    });
    let l0 = &w.layers[0];
    let cases = [
        ("model.layers.0.mlp.experts.3.gate_proj", &l0.moe.experts[3].gate),
        ("model.layers.0.mlp.shared_expert.down_proj", &l0.moe.shared.down),
        ("model.layers.0.mlp.gate", &l0.moe.router),
        ("model.layers.0.attn_hyper_connection.input_mix_weight_up", &l0.attn_mix.up),
        ("model.layers.0.linear_attn.out_proj", &gdn.expect("a GDN layer").out),
        ("lm_head", &w.lm_head),
    ];
    for (name, linear) in cases {
        let m = stored(&ck, name).unwrap_or_else(|| panic!("{name} is NVFP4"));
        assert_eq!(w.nvfp4[name], m, "{name} kept as stored");
        assert_same(name, &linear.w, &m.dequantise());
    }
}

/// A stored matrix whose shape is not the one the step needs (weights assembled by hand) is not
/// uploaded: the values are quantised again.
#[test]
fn a_stored_matrix_of_another_shape_is_quantised_again() {
    let (_, mut w) = tiny_step_nvfp4(true, 1.5);
    let m = w.nvfp4.get_mut("lm_head").expect("stored");
    m.rows /= 2;
    m.packed.truncate(m.packed.len() / 2);
    m.scales.truncate(m.scales.len() / 2);
    let got = nvfp4_matrix(&w, "lm_head", &w.lm_head, false);
    assert!(matches!(got, Cow::Owned(_)));
    assert_eq!(*got, Nvfp4Matrix::quantise(&w.lm_head.w, w.lm_head.rows, w.lm_head.cols));
}
