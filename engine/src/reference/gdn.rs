//! Gated DeltaNet, one token: projections, the causal conv, the gates, the delta rule on the fp32
//! state, the gated norm and the output projection.

use super::norm::{gated_rms_norm, l2_norm, sigmoid, silu, softplus};
use crate::model::config::ModelConfig;
use crate::model::weights::GdnWeights;

/// What a GDN layer carries from token to token.
#[derive(Clone, Debug, PartialEq)]
pub struct GdnState {
    /// The last kernel−1 conv inputs (q, k, v before the conv), oldest first.
    pub conv_inputs: Vec<Vec<f32>>,
    /// [Hv][dk][dv].
    pub state: Vec<f32>,
}

impl GdnState {
    pub fn new(cfg: &ModelConfig) -> GdnState {
        GdnState {
            conv_inputs: vec![vec![0.0; cfg.gdn_conv_dim()]; cfg.linear_conv_kernel - 1],
            state: vec![0.0; cfg.linear_value_heads * cfg.linear_key_dim * cfg.linear_value_dim],
        }
    }
}

pub fn gdn(x: &[f32], w: &GdnWeights, cfg: &ModelConfig, st: &mut GdnState) -> Vec<f32> {
    let (hk, hv, dk, dv) = (cfg.linear_key_heads, cfg.linear_value_heads, cfg.linear_key_dim, cfg.linear_value_dim);
    let kernel = cfg.linear_conv_kernel;
    let qkv = w.in_qkv.apply(x);
    let z = w.in_z.apply(x);
    let b = w.in_b.apply(x);
    let a = w.in_a.apply(x);

    // Depthwise causal conv: tap kernel−1 meets the current input, tap 0 the oldest; then SiLU.
    let conv: Vec<f32> = (0..qkv.len())
        .map(|c| {
            let mut s = f64::from(w.conv[c * kernel + kernel - 1]) * f64::from(qkv[c]);
            for (j, past) in st.conv_inputs.iter().enumerate() {
                s += f64::from(w.conv[c * kernel + j]) * f64::from(past[c]);
            }
            silu(s as f32)
        })
        .collect();
    st.conv_inputs.remove(0);
    st.conv_inputs.push(qkv);

    let (q, rest) = conv.split_at(hk * dk);
    let (k, v) = rest.split_at(hk * dk);
    let q_scale = 1.0 / (dk as f32).sqrt();
    let mut out = Vec::with_capacity(hv * dv);
    for h in 0..hv {
        let kh = h / (hv / hk);
        let qh: Vec<f32> = l2_norm(&q[kh * dk..(kh + 1) * dk], 1e-6).iter().map(|v| v * q_scale).collect();
        let kn = l2_norm(&k[kh * dk..(kh + 1) * dk], 1e-6);
        let vh = &v[h * dv..(h + 1) * dv];
        let beta = sigmoid(b[h]);
        let g = -(f64::from(w.a_log[h]).exp()) * f64::from(softplus(a[h] + w.dt_bias[h]));
        let decay = g.exp() as f32;
        let s = &mut st.state[h * dk * dv..(h + 1) * dk * dv];
        s.iter_mut().for_each(|x| *x *= decay);
        // m = Sᵀk̂, δ = β(v − m), S += k̂ δᵀ, o = Sᵀq̂.
        let delta: Vec<f32> = (0..dv)
            .map(|j| {
                let m: f64 = (0..dk).map(|i| f64::from(s[i * dv + j]) * f64::from(kn[i])).sum();
                beta * (vh[j] - m as f32)
            })
            .collect();
        for i in 0..dk {
            for j in 0..dv {
                s[i * dv + j] += kn[i] * delta[j];
            }
        }
        let o: Vec<f32> =
            (0..dv).map(|j| (0..dk).map(|i| f64::from(s[i * dv + j]) * f64::from(qh[i])).sum::<f64>() as f32).collect();
        out.extend(gated_rms_norm(&o, &z[h * dv..(h + 1) * dv], &w.norm, cfg.rms_norm_eps, cfg.gdn_gate_sigmoid));
    }
    w.out.apply(&out)
}
