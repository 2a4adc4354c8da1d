//! Synthetic weights (`engine::synthetic`) on a GPU: every part of the tiny-step model made in
//! both formats from a fresh seed, at least one buffer of each kind compared element by element
//! with the CPU fill it must equal (bf16 and f32 values, NVFP4 codes, block scales, global
//! scales, the PLE table's rows in host memory), every block scale positive and finite, every
//! value in its range. Then the time to make one layer's MoE block at the published shape (and
//! the published PLE table on the host, when asked), in bytes/s. A model's PLE table kept for the
//! next model of its seed (the step bench's tile sets) gives the logits a table of its own would.

use engine::cuda::{DeviceBuffer, Gpu};
use engine::layers::lm_head::{LmHeadTiles, LmHeadWeights};
use engine::layers::matrix::MatrixOnDevice;
use engine::layers::mix::MixMatrices;
use engine::layers::moe::ExpertsOnDevice;
use engine::layers::paired_codes;
use engine::layers::ple::PleTableOnHost;
use engine::model::config::ModelConfig;
use engine::model::ple_table::RowFormat;
use engine::reference::fill::{self as reference, Uniform};
use engine::step::Formats;
use engine::step::weights::MixerOnDevice;
use engine::synthetic::{
    self, SCALE_LO, SCALE_SPAN, Stream, layer_part_seed, model_part_seed, nvfp4_scale_2, projection_std, stream_seed,
    tag,
};
use flashnext::rng::Rng;
use half::bf16;
use kernel_dsl::e2m1_pairs::{self, Layout};
use kernel_dsl::{E2m1x2, E4m3};

fn tiny_step() -> ModelConfig {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-step/config.json");
    ModelConfig::from_file(std::path::Path::new(path)).expect("tiny-step config")
}

/// `buf` is element 0.. of the bf16 fill of `seed` at `u`.
fn expect_bf16(gpu: &Gpu, buf: &DeviceBuffer<bf16>, seed: u64, u: Uniform, what: &str) {
    let got = gpu.download(buf).expect("download");
    let mut want = vec![bf16::ZERO; got.len()];
    reference::fill_bf16(&mut want, 0, seed, u);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what}: element {i}");
        // Rounding to bf16 is monotonic: values in [lo, hi) land in [bf16(lo), bf16(hi)].
        let (lo, hi) = (bf16::from_f32(u.lo).to_f32(), bf16::from_f32(u.hi()).to_f32());
        assert!(g.to_f32() >= lo && g.to_f32() <= hi, "{what}: element {i} = {g} outside [{lo}, {hi}]");
    }
}

fn expect_f32(gpu: &Gpu, buf: &DeviceBuffer<f32>, seed: u64, u: Uniform, what: &str) {
    let got = gpu.download(buf).expect("download");
    let mut want = vec![0f32; got.len()];
    reference::fill_f32(&mut want, 0, seed, u);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what}: element {i}");
    }
}

/// Codes and scales of an NVFP4 matrix of part `seed`, buffer `tag`: every byte, every scale
/// positive and finite.
fn expect_nvfp4(
    gpu: &Gpu,
    packed: &DeviceBuffer<E2m1x2>,
    scales: &DeviceBuffer<E4m3>,
    seed: u64,
    tag: u64,
    what: &str,
) {
    let got: Vec<u8> = gpu.download(packed).expect("codes").iter().map(|c| c.0).collect();
    expect_nvfp4_codes(gpu, &got, scales, seed, tag, what);
}

