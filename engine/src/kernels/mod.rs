//! Every kernel of the engine, each described once in the DSL. [`ALL`] lists them for the tools
//! that walk every kernel: the generated files, the NVRTC compile test, the autotuner.
//!
//! `helpers/` holds files of device functions that kernels expand (`helpers = "..."` in
//! their attribute): DSL text, not Rust modules, so they are not declared here.

pub mod e2m1_pairs;
pub mod embed;
pub mod fill;
pub mod gdn;
pub mod gemv_bf16;
pub mod gemv_nvfp4;
pub mod lm_head;
pub mod mix;
pub mod moe;
pub mod ple;
pub mod qsa;
pub mod sample;
pub mod zc_rmsnorm;

use kernel_dsl::AnyKernel;

/// Every kernel, in a stable order.
pub static ALL: &[&dyn AnyKernel] = &[
    &gemv_bf16::gemv_bf16::ERASED,
    &gemv_nvfp4::gemv_nvfp4::ERASED,
    &mix::mix_down_bf16::ERASED,
    &mix::mix_up_bf16::ERASED,
    &mix::mix_down_nvfp4::ERASED,
    &mix::mix_up_nvfp4::ERASED,
    &moe::router::moe_router::ERASED,
    &moe::gate_up::moe_gate_up_nvfp4::ERASED,
    &moe::gate_up::moe_gate_up_bf16::ERASED,
    &moe::down::moe_down_nvfp4::ERASED,
    &moe::down::moe_down_bf16::ERASED,
    &zc_rmsnorm::zc_rmsnorm::ERASED,
    &gdn::in_proj::gdn_in_proj_bf16::ERASED,
    &gdn::in_proj::gdn_in_proj_nvfp4::ERASED,
    &gdn::delta_rule_normed::gdn_delta_rule_normed::ERASED,
    &ple::ids::ple_ids::ERASED,
    &ple::gather_bf16::ple_gather_bf16::ERASED,
    &ple::gather_nvfp4::ple_gather_nvfp4::ERASED,
    &ple::gate_conv::ple_gate_conv::ERASED,
    &qsa::block_scores::qsa_block_scores::ERASED,
    &qsa::top_blocks::qsa_top_blocks::ERASED,
    &qsa::top_blocks_grid::qsa_top_blocks_grid::ERASED,
    &qsa::attention::qsa_attention::ERASED,
    &qsa::combine::qsa_attention_combine::ERASED,
    &qsa::prepare::qsa_prepare::ERASED,
    &embed::embed_streams::ERASED,
    &lm_head::lm_head_argmax_bf16::ERASED,
    &lm_head::lm_head_argmax_nvfp4::ERASED,
    &fill::fill_bf16::ERASED,
    &fill::fill_f32::ERASED,
    &fill::fill_nvfp4_codes::ERASED,
    &fill::fill_e4m3_scales::ERASED,
    &e2m1_pairs::e2m1_pair_words::ERASED,
    &sample::sample_top_p::ERASED,
];