/// As [`expect_nvfp4`] for codes already downloaded (and put back into ModelOpt's layout).
fn expect_nvfp4_codes(gpu: &Gpu, got: &[u8], scales: &DeviceBuffer<E4m3>, seed: u64, tag: u64, what: &str) {
    let codes = got.len();
    let mut want = vec![0u8; got.len()];
    reference::fill_nvfp4_codes(&mut want, 0, stream_seed(seed, tag, Stream::Codes));
    assert!(got == want, "{what}: codes differ from byte {:?}", got.iter().zip(&want).position(|(a, b)| a != b));
    let got: Vec<u8> = gpu.download(scales).expect("scales").iter().map(|c| c.0).collect();
    let mut want = vec![0u8; got.len()];
    reference::fill_e4m3_scales(&mut want, 0, stream_seed(seed, tag, Stream::Scales), SCALE_LO, SCALE_SPAN);
    assert!(got == want, "{what}: scales differ from {:?}", got.iter().zip(&want).position(|(a, b)| a != b));
    for &s in &got {
        let v = E4m3(s).to_f32();
        assert!(v.is_finite() && v > 0.0, "{what}: scale {s:#x} = {v}");
    }
    assert_eq!(got.len() * 16, codes * 2, "{what}: a scale per 16 values");
}

#[test]
#[ignore = "needs a CUDA device"]
fn every_part_of_the_tiny_step_model_matches_its_cpu_fill() {
    let gpu = flashnext::gpu::open();
    let cfg = tiny_step();
    let seed = Rng::fresh("synthetic tiny-step").next_u64();
    for nvfp4 in [false, true] {
        let formats = Formats::all(nvfp4);
        let mut seen = Vec::new();
        let mut layers = synthetic::layers(&gpu, &cfg, &formats, seed, &mut |what, done, total| {
            seen.push(done);
            assert_eq!((what, total), ("layer", cfg.num_layers));
        })
        .expect("layers");
        // GDN's input projection in the layout its tensor-core path reads (the paired one on
        // sm_90), rearranged on the device: read back into ModelOpt's, every code must be the fill's.
        let gdn_layout = Layout::for_arch(gpu.arch());
        synthetic::gdn_in_proj_to_layout(&gpu, &mut layers, gdn_layout).expect("GDN codes to the paired layout");
        assert_eq!(seen, (1..=cfg.num_layers).collect::<Vec<_>>(), "progress after every layer");
        let site = synthetic::mix_shape(&cfg, true);
        let (w, d) = (site.width(), cfg.hidden_size);
        for (l, lw) in layers.iter().enumerate() {
            let part = |p| layer_part_seed(seed, l, p);
            let label = |what: &str| format!("nvfp4 {nvfp4}, layer {l}: {what}");
            // Mix sites: the norm, and the matrices in their format.
            for (site_w, p) in [(&lw.attn_mix, 0), (&lw.mlp_mix, 2)] {
                let s = part(p);
                let zc = Uniform::symmetric(synthetic::ZC_NORM);
                expect_bf16(&gpu, &site_w.norm, stream_seed(s, tag::MIX_NORM, Stream::Values), zc, &label("hc_norm"));
                match &site_w.matrices {
                    MixMatrices::Bf16 { proj, up } => {
                        assert!(!nvfp4);
                        let u = Uniform::with_std(projection_std(w));
                        expect_bf16(&gpu, proj, stream_seed(s, tag::MIX_PROJ, Stream::Values), u, &label("mix proj"));
                        let u = Uniform::with_std(projection_std(site.rank));
                        expect_bf16(&gpu, up, stream_seed(s, tag::MIX_UP, Stream::Values), u, &label("mix up"));
                    }
                    MixMatrices::Nvfp4 { proj_packed, proj_scales, up_packed, up_scales, scale2 } => {
                        assert!(nvfp4);
                        expect_nvfp4(&gpu, proj_packed, proj_scales, s, tag::MIX_PROJ, &label("mix proj"));
                        expect_nvfp4(&gpu, up_packed, up_scales, s, tag::MIX_UP, &label("mix up"));
                        let ps = nvfp4_scale_2(projection_std(w));
                        let want = [ps, ps, nvfp4_scale_2(projection_std(site.rank))];
                        assert_eq!(gpu.download(scale2).expect("scale2"), want, "{}", label("mix global scales"));
                    }
                }
            }
            match &lw.mixer {
                MixerOnDevice::Gdn(g) => {
                    let s = part(1);
                    let a_log = Uniform::new(0.0, 16f32.ln());
                    expect_f32(&gpu, &g.a_log, stream_seed(s, tag::GDN_A_LOG, Stream::Values), a_log, &label("A_log"));
                    let dt = Uniform::new(1e-3f32.ln(), 1e-1f32.ln());
                    expect_f32(
                        &gpu,
                        &g.dt_bias,
                        stream_seed(s, tag::GDN_DT_BIAS, Stream::Values),
                        dt,
                        &label("dt_bias"),
                    );
                    let norm = Uniform::new(0.9, 1.1);
                    expect_bf16(&gpu, &g.norm, stream_seed(s, tag::GDN_NORM, Stream::Values), norm, &label("GDN norm"));
                    match &g.out_proj {
                        MatrixOnDevice::Nvfp4 { packed, scales, .. } => {
                            assert!(nvfp4);
                            expect_nvfp4(&gpu, packed, scales, s, tag::GDN_OUT_PROJ, &label("GDN out_proj"));
                        }
                        MatrixOnDevice::Bf16(b) => {
                            assert!(!nvfp4);
                            let u = Uniform::with_std(projection_std(g.shape.z_dim()));
                            let seed = stream_seed(s, tag::GDN_OUT_PROJ, Stream::Values);
                            expect_bf16(&gpu, b, seed, u, &label("GDN out_proj"));
                        }
                    }
                    match &g.in_proj {
                        engine::layers::gdn::InProjOnDevice::Nvfp4 { packed, scales, scale2, layout } => {
                            assert_eq!(*layout, gdn_layout, "{}", label("GDN in_proj layout"));
                            let mut codes: Vec<u8> = gpu.download(packed).expect("codes").iter().map(|c| c.0).collect();
                            e2m1_pairs::from_layout(&mut codes, *layout).expect("whole words");
                            expect_nvfp4_codes(&gpu, &codes, scales, s, tag::GDN_IN_PROJ, &label("GDN in_proj"));
                            let want = [nvfp4_scale_2(projection_std(d)); 4];
                            assert_eq!(gpu.download(scale2).expect("scale2"), want);
                        }
                        engine::layers::gdn::InProjOnDevice::Bf16(b) => {
                            let u = Uniform::with_std(projection_std(d));
                            expect_bf16(
                                &gpu,
                                b,
                                stream_seed(s, tag::GDN_IN_PROJ, Stream::Values),
                                u,
                                &label("in_proj"),
                            );
                        }
                    }
                }
                MixerOnDevice::Qsa(q) => {
                    let s = part(1);
                    match &q.in_proj {
                        MatrixOnDevice::Nvfp4 { packed, scales, scale2, segs } => {
                            assert!(nvfp4);
                            expect_nvfp4(&gpu, packed, scales, s, tag::QSA_IN_PROJ, &label("QSA proj"));
                            let ps = nvfp4_scale_2(projection_std(d));
                            assert_eq!(gpu.download(scale2).expect("scale2"), [ps; 4], "{}", label("QSA scales"));
                            assert_eq!(*segs, [q.shape.in_rows() as u32; 3]);
                        }
                        MatrixOnDevice::Bf16(b) => {
                            assert!(!nvfp4);
                            let u = Uniform::with_std(projection_std(d));
                            expect_bf16(
                                &gpu,
                                b,
                                stream_seed(s, tag::QSA_IN_PROJ, Stream::Values),
                                u,
                                &label("QSA proj"),
                            );
                        }
                    }
                    let zc = Uniform::symmetric(synthetic::ZC_NORM);
                    expect_bf16(&gpu, &q.k_norm, stream_seed(s, tag::QSA_K_NORM, Stream::Values), zc, &label("k_norm"));
                }
            }
            let s = part(3);
            let sh = lw.moe.shape;
            let u = Uniform::with_std(projection_std(d));
            expect_bf16(&gpu, &lw.moe.router, stream_seed(s, tag::MOE_ROUTER, Stream::Values), u, &label("router"));
            match &lw.moe.experts {
                ExpertsOnDevice::Nvfp4 {
                    gate_up_packed,
                    gate_up_scales,
                    gate_up_scale2,
                    down_packed,
                    down_scales,
                    down_scale2,
                } => {
                    let gu = paired_codes::download(&gpu, gate_up_packed).expect("gate_up codes");
                    expect_nvfp4_codes(&gpu, &gu, gate_up_scales, s, tag::MOE_GATE_UP, &label("gate_up"));
                    expect_nvfp4(&gpu, down_packed, down_scales, s, tag::MOE_DOWN, &label("down"));
                    let gu = gpu.download(gate_up_scale2).expect("scale2");
                    assert_eq!(gu, vec![nvfp4_scale_2(projection_std(d)); 2 * (sh.experts + 1)]);
                    let dn = gpu.download(down_scale2).expect("scale2");
                    assert_eq!(dn[0], nvfp4_scale_2(projection_std(sh.inter)));
                    assert_eq!(dn[sh.experts], nvfp4_scale_2(projection_std(sh.shared_inter)));
                }
                ExpertsOnDevice::Bf16 { gate_up, down } => {
                    expect_bf16(&gpu, gate_up, stream_seed(s, tag::MOE_GATE_UP, Stream::Values), u, &label("gate_up"));
                    // One stream, the shared expert's part at its own magnitude.
                    let got = gpu.download(down).expect("down");
                    let routed = sh.experts * sh.inter * d;
                    let ds = stream_seed(s, tag::MOE_DOWN, Stream::Values);
                    for (i, g) in got.iter().enumerate() {
                        let fan_in = if i < routed { sh.inter } else { sh.shared_inter };
                        let want = reference::uniform_bf16(ds, i as u64, Uniform::with_std(projection_std(fan_in)));
                        assert_eq!(g.to_bits(), want.to_bits(), "{}: element {i}", label("down"));
                    }
                }
            }
            assert_eq!(lw.ple.is_some(), cfg.is_ple_layer(l));
            if let Some(p) = &lw.ple {
                let std = projection_std(p.shape.embed_dim());
                match &p.proj {
                    MatrixOnDevice::Nvfp4 { packed, scales, scale2, segs } => {
                        assert!(nvfp4);
                        expect_nvfp4(&gpu, packed, scales, part(4), tag::PLE_PROJ, &label("PLE proj"));
                        let ps = nvfp4_scale_2(std);
                        assert_eq!(gpu.download(scale2).expect("scale2")[..2], [ps; 2], "{}", label("PLE scales"));
                        let rows = p.shape.proj_rows() as u32;
                        assert_eq!(*segs, [p.shape.residual_width() as u32, rows, rows]);
                    }
                    MatrixOnDevice::Bf16(b) => {
                        assert!(!nvfp4);
                        let seed = stream_seed(part(4), tag::PLE_PROJ, Stream::Values);
                        expect_bf16(&gpu, b, seed, Uniform::with_std(std), &label("PLE proj"));
                    }
                }
            }
        }

        let fin = synthetic::final_mix(&gpu, &cfg, &formats, seed).expect("final mix");
        assert!(!fin.shape.inject && fin.is_nvfp4() == nvfp4);
        if let MixMatrices::Nvfp4 { scale2, .. } = &fin.matrices {
            assert_eq!(gpu.download(scale2).expect("scale2")[1], 0.0, "no inject in the final mixer");
        }

        let emb_seed = model_part_seed(seed, 1);
        let emb = synthetic::embed(&gpu, cfg.vocab_size, d, emb_seed).expect("embed");
        let u = Uniform::with_std(1.0);
        expect_bf16(&gpu, &emb, stream_seed(emb_seed, tag::EMBED, Stream::Values), u, "embedding");

        let head_seed = model_part_seed(seed, 2);
        let head =
            synthetic::lm_head(&gpu, cfg.vocab_size, d, nvfp4, head_seed, LmHeadTiles::default()).expect("lm_head");
        match head.weights() {
            LmHeadWeights::Bf16(b) => {
                let u = Uniform::with_std(projection_std(d));
                expect_bf16(&gpu, b, stream_seed(head_seed, tag::LM_HEAD, Stream::Values), u, "lm_head");
            }
            LmHeadWeights::Nvfp4 { packed, scales, scale2 } => {
                let codes = paired_codes::download(&gpu, packed).expect("lm_head codes");
                expect_nvfp4_codes(&gpu, &codes, scales, head_seed, tag::LM_HEAD, "lm_head");
                assert_eq!(gpu.download(scale2).expect("scale2"), [nvfp4_scale_2(projection_std(d))]);
            }
        }
        // The lm_head runs on the synthetic weights: a token below the vocabulary comes out.
        let mut head = head;
        let x = synthetic::embed(&gpu, 1, d, 5).expect("x");
        let mut logits = gpu.alloc::<f32>(cfg.vocab_size).expect("logits");
        let mut token = gpu.alloc::<u32>(1).expect("token");
        gpu.fill_bytes(&mut token, 0xff).expect("poison");
        head.launch(&gpu, &x, &mut logits, &mut token).expect("lm_head launch");
        let t = gpu.download(&token).expect("token")[0];
        let l = gpu.download(&logits).expect("logits");
        assert!((t as usize) < cfg.vocab_size, "token {t}");
        assert!(l.iter().all(|v| v.is_finite() && v.abs() < 20.0), "logits are sane");
        assert!(l.iter().all(|&v| v <= l[t as usize]), "the token has the largest logit");

        // The PLE table in host memory: every row against the CPU fill, the header's scales.
        let table_seed = model_part_seed(seed, 3);
        let mut calls = 0;
        let table = synthetic::ple_table(&gpu, &cfg, formats.ple_table, table_seed, &mut |_, done, total| {
            calls += 1;
            assert!(done <= total);
        })
        .expect("PLE table");
        assert!(calls >= 2, "progress at the start and the end");
        let PleTableOnHost::Pinned { header, rows } = &table else { panic!("a pinned table") };
        assert_eq!(header.format, if nvfp4 { RowFormat::Nvfp4 } else { RowFormat::Bf16 });
        let mut want = vec![0u8; rows.len()];
        synthetic::fill_ple_rows(&mut want, 0, header.format, header.width as usize, table_seed);
        assert!(rows.as_slice() == &want[..], "PLE table rows differ");
        let want_scale = if nvfp4 { nvfp4_scale_2(1.0) } else { 1.0 };
        assert!(header.scale_2.iter().all(|&s| s == want_scale));
        println!("nvfp4 {nvfp4}: every part matches; PLE table {} rows of {} bytes", header.rows, header.row_bytes());
    }
}

/// A synthetic model's PLE table taken from its engine and given to the next model of the same
/// config and seed (what the step bench does between tile sets) reads as the table that model
/// would have made: twelve greedy steps of the tiny-step model (PLE on its layers) give the same
/// logits, bit for bit, as a model that made its own, with bf16 and with NVFP4 weights (the
/// table's rows bf16 in both: tiny-step's 16-value rows are too narrow for the NVFP4 rows'
/// kernel). A table offered for another seed is refused, naming both seeds.
#[test]
#[ignore = "needs a CUDA device"]
fn a_kept_ple_table_makes_the_model_a_fresh_one_would() {
    use engine::step::{Engine, ModelOnDevice, StepPlan, SyntheticPleTable};
    let mut gpu = Some(flashnext::gpu::open());
    let cfg = tiny_step();
    assert!(!cfg.ple_layers.is_empty(), "tiny-step has PLE layers");
    let seed = Rng::fresh("kept PLE table").next_u64();
    let first = (Rng::fresh("kept PLE table, first token").next_u64() % cfg.vocab_size as u64) as u32;
    for nvfp4 in [false, true] {
        // NVFP4 weights but GDN's input projection and the PLE table's rows, whose NVFP4 kernels
        // do not take tiny-step's hidden size and row width (256 and 16; gpu_step keeps the input
        // projection bf16 the same way). The step bench keeps an NVFP4 table at the published
        // shape.
        let formats = if nvfp4 {
            Formats { gdn_in_proj: false, ple_table: RowFormat::Bf16, ..Formats::NVFP4 }
        } else {
            Formats::BF16
        };
        let plan = StepPlan::new(&cfg, formats, 64).expect("plan");
        // A model of `seed` (with `kept` for its table), its logits at each of 12 greedy steps,
        // then the device and the table back.
        let mut run = |kept: Option<SyntheticPleTable>| {
            let g = gpu.take().expect("the device");
            let mut filled = false;
            let reused = kept.is_some();
            let model = ModelOnDevice::synthetic_with(&g, &cfg, &plan, seed, kept, &mut |what, _, _| {
                filled |= what.starts_with("PLE table: filling");
            })
            .expect("model");
            assert_eq!(filled, !reused, "the table is filled only when none is kept");
            let mut e = Engine::new(g, plan.clone(), model).expect("engine");
            let mut token = first;
            let mut logits = Vec::new();
            for _ in 0..12 {
                token = e.step(token).expect("step");
                logits.push(e.logits().expect("logits"));
            }
            let (g, table) = e.into_gpu_and_ple_table();
            gpu = Some(g);
            (logits, table.expect("a synthetic model's table comes back"))
        };
        let (fresh, table) = run(None);
        assert_eq!(table.format(), plan.formats.ple_table);
        let (kept, table) = run(Some(table));
        for (p, (a, b)) in fresh.iter().zip(&kept).enumerate() {
            let same = a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "nvfp4 {nvfp4}: position {p}'s logits differ with the kept table");
        }
        let g = gpu.as_ref().expect("the device");
        let err = ModelOnDevice::synthetic_with(g, &cfg, &plan, seed ^ 1, Some(table), &mut |_, _, _| {})
            .expect_err("a table of another seed is refused")
            .to_string();
        assert!(err.contains(&format!("seed {seed}")) && err.contains(&format!("seed {}", seed ^ 1)), "{err}");
        println!("nvfp4 {nvfp4}: 12 steps' logits identical with the kept table; another seed refused: {err}");
    }
}

/// The published geometry's bytes, and the time to make one layer's MoE block (NVFP4 and bf16):
/// allocation and fill, then a refill of the same buffers (the fill kernels alone).
#[test]
#[ignore = "needs a CUDA device"]
fn published_moe_layer_fill_speed() {
    let gpu = flashnext::gpu::open();
    let cfg = ModelConfig::published();
    for nvfp4 in [true, false] {
        let b = synthetic::synthetic_weight_bytes(&cfg, &Formats::all(nvfp4)).expect("bytes");
        println!(
            "published, nvfp4 {nvfp4}: device {:.2} GB (MoE {:.2}, GDN {:.2}, QSA {:.2}, mix {:.2}, PLE {:.3}, embed {:.2}, lm_head {:.2}), PLE table {:.2} GB on the host, {:.3} GB of weights read per token",
            b.device() as f64 / 1e9,
            b.moe as f64 / 1e9,
            b.gdn as f64 / 1e9,
            b.qsa as f64 / 1e9,
            b.mix as f64 / 1e9,
            b.ple as f64 / 1e9,
            b.embed as f64 / 1e9,
            b.lm_head as f64 / 1e9,
            b.ple_table as f64 / 1e9,
            b.read_per_token as f64 / 1e9,
        );
    }
    let sh = synthetic::moe_shape(&cfg);
    // Compile the fills first.
    drop(synthetic::moe(&gpu, engine::layers::moe::MoeShape { experts: 2, ..sh }, true, 0).expect("warm-up"));
    for nvfp4 in [true, false] {
        let bytes = {
            let b = synthetic::synthetic_weight_bytes(&cfg, &Formats::all(nvfp4)).expect("bytes");
            b.moe / cfg.num_layers
        };
        gpu.synchronize().expect("sync");
        let t = std::time::Instant::now();
        let mut w = synthetic::moe(&gpu, sh, nvfp4, 7).expect("MoE");
        gpu.synchronize().expect("sync");
        let made = t.elapsed().as_secs_f64();
        let f = synthetic::Fills::load(&gpu).expect("fills");
        let t = std::time::Instant::now();
        match &mut w.experts {
            ExpertsOnDevice::Nvfp4 { gate_up_packed, gate_up_scales, down_packed, down_scales, .. } => {
                f.codes(&gpu, gate_up_packed, 1).expect("fill");
                f.scales(&gpu, gate_up_scales, 2).expect("fill");
                f.codes(&gpu, down_packed, 3).expect("fill");
                f.scales(&gpu, down_scales, 4).expect("fill");
            }
            ExpertsOnDevice::Bf16 { gate_up, down } => {
                f.bf16(&gpu, gate_up, 1, Uniform::with_std(0.02)).expect("fill");
                f.bf16(&gpu, down, 2, Uniform::with_std(0.04)).expect("fill");
            }
        }
        gpu.synchronize().expect("sync");
        let refill = t.elapsed().as_secs_f64();
        println!(
            "published MoE layer, nvfp4 {nvfp4}: {:.3} GB made in {:.1} ms ({:.0} GB/s, allocation included), experts refilled in {:.1} ms ({:.0} GB/s); 48 layers ≈ {:.2} s",
            bytes as f64 / 1e9,
            made * 1e3,
            bytes as f64 / made / 1e9,
            refill * 1e3,
            bytes as f64 / refill / 1e9,
            48.0 * made,
        );
    }
}

/// The published PLE table (NVFP4, 30.7 GB of pinned host memory) filled by every core: the time
/// it takes and a few rows against the CPU fill. Set FLASHNEXT_SYNTH_PLE_TABLE=1 to run it (it
/// pins 31 GB of host memory).
#[test]
#[ignore = "needs a CUDA device"]
fn published_ple_table_fill_time() {
    if std::env::var_os("FLASHNEXT_SYNTH_PLE_TABLE").is_none() {
        println!("skipped: set FLASHNEXT_SYNTH_PLE_TABLE=1 to pin and fill the published 30.7 GB table");
        return;
    }
    let gpu = flashnext::gpu::open();
    let cfg = ModelConfig::published();
    let t = std::time::Instant::now();
    let mut last = 0;
    let mut phases = Vec::new();
    let table = synthetic::ple_table(&gpu, &cfg, RowFormat::Nvfp4, 9, &mut |what, done, total| {
        if phases.last() != Some(&what.to_owned()) {
            println!("{:>6.2} s: {what}", t.elapsed().as_secs_f64());
            phases.push(what.to_owned());
        }
        if done * 10 / total.max(1) > last {
            last = done * 10 / total.max(1);
            println!("{:>6.2} s: {done} of {total} rows", t.elapsed().as_secs_f64());
        }
    })
    .expect("table");
    let s = t.elapsed().as_secs_f64();
    let PleTableOnHost::Pinned { header, rows } = &table else { panic!("pinned") };
    println!(
        "published PLE table: {:.2} GB in {s:.2} s ({:.2} GB/s, pinning included)",
        rows.len() as f64 / 1e9,
        rows.len() as f64 / s / 1e9
    );
    let rb = header.row_bytes();
    let mut rng = Rng::fresh("ple table rows");
    for _ in 0..1000 {
        let r = rng.next_u64() % header.rows;
        let mut want = vec![0u8; rb];
        synthetic::fill_ple_rows(&mut want, r, header.format, header.width as usize, 9);
        let at = r as usize * rb;
        assert_eq!(rows.as_slice()[at..at + rb], want[..], "row {r}");
    }
}
